"""What the fused modules that stand in for an e3nn module share: e3nn's module, its state.

:class:`FusedConvTP <cfm_plugins.ops.conv_tp.FusedConvTP>` and
:class:`FusedSkipTP <cfm_plugins.ops.skip_tp.FusedSkipTP>` hold the e3nn module they replace
(``self.__dict__["_e3nn_tp"]``, not a submodule) and share its parameters, buffers and compiled
submodules, so that the state_dict is e3nn's and the stock path can run from the same tensors.
"""

from __future__ import annotations

from collections import OrderedDict

import torch


def module_device(module: torch.nn.Module) -> torch.device:
    """Where a module's tensors live (its first parameter or buffer; CPU for none)."""
    for t in module.parameters():
        return t.device
    for t in module.buffers():
        return t.device
    return torch.device("cpu")


class SharesE3nnModule:
    """Mixin (before ``torch.nn.Module``) for a module sharing the state of ``_e3nn_tp``.

    ``F64_BUFFERS``: the buffers that stay float64 under ``.to(dtype)`` (coefficients the
    kernels read in double) and only follow the device. ``DERIVED``: attributes holding tables
    derived from the buffers, emptied when the module moves or is pickled.
    """

    F64_BUFFERS: tuple[str, ...] = ()
    DERIVED: tuple[str, ...] = ()

    def _share_state_of(self, tp: torch.nn.Module) -> None:
        """Take ``tp``'s parameters, buffers and compiled submodules as this module's own (the same
        state_dict; e3nn's compiled code is the stock path) and keep ``tp`` beside them (not a
        submodule: the state_dict keys stay e3nn's; :meth:`to_e3nn` hands it back)."""
        for name, p in tp._parameters.items():
            self.register_parameter(name, p)
        for name, buf in tp._buffers.items():
            self.register_buffer(name, buf, persistent=name not in tp._non_persistent_buffers_set)
        for name, mod in tp._modules.items():
            self.add_module(name, mod)
        self.__dict__["_e3nn_tp"] = tp

    def _register_descriptor(self, prefix: str, desc, device) -> None:
        """The descriptor ``desc`` and its transpose as the operators take them: buffers
        ``{prefix}_ints[_t]`` (int32) and ``{prefix}_coef[_t]`` (float64), not in the state_dict."""
        for suffix, d in (("", desc), ("_t", desc.transpose())):
            ints, coef = d.packed()
            self.register_buffer(
                f"{prefix}_ints{suffix}",
                torch.as_tensor(ints, dtype=torch.int32, device=device),
                persistent=False,
            )
            self.register_buffer(
                f"{prefix}_coef{suffix}",
                torch.as_tensor(coef, dtype=torch.float64, device=device),
                persistent=False,
            )

    def to_e3nn(self) -> torch.nn.Module:
        """The original e3nn module, holding this module's current parameters, buffers and
        submodules."""
        tp = self.__dict__["_e3nn_tp"]
        for name in list(tp._parameters):
            tp._parameters[name] = self._parameters[name]
        for name in list(tp._buffers):
            tp._buffers[name] = self._buffers[name]
        for name in list(tp._modules):
            tp._modules[name] = self._modules[name]
        tp.train(self.training)
        return tp

    def _apply(self, fn, recurse=True):
        keep = {name: self._buffers[name] for name in self.F64_BUFFERS}
        super()._apply(fn, recurse)
        for name, old in keep.items():
            self._buffers[name] = old.to(device=self._buffers[name].device)
        for name in self.DERIVED:
            self.__dict__[name] = {}
        return self

    def __getstate__(self):
        # e3nn's compiled submodules are TorchScript modules that only e3nn knows how to pickle:
        # leave them to the (synchronised) e3nn module, which travels in the state, and re-attach
        # them on load
        tp = self.to_e3nn()
        state = self.__dict__.copy()
        state["_modules"] = OrderedDict(
            (k, v) for k, v in self._modules.items() if k not in tp._modules
        )
        state["_cfm_shared_modules"] = list(tp._modules)
        for name in self.DERIVED:
            state[name] = {}
        return state

    def __setstate__(self, state):
        state = dict(state)
        shared = state.pop("_cfm_shared_modules", [])
        super().__setstate__(state)
        tp = self.__dict__["_e3nn_tp"]
        for name in shared:
            self._modules[name] = tp._modules[name]

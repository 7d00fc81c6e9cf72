"""The skeleton the fused modules share: the operators they call, the library a scripted one
names, the Triton set-up before a step is compiled or captured, and their eager input checks.

:class:`FusedModule` is the base of :class:`~cfm_plugins.ops.symmetric_contraction.
FusedSymmetricContraction`, :class:`~cfm_plugins.ops.conv_tp.FusedConvTP` and
:class:`~cfm_plugins.ops.skip_tp.FusedSkipTP`: a subclass names its operators (``OPERATORS``) and
gives the descriptor arguments they take (:meth:`FusedModule.operator_tables`).
:class:`FusedE3nnModule` adds what the two that replace an e3nn tensor product share: they keep
e3nn's attributes, hold the e3nn module (``self.__dict__["_e3nn_tp"]``, not a submodule) and share
its parameters, buffers and compiled submodules, so that the state_dict is e3nn's and the stock
path runs from the same tensors.
"""

from __future__ import annotations

import importlib
from collections import OrderedDict

import torch

from cfm_plugins.ops import _backend

__all__ = ["FLOAT_DTYPES", "FusedE3nnModule", "FusedModule", "module_device"]

#: the dtypes the fused kernels compute in
FLOAT_DTYPES = (torch.float32, torch.float64)


def module_device(module: torch.nn.Module) -> torch.device:
    """Where a module's tensors live (its first parameter or buffer; CPU for none)."""
    for t in module.parameters():
        return t.device
    for t in module.buffers():
        return t.device
    return torch.device("cpu")


class FusedModule(torch.nn.Module):
    """Base of the fused modules (see the module docstring).

    ``OPERATORS`` names the kernel's operators (``cfm::<OPERATORS>_fwd``, ...) and their Triton
    launchers (``cfm_plugins.ops.triton.<OPERATORS>``, whose ``prepare`` takes
    :meth:`operator_tables`). A scripted module names the operator library it needs
    (``__prepare_scriptable__``).
    """

    OPERATORS = ""

    def __prepare_scriptable__(self):
        """Called by ``torch.jit.script``: the scripted module names the operator library it
        needs."""
        return _backend.carry_operator_note(self, self.OPERATORS)

    @torch.jit.unused
    def operator_tables(self) -> tuple:
        """The descriptor arguments the operators take after the data: ``(desc, meta)`` or
        ``(desc, desc_t, meta)``, the module's buffers and ints."""
        raise NotImplementedError

    @torch.jit.unused
    def _runs_triton(self, device: torch.device) -> bool:
        """Whether the operators run their Triton kernels for this module on ``device``."""
        return _backend.runs_triton(device)

    @torch.jit.unused
    def prepare_kernels(self) -> None:
        """Choose this module's kernels for the device of its buffers and build what their first
        launch would, now (:func:`cfm_plugins.ops._backend.prepare_kernels`)."""
        tables = self.operator_tables()
        if self._runs_triton(tables[0][0].device):
            launchers = importlib.import_module(f"cfm_plugins.ops.triton.{self.OPERATORS}")
            launchers.prepare(*tables)

    # -- eager input checks (a scripted or traced model skips them) --------------------------------
    @torch.jit.unused
    def _check_floats(self, inputs: dict, like: torch.Tensor | None = None) -> None:
        """A ValueError unless every value of ``inputs`` (name -> input) is a tensor, all of one
        dtype, float32 or float64: ``like``'s where given (the module's weights)."""
        cls = type(self).__name__
        for name, t in inputs.items():
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"{cls}: {name} must be a tensor, got {type(t).__name__}")
        dtype = like.dtype if like is not None else next(iter(inputs.values())).dtype
        said = ", ".join(f"{name} {t.dtype}" for name, t in inputs.items())
        if dtype not in FLOAT_DTYPES:
            raise ValueError(f"{cls}: {said}; float32 or float64 expected")
        if any(t.dtype != dtype for t in inputs.values()):
            weights = "" if like is None else f", the weights {dtype}"
            raise ValueError(f"{cls}: dtype mismatch: {said}{weights}")

    @torch.jit.unused
    def _check_devices(self, inputs: dict, device: torch.device, owner: str) -> None:
        """A ValueError unless every tensor of ``inputs`` is on ``device``, where the module's
        ``owner`` (its weights, its tables) lives."""
        if any(t.device != device for t in inputs.values()):
            said = ", ".join(f"{name} on {t.device}" for name, t in inputs.items())
            raise ValueError(
                f"{type(self).__name__}: {said}, but the module's {owner} on {device}; move the "
                "model with .to(device)"
            )

    @torch.jit.unused
    def _check_shape(self, name: str, t: torch.Tensor, expected: tuple, meaning: str = "") -> None:
        """A ValueError unless ``t`` has one dimension per item of ``expected``, of the size an int
        item gives (a str item names a size that may be anything)."""
        sizes = zip(t.shape, expected)
        if t.dim() != len(expected) or any(isinstance(e, int) and s != e for s, e in sizes):
            dims = ", ".join(str(e) for e in expected)
            raise ValueError(
                f"{type(self).__name__}: {name} shape {list(t.shape)}; expected [{dims}]"
                + (f" ({meaning})" if meaning else "")
            )


class FusedE3nnModule(FusedModule):
    """A fused module standing in for an e3nn tensor product ``tp`` (see the module docstring).

    It keeps e3nn's attributes (``irreps_in1``, ``irreps_in2``, ``irreps_out``, ``instructions``,
    ``weight_numel``), shares ``tp``'s state, and holds its descriptor ``desc`` and the transpose
    as the operators take them: buffers ``<PREFIX>_ints[_t]`` (int32) and ``<PREFIX>_coef[_t]``
    (float64; not in the state_dict), and the ints ``<PREFIX>_meta``. The coefficients stay
    float64 under ``.to(dtype)`` (the kernels read them in double) and only follow the device.
    ``DERIVED``: attributes holding tables derived from the buffers, emptied when the module moves
    or is pickled.
    """

    PREFIX = ""
    DERIVED: tuple[str, ...] = ()

    def __init__(self, tp: torch.nn.Module, desc, device: torch.device | None = None):
        super().__init__()
        device = torch.device(device) if device is not None else module_device(tp)
        for name in ("irreps_in1", "irreps_in2", "irreps_out", "instructions", "weight_numel"):
            setattr(self, name, getattr(tp, name))
        self._in1_dim = int(tp.irreps_in1.dim)
        self._in2_dim = int(tp.irreps_in2.dim)
        self.descriptor = desc
        self._share_state_of(tp)
        for suffix, d in (("", desc), ("_t", desc.transpose())):
            ints, coef = d.packed()
            for name, value, dtype in (("ints", ints, torch.int32), ("coef", coef, torch.float64)):
                t = torch.as_tensor(value, dtype=dtype, device=device)
                self.register_buffer(f"{self.PREFIX}_{name}{suffix}", t, persistent=False)
        setattr(self, f"{self.PREFIX}_meta", [int(v) for v in desc.meta()])

    @classmethod
    def from_e3nn(cls, tp: torch.nn.Module, device: torch.device | None = None):
        """Wrap the built e3nn module ``tp``, sharing its state; the tables on ``device``
        (default: where ``tp`` lives)."""
        return cls(tp, device=device)

    @torch.jit.unused
    def operator_tables(self) -> tuple:
        p = self.PREFIX
        return (
            [getattr(self, f"{p}_ints"), getattr(self, f"{p}_coef")],
            [getattr(self, f"{p}_ints_t"), getattr(self, f"{p}_coef_t")],
            getattr(self, f"{p}_meta"),
        )

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
        keep = {n: self._buffers[n] for n in (f"{self.PREFIX}_coef", f"{self.PREFIX}_coef_t")}
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

"""Find the modules the fused kernels replace by their structure, not by their class.

Trainers vendor MACE's modules (HydraGNN's ``MACEStack`` carries its own copy of
``SymmetricContraction``), so a class check against ``mace.modules`` misses them. What the fused
kernels need is structure, and that is what is checked here:

- a **symmetric contraction**: ``.contractions``, a non-empty module list whose items each have
  an integer ``correlation``, a 3-D ``weights_max`` parameter, ``correlation - 1`` further
  ``weights``, buffers ``U_matrix_1 .. U_matrix_<correlation>`` and ``U_tensors(nu)``: MACE's
  layout, read by :class:`~cfm_plugins.ops.FusedSymmetricContraction`;
- a **uvu convolution tensor product**: e3nn's interface (``irreps_in1``, ``irreps_in2``,
  ``irreps_out``, ``instructions``) with every instruction in ``"uvu"`` mode and per-edge
  weights (``internal_weights`` and ``shared_weights`` false), read by
  :class:`~cfm_plugins.ops.FusedConvTP`. When the module is a block's ``conv_tp`` and the block's
  forward reads ``conv_fusion`` (MACE >= 0.3.14), the block gets the fused scatter; otherwise
  the fused module replaces the tensor product alone (e3nn's call form).

:func:`patch_by_structure` swaps what it finds in place (parameters shared, state_dict kept) and
:func:`unpatch_by_structure` restores the originals. (``ops/patching.py`` finds MACE's own classes;
this module is the structural finder an adapter for a trainer with vendored modules uses.)
"""
from __future__ import annotations

import logging

import torch

from cfm_plugins.ops.conv_tp import _reads_conv_fusion
from cfm_plugins.ops.patching import KERNELS, PatchReport

log = logging.getLogger("cfm_plugins.fused")

KINDS = tuple(KERNELS)  # the kernel names, one list (ops/patching.py)


def is_symmetric_contraction(m) -> bool:
    """MACE's symmetric-contraction layout, whatever the class (see module docstring)."""
    from cfm_plugins.ops.symmetric_contraction import FusedSymmetricContraction

    if isinstance(m, FusedSymmetricContraction) or not isinstance(m, torch.nn.Module):
        return False
    contractions = getattr(m, "contractions", None)
    if not isinstance(contractions, torch.nn.ModuleList) or len(contractions) == 0:
        return False
    for c in contractions:
        nu = getattr(c, "correlation", None)
        w = getattr(c, "weights_max", None)
        if not isinstance(nu, int) or nu < 1 or not isinstance(w, torch.Tensor) or w.dim() != 3:
            return False
        if len(getattr(c, "weights", ())) != nu - 1 or not callable(getattr(c, "U_tensors", None)):
            return False
        if any(not isinstance(getattr(c, f"U_matrix_{k}", None), torch.Tensor) for k in range(1, nu + 1)):
            return False
    return True


def is_uvu_conv_tp(m) -> bool:
    """An e3nn-interface tensor product with only uvu paths and per-edge weights."""
    from cfm_plugins.ops.conv_tp import FusedConvTP

    if isinstance(m, FusedConvTP) or not isinstance(m, torch.nn.Module):
        return False
    if not all(hasattr(m, a) for a in ("irreps_in1", "irreps_in2", "irreps_out", "instructions", "weight_numel")):
        return False
    ins = list(getattr(m, "instructions") or [])
    if not ins or any(getattr(i, "connection_mode", None) != "uvu" for i in ins):
        return False
    return not getattr(m, "internal_weights", True) and not getattr(m, "shared_weights", True)


def find_by_structure(model: torch.nn.Module, kernels=KINDS) -> dict[str, list[str]]:
    """Names of the modules of each kind in ``model`` (nothing is changed)."""
    tests = {"symmetric_contraction": is_symmetric_contraction, "conv_tp": is_uvu_conv_tp}
    unknown = [k for k in kernels if k not in tests]
    if unknown:
        raise ValueError(f"unknown fused kernel(s) {', '.join(unknown)}; known: {', '.join(KINDS)}")
    found = {k: [] for k in kernels}
    for name, mod in model.named_modules():
        for k in kernels:
            if tests[k](mod):
                found[k].append(name)
    return found


def _parent(model, name):
    parent_name, _, attr = name.rpartition(".")
    return (model.get_submodule(parent_name) if parent_name else model), attr


def patch_by_structure(model: torch.nn.Module, kernels=KINDS, use_kernel: bool = True) -> PatchReport:
    """Swap every module :func:`find_by_structure` finds for its fused twin, in place."""
    from cfm_plugins.ops.conv_tp import FusedConvTP
    from cfm_plugins.ops.symmetric_contraction import FusedSymmetricContraction

    found = find_by_structure(model, kernels)
    counts = {}
    for kind, names in found.items():
        n = 0
        for name in names:
            if not name:
                raise ValueError("the model itself is the module to swap; wrap it directly instead")
            parent, attr = _parent(model, name)
            old = getattr(parent, attr)
            try:
                if kind == "symmetric_contraction":
                    new = FusedSymmetricContraction(old, use_kernel=use_kernel)
                else:
                    new = FusedConvTP.from_e3nn(old)
            except ValueError as exc:
                log.warning("%s (%s) not fused: %s", name, type(old).__name__, exc)
                continue
            new.train(old.training)
            setattr(parent, attr, new)
            if kind == "conv_tp" and attr == "conv_tp" and not hasattr(parent, "conv_fusion") \
                    and _reads_conv_fusion(parent):
                parent.conv_fusion = "cfm_plugins"
            n += 1
        counts[kind] = n
    return PatchReport(counts)


def unpatch_by_structure(model: torch.nn.Module) -> PatchReport:
    """Put back the original modules that :func:`patch_by_structure` replaced (in place)."""
    from cfm_plugins.ops.conv_tp import FusedConvTP
    from cfm_plugins.ops.symmetric_contraction import FusedSymmetricContraction

    counts = {"symmetric_contraction": 0, "conv_tp": 0}
    for name, mod in list(model.named_modules()):
        if isinstance(mod, FusedSymmetricContraction):
            parent, attr = _parent(model, name)
            setattr(parent, attr, mod.to_mace())
            counts["symmetric_contraction"] += 1
        elif isinstance(mod, FusedConvTP):
            parent, attr = _parent(model, name)
            setattr(parent, attr, mod.to_e3nn())
            if getattr(parent, "conv_fusion", None) == "cfm_plugins":
                del parent.conv_fusion
            counts["conv_tp"] += 1
    return PatchReport(counts)

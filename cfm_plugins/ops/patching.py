"""Swap a built model's modules for the fused ones, and back, with the kernel table.

``patch_model(model, kernels)`` walks the model once: every module that a form of one of
``kernels`` recognises (:mod:`cfm_plugins.ops.kernel_table`) is replaced, in place, by its fused
twin, and the walk does not look inside it. The swaps share parameters and keep state_dict keys,
so a checkpoint loads with or without the plugin; ``unpatch_model`` restores the stock modules
(do it before pickling a whole model for users who do not have cfm-plugins). The fused modules
are made on the model's device and dtype and follow ``.to()``; a patched model can be scripted
(``torch.jit.script``, ``mace.cli.create_lammps_model``) or exported (``torch.export``) as long as
the operator library is loaded where it runs (:func:`cfm_plugins.library_paths`). Importing this
module loads it into this process (once; silent where it is not built), so that
``torch.jit.load`` of a scripted patched model works after ``import cfm_plugins.ops.patching``.

Every route to a swap comes here: the ``fused`` plugin (``cfm_patch_model``, which every trainer
adapter calls), :class:`~cfm_plugins.calculators.CFMCalculator` and nequip's ``enable_CFMFused``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from cfm_plugins.ops import _backend
from cfm_plugins.ops.kernel_table import check_kernels, kernel_names
from cfm_plugins.ops.kernel_table import kernels as _kernels

log = logging.getLogger("cfm_plugins.fused")

# a scripted or exported patched model calls the cfm:: operators: declare them before it is loaded
_backend.declare_operators()


@dataclass
class PatchReport:
    """What a patch or unpatch did: per kernel, the names of the modules swapped, those found
    already fused, and the modules recognised but left as they were (with why)."""

    swapped: dict[str, list[str]] = field(default_factory=dict)
    already: dict[str, list[str]] = field(default_factory=dict)
    left: list[tuple[str, str]] = field(default_factory=list)

    @property
    def counts(self) -> dict[str, int]:
        return {k: len(v) for k, v in self.swapped.items()}

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def missing(self) -> tuple[str, ...]:
        """The kernels asked for that have no module in the model (none swapped, none already
        fused)."""
        return tuple(
            k for k, names in self.swapped.items() if not names and not self.already.get(k)
        )

    def __str__(self) -> str:
        return ", ".join(f"{k}: {v}" for k, v in self.counts.items()) or "nothing"

    def describe(self, empty: bool = True) -> str:
        """The counts and the module names, for a log line (``empty=False``: only the kernels
        that swapped something)."""
        return "; ".join(
            f"{k}: {len(v)} ({', '.join(v)})" if v else f"{k}: 0"
            for k, v in self.swapped.items()
            if v or empty
        )


def _forms(names):
    table = _kernels()
    return [(k, form) for k in names for form in table[k].forms]


def _made_by(forms, module, parent, attr):
    return next(((k, f) for k, f in forms if f.is_fused(module, parent, attr)), None)


def _walk(model: torch.nn.Module):
    """(name, parent, attr, module) below ``model``, parents before children; ``send(True)``
    into the generator skips the last module's children."""
    stack = [("", model)]
    while stack:
        prefix, parent = stack.pop()
        children = [(a, m) for a, m in parent._modules.items() if m is not None]
        for attr, child in reversed(children):  # reversed + stack: visited in definition order
            skip = yield prefix + attr, parent, attr, child
            if skip:
                yield None  # the value of send()
            else:
                stack.append((prefix + attr + ".", child))


def find_modules(model: torch.nn.Module, kernels=None) -> dict[str, list[str]]:
    """Names of the stock modules each of ``kernels`` (default: those of ``auto``) would swap in
    ``model`` (nothing changes)."""
    names = check_kernels(kernel_names(auto=True) if kernels is None else kernels)
    return {k: [name for name, *_ in hits] for k, hits in _matches(model, names, {}).items()}


def _matches(model, names, already):
    """Per kernel, (name, form, parent, attr, module) of every stock module a form recognises;
    the names of modules already fused go to ``already`` (per kernel)."""
    forms = _forms(names)
    every_form = _forms(kernel_names())
    for kind, form in forms:
        if form.recognise(model, None, ""):
            raise ValueError(
                f"the model itself ({type(model).__name__}) is the {kind} module to swap; "
                "wrap it in a module first"
            )
    found = {k: [] for k in names}
    walk = _walk(model)
    for name, parent, attr, module in walk:
        hit = next(((k, f) for k, f in forms if f.recognise(module, parent, attr)), None)
        if hit is not None:
            found[hit[0]].append((name, hit[1], parent, attr, module))
            walk.send(True)
        else:
            made = _made_by(every_form, module, parent, attr)
            if made is not None:  # already fused: nothing inside to swap
                already.setdefault(made[0], []).append(name)
                walk.send(True)
    return found


def patch_model(model: torch.nn.Module, kernels=None) -> PatchReport:
    """Swap the modules of ``kernels`` (default: every kernel of ``fused_kernels=auto``) in
    ``model``, in place.

    A module that cannot be fused is left as it is with a warning saying why (for an
    ``all_or_none`` form, every module of that form is). Patching twice swaps nothing more.
    ``kernels`` given (not ``None``, ``auto``) also turns on what a form keeps for a request that
    names it (``Form.named``: the skip connection's untimed GPU kernel).
    """
    names = check_kernels(kernel_names(auto=True) if kernels is None else kernels)
    report = PatchReport({k: [] for k in names})
    made = {}
    named = kernels is not None  # the request names its kernels (not auto): forms' ``named`` run
    for kind, hits in _matches(model, names, report.already).items():
        refused = set()
        for name, form, parent, attr, module in hits:
            try:
                new = form.make(module, parent, attr)
            except ValueError as exc:
                log.warning("%s (%s) not fused: %s", name, type(module).__name__, exc)
                report.left.append((name, str(exc)))
                if form.all_or_none:
                    refused.add(form.name)
                continue
            new.train(module.training)
            if named and form.named is not None:
                form.named(new)
            made.setdefault(kind, []).append((name, form, parent, attr, new))
        for name, form, parent, attr, new in made.get(kind, []):
            if form.name in refused:
                report.left.append(
                    (name, f"another module of the form {form.name!r} cannot be fused")
                )
                continue
            form.install(parent, attr, new)
            report.swapped[kind].append(name)
    return report


def unpatch_model(model: torch.nn.Module, kernels=None) -> PatchReport:
    """Undo :func:`patch_model` (in place) for ``kernels`` (default: every registered kernel; the
    report then lists the opt-in kernels only where they had swapped something)."""
    names = check_kernels(kernel_names() if kernels is None else kernels)
    forms = _forms(names)
    report = PatchReport({k: [] for k in names})
    walk = _walk(model)
    for name, parent, attr, module in walk:
        hit = _made_by(forms, module, parent, attr)
        if hit is not None:
            hit[1].restore(module, parent, attr)
            report.swapped[hit[0]].append(name)
            walk.send(True)
    if kernels is None:
        auto = kernel_names(auto=True)
        report.swapped = {k: v for k, v in report.swapped.items() if v or k in auto}
    return report


def is_patched(model: torch.nn.Module) -> bool:
    """Whether ``model`` holds a module that a registered kernel made."""
    every_form = _forms(kernel_names())
    return any(
        _made_by(every_form, module, parent, attr) is not None
        for _, parent, attr, module in _walk(model)
    )

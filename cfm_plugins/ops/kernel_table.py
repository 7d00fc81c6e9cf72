"""The one table of fused kernels: what each replaces, how a module is recognised, made and
restored.

A fused kernel (``symmetric_contraction``, ``conv_tp``, ``skip_tp``, or one a third party
registers) is a :class:`Kernel`: a name and an ordered list of :class:`Form` entries, one per way a
trainer's model holds the module the kernel replaces. A form **recognises** a stock module (by
class, or by structure: trainers vendor MACE's modules, so the built-in forms check the layout the
fused module reads, whatever the class), **makes** the fused module (sharing the stock module's
parameters and buffers, so the state_dict is unchanged), **installs** it in its parent, tells a
module it made and **restores** the stock one. The built-in kernels are named in :data:`BUILTINS`;
an adapter adds the form of its trainer's own module class with :func:`add_form` (the nequip
adapter adds ``TensorProductScatter``); a new kernel is one :func:`register_kernel` call.
:mod:`cfm_plugins.ops.patching` walks a model with this table: it is the one way from the
``fused`` option (or :class:`~cfm_plugins.calculators.CFMCalculator`, or nequip's
``enable_CFMFused`` modifier) to a swapped module.
"""

from __future__ import annotations

import dataclasses
import importlib

from cfm_plugins.ops.kernel_types import Form, Kernel, Recognise

__all__ = [
    "BUILTINS",
    "Form",
    "Kernel",
    "Recognise",
    "add_form",
    "check_kernels",
    "kernel_names",
    "kernels",
    "register_kernel",
    "unregister_kernel",
]

#: the built-in kernels, in order: name -> the module whose ``KERNEL`` is its entry
BUILTINS = {
    "symmetric_contraction": "cfm_plugins.ops.symmetric_contraction",
    "conv_tp": "cfm_plugins.ops.conv_tp",
    "conv_tp_radial": "cfm_plugins.ops.conv_tp_radial",
    "skip_tp": "cfm_plugins.ops.skip_tp",
}

_TABLE: dict[str, Kernel] = {}
_BUILTINS_LOADED = False


def _table() -> dict[str, Kernel]:
    """The table, with the built-in kernels of :data:`BUILTINS` (imported by name on first use:
    they import torch).

    The built-in entries (``KERNEL`` of :mod:`cfm_plugins.ops.symmetric_contraction`,
    :mod:`cfm_plugins.ops.conv_tp` and :mod:`cfm_plugins.ops.skip_tp`, built from the types of
    :mod:`cfm_plugins.ops.kernel_types`) are imported here, when the table is first asked: the
    table imports no kernel module, and no kernel module imports the table."""
    global _BUILTINS_LOADED
    if not _BUILTINS_LOADED:
        _BUILTINS_LOADED = True
        for name, module in BUILTINS.items():
            _TABLE.setdefault(name, importlib.import_module(module).KERNEL)
    return _TABLE


def kernels() -> dict[str, Kernel]:
    """Every registered kernel by name, built-in ones first."""
    return dict(_table())


def kernel_names(auto: bool = False) -> tuple[str, ...]:
    """The kernels' names; ``auto``: those ``fused_kernels=auto`` runs (:attr:`Kernel.auto`)."""
    return tuple(name for name, k in _table().items() if k.auto or not auto)


def register_kernel(kernel: Kernel, replace: bool = False) -> Kernel:
    """Add a kernel to the table (a third kernel is one call). ``replace`` allows re-registering a
    name."""
    table = _table()
    if kernel.name in table and not replace:
        raise ValueError(f"a fused kernel named {kernel.name!r} is already registered")
    if not kernel.forms:
        raise ValueError(
            f"fused kernel {kernel.name!r} has no form: nothing would recognise its modules"
        )
    table[kernel.name] = kernel
    return kernel


def unregister_kernel(name: str) -> None:
    """Remove a kernel (tests and plugins that registered one for a while)."""
    _table().pop(name, None)


def add_form(kernel: str, form: Form, first: bool = True) -> None:
    """Teach ``kernel`` another form (an adapter's module class); idempotent by form name.

    ``first`` puts it before the built-in forms, so a trainer's own class is matched before the
    generic structural forms would match one of its parts.
    """
    table = _table()
    current = table[check_kernels([kernel], "add_form")[0]]
    forms = [f for f in current.forms if f.name != form.name]
    forms = [form] + forms if first else forms + [form]
    table[kernel] = dataclasses.replace(current, forms=tuple(forms))


def check_kernels(names, where: str = "fused kernels") -> tuple[str, ...]:
    """``names`` as a tuple, or a ValueError naming the unknown ones and the known ones."""
    names = tuple(names)
    known = _table()
    bad = [n for n in names if n not in known]
    if bad:
        raise ValueError(
            f"{where}: unknown fused kernel {', '.join(map(repr, bad))}; known: {', '.join(known)}"
        )
    return names

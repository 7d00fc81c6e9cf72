"""The one table of fused kernels: what each replaces, how a module is recognised, made and
restored.

A fused kernel (``symmetric_contraction``, ``conv_tp``, or one a third party registers) is a
:class:`Kernel`: a name and an ordered list of :class:`Form` entries, one per way a trainer's
model holds the module the kernel replaces. A form says

- how to **recognise** a stock module (by class, or by structure: trainers vendor MACE's modules,
  so the built-in forms check the layout the fused module reads, whatever the class);
- how to **make** the fused module (sharing the stock module's parameters and buffers, so the
  state_dict is unchanged) and **install** it in its parent (MACE's interaction blocks also get
  their ``conv_fusion`` seam set);
- how to tell a module it **made** (``is_fused``) and how to **restore** the stock one.

The built-in kernels come from the kernel modules (``symmetric_contraction.KERNEL``,
``conv_tp.KERNEL``). An adapter adds the form of its trainer's own module class with
:func:`add_form` (the nequip adapter adds ``TensorProductScatter``); a new kernel is one
:func:`register_kernel` call. :mod:`cfm_plugins.ops.patching` walks a model with this table: it is
the one way from the ``fused`` option (or :class:`~cfm_plugins.calculators.CFMCalculator`, or
nequip's ``enable_CFMFused`` modifier) to a swapped module.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

#: form callables take (module, parent, attr): the module, the module holding it, and its name there
Recognise = Callable[[object, object, str], bool]


def _setattr(parent, attr: str, module) -> None:
    setattr(parent, attr, module)


@dataclass(frozen=True)
class Form:
    """One way a model holds a module that a kernel replaces, and how to swap it both ways.

    - ``recognise(module, parent, attr)``: True for a stock module this form swaps (never for a
      module it made). The walk does not look inside a recognised module.
    - ``make(module, parent, attr)``: the fused module. It must not change ``parent``; it raises
      ``ValueError`` saying why when this module cannot be fused (it is then left as it is, with a
      warning naming it).
    - ``install(parent, attr, fused)``: put it in place (default ``setattr``; a form whose parent
      needs more, such as MACE's ``conv_fusion`` seam, sets that too).
    - ``is_fused(module, parent, attr)``: True for a module this form made.
    - ``restore(fused, parent, attr)``: put the stock module back (undoing what ``install`` did).
    - ``all_or_none``: when one module of this form cannot be fused, none is (NequIP refuses models
      that mix its stock and modified tensor-product classes).
    """

    name: str
    recognise: Recognise
    make: Callable
    is_fused: Recognise
    restore: Callable
    install: Callable = _setattr
    all_or_none: bool = False


@dataclass(frozen=True)
class Kernel:
    """A fused kernel: its name (the value users write in ``fused_kernels``), one line saying
    what it replaces, and its forms, tried in order for every module of a model."""

    name: str
    summary: str
    forms: tuple[Form, ...]


_TABLE: dict[str, Kernel] = {}
_BUILTINS_LOADED = False


def _table() -> dict[str, Kernel]:
    """The table, with the built-in kernels (imported on first use: they import torch)."""
    global _BUILTINS_LOADED
    if not _BUILTINS_LOADED:
        _BUILTINS_LOADED = True
        from cfm_plugins.ops import conv_tp, symmetric_contraction

        for kernel in (symmetric_contraction.KERNEL, conv_tp.KERNEL):
            _TABLE.setdefault(kernel.name, kernel)
    return _TABLE


def kernels() -> dict[str, Kernel]:
    """Every registered kernel by name, built-in ones first."""
    return dict(_table())


def kernel_names() -> tuple[str, ...]:
    return tuple(_table())


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

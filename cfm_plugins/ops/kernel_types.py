"""The types of the kernel table: a fused :class:`Kernel` and the :class:`Form` entries that say
how a model holds the module it replaces (see :mod:`cfm_plugins.ops.kernel_table`).

A leaf module: the kernel modules (:mod:`cfm_plugins.ops.conv_tp`,
:mod:`cfm_plugins.ops.symmetric_contraction`) build their entries from these types, and the table
finds those entries by name, so neither imports the other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Form", "Kernel", "Recognise"]

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
    - ``named(fused)``: called on each module made when the request named this kernel (not under
      ``auto``, every kernel the model has): a kernel with a path no measurement has shown faster
      (a GPU path no GPU has timed) turns it on here only, so that ``auto`` never runs it.
    """

    name: str
    recognise: Recognise
    make: Callable
    is_fused: Recognise
    restore: Callable
    install: Callable = _setattr
    all_or_none: bool = False
    named: Callable | None = None


@dataclass(frozen=True)
class Kernel:
    """A fused kernel: its name (the value users write in ``fused_kernels``), one line saying
    what it replaces, and its forms, tried in order for every module of a model. ``auto``: part of
    ``fused_kernels=auto``; a kernel no measurement has shown faster runs only where named."""

    name: str
    summary: str
    forms: tuple[Form, ...]
    auto: bool = True

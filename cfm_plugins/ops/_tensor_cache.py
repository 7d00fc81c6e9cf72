"""A small cache of what is computed from a batch tensor, shared by the layers of one forward.

The fused modules derive tables from a batch's index tensors: the CSR groupings of ``edge_index``
(:func:`cfm_plugins.ops.conv_tp.edge_csr`) and the nodes grouped by element
(:func:`cfm_plugins.ops.symmetric_contraction.node_groups`). Every interaction layer and the
backward get the same tensor, so the work (and its copy to the host) is done once per batch.
:class:`TensorCache` keys an entry on the tensor's storage, version (an in-place change recomputes),
shape, dtype and device, checks its identity, keeps the most recent entries, and drops an entry when
its tensor is freed (the batch is over).
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TypeVar

import torch

T = TypeVar("T")


class TensorCache:
    """``get(t, extra, make)``: ``make()`` for tensor ``t`` (and the hashable ``extra``), computed
    once while ``t`` lives unchanged; at most ``size`` entries."""

    def __init__(self, size: int = 8):
        self.size = size
        self.entries: OrderedDict[tuple, tuple] = OrderedDict()

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, t: torch.Tensor, extra: Hashable, make: Callable[[], T]) -> T:
        key = (t.data_ptr(), t._version, tuple(t.shape), t.dtype, t.device, extra)
        hit = self.entries.get(key)
        if hit is not None and hit[0]() is t:
            self.entries.move_to_end(key)
            return hit[1]
        value = make()
        entries = self.entries
        entries[key] = (weakref.ref(t, lambda _ref, k=key: entries.pop(k, None)), value)
        while len(entries) > self.size:
            entries.popitem(last=False)
        return value

"""A duck-typed communicator for the samplers' unit tests: where they call collectives."""

from __future__ import annotations

import contextlib


class LoopbackComm:
    """A duck-typed communicator of ``size`` ranks that all hold what this rank gives (``allgather``
    returns ``size`` copies). It counts the collectives and raises inside :meth:`forbid`."""

    def __init__(self, rank=0, size=2):
        self.rank, self.size, self.calls, self._forbidden = rank, size, 0, None

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return self.size

    def allgather(self, obj):
        if self._forbidden:
            raise AssertionError(f"a collective (allgather) during {self._forbidden}")
        self.calls += 1
        return [obj] * self.size

    @contextlib.contextmanager
    def forbid(self, what):
        """Inside: any collective raises ``AssertionError`` naming ``what``."""
        self._forbidden = what
        try:
            yield
        finally:
            self._forbidden = None

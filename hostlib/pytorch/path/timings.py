"""The path choice's measurements (``inagg.hostlib.pytorch.path.choice``): per path, per size class, the
rank's own times of the last few measured calls.

A size class is a power of 4 bytes. Each path keeps, per class, a ring of the last
``per_class`` measured calls, the k-th measured call of a class in slot k mod ``per_class``.
Every rank measures the same calls (the chooser decides which), so a slot holds the same call on
every rank, and the ranks can combine their rings slot by slot with one exchange taking minima
(``PathTimings.summary``). Nothing here decides anything: it only records and forgets.
"""

from __future__ import annotations

import numpy as np

SIZE_CLASSES = 24   # powers of 4: 1 B ... 2^46 B (the last class takes anything larger)
UNSEEN = np.inf     # a slot with no time: the minimum over ranks skips it, and it sorts last


def size_class(nbytes: int) -> int:
    """The power-of-4 size class of a call of ``nbytes`` payload bytes."""
    return min(SIZE_CLASSES - 1, max(0, int(nbytes).bit_length() - 1) // 2)


class PathTimings:
    """One path's recent call times on this rank: per size class, the last ``per_class``
    measured calls in a ring; with ``shared_clock`` each call's start too, so the ranks can
    time a call from the last rank's start to the last rank's end."""

    def __init__(self, per_class: int, shared_clock: bool = False) -> None:
        self._ring = np.full((SIZE_CLASSES, per_class), UNSEEN)
        self._starts = np.full((SIZE_CLASSES, per_class), UNSEEN) if shared_clock else None
        self._count = np.zeros(SIZE_CLASSES, dtype=np.int64)
        self._nbytes = np.full(SIZE_CLASSES, UNSEEN)

    def observe(self, nbytes: int, seconds: float, started: float) -> None:
        """Record one call of ``nbytes`` that took ``seconds`` from ``started``."""
        c = size_class(nbytes)
        slot = self._count[c] % self._ring.shape[1]
        self._ring[c, slot] = seconds
        if self._starts is not None:
            self._starts[c, slot] = started
        self._count[c] += 1
        self._nbytes[c] = nbytes

    def measured(self, c: int) -> int:
        """How many calls of size class ``c`` were recorded since it was last forgotten."""
        return int(self._count[c])

    def filling(self, c: int) -> bool:
        """Whether size class ``c`` has fewer measured calls than its ring holds."""
        return bool(self._count[c] < self._ring.shape[1])

    def forget(self, c: int, keep_newest: bool = False) -> None:
        """Drop size class ``c``'s times, all or all but the newest. Every rank does so at the
        same call, so the slots stay aligned across ranks."""
        kept = (self._count[c] - 1) % self._ring.shape[1] if keep_newest and self._count[c] else None
        for ring in (self._ring, self._starts):
            if ring is not None:
                newest = ring[c, kept] if kept is not None else UNSEEN
                ring[c] = UNSEEN
                ring[c, 0] = newest
        self._count[c] = 0 if kept is None else 1

    def summary(self) -> np.ndarray:
        """What the ranks combine by their minimum (``inf`` where unseen): the ring of times, or
        on a shared clock each call's start and end negated (so their minimum is the last
        rank's start and end); then each class's measured calls and latest size in bytes."""
        tail = [self._count.astype(float), self._nbytes]
        if self._starts is None:
            return np.concatenate([self._ring.ravel(), *tail])
        seen = np.isfinite(self._ring)
        starts = np.where(seen, -self._starts, UNSEEN)
        ends = np.where(seen, -(self._starts + self._ring), UNSEEN)
        return np.concatenate([starts.ravel(), ends.ravel(), *tail])

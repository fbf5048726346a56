"""When the path choice (``inagg.hostlib.pytorch.path.choice``) checks a size class's path on its own
calls instead of waiting for the next scheduled agreement (``Confirmations``).

A path is often taken on a few calls' times (probes, one exploration, a recheck), and a path's
times change (a link slows down). So, per size class:

* *New to its path*, or *moved to a path*: the ranks agree again as soon as the path's ring
  there is full of its own calls (the chooser times every call while a ring fills).
* *Moved off ``prefer``*: once that ring is full, both paths are probed again there (a
  *recheck*), so leaving the baseline rests on fresh times of both. Where the class stays off
  ``prefer`` but ``prefer``'s fastest recent call there comes within ``probe_ratio`` of the
  path's figure (its times may be bimodal), it is rechecked again after ``per_class`` times
  2^(rechecks so far) more calls; not where both figures are link-bound
  (``inagg.hostlib.pytorch.path.links``): their difference is then the bytes each puts on the links,
  not the machine's noise.
* *Slower*: where a class's newest agreed call on its path was slower than its other recent
  ones by ``measure_from_seconds`` or more, its older times go (the newest stays, so the path
  stays measured, and so eligible, there), its next calls are all timed, and the ranks agree
  once its ring is full again.

All of it follows from agreed figures and call numbers only, as every decision does.
"""

from __future__ import annotations

from typing import Mapping, NamedTuple

import numpy as np

from inagg.hostlib.pytorch.path.cost import PathModel


class Pending(NamedTuple):
    """A size class waiting for ``calls`` more calls on ``path`` before the ranks agree;
    ``left_prefer``: it moved off ``prefer``, which is rechecked first."""
    path: str
    calls: int
    left_prefer: bool


class Confirmations:
    """Per size class: the path it takes (``chosen``), what it waits for before the ranks agree
    again (``waiting``), and how often ``prefer`` was rechecked there since it left
    (``rechecks``)."""

    def __init__(self, prefer: str | None, per_class: int, probe_ratio: float) -> None:
        self._prefer, self._per_class, self._probe_ratio = prefer, per_class, probe_ratio
        self.chosen: dict[int, str] = {}
        self.waiting: dict[int, Pending] = {}
        self.rechecks: dict[int, int] = {}

    def track(self, c: int, path: str, models: Mapping[str, PathModel], link_bound: bool = False) -> None:
        """Size class ``c``'s fastest path at the agreed ``models`` is ``path``: wait for its
        own calls where it is new to the path or the class moved; where it stayed off
        ``prefer`` after a recheck, recheck again while the two are close, unless both are
        ``link_bound`` there."""
        model = models[path]
        if not model.seen[c] and c not in self.waiting:
            self.waiting[c] = Pending(path, self._per_class, False)
        if self.chosen.get(c, self._prefer) == path:
            if not link_bound:
                self._recheck_while_close(c, path, models)
            return
        self.chosen[c] = path
        self.waiting.pop(c, None)
        self.rechecks.pop(c, None)
        samples = int(model.samples[c])
        if path != self._prefer:
            self.waiting[c] = Pending(path, max(1, self._per_class - samples), True)
        elif samples < self._per_class:   # back on ``prefer`` on a few calls: its own calls confirm it
            self.waiting[c] = Pending(path, self._per_class - samples, False)

    def count(self, c: int, path: str) -> Pending | None:
        """A call of size class ``c`` took ``path``: what it completes, if anything (then the
        ranks agree, or recheck ``prefer`` first where ``left_prefer``)."""
        pending = self.waiting.get(c)
        if pending is None or pending.path != path:
            return None
        if pending.calls > 1:
            self.waiting[c] = pending._replace(calls=pending.calls - 1)
            return None
        del self.waiting[c]
        return pending

    def start_recheck(self, c: int) -> bool:
        """Count a recheck of ``prefer`` at size class ``c``; whether it is the first since
        the class left ``prefer`` (then ``prefer``'s older times there go)."""
        first = c not in self.rechecks
        self.rechecks[c] = self.rechecks.get(c, 0) + 1
        return first

    def slowed(self, models: Mapping[str, PathModel], threshold: float) -> list[tuple[str, int]]:
        """The (path, size class) pairs whose newest agreed call on the class's path was slower
        than its other recent ones by ``threshold`` or more, not already waiting: each now
        waits for a full ring of its path's calls. The caller drops their older times."""
        found = []
        for path in {*self.chosen.values(), self._prefer} - {None}:
            for c in np.flatnonzero(models[path].newest_lags() >= threshold):
                c = int(c)
                if self.chosen.get(c, self._prefer) != path or c in self.waiting:
                    continue
                self.waiting[c] = Pending(path, self._per_class, False)
                found.append((path, c))
        return found

    def _recheck_while_close(self, c: int, path: str, models: Mapping[str, PathModel]) -> None:
        """Size class ``c`` stayed on ``path`` after a recheck of ``prefer``: where
        ``prefer``'s fastest recent call there is within ``probe_ratio`` of ``path``'s figure,
        recheck it again after ``per_class`` times 2^(rechecks so far) more calls."""
        done = self.rechecks.get(c)   # none once the class is back on ``prefer``
        if done is None or c in self.waiting:
            return
        if models[self._prefer].ring[c].min() <= self._probe_ratio * models[path].seconds[c]:
            self.waiting[c] = Pending(path, self._per_class << done, True)

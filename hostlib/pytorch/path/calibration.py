"""Which sizes the backend's calibration times each path at (``AllreduceDispatch.calibrate``), so
that no calibration call takes long whatever the links: ``CalibrationPlan``.

A calibration times every path before the first real call, so those are already chosen from
measurements. It climbs a *ladder* of target sizes (64 B, 16 KiB, 1 MiB; fewer for a job on one
host) in *rounds*: each round times every path still climbing at its next size (the caller runs
one untimed call, then ``timed`` timed ones), then the ranks agree, and the next round's sizes
follow from the agreed figures alone, so every rank plans the same calls.

A path's next size is the largest power of 4 bytes from 4x its last size up to its next ladder
target whose call is *bounded* by ``calibration_seconds`` (``PathChoiceOptions``, 0.25 s): the
target itself where calls are cheap (so there, the ladder), else a size between, else (not even
4x its last size is) the path is done. The bound, from the agreed figure of the path's last
size: that figure scaled by the bytes (``t * n / last``), which no call costing alpha + beta * n
with alpha, beta >= 0 exceeds; never under the path's floor on the links where their rate is
known (``inagg.hostlib.pytorch.path.links``; the ranks' agreed links, the same on every rank). Not the fitted line: on a loaded machine a path's
small calls need be no line (gloo's), and a line through them can put a call well over the
bound under it (docs/results/startup.md). A size a path was not timed at is probed later on
real calls of that size (``inagg.hostlib.pytorch.path.explore``), calls the job makes anyway.

So, machine and links aside: every calibration call past the first size (64 B: one packet each
way, a round trip) takes at most ``calibration_seconds`` where the path's cost is alpha + beta *
bytes and its agreed figures hold; a path's size grows at least 4x a round, so it takes at most
``max_rounds`` rounds (8 from 64 B to 1 MiB); and each rank's payload per path is ``timed + 1``
calls of each size it was timed at (``payload_bytes``). A slow link's large calls, which held a
job's start for minutes, are not made (docs/results/startup.md: before and after).
"""

from __future__ import annotations

import math
from typing import Sequence

from inagg.hostlib.pytorch.path.choice import PathChooser
from inagg.hostlib.pytorch.path.timings import size_class

LADDER = (64, 16 * 1024, 1 << 20)   # the sizes a calibration aims at: their figures pin each line


class CalibrationPlan:
    """The calibration of ``chooser``'s paths up ``ladder`` (module docstring): ``next_round``
    the sizes to time, ``ran`` what was run; ``record`` what it ran, for reports."""

    def __init__(self, chooser: PathChooser, ladder: Sequence[int] = LADDER, timed: int = 3) -> None:
        """Nothing run yet: the first round times every path at ``ladder[0]``."""
        if not ladder or list(ladder) != sorted(set(ladder)) or any(n <= 0 or n & (n - 1) or n.bit_length() % 2 != 1
                                                                      for n in ladder):
            raise ValueError(f"a calibration ladder is rising powers of 4 bytes, e.g. {LADDER}; got {tuple(ladder)}")
        if timed < 1:
            raise ValueError(f"a calibration times at least one call per path and size, got timed={timed}")
        self._chooser, self.ladder, self.timed = chooser, tuple(ladder), timed
        self.seconds = chooser.options.calibration_seconds
        self.sizes: dict[str, list[int]] = {p: [] for p in chooser.paths}   # each path's sizes, in order
        self.rounds = 0

    @property
    def max_rounds(self) -> int:
        """The most rounds a calibration takes: the first, then one per 4x up the ladder."""
        return 1 + (self.ladder[-1].bit_length() - self.ladder[0].bit_length()) // 2

    def next_round(self) -> dict[str, int]:
        """Each path's size in the next round (paths done are left out; empty: the calibration
        is over); from the agreed figures only, the same on every rank."""
        if self.rounds == 0:
            return dict.fromkeys(self._chooser.paths, self.ladder[0])
        planned = {p: self._next_size(p, sizes[-1]) for p, sizes in self.sizes.items() if sizes}
        return {p: n for p, n in planned.items() if n is not None}

    def ran(self, sizes: dict[str, int]) -> None:
        """The round ``next_round`` planned was run (and the ranks agreed since)."""
        for path, nbytes in sizes.items():
            self.sizes[path].append(nbytes)
        self.rounds += 1

    def _next_size(self, path: str, last: int) -> int | None:
        """``path``'s next size after ``last`` (module docstring), None where it is done."""
        target = next((n for n in self.ladder if n > last), None)
        if target is None:
            return None
        n, best = last * 4, None
        while n <= target and self.bound(path, last, n) <= self.seconds:
            best, n = n, n * 4
        return best

    def bound(self, path: str, last: int, nbytes: int) -> float:
        """The most a call of ``nbytes`` on ``path`` takes if its cost is alpha + beta * bytes
        (alpha, beta >= 0) and a call of ``last`` bytes, its last size, took the agreed figure:
        that figure scaled by the bytes, never under the path's floor on the links. Infinite
        where no call of ``last`` bytes was agreed on (none was timed: nothing bounds it)."""
        chooser = self._chooser
        model, c = chooser.models[path], size_class(last)
        if not model.seen[c]:
            return math.inf
        floor = chooser.links.floor(path, nbytes) if chooser.links is not None else 0.0
        return max(float(model.seconds[c] * nbytes / model.nbytes[c]), floor)

    def payload_bytes(self) -> int:
        """The payload bytes each rank sent and received in the calibration's calls."""
        return (self.timed + 1) * sum(sum(sizes) for sizes in self.sizes.values())

    def record(self) -> dict:
        """What the calibration ran: rounds, calls and payload bytes per rank, each path's sizes."""
        calls = (self.timed + 1) * sum(len(sizes) for sizes in self.sizes.values())
        return {"rounds": self.rounds, "calls": calls, "payload_bytes": self.payload_bytes(),
                "sizes": {p: list(sizes) for p, sizes in self.sizes.items()}, "calibration_seconds": self.seconds}

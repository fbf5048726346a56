"""How the path choice (``inagg.hostlib.pytorch.path.choice``) measures paths it is not using: probes of
new size classes (``Probes``) and budgeted explorations at agreements (``ExplorationBudget``).

*Probes.* A size class not measured on a path yet may be probed there: its next calls take,
``probes`` times each, one path after another (the path of the call before first, then the one
predicted slowest), each path's run starting with one untimed warm-up where the call before was
another path's, because a call right after another path's runs slow. So a class probed on two
paths takes 3 + 1 + 3 calls, and the ranks agree at its 8th: its path is settled there
(``tests/test_backend.py``). Where calls are cheap (under ``probe_seconds``) ``prefer``
and every path whose line is within ``probe_ratio`` of the best are probed; at dearer sizes only
paths predicted faster than the best by ``margin`` (and then ``prefer`` beside them), because a
probe of a slower path costs a whole slow call; the rest are left to exploration. Where the
links' rate is known, a path whose floor there (``inagg.hostlib.pytorch.path.links``) is faster by
``link_margin`` is probed too: the links allow it to be faster, and its line comes from smaller
calls, where per-call costs weigh more (and a job's first calls, on a window still opening, run
slow).

*Explorations.* At a scheduled agreement, a call may take a path the model did not choose, so
the figures of paths not in use do not go stale. Each size class earns ``explore_budget`` of
its calls' predicted time; an exploration costs its predicted extra time plus the agreement it
brings, and is taken once its class can afford it. Paths take turns strictly, so a cheap path
cannot spend the budget a dearer one is saving for, and each class pays for its own, so calls
of one size cannot fund a burst at another.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from inagg.hostlib.pytorch.path.cost import PathModel
from inagg.hostlib.pytorch.path.options import PathChoiceOptions
from inagg.hostlib.pytorch.path.timings import SIZE_CLASSES, size_class


class Probes:
    """The probe calls still to take, per (path, size class), and which probe runs have not
    had their warm-up yet."""

    def __init__(self, paths: Sequence[str], options: PathChoiceOptions) -> None:
        self._paths = tuple(paths)
        self._options = options
        self._left: dict[tuple[str, int], int] = {}   # (path, size class) -> probe calls left
        self._warm_up_due: set[tuple[str, int]] = set()   # probe runs not started yet

    def plan(self, models: Mapping[str, PathModel], prefer: str | None, nbytes: int, best_seconds: float,
             margins: Mapping[str, float] | None = None, floors: Mapping[str, float] | None = None) -> bool:
        """Schedule probes of calls of ``nbytes``, ``best_seconds`` predicted on the best path,
        on each path never measured nor probed at their size class that is worth it (module
        docstring; ``margins``: a path's own margin where it is not ``margin``; ``floors``: a
        path's least time on the links, where known); whether the class has probes left to
        take."""
        c = size_class(nbytes)
        o = self._options
        margins, floors = margins or {}, floors or {}
        unprobed = {p: m for p, m in models.items() if not m.seen[c] and (p, c) not in self._left}
        if best_seconds < o.probe_seconds:
            wanted = [p for p, m in unprobed.items()
                      if p == prefer or m.line(nbytes) <= o.probe_ratio * best_seconds]
        else:
            wanted = [p for p, m in unprobed.items()
                      if p != prefer and (m.line(nbytes) <= (1 - margins.get(p, o.margin)) * best_seconds
                                          or floors.get(p, np.inf) <= (1 - o.link_margin) * best_seconds)]
            if wanted and prefer in unprobed:
                wanted.append(prefer)
        for p in wanted:
            self.schedule(p, c, o.probes)
        return self.pending(c)

    def schedule(self, path: str, c: int, calls: int) -> None:
        """Probe ``path`` at size class ``c`` with ``calls`` timed calls, after a warm-up."""
        self._left[(path, c)] = calls
        self._warm_up_due.add((path, c))

    def pending(self, c: int) -> bool:
        """Whether size class ``c`` has probe calls left on any path."""
        return any(self._left.get((p, c), 0) for p in self._paths)

    def take(self, models: Mapping[str, PathModel], nbytes: int, last_path: str | None) -> tuple[str | None, bool]:
        """The path this call of ``nbytes`` probes (None: no probes left at its size class),
        and whether it is that path's untimed warm-up (once per run, where ``last_path``, the
        path of the call before, was another); a probe taken counts down."""
        c = size_class(nbytes)
        left = [p for p in self._paths if self._left.get((p, c), 0)]
        if not left:
            return None, False
        # the path the calls are on goes first (its run needs no warm-up), then the slowest
        path = last_path if last_path in left else max(left, key=lambda p: models[p].line(nbytes))
        if (path, c) in self._warm_up_due:
            self._warm_up_due.discard((path, c))
            if path != last_path:
                return path, True
        self._left[(path, c)] -= 1
        return path, False


class ExplorationBudget:
    """Per size class, the exploration budget left (seconds, ``credit``), and per path the call
    of its last exploration, for the turns."""

    def __init__(self, paths: Sequence[str], fraction: float) -> None:
        self._paths = tuple(paths)
        self._fraction = fraction
        self.credit = np.zeros(SIZE_CLASSES)
        self._explored_at = dict.fromkeys(self._paths, 0)

    def earn(self, c: int, seconds: float, calls: int = 1) -> None:
        """``calls`` calls of size class ``c``, predicted ``seconds`` each, were made."""
        self.credit[c] += calls * self._fraction * seconds

    def affordable(self, c: int, seconds: float, agreement_s: float) -> float:
        """The dearest predicted time an exploration may take at a call of size class ``c``
        predicted ``seconds`` on its chosen path, paying for its agreement (``agreement_s``)
        too."""
        return seconds + self._fraction * seconds + self.credit[c] - agreement_s

    def next_turn(self, best: str) -> str | None:
        """The path explored least recently other than ``best`` (None: there is none)."""
        return min((p for p in self._paths if p != best), key=self._explored_at.__getitem__, default=None)

    def spend(self, c: int, cost: float, path: str, call: int) -> None:
        """``path`` is explored at call ``call`` of size class ``c``, costing ``cost`` seconds."""
        self.credit[c] -= cost
        self._explored_at[path] = call

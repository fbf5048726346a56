"""Which path one allreduce takes in the ``inagg`` backend: whichever of the job's paths (inagg
on the grant the controller gave, and plain gloo) the model predicts fastest, so an inagg job is
never slower than gloo.

**Measuring.** Each path keeps the recent times of its calls per size class (powers of 4 bytes),
fed by the backend with calls that ran while the path was otherwise idle (every call of inagg,
of gloo's fast path those from ``measure_from_bytes`` up and every ``sample_every``-th smaller
one, every probe and exploration). A class's figure is
the *median* of its last ``per_class`` times: the machine may be shared, and a call preempted by
another process is an outlier, not a slower path.

**The model.** Per path ``seconds = alpha + beta * payload bytes``, fitted to its size classes'
figures minimising relative error (so a 64 MiB call does not drown the 4 B ones that pin alpha,
and one point per class, so a job repeating one bucket size does not outweigh everything else).
The line predicts sizes a path has not been measured at; at a size class it has been measured
at, the class's figure, scaled along the line to the call's size, predicts it: on a shared
machine gloo's cost is not one line (at 4 and 8 processes on 2 cores a 4 B call took 0.9 ms and
a 1 KiB one 5 ms), and a line through both would choose wrongly at each.

**Agreeing.** Every rank must take the same path for the same call, but each measures its own
times. So the decision uses *agreed* figures only: at fixed call numbers (every rank makes the
same calls in the same order: calls 16, 32, 64, then every ``agree_every``, and right after a
new size class's probes) the ranks combine their per-class figures with one small allreduce
taking each one's minimum over ranks, and every rank fits the same model from the result and
computes the same choices until the next agreement. The minimum, because a rank's time of a
call includes waiting for the ranks that arrived later; the last to arrive measures the path
alone.

**Exploring.** A size class first seen is *probed*: its next calls take, ``probes`` times each
(once where a call is predicted to take ``probe_seconds`` or more), every path not yet measured
there whose line predicts it within ``probe_ratio`` of the best path, then the ranks agree. After that, the call at an agreement may take a path the model did
not choose, so the estimate of a path not in use does not go stale (a link's bandwidth changed,
the switch became free). Its predicted extra time is paid from a budget of ``explore_budget`` (a
fraction) of the predicted time of every call so far: a path predicted much slower is explored
rarely, one close to the best at nearly every agreement; paths take turns. Probes and budget
follow from agreed figures and call numbers only, so every rank explores the same calls.

``forced`` pins every call to one path (``INAGG_ALLREDUCE_PATH`` in the backend), for tests and
comparisons; the model still measures what runs and agrees. ``prefer`` (gloo, the baseline)
wins unless another path is predicted faster by more than ``margin`` (10 %): the aim is never
to be slower than gloo, and a path predicted a few % faster gains little and may be noise (at
8 workers / 4 B inagg came out 0.8x and 1.3x gloo in two runs of the sweep). ``history()`` is the per-call record
(time, call number, size, path, explored) of the last ``history`` calls.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable, Sequence

import numpy as np

from .cost_model import nonnegative_fit

PATHS = ("inagg", "gloo")

# Priors until measured: a loopback/LAN round trip and ~1 GB/s; calibration replaces them.
_PRIOR_ALPHA, _PRIOR_BETA = 1e-4, 1e-9
SIZE_CLASSES = 24            # powers of 4: 1 B ... 2^48 B (the last class takes anything larger)
_FIRST_AGREEMENT = 16        # then 32, 64, ... up to every ``agree_every`` calls
_UNSEEN = np.inf             # a size class a rank has no time for (the minimum over ranks skips it)


def size_class(nbytes: int) -> int:
    """The power-of-4 size class of a call of ``nbytes`` payload bytes."""
    return min(SIZE_CLASSES - 1, max(0, int(nbytes).bit_length() - 1) // 2)


class PathTimings:
    """One path's recent call times, ``per_class`` per size class (module docstring)."""

    def __init__(self, per_class: int) -> None:
        self._seconds = [deque(maxlen=per_class) for _ in range(SIZE_CLASSES)]
        self._nbytes = np.full(SIZE_CLASSES, _UNSEEN)

    def observe(self, nbytes: int, seconds: float) -> None:
        c = size_class(nbytes)
        self._seconds[c].append(seconds)
        self._nbytes[c] = nbytes

    def summary(self) -> np.ndarray:
        """Per size class its median seconds, then its latest size in bytes (``inf`` where
        unseen)."""
        return np.concatenate([[min(s) if s else _UNSEEN for s in self._seconds], self._nbytes])


class PathModel:
    """One path's agreed figures (a combined ``PathTimings.summary``) and the alpha-beta line
    fitted to them (module docstring)."""

    def __init__(self, summary: np.ndarray, prior: tuple[float, float]) -> None:
        self.seconds, self.nbytes = summary[:SIZE_CLASSES], summary[SIZE_CLASSES:]
        seen = np.isfinite(self.seconds) & np.isfinite(self.nbytes)
        self.seen = seen
        self.alpha, self.beta = fit_alpha_beta(self.seconds[seen], self.nbytes[seen], prior)

    def line(self, nbytes: float) -> float:
        return self.alpha + self.beta * nbytes

    def predict(self, nbytes: int) -> float:
        """Seconds of a call of ``nbytes``: its class's figure scaled along the line, or the line."""
        c = size_class(nbytes)
        if not self.seen[c]:
            return self.line(nbytes)
        return float(self.seconds[c] * self.line(nbytes) / max(self.line(self.nbytes[c]), 1e-12))


def fit_alpha_beta(seconds: np.ndarray, nbytes: np.ndarray, prior: tuple[float, float]) -> tuple[float, float]:
    """alpha, beta >= 0 fitted to calls of ``nbytes`` taking ``seconds``, minimising relative
    error; the prior where nothing was seen, scaled through the point where one size was."""
    if not len(seconds):
        return prior
    fit = nonnegative_fit(np.stack([1 / seconds, nbytes / seconds], axis=1), np.ones_like(seconds))
    if fit is not None:
        return fit
    i = len(seconds) // 2
    scale = seconds[i] / (prior[0] + prior[1] * nbytes[i])
    return prior[0] * scale, prior[1] * scale


class PathChooser:
    """Per-call path choice, identical on every rank (module docstring)."""

    def __init__(self, agree: Callable[[np.ndarray], np.ndarray], paths: Sequence[str] = PATHS, *,
                 agree_every: int = 128, explore_budget: float = 0.02, per_class: int = 5,
                 probes: int = 3, probe_seconds: float = 2e-3, probe_ratio: float = 4.0, sample_every: int = 32,
                 measure_from_bytes: int = 64 << 10, prefer: str | None = "gloo", margin: float = 0.1,
                 forced: str | None = None, history: int = 4096) -> None:
        if agree_every < _FIRST_AGREEMENT:
            raise ValueError(f"agree_every must be >= {_FIRST_AGREEMENT}, got {agree_every}")
        if not 0 <= explore_budget < 1:
            raise ValueError(f"explore_budget must be in [0, 1), got {explore_budget}")
        if len(set(paths)) != len(paths) or not paths:
            raise ValueError(f"paths must be distinct names, got {paths}")
        if forced is not None and forced not in paths:
            raise ValueError(f"a forced path must be one of {', '.join(paths)}, got {forced!r}")
        if not 0 <= margin < 1:
            raise ValueError(f"margin must be in [0, 1), got {margin}")
        if probes < 0 or probe_ratio < 1 or sample_every < 1:
            raise ValueError(f"need probes >= 0, probe_ratio >= 1, sample_every >= 1; got {probes}, "
                             f"{probe_ratio}, {sample_every}")
        self.paths = tuple(paths)
        self.forced = forced
        self._agree_fn = agree
        self.agree_every = agree_every
        self.explore_budget = explore_budget
        self.probes, self.probe_ratio, self.sample_every = probes, probe_ratio, sample_every
        self.probe_seconds = probe_seconds
        self.measure_from_bytes = measure_from_bytes
        self.prefer, self.margin = (prefer if prefer in self.paths else None), margin
        self._lock = threading.Lock()
        self.timings = {p: PathTimings(per_class) for p in self.paths}
        unseen = np.full(2 * SIZE_CLASSES, _UNSEEN)
        self.models = {p: PathModel(unseen, (_PRIOR_ALPHA, _PRIOR_BETA)) for p in self.paths}
        # per call size until the next agreement: (fastest path, its predicted seconds, probing)
        self._best: dict[int, tuple[str, float, bool]] = {}
        self._probes_left: dict[tuple[str, int], int] = {}   # (path, size class) -> probe calls
        self._credit = 0.0                                   # exploration budget left, seconds
        self._explored_at = dict.fromkeys(self.paths, 0)     # call of each path's last exploration
        self._next_agreement = _FIRST_AGREEMENT
        self._history: deque[tuple[float, int, int, str, bool]] = deque(maxlen=history)
        self.calls = 0
        self.agreements = 0
        self.explorations = 0
        self.probed = 0

    @property
    def agreed(self) -> dict[str, tuple[float, float]]:
        """Each path's agreed alpha and beta."""
        return {p: (m.alpha, m.beta) for p, m in self.models.items()}

    def observe(self, path: str, nbytes: int, seconds: float) -> None:
        """One call of ``nbytes`` payload took ``seconds`` on ``path`` (any thread)."""
        with self._lock:
            self.timings[path].observe(nbytes, seconds)

    def predict(self, path: str, nbytes: int) -> float:
        """Seconds of an allreduce of ``nbytes`` on ``path`` at the agreed figures."""
        return self.models[path].predict(nbytes)

    def _fastest(self, nbytes: int) -> tuple[str, float, bool]:
        """The fastest path at the agreed figures (``prefer`` unless another is predicted
        faster by more than ``margin``; ties: the earlier path), its predicted seconds, and whether the size's class still has probes to run; remembered per size until
        the next agreement: a training job repeats a handful of sizes."""
        entry = self._best.get(nbytes)
        if entry is None:
            path, seconds = min(((p, self.predict(p, nbytes)) for p in self.paths),
                                key=lambda e: e[1] * (1 - self.margin if e[0] == self.prefer else 1))
            entry = self._best[nbytes] = (path, seconds, self._plan_probes(nbytes, seconds))
        return entry

    def _plan_probes(self, nbytes: int, best_seconds: float) -> bool:
        """Whether calls of this size still probe: schedules probe calls on each path that was
        never measured at its size class (nor probed there) and whose line predicts it within
        ``probe_ratio`` of the best (module docstring): ``probes`` of them (their median is the
        figure) where calls are predicted under ``probe_seconds``, one where they cost more."""
        if self.forced:
            return False
        c = size_class(nbytes)
        count = self.probes if best_seconds < self.probe_seconds else min(self.probes, 1)
        for p, m in self.models.items():
            if not m.seen[c] and (p, c) not in self._probes_left and m.line(nbytes) <= self.probe_ratio * best_seconds:
                self._probes_left[(p, c)] = count
        return any(self._probes_left.get((p, c), 0) for p in self.paths)

    def best(self, nbytes: int) -> str:
        """The path the model predicts fastest for ``nbytes``."""
        return self._fastest(nbytes)[0]

    def fastest_seconds(self, nbytes: float) -> float:
        """Predicted seconds of an allreduce of ``nbytes`` on the fastest path."""
        return self._fastest(nbytes)[1]

    def agree(self) -> None:
        """Combine every rank's timings (each size class's minimum over ranks) and fit every
        path's model to the result; a collective, so every rank must call it at the same
        point."""
        with self._lock:
            local = np.concatenate([self.timings[p].summary() for p in self.paths])
        combined = self._agree_fn(local).reshape(len(self.paths), -1)
        self.models = {p: PathModel(combined[i], (_PRIOR_ALPHA, _PRIOR_BETA)) for i, p in enumerate(self.paths)}
        self._best.clear()
        self.agreements += 1

    def choose(self, nbytes: int) -> tuple[str, bool]:
        """The path of the next call, and whether to time it (every rank calls this once per
        eligible allreduce, in the same order)."""
        self.calls += 1
        entry = self._best.get(nbytes)
        if entry is None or entry[2] or self.calls >= self._next_agreement:
            return self._choose_slowly(nbytes)
        self._credit += self.explore_budget * entry[1]
        path = self.forced or entry[0]
        self._history.append((time.time(), self.calls, nbytes, path, False))
        return path, nbytes >= self.measure_from_bytes or self.calls % self.sample_every == 0

    def _choose_slowly(self, nbytes: int) -> tuple[str, bool]:
        """``choose`` at an agreement, a size not seen since the last one, or a probe."""
        agreement = self.calls >= self._next_agreement
        if agreement:
            self._next_agreement = self.calls + min(self.calls, self.agree_every)
            self.agree()
        path, seconds, probing = self._fastest(nbytes)
        explore = self._probe(nbytes) if probing else None
        if explore is None and agreement:
            explore = self._exploration(nbytes, seconds + self.explore_budget * seconds + self._credit)
            if explore is not None:
                self._credit -= self.predict(explore, nbytes) - seconds
                self._explored_at[explore] = self.calls
                self.explorations += 1
        self._credit += self.explore_budget * seconds
        path = self.forced or explore or path
        self._history.append((time.time(), self.calls, nbytes, path, explore is not None))
        return path, explore is not None or nbytes >= self.measure_from_bytes or self.calls % self.sample_every == 0

    def _probe(self, nbytes: int) -> str | None:
        """The path this call probes, taking turns, the one predicted slowest first (a job's
        or a benchmark's first call of a size is often a warm-up); when the size's last probe is
        taken, the ranks agree at the next call so the probes' times are used at once."""
        c = size_class(nbytes)
        left = [p for p in self.paths if self._probes_left.get((p, c), 0)]
        if not left:
            return None
        path = max(left, key=lambda p: (self._probes_left[(p, c)], self.models[p].line(nbytes)))
        self._probes_left[(path, c)] -= 1
        self.probed += 1
        if not any(self._probes_left.get((p, c), 0) for p in self.paths):
            self._next_agreement = self.calls + 1
        return path

    def _exploration(self, nbytes: int, affordable: float) -> str | None:
        """The path this agreement call explores, if any: the one explored least recently
        among those the budget affords (predicted at most ``affordable`` seconds)."""
        if self.forced:
            return None
        best = self.best(nbytes)
        others = sorted((p for p in self.paths if p != best), key=self._explored_at.__getitem__)
        return next((p for p in others if self.predict(p, nbytes) <= affordable), None)

    def history(self) -> list[dict]:
        """The last calls' choices, oldest first: wall-clock time, call number, payload bytes,
        path, and whether the call explored (took a path the model did not choose)."""
        return [dict(time=t, call=c, bytes=b, path=p, explored=e) for t, c, b, p, e in list(self._history)]

    def as_dict(self) -> dict:
        return {"agreed": {p: {"alpha_s": m.alpha, "beta_s_per_byte": m.beta,
                               "measured_s": {int(n): float(t) for n, t in zip(m.nbytes[m.seen], m.seconds[m.seen])}}
                           for p, m in self.models.items()},
                "paths": list(self.paths), "calls": self.calls, "agreements": self.agreements,
                "explorations": self.explorations, "probes": self.probed, "explore_credit_s": self._credit}

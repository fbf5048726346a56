"""Which path one allreduce takes in the ``inagg`` backend: whichever of the job's paths (inagg
on the grant the controller gave, the host lane beside a grant on a switch, plain gloo) the model
predicts fastest, so an inagg job is never slower than gloo.

**Measuring.** Each path keeps the times of its last ``per_class`` measured calls per size
class (powers of 4 bytes). The chooser says which calls to measure: probes and explorations,
every call of a class whose ring is not full yet, a call predicted to take
``measure_from_seconds`` or more once ``measure_every_seconds`` of its class's predicted time has
passed since the class's last timed one (every call from 100 ms, every fifth of 20 ms), and
*samples* of the others: a class's call once ``sample_every`` calls have passed since the last
sample and ``sample_seconds`` of the class's predicted time since its own.
Every rank measures the same calls, so the k-th measured call of a class is the same call on
every rank; samples follow from call numbers and agreed figures only, so a call one rank could
not time (the backend times a call where its caller waits, and only when the path was otherwise
idle) does not move the others.

Why samples, and why so: a timed call costs ~0.1 ms of Python (timing every call from 64 KiB up
made the backend's gloo path 1.17x plain gloo at 256 KiB; one call in 32 timed cost 0.2 ms each
at 2 workers / 4 B and 0.5-1.2 ms at 4 workers, on calls of 0.25 and 0.9 ms); and the size where
the time goes is sampled most (at the bandwidth flip's 256 KiB, 64 KiB and 4 B per step, the
256 KiB class every ~11 steps, where one sample in 32 calls whatever their size took it every
third sample). And a timed call's Python is paid on every rank: with 8 ranks on 2 cores, timing
every 4 MiB call (24 ms) made the backend's gloo path 1.04-1.08x plain gloo in every sweep.

**The model.** Per path ``seconds = alpha + beta * payload bytes``, fitted to its size classes'
figures minimising relative error (so a 64 MiB call does not drown the 4 B ones that pin alpha,
and one point per class, so a job repeating one bucket size does not outweigh everything else).
The line predicts sizes a path has not been measured at; at a size class it has been measured
at, the class's figure, scaled along the line to the call's size, predicts it: on a shared
machine gloo's cost is not one line (at 4 and 8 processes on 2 cores a 4 B call took 0.9 ms and
a 1 KiB one 5 ms), and a line through both would choose wrongly at each.

**Agreeing.** Every rank must take the same path for the same call, but each measures its own
times. So the decision uses *agreed* figures only: at fixed call numbers (every rank makes the
same calls in the same order: calls 16, 32, 64, then every ``agree_every`` but no sooner than
the calls' predicted time since the last one reaches ``1 / agree_budget`` times one agreement's
own work, and right after a new size class's probes or an exploration) the ranks combine
their recent times with one exchange taking minima over ranks (``agree``: the backend's goes
through the job's store, ``inagg.pytorch.agreement``), and a class's figure is
the median over its recent calls of each call's agreed time. Where the ranks share a clock (``shared_clock``: one kernel, as in the
local deployment), a call's time runs from the last rank's start to the last rank's end: what
the job waits for, without the ranks' arrival skew, which is not the path's doing. Otherwise it
is the minimum over ranks of each rank's time, because a rank's time of a call includes waiting
for the ranks that arrived later (the last to arrive measures the path alone); but that is the
rank that finished first, which flatters a path whose ranks finish apart (results handed
between threads: inagg at 2 workers / 64 B, chosen 25 % faster, measured 1.1-1.25x gloo). The
median over calls, because on a shared machine a call preempted by another process is an
outlier, not a slower path. Other combinations chose wrongly on the loaded 2-core machine: per-rank medians combined
by maximum (inagg at 4 workers / 4 B, twice gloo's time), the fastest recent call (a path with
more spread looks faster: the host lane at 8 workers / 4 B, 1.6x), each call's mean or maximum
over ranks (the host lane or inagg at 2 workers / 4 B, 2.5-5x). Every rank fits the same
model from the result and computes the same choices until the next agreement.

**Exploring.** A size class first seen where calls are cheap (predicted under ``probe_seconds``)
is *probed*: its next calls take, ``probes`` times each, one path after another, ``prefer`` and
every other path not yet measured there whose line predicts it within ``probe_ratio`` of the
best (a path's first call after another path's is an untimed warm-up), then the ranks agree.
Larger sizes are left to exploration (a probe of a slower path would cost a whole slow call; a
line alone never takes a call off ``prefer``, below). After that, the
call at an agreement may take a path the model did not choose, so the estimate of a path not in
use does not go stale (a link's bandwidth changed, the switch became free): that call's time
replaces the path's older ones at its size class, and the ranks agree at the next call. Only
a scheduled agreement explores (not one an exploration, probes or a confirmation brought
forward: chained so, explorations took 6 % of the calls at 4 workers / 4 B, each with an
agreement of its own, and the backend 1.3x gloo on the mean). The ranks also agree
again as soon as a class that moved off ``prefer`` has its new path's ring full of that path's
own calls and both it and ``prefer`` have been timed afresh there (``_recheck_prefer``): a lucky
exploration or slow probes of ``prefer`` cost a handful of calls, not ``agree_every``; where ``prefer``'s
fastest recent call there is within ``probe_ratio`` of the path's figure, it is rechecked again
after 10, 20, 40, ... calls: its times may be bimodal, ``_recheck_again``; a class back on
``prefer`` on a recheck's few calls agrees again once its ring is full), and where a
class's newest agreed call on its path was slower than the class's other recent ones by
``measure_from_seconds`` or more (a link slowed down: its older times go, its next calls are all
timed, then the ranks agree). Its
predicted extra time and the agreement it brings (``agreement_s``: where calls take 0.3 ms, an
agreement's ~3 ms dwarfs the exploration itself) are paid from a budget of ``explore_budget``
(a fraction) of the predicted
time of every call of its size class so far: a path predicted much slower is explored rarely,
one close to the best at nearly every agreement; paths take turns, strictly. Each size class
pays for its own explorations (one budget for all let the calls of earlier sizes pay for a
burst at a later one: 5 of the 18 timed 4 MiB calls explored, at 8 workers, 1.6x gloo). Probes and budget follow from
agreed figures and call numbers only, so every rank explores the same calls.

``forced`` pins every call to one path (``INAGG_ALLREDUCE_PATH`` in the backend), for tests and
comparisons; the model still measures what runs and agrees. ``prefer`` (gloo, the baseline)
wins unless another path is predicted faster by more than ``margin`` (25 %): the aim is never
to be slower than gloo, and where two paths are that close their figures on a shared machine
are noise (at 8 workers / 4 B inagg came out 0.8x and 1.4x gloo in different runs). Nor does a
line alone move a call off ``prefer``: another path must have been measured at the call's size
class (a probe, an exploration), and by ``trusted`` calls unless it looks twice as fast; lines
extrapolated from small calls chose inagg at 8 workers / 4 and 64 MiB, at 1.3 and 1.65x gloo's
time. ``history()`` is
the per-call record (time, call number, size, path, explored) of the last ``history`` calls.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable, NamedTuple, Sequence

import numpy as np

from inagg.worker.cost_model import nonnegative_fit

# inagg on the job's grant (the switch, or the host aggregator where the controller grants that),
# the job's host lane (the host aggregator beside a grant on a switch), gloo
PATHS = ("inagg", "host", "gloo")

# Priors until measured: a loopback/LAN round trip and ~1 GB/s; calibration replaces them.
_PRIOR_ALPHA, _PRIOR_BETA = 1e-4, 1e-9
SIZE_CLASSES = 24            # powers of 4: 1 B ... 2^48 B (the last class takes anything larger)
_FIRST_AGREEMENT = 16        # then 32, 64, ... up to every ``agree_every`` calls
_UNSEEN = np.inf             # a size class a rank has no time for (the minimum over ranks skips it)


class _Pending(NamedTuple):
    """A size class waiting for ``calls`` more calls on ``path`` before the ranks agree
    (``PathChooser._confirm_soon``); ``left_prefer``: it just moved off ``prefer``, which is
    timed again first."""
    path: str
    calls: int
    left_prefer: bool


def row_medians(ring: np.ndarray) -> np.ndarray:
    """Each row's median over its finite entries, ``inf`` where it has none (unseen entries are
    ``inf`` and sort last): one sort for every class, where a median per class made an
    agreement cost ~2 ms of Python, as much as six 4 B calls at 2 workers."""
    s = np.sort(ring, axis=1)
    n = np.isfinite(s).sum(axis=1)
    rows = np.arange(len(s))
    mid = (s[rows, np.maximum(n - 1, 0) // 2] + s[rows, n // 2]) / 2
    return np.where(n > 0, mid, _UNSEEN)


def size_class(nbytes: int) -> int:
    """The power-of-4 size class of a call of ``nbytes`` payload bytes."""
    return min(SIZE_CLASSES - 1, max(0, int(nbytes).bit_length() - 1) // 2)


class PathTimings:
    """One path's recent call times: per size class, the last ``per_class`` measured calls in
    a ring, the k-th measured call of a class in slot k mod ``per_class``. Every rank measures
    the same calls (the chooser decides which), so a slot holds the same call on every rank
    and the ranks' minimum per slot is that call's time without waiting for other ranks
    (module docstring)."""

    def __init__(self, per_class: int, shared_clock: bool = False) -> None:
        self._ring = np.full((SIZE_CLASSES, per_class), _UNSEEN)
        self._starts = np.full((SIZE_CLASSES, per_class), _UNSEEN) if shared_clock else None
        self._count = np.zeros(SIZE_CLASSES, dtype=np.int64)
        self._nbytes = np.full(SIZE_CLASSES, _UNSEEN)

    def observe(self, nbytes: int, seconds: float, started: float) -> None:
        c = size_class(nbytes)
        slot = self._count[c] % self._ring.shape[1]
        self._ring[c, slot] = seconds
        if self._starts is not None:
            self._starts[c, slot] = started
        self._count[c] += 1
        self._nbytes[c] = nbytes

    def filling(self, c: int) -> bool:
        """Whether size class ``c`` has fewer measured calls than its ring holds."""
        return bool(self._count[c] < self._ring.shape[1])

    def forget(self, c: int, keep_newest: bool = False) -> None:
        """Drop size class ``c``'s times, all or all but the newest (on every rank at the same
        call: slots stay aligned)."""
        kept = (self._count[c] - 1) % self._ring.shape[1] if keep_newest and self._count[c] else None
        for ring in (self._ring, self._starts):
            if ring is not None:
                newest = ring[c, kept] if kept is not None else _UNSEEN
                ring[c] = _UNSEEN
                ring[c, 0] = newest
        self._count[c] = 0 if kept is None else 1

    def summary(self) -> np.ndarray:
        """What the ranks combine by their minimum (``inf`` where unseen), then each class's
        measured calls and latest size in bytes: the ring of times; on a shared clock, each
        call's start and end, negated (the minimum of those is the last rank's start and end)."""
        tail = [self._count.astype(float), self._nbytes]
        if self._starts is None:
            return np.concatenate([self._ring.ravel(), *tail])
        seen = np.isfinite(self._ring)
        starts, ends = np.where(seen, -self._starts, _UNSEEN), np.where(seen, -(self._starts + self._ring), _UNSEEN)
        return np.concatenate([starts.ravel(), ends.ravel(), *tail])


class PathModel:
    """One path's agreed figures (the ranks' minimum of ``PathTimings.summary``: per class the
    median over its recent calls of each call's time) and the alpha-beta line fitted to them
    (module docstring); ``ring`` holds the calls' agreed times, ``counts`` each class's
    measured calls so far (the newest in slot ``counts - 1`` mod the ring's length)."""

    def __init__(self, summary: np.ndarray, prior: tuple[float, float], shared_clock: bool = False) -> None:
        self.summary = summary
        body, self.nbytes = summary[:-2 * SIZE_CLASSES], summary[-SIZE_CLASSES:]
        self.counts = summary[-2 * SIZE_CLASSES:-SIZE_CLASSES]
        if shared_clock:   # last start and last end, negated: the call's time, from the last rank's start
            neg_start, neg_end = body.reshape(2, SIZE_CLASSES, -1)
            with np.errstate(invalid="ignore"):
                ring = np.where(np.isfinite(neg_start) & np.isfinite(neg_end), np.maximum(neg_start - neg_end, 1e-9),
                                _UNSEEN)
        else:
            ring = body.reshape(SIZE_CLASSES, -1)
        self.ring = ring
        timed = np.isfinite(ring)
        self.samples = timed.sum(axis=1)
        self.seen = (self.samples > 0) & np.isfinite(self.nbytes)
        self.seconds = np.where(self.seen, row_medians(ring), _UNSEEN)
        self.alpha, self.beta = fit_alpha_beta(self.seconds[self.seen], self.nbytes[self.seen], prior)

    def line(self, nbytes: float) -> float:
        return self.alpha + self.beta * nbytes

    def newest_lags(self) -> np.ndarray:
        """Per size class, how much slower its newest call was than the median of its other
        recent calls (0 with fewer than two calls)."""
        counts = np.where(np.isfinite(self.counts), self.counts, 0).astype(np.int64)
        rows = np.arange(SIZE_CLASSES)
        newest = (counts - 1) % self.ring.shape[1]
        others = self.ring.copy()
        others[rows, newest] = _UNSEEN
        with np.errstate(invalid="ignore"):
            lags = self.ring[rows, newest] - row_medians(others)
        return np.where((counts >= 2) & np.isfinite(lags), lags, 0.0)

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

    def __init__(self, agree: Callable[[np.ndarray], np.ndarray], paths: Sequence[str] = ("inagg", "gloo"), *,
                 agree_every: int = 128, agree_budget: float = 0.01, explore_budget: float = 0.02, per_class: int = 5,
                 probes: int = 3, probe_seconds: float = 2e-3, probe_ratio: float = 2.0, sample_every: int = 32,
                 sample_seconds: float = 0.05, measure_from_seconds: float = 10e-3, measure_every_seconds: float = 0.1,
                 prefer: str | None = "gloo", margin: float = 0.25,
                 forced: str | None = None, history: int = 4096, shared_clock: bool = False,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if agree_every < _FIRST_AGREEMENT:
            raise ValueError(f"agree_every must be >= {_FIRST_AGREEMENT}, got {agree_every}")
        if not 0 <= explore_budget < 1:
            raise ValueError(f"explore_budget must be in [0, 1), got {explore_budget}")
        if not 0 < agree_budget < 1:
            raise ValueError(f"agree_budget must be in (0, 1), got {agree_budget}")
        if len(set(paths)) != len(paths) or not paths:
            raise ValueError(f"paths must be distinct names, got {paths}")
        if forced is not None and forced not in paths:
            raise ValueError(f"a forced path must be one of {', '.join(paths)}, got {forced!r}")
        if not 0 <= margin < 1:
            raise ValueError(f"margin must be in [0, 1), got {margin}")
        if (probes < 0 or probe_ratio < 1 or sample_every < 1 or not 0 <= sample_seconds < np.inf
                or not 0 <= measure_every_seconds < np.inf):
            raise ValueError(f"need probes >= 0, probe_ratio >= 1, sample_every >= 1, sample_seconds >= 0, "
                             f"measure_every_seconds >= 0; got {probes}, {probe_ratio}, {sample_every}, "
                             f"{sample_seconds}, {measure_every_seconds}")
        self.paths = tuple(paths)
        self.forced = forced
        self._agree_fn = agree
        self.agree_every, self.agree_budget = agree_every, agree_budget
        self.explore_budget = explore_budget
        self.probes, self.probe_ratio, self.sample_every = probes, probe_ratio, sample_every
        self.probe_seconds, self.sample_seconds = probe_seconds, sample_seconds
        self.measure_from_seconds, self.measure_every_seconds = measure_from_seconds, measure_every_seconds
        self.prefer, self.margin = (prefer if prefer in self.paths else None), margin
        self.per_class, self.trusted = per_class, min(3, per_class)
        self._lock = threading.Lock()
        self.shared_clock, self._clock = shared_clock, clock   # ``clock`` times the agreements
        self.timings = {p: PathTimings(per_class, shared_clock) for p in self.paths}
        unseen = np.full_like(self.timings[self.paths[0]].summary(), _UNSEEN)
        self.models = {p: PathModel(unseen, (_PRIOR_ALPHA, _PRIOR_BETA), shared_clock) for p in self.paths}
        # per call size until the next agreement: (fastest path, its predicted seconds, probing)
        self._best: dict[int, tuple[str, float, bool]] = {}
        self._probes_left: dict[tuple[str, int], int] = {}   # (path, size class) -> probe calls
        self._warm_up_due: set[tuple[str, int]] = set()      # probe runs not started yet (``_probe``)
        self._chosen: dict[int, str] = {}                    # size class -> its path (``_confirm_soon``)
        self._confirming: dict[int, _Pending] = {}          # size class -> what it waits for
        self._rechecks: dict[int, int] = {}                  # size class off prefer -> its rechecks of prefer
        self._credit = np.zeros(SIZE_CLASSES)                # exploration budget left per class, seconds
        self._explored_at = dict.fromkeys(self.paths, 0)     # call of each path's last exploration
        self._next_agreement = _FIRST_AGREEMENT     # the next agreement, scheduled or not
        self._next_scheduled = _FIRST_AGREEMENT     # the next scheduled one (16, 32, 64, ..., time allowing)
        self._scheduled_floor = _FIRST_AGREEMENT    # ... not before this call
        self._scheduled_at = 0                      # the call of the last scheduled one
        self._soon = False                          # an unscheduled agreement is due at _next_agreement
        self._predicted_s = 0.0                     # predicted seconds of the calls since the last scheduled one
        self._due_s = 0.0                           # ... that the next scheduled one waits for
        self._sampled_at = 0                        # the call of the last sample (``_measure``)
        self._unsampled_s = np.zeros(SIZE_CLASSES)  # per class, predicted seconds since its last one
        self._untimed_s = np.zeros(SIZE_CLASSES)    # per class, predicted seconds since its last timed call
        self._own_agreement_s = _UNSEEN             # this rank's time for the last agreement
        self.agreement_s = 0.0                      # one agreement's own work, agreed (0: none yet)
        # runs of calls: [wall-clock time, first call, calls, payload bytes, path, explored]
        self._history: deque[list] = deque(maxlen=history)
        self._last_path: str | None = None         # the path of the last call (``_probe``'s warm-ups)
        self.calls = 0
        self.agreements = 0
        self.explorations = 0
        self.probed = 0

    @property
    def agreed(self) -> dict[str, tuple[float, float]]:
        """Each path's agreed alpha and beta."""
        return {p: (m.alpha, m.beta) for p, m in self.models.items()}

    def observe(self, path: str, nbytes: int, seconds: float, started: float = 0.0) -> None:
        """One call of ``nbytes`` payload took ``seconds`` on ``path`` from ``started`` (on
        the clock every rank shares, where they do: ``shared_clock``; any thread)."""
        with self._lock:
            self.timings[path].observe(nbytes, seconds, started)

    def predict(self, path: str, nbytes: int) -> float:
        """Seconds of an allreduce of ``nbytes`` on ``path`` at the agreed figures."""
        return self.models[path].predict(nbytes)

    def _fastest(self, nbytes: int) -> tuple[str, float, bool]:
        """The fastest path at the agreed figures (``prefer`` unless another, measured at this
        size class, is predicted faster by more than ``margin``; ties: the earlier path), its
        predicted seconds, and whether the size's class still has probes to run; remembered per size until
        the next agreement: a training job repeats a handful of sizes."""
        entry = self._best.get(nbytes)
        if entry is None:
            c = size_class(nbytes)
            eligible = [p for p in self.paths if p == self.prefer or self.models[p].seen[c]] or self.paths
            path, seconds = min(((p, self.predict(p, nbytes)) for p in eligible),
                                key=lambda e: e[1] * self._handicap(e[0], c))
            entry = self._best[nbytes] = (path, seconds, self._plan_probes(nbytes, seconds))
            self._confirm_soon(c, path)
        return entry

    def _confirm_soon(self, c: int, path: str) -> None:
        """Where size class ``c`` moves off ``prefer``, or is new to its path, agree again as
        soon as the path's ring is full of its own calls (all timed while it fills, ``_measure``), rather than at
        the next scheduled agreement up to ``agree_every`` calls later: a path taken on a few
        lucky times (an exploration, probes) is dropped after a handful of calls if its own
        calls say otherwise. Follows from agreed figures and call numbers only, as every
        agreement."""
        if self.forced:
            return
        if not self.models[path].seen[c] and c not in self._confirming:
            # a size new to its path: agree once its ring is full, so its own figure replaces
            # the line's guess (and a dearer size probes a path faster than that figure,
            # ``_plan_probes``: gloo's line said 5 ms at 8 workers / 1 KiB, its calls took 14 ms,
            # and the next agreement, 150 calls later, came after the size's last call)
            self._confirming[c] = _Pending(path, self.per_class, False)
        if self._chosen.get(c, self.prefer) == path:
            self._recheck_again(c, path)
            return
        self._chosen[c] = path
        self._confirming.pop(c, None)
        self._rechecks.pop(c, None)
        samples = int(self.models[path].samples[c])
        if path != self.prefer:
            self._confirming[c] = _Pending(path, max(1, self.per_class - samples), True)
        elif samples < self.per_class:
            # back on ``prefer`` on a few calls (a recheck): its own calls confirm it too. A
            # throttled link's token bucket, full after seconds unused, let gloo's three
            # recheck calls through at full speed; its next calls took 180 ms where the host
            # lane's took 17, and only the next scheduled agreement, 7 s later, saw it
            self._confirming[c] = _Pending(path, self.per_class - samples, False)

    def _count_toward_confirmation(self, c: int, path: str) -> None:
        """A call of class ``c`` took ``path``: once the calls ``_confirm_soon`` (or
        ``_refresh_where_slower``) waits for are taken, the ranks agree at the next call, or,
        where the class just left ``prefer``, after ``prefer`` is timed again there."""
        pending = self._confirming.get(c)
        if pending is None or pending.path != path:
            return
        if pending.calls > 1:
            self._confirming[c] = pending._replace(calls=pending.calls - 1)
            return
        del self._confirming[c]
        if pending.left_prefer and self.prefer is not None:
            self._recheck_prefer(c, path)
        else:
            self._agree_soon()

    def _agree_soon(self) -> None:
        """The ranks agree at the next call (an unscheduled agreement)."""
        self._next_agreement, self._soon = min(self._next_agreement, self.calls + 1), True

    def _recheck_prefer(self, c: int, path: str) -> None:
        """Size class ``c``'s calls on ``path``, not ``prefer``, filled its ring: measure both
        again there, ``trusted`` calls each in a run (as probes: then the ranks agree), so
        leaving ``prefer`` rests on fresh times of both, not on the few ``prefer`` had, taken
        beside other paths' calls (probes, an exploration), nor on ``path``'s old ones (its
        ring keeps its two newest beside the three: a majority, so its median is a fresh call;
        emptied, ``path`` was not eligible at an agreement falling among the probes). gloo's
        times are bimodal at 2 workers / 4 B and 256 KiB on the 2-core machine (0.2 or 0.4 ms,
        0.5 or 3 ms): three slow probes put the host lane on every call at 1.6x gloo's time.
        And ``path``'s calls are timed only as samples once its ring is full (at 0.25 ms, one
        in 200): rechecked against the host lane's figure from its first calls (0.25 ms), gloo's
        fresh 0.4-1.3 ms kept 16 KiB calls on the host lane for 150-300 calls at 2 workers,
        where its calls took 0.9-1.5 ms."""
        if c not in self._rechecks:
            with self._lock:
                self.timings[self.prefer].forget(c)
        self._rechecks[c] = self._rechecks.get(c, 0) + 1
        self._probes_left[(self.prefer, c)] = self._probes_left[(path, c)] = self.trusted
        self._warm_up_due.update({(self.prefer, c), (path, c)})
        for nbytes in [n for n in self._best if size_class(n) == c]:
            del self._best[nbytes]   # the class's next call plans its probes (``_fastest``)

    def _recheck_again(self, c: int, path: str) -> None:
        """Size class ``c`` stayed on ``path``, off ``prefer``, after ``prefer`` was rechecked
        there (``_recheck_prefer``): where ``prefer``'s fastest recent call there is within
        ``probe_ratio`` of the path's figure, recheck it again after ``per_class`` times
        2^(rechecks so far) more calls, its new times joining the last recheck's. gloo's times
        at 2 workers / 64 B-16 KiB on the 2-core machine are bimodal (~0.36 ms, or 1-4 ms for
        a third of the calls) and its first call after another path's is slow: three such
        calls put the host lane, 1.3x gloo's typical time, on hundreds of 16 KiB calls, where
        the next exploration of gloo, priced at its slow figure, came late. Keyed on gloo's
        figure (a median of slow calls) instead, the rechecks stopped early: simulated jobs of
        1,200 calls with gloo fast on 65 % of calls still spent 212 calls off gloo on the mean
        (34 keyed so). A throttled link's calls are all slow: no more rechecks. A recheck's
        calls are gloo's, the baseline's."""
        done = self._rechecks.get(c)   # none once the class is back on ``prefer`` (``_confirm_soon``)
        if done is None or c in self._confirming:
            return
        if self.models[self.prefer].ring[c].min() <= self.probe_ratio * self.models[path].seconds[c]:
            self._confirming[c] = _Pending(path, self.per_class << done, True)

    def _plan_probes(self, nbytes: int, best_seconds: float) -> bool:
        """Whether calls of this size still probe (planned here, or a recheck of ``prefer``,
        ``_recheck_prefer``). Schedules ``probes`` calls on each path never measured at the
        size's class (nor probed there) that is worth it: where calls are predicted under
        ``probe_seconds``, ``prefer`` (the baseline must be measured to be compared) and each
        path whose line is within ``probe_ratio`` of the best; where they are dearer, each
        path whose line predicts it faster than the best by ``margin``, and then ``prefer``
        too (its probes are calls it takes anyway, timed). Other paths at dearer sizes are
        left to exploration (module docstring): at 8 workers / 1 KiB (gloo 14 ms) the host
        lane, 4 ms by its line, waited for an exploration that did not come in 150 calls, in
        four of six jobs."""
        if self.forced:
            return False
        c = size_class(nbytes)
        cheap = best_seconds < self.probe_seconds
        unprobed = {p: m for p, m in self.models.items() if not m.seen[c] and (p, c) not in self._probes_left}
        if cheap:
            wanted = [p for p, m in unprobed.items()
                      if p == self.prefer or m.line(nbytes) <= self.probe_ratio * best_seconds]
        else:
            wanted = [p for p, m in unprobed.items()
                      if p != self.prefer and m.line(nbytes) <= (1 - self.margin) * best_seconds]
            if wanted and self.prefer in unprobed:
                wanted.append(self.prefer)
        for p in wanted:
            self._probes_left[(p, c)] = self.probes
            self._warm_up_due.add((p, c))
        return any(self._probes_left.get((p, c), 0) for p in self.paths)

    def _handicap(self, path: str, c: int) -> float:
        """The factor on ``path``'s predicted time at size class ``c`` when paths are compared:
        ``prefer``'s is 1 - ``margin``; another path's is 2 while fewer than ``trusted``
        calls measured it there (one probe or exploration: it must look twice as fast to
        win; single lucky probes put the host lane on 4 MiB calls at 1.4x gloo's time)."""
        if path == self.prefer:
            return 1 - self.margin
        return 1.0 if self.models[path].samples[c] >= self.trusted else 2.0

    def best(self, nbytes: int) -> str:
        """The path the model predicts fastest for ``nbytes``."""
        return self._fastest(nbytes)[0]

    def fastest_seconds(self, nbytes: float) -> float:
        """Predicted seconds of an allreduce of ``nbytes`` on the fastest path."""
        return self._fastest(nbytes)[1]

    def agree(self) -> None:
        """Combine every rank's timings (each measured call's minimum over ranks) and fit every
        path's model to the result; a collective, so every rank must call it at the same
        point."""
        started = self._clock()
        with self._lock:
            local = np.concatenate([self.timings[p].summary() for p in self.paths] + [[self._own_agreement_s]])
        sent = self._clock()
        agreed = self._agree_fn(local)
        received = self._clock()
        if np.isfinite(agreed[-1]):
            self.agreement_s = float(agreed[-1])
        combined = agreed[:-1].reshape(len(self.paths), -1)
        self.models = {p: self._refit(p, combined[i]) for i, p in enumerate(self.paths)}
        self._best.clear()
        self.agreements += 1
        self._refresh_where_slower()
        # its own work, not the exchange: that crosses a link (the store's, in the backend) and
        # costs what the link does; budgeted too, a throttled link put the agreements, which
        # notice the throttle, tens of seconds apart
        self._own_agreement_s = (sent - started) + (self._clock() - received)

    def _refit(self, path: str, summary: np.ndarray) -> PathModel:
        """``path``'s model from its agreed ``summary``: the one it has where nothing changed
        since the last agreement (the paths not in use, mostly; a fit costs ~0.1 ms of the
        agreement's own work, which every rank does while the job waits)."""
        model = self.models[path]
        if np.array_equal(model.summary, summary):
            return model
        return PathModel(summary, (_PRIOR_ALPHA, _PRIOR_BETA), self.shared_clock)

    def _refresh_where_slower(self) -> None:
        """Where a size class's newest agreed call on the path it takes was slower than the
        class's other recent calls by ``measure_from_seconds`` or more (its link got slower),
        the older times go, every call of the class is timed until its ring is full again,
        and the ranks agree at once then (``_confirming``). The newest stays: with none, an
        agreement in between (another class's exploration) found the path unmeasured there,
        and so not eligible (``_fastest``): one slow call on inagg (45 ms among 20 ms ones,
        the machine loaded) put a class back on gloo's throttled link for 14 s. Otherwise, sampled (1 in
        ``sample_every`` or fewer), three slow calls had to come in to move the median: a link throttled
        to 20 Mbit/s stayed in use for 27 s, 135 steps at 200 ms where the host lane took
        30 ms. Decided from agreed figures only, as every agreement."""
        if self.forced:
            return
        for path in {*self._chosen.values(), self.prefer} - {None}:
            for c in np.flatnonzero(self.models[path].newest_lags() >= self.measure_from_seconds):
                c = int(c)
                if self._chosen.get(c, self.prefer) != path or c in self._confirming:
                    continue
                with self._lock:
                    self.timings[path].forget(c, keep_newest=True)
                self._confirming[c] = _Pending(path, self.per_class, False)

    def choose(self, nbytes: int) -> tuple[str, bool]:
        """The path of the next call, and whether to time it (every rank calls this once per
        eligible allreduce, in the same order)."""
        self.calls += 1
        entry = self._best.get(nbytes)
        if entry is None or entry[2] or self.calls >= self._next_agreement:
            return self._choose_slowly(nbytes)
        c = size_class(nbytes)
        self._count(c, entry[1])
        path = self.forced or entry[0]
        if self._confirming:
            self._count_toward_confirmation(c, path)
        self._history.append([time.time(), self.calls, 1, nbytes, path, False])
        self._last_path = path
        return path, self._measure(path, c, entry[1])

    def run_length(self, nbytes: int, path: str) -> tuple[int, int, int]:
        """How many calls of ``nbytes`` right after the one ``choose`` just answered (with
        ``path``, measured or not) would be answered ``path`` with nothing but counting (no
        agreement, probe or exploration due), and which of them are samples (timed; the others
        are not): the ``first``-th from now and every ``period``-th after it (``first`` 0: none).
        A caller may take them without asking, then report them with ``skip`` before its next
        ``choose``. The backend's gloo path does (a few attribute reads per call instead of
        ``choose``: at 2 workers / 4 B its per-call Python made the backend 1.2x plain gloo),
        and times the samples itself: asked for through ``choose``, a sample cost ~0.2 ms of each
        rank's CPU at 4 workers / 4 B (1.2 ms calls) and fell in 4 % of the sweep's repetitions
        there, each read 1.2-1.3x."""
        c = size_class(nbytes)
        entry = self._best.get(nbytes)
        if (entry is None or entry[2] or entry[1] >= self.measure_from_seconds or (self.forced or entry[0]) != path
                or self.timings[path].filling(c) or c in self._confirming):
            return 0, 0, 0
        calls = max(0, self._next_agreement - self.calls - 1)
        first, period = self._samples_ahead(c, entry[1])
        return calls, (first if first <= calls else 0), period

    def _samples_ahead(self, c: int, seconds: float) -> tuple[int, int]:
        """Which calls of size class ``c``, ``seconds`` predicted each, from now, are sampled
        (``_sample_due``) if nothing else comes between: the ``first``-th and every
        ``period``-th after it."""
        by_calls = self.sample_every - (self.calls - self._sampled_at)
        by_time = int(np.ceil((self.sample_seconds - self._unsampled_s[c]) / max(seconds, 1e-9)))
        period = max(self.sample_every, int(np.ceil(self.sample_seconds / max(seconds, 1e-9))), 1)
        return max(1, by_calls, by_time), period

    def skip(self, count: int) -> None:
        """``count`` calls were taken as ``run_length`` allowed, after the last ``choose``:
        counted, in the budget, the samples and the history, as ``choose`` would have."""
        if count <= 0:
            return
        run = self._history[-1]
        nbytes, c = run[3], size_class(run[3])
        seconds = self._best[nbytes][1]
        first, period = self._samples_ahead(c, seconds)
        self._count(c, seconds, count)
        if first <= count:   # samples among them: counted from the last one
            last = first + (count - first) // period * period
            self._sampled_at = self.calls + last
            self._unsampled_s[c] = self._untimed_s[c] = (count - last) * seconds
        self.calls += count
        run[2] += count

    def _count(self, c: int, seconds: float, calls: int = 1) -> None:
        """``calls`` calls of size class ``c``, each predicted to take ``seconds``: what they
        add to the class's exploration budget and to the time the agreements' budget counts."""
        self._credit[c] += calls * self.explore_budget * seconds
        self._predicted_s += calls * seconds
        self._unsampled_s[c] += calls * seconds
        self._untimed_s[c] += calls * seconds

    def _measure(self, path: str, c: int, seconds: float) -> bool:
        """Whether to time this call, of size class ``c`` and predicted to take ``seconds``: every
        call of a size class whose times on ``path`` do not fill its ring yet (a path just taken
        on one exploration's time gets its figure from its next calls, not from five samples
        later: one lucky exploration kept the host lane on 16 KiB calls at 1.7x gloo's time),
        from ``measure_from_seconds`` up one per ``measure_every_seconds`` of the class's
        predicted time, and a sample (``_sample_due``)."""
        if seconds >= self.measure_from_seconds:   # takes no sample's turn
            timed = self._untimed_s[c] >= self.measure_every_seconds or self.timings[path].filling(c)
        else:
            timed = self._sample_due(c) or self.timings[path].filling(c)
        if timed:
            self._untimed_s[c] = 0.0
        return timed

    def _sample_due(self, c: int) -> bool:
        """Whether this call of size class ``c`` is a sample: ``sample_every`` calls since the
        last sample and ``sample_seconds`` of the class's predicted time since its own. Only
        samples move this count, and they follow from call numbers and agreed figures alone:
        counted from any timed call, a rank's own ring count (a ring still filling) moved its
        samples off the other ranks', and a 12 ms class, timed on every call, kept a 256 KiB
        class beside it unsampled for 3,300 simulated calls."""
        if self.calls - self._sampled_at < self.sample_every or self._unsampled_s[c] < self.sample_seconds:
            return False
        self._sampled_at, self._unsampled_s[c] = self.calls, 0.0
        return True

    def _choose_slowly(self, nbytes: int) -> tuple[str, bool]:
        """``choose`` at an agreement, a size not seen since the last one, or a probe."""
        scheduled = self.calls >= self._next_scheduled
        if scheduled and self._predicted_s < self._due_s:   # its calls have come, not its time
            scheduled = False
            self._postpone_scheduled()
        agreement = scheduled or (self._soon and self.calls >= self._next_agreement)
        if agreement:
            self.agree()
            if scheduled:
                self._next_scheduled = self._scheduled_floor = self.calls + min(self.calls, self.agree_every)
                self._scheduled_at, self._predicted_s = self.calls, 0.0
                self._due_s = self.agreement_s / self.agree_budget
            self._next_agreement, self._soon = self._next_scheduled, False
        c = size_class(nbytes)
        path, seconds, probing = self._fastest(nbytes)
        self._bring_scheduled_forward(seconds)
        explore, warm_up = self._probe(nbytes) if probing else (None, False)
        if explore is None and scheduled:   # the exploration pays for the agreement it brings too
            explore = self._exploration(nbytes, seconds + self.explore_budget * seconds + self._credit[c]
                                        - self.agreement_s)
            if explore is not None:
                self._credit[c] -= self.predict(explore, nbytes) - seconds + self.agreement_s
                self._explored_at[explore] = self.calls
                self.explorations += 1
                # a path not in use: its old times are stale, this call's is its figure, used
                # at once (restored to gloo's link, gloo waited 3 explorations, each ~100
                # steps apart, to outvote its throttled times)
                with self._lock:
                    self.timings[explore].forget(c)
                self._agree_soon()
        self._count(c, seconds)
        path = self.forced or explore or path
        if self._confirming:
            self._count_toward_confirmation(c, path)
        self._history.append([time.time(), self.calls, 1, nbytes, path, explore is not None])
        self._last_path = path
        return path, not warm_up and (explore is not None or self._measure(path, c, seconds))

    def _postpone_scheduled(self) -> None:
        """The scheduled agreement's calls (16, 32, 64, then every ``agree_every``) have come,
        but the calls since the last one are predicted to have taken less than ``1 /
        agree_budget`` times one agreement's own work (``agreement_s``): put it off by as many
        calls as that takes at their mean predicted time so far (checked again then). An
        agreement's summaries and refit took ~1 ms at 2 workers on the 2-core machine, its
        allreduce on gloo 0.3-2 ms more (its store exchange now 0.4): every 128 calls of 0.2 ms, and once more after each
        exploration, agreements cost 10-15 % of the time on the mean (the backend 1.2x gloo
        at 2 workers / 4 B)."""
        self._schedule_at(self._call_earning_due(self._predicted_s / max(1, self.calls - self._scheduled_at)))

    def _bring_scheduled_forward(self, seconds: float) -> None:
        """A put-off scheduled agreement comes sooner where calls of ``seconds`` (this call's
        size, a slow call: new since the last agreement, a probe) would earn its time sooner:
        reckoned at the mean of cheaper calls, it was put seconds away once the calls became
        dearer (at 8 workers, 1 KiB calls after 64 B ones: no exploration in 260 calls)."""
        if self._next_scheduled > self.calls and self._predicted_s < self._due_s:
            self._schedule_at(max(self._scheduled_floor, min(self._next_scheduled, self._call_earning_due(seconds))))

    def _call_earning_due(self, per_call: float) -> int:
        """The call by which calls of ``per_call`` predicted seconds from now on bring the
        calls' predicted time since the last scheduled agreement to its due."""
        return self.calls + max(1, int(np.ceil((self._due_s - self._predicted_s) / max(per_call, 1e-9))))

    def _schedule_at(self, call: int) -> None:
        """The next scheduled agreement at ``call`` (an unscheduled one due sooner stays due)."""
        self._next_scheduled = call
        self._next_agreement = min(self._next_agreement, call) if self._soon else call

    def _probe(self, nbytes: int) -> tuple[str | None, bool]:
        """The path this call probes (None: no probes left at its size), and whether the call
        is a warm-up: one path's probes after another, the one predicted slowest first (a job's
        or a benchmark's first call of a size is often a warm-up). Not in turns, and a path's
        first call right after another path's is untimed and not one of its probes: a call right
        after another path's runs slower (that path's tail still holds the CPU: gloo probes that
        alternated with inagg's took 3 ms where gloo's calls took 0.5, 2 workers / 256 KiB,
        load 12; gloo's first call after ten on the host lane took 0.56 ms, its next ones
        0.33-0.37, 2 workers / 16 KiB: one such call among a recheck's three counted against
        gloo). One warm-up per run: where calls of other sizes on other paths come between
        (the bandwidth flip's steps), each of its calls follows another path's, and a warm-up
        before each would never let the probes end. When the size's last probe is taken, the
        ranks agree at the next call so the probes are used at once."""
        c = size_class(nbytes)
        left = [p for p in self.paths if self._probes_left.get((p, c), 0)]
        if not left:
            return None, False
        path = max(left, key=lambda p: self.models[p].line(nbytes))
        if (path, c) in self._warm_up_due:
            self._warm_up_due.discard((path, c))
            if path != self._last_path:
                return path, True
        self._probes_left[(path, c)] -= 1
        self.probed += 1
        if not any(self._probes_left.get((p, c), 0) for p in self.paths):
            self._agree_soon()
        return path, False

    def _exploration(self, nbytes: int, affordable: float) -> str | None:
        """The path this agreement call explores, if any: the one explored least recently, once
        the budget affords it (predicted at most ``affordable`` seconds). Strictly in turns: a
        cheaper path must not spend the budget a dearer one is saving for (after gloo's link was
        restored, inagg's explorations kept gloo, throttled in the figures, from ever being
        retried)."""
        if self.forced:
            return None
        best = self.best(nbytes)
        due = min((p for p in self.paths if p != best), key=self._explored_at.__getitem__, default=None)
        return due if due is not None and self.predict(due, nbytes) <= affordable else None

    def history(self) -> list[dict]:
        """The last runs of calls, oldest first: each run's wall-clock time (of its first
        call), first call number, number of calls, payload bytes, path, and whether it explored
        (took a path the model did not choose; a run of one call)."""
        return [dict(time=t, call=c, calls=n, bytes=b, path=p, explored=e) for t, c, n, b, p, e in list(self._history)]

    def as_dict(self) -> dict:
        return {"agreed": {p: {"alpha_s": m.alpha, "beta_s_per_byte": m.beta,
                               "measured_s": {int(n): float(t) for n, t in zip(m.nbytes[m.seen], m.seconds[m.seen])}}
                           for p, m in self.models.items()},
                "paths": list(self.paths), "calls": self.calls, "agreements": self.agreements,
                "agreement_s": self.agreement_s,
                "explorations": self.explorations, "probes": self.probed,
                "explore_credit_s": {1 << 2 * int(c): float(self._credit[c]) for c in np.flatnonzero(self._credit)}}

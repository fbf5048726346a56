"""Which path one allreduce takes in the ``inagg`` backend: whichever of the job's paths (inagg on
the grant the controller gave, the host lane beside a grant on a switch, plain gloo) the model
predicts fastest, with gloo kept unless another path is clearly faster, so an inagg job is
never slower than gloo.

The choice has three parts, each in a module of its own:

* **Timings** (``inagg.hostlib.pytorch.path.timings``): each rank's own times of the last few measured
  calls, per path and size class (powers of 4 bytes).
* **Cost model** (``inagg.hostlib.pytorch.path.cost``): per path, the figures the ranks agreed on (per
  size class the median over its recent calls) and an alpha-beta line fitted to them, which
  predict what a call will take.
* **Links** (``inagg.hostlib.pytorch.path.links``), where their rate is known: the bytes each path puts
  on a host link, flat in the number of ranks for inagg, 2(N-1)/N of the tensor for gloo's ring;
  no call is predicted faster than its path's floor there, and where two paths' figures are
  both link-bound, ``link_margin`` replaces ``margin``. Each rank reads its own links, so the
  floors are the ranks' agreed ones (``agreed_links``: the slowest rate any rank reports).
* **The grant** (``inagg.hostlib.pytorch.path.links.GrantMove``): each agreement carries the newest
  inagg grant every rank has seen, offered or taken; a newer one drops inagg's figures and
  links, which were the old grant's, and probes it again (the probe's warm-up takes an offered
  grant).
* **Policy**: ``PathChooser`` below, which picks each call's path and decides when to measure
  and when the ranks agree, with its parts: the agreements' schedule and the choice of timed
  calls (``inagg.hostlib.pytorch.path.schedule``), probes of new sizes and explorations of paths not in
  use (``inagg.hostlib.pytorch.path.explore``), and the early checks of a size's path on its own calls
  (``inagg.hostlib.pytorch.path.confirm``). What may be tuned is ``PathChoiceOptions``
  (``inagg.hostlib.pytorch.path.options``).

**Agreeing.** Every rank must take the same path for the same call, but each measures its own
times. So decisions use *agreed* figures only: at calls every rank reaches alike, the ranks
combine their timings with one exchange taking minima over ranks (``agree``; the backend's goes
through the job's store, ``inagg.hostlib.pytorch.agreement``), every rank fits the same models, and
every rank computes the same choices until the next agreement. Every rank also times the same
calls, so the k-th measured call of a class is the same call everywhere. Where the ranks share
a clock (``shared_clock``: one kernel), a call's agreed time runs from the last rank's start to
the last rank's end: what the job waits for, without the ranks' arrival skew. Otherwise it is
the minimum over ranks of each rank's time, because a rank's time includes waiting for the
ranks that arrived later.

**Choosing.** ``prefer`` (gloo, the baseline) keeps a call unless another path is predicted
faster by more than ``margin``, because where paths are that close their figures on a shared
machine are noise; by more than ``link_margin`` where both are link-bound, because then their
difference is the bytes each puts on the links. A path must have been measured at the call's size class to take it from
``prefer`` (a line alone extrapolates too far), and by ``trusted`` calls unless it looks twice
as fast. ``forced`` pins every call to one path (``INAGG_ALLREDUCE_PATH`` in the backend), for
tests and comparisons; what runs is still measured and agreed on. ``history()`` is the per-call
record; ``as_dict()`` the agreed figures and counters.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from inagg.hostlib.pytorch.path.confirm import Confirmations
from inagg.hostlib.pytorch.path.cost import PathModel, fit_alpha_beta, row_medians
from inagg.hostlib.pytorch.path.explore import ExplorationBudget, Probes
from inagg.hostlib.pytorch.path.links import GrantMove, LinkShape, agreed_links, link_vector
from inagg.hostlib.pytorch.path.news import GrantNews
from inagg.hostlib.pytorch.path.options import PathChoiceOptions
from inagg.hostlib.pytorch.path.schedule import AgreementSchedule, Sampler
from inagg.hostlib.pytorch.path.timings import SIZE_CLASSES, UNSEEN, PathTimings, size_class

__all__ = ["PATHS", "SIZE_CLASSES", "ChoiceStats", "PathChoiceOptions", "PathChooser", "PathModel", "PathTimings",
           "fit_alpha_beta", "row_medians", "size_class"]

# inagg on the job's grant (the switch, or the host aggregator where the controller grants that),
# the job's host lane (the host aggregator beside a grant on a switch), gloo
PATHS = ("inagg", "host", "gloo")


class _Best(NamedTuple):
    """A call size's choice until the next agreement."""
    path: str          # the fastest path at the agreed figures
    seconds: float     # its predicted seconds
    probing: bool      # whether the size's class still has probes to take


@dataclass
class ChoiceStats:
    """What the chooser did, for reports (no decision reads it)."""
    agreements: int = 0
    news: int = 0          # agreements the gloo calls' news of a newer grant brought (``GrantNews``)
    explorations: int = 0
    probes: int = 0
    calibration: dict = field(default_factory=dict)   # what the backend's calibration ran (``CalibrationPlan.record``)


def _check_paths(paths: Sequence[str], forced: str | None) -> None:
    """Raise ValueError unless ``paths`` are distinct names and ``forced`` is None or one of them."""
    if len(set(paths)) != len(paths) or not paths:
        raise ValueError(f"paths must be distinct names, got {paths}")
    if forced is not None and forced not in paths:
        raise ValueError(f"a forced path must be one of {', '.join(paths)}, got {forced!r}")


class PathChooser:
    """Per-call path choice, identical on every rank (module docstring). ``agree`` combines
    every rank's vector by elementwise minimum (a collective); ``options`` (or keyword
    overrides of its fields) tune the choice; ``links``: this rank's links, where their rate is
    known (the ranks agree on the job's, ``agree``); ``move``: how it learns that the inagg path's grant is about to move (``GrantMove``);
    ``news``: the gloo calls' news of a move (``GrantNews``, over ``move``); ``clock`` times the agreements' own work."""

    def __init__(self, agree: Callable[[np.ndarray], np.ndarray], paths: Sequence[str] = ("inagg", "gloo"),
                 options: PathChoiceOptions | None = None, *, forced: str | None = None, shared_clock: bool = False,
                 links: LinkShape | None = None, move: GrantMove | None = None, news: GrantNews | None = None,
                 clock: Callable[[], float] = time.perf_counter, **overrides: Any) -> None:
        options = replace(options or PathChoiceOptions(), **overrides)
        _check_paths(paths, forced)
        self.options, self.paths, self.forced, self.shared_clock = options, tuple(paths), forced, shared_clock
        self.links, self._move = links, move   # the agreed links (``agree``); this rank's until then
        self._own_links = links   # this rank's, under the grant of epoch ``_own_epoch`` (``agree``)
        self._grant_epoch = move.epoch() if move else 0   # the inagg grant the figures are of
        self._own_epoch = float(self._grant_epoch)
        self.news = news
        if news is not None:
            news.agreed = self._grant_epoch
        self.prefer = options.prefer if options.prefer in self.paths else None
        self._agree_fn, self._clock = agree, clock
        self._lock = threading.Lock()   # ``observe`` may come from any thread
        self.timings = {p: PathTimings(options.per_class, shared_clock) for p in self.paths}
        summary_length = len(self.timings[self.paths[0]].summary())
        self.models = {p: PathModel.unseen(summary_length, shared_clock) for p in self.paths}
        self._schedule = AgreementSchedule(options.agree_every, options.agree_budget, options.agree_seconds)
        self._sampler = Sampler(options)
        self._probes = Probes(self.paths, options)
        self._budget = ExplorationBudget(self.paths, options.explore_budget)
        self._confirm = Confirmations(self.prefer, options.per_class, options.probe_ratio)
        self._best: dict[int, _Best] = {}   # per call size, until the next agreement
        self._prefer_probes: dict[int, int] = {}   # size class -> the call of ``prefer``'s last probe there
        # runs of calls: [wall-clock time, first call, calls, payload bytes, path, explored]
        self._history: deque[list] = deque(maxlen=options.history)
        self._last_path: str | None = None   # the last call's path (a probe run's warm-up)
        self._own_agreement_s = UNSEEN        # this rank's time for the last agreement's own work
        self.agreement_s = 0.0                # one agreement's own work, agreed (0: none yet)
        self.calls = 0
        self.stats = ChoiceStats()

    @property
    def agreements(self) -> int:
        """Agreements so far."""
        return self.stats.agreements

    @property
    def explorations(self) -> int:
        """Explorations so far."""
        return self.stats.explorations

    @property
    def probed(self) -> int:
        """Probe calls taken so far (warm-ups aside)."""
        return self.stats.probes

    @property
    def agreed(self) -> dict[str, tuple[float, float]]:
        """Each path's agreed alpha and beta."""
        return {p: (m.alpha, m.beta) for p, m in self.models.items()}

    # -- measurements and predictions ----------------------------------------------------------

    def observe(self, path: str, nbytes: int, seconds: float, started: float = 0.0) -> None:
        """One call of ``nbytes`` payload took ``seconds`` on ``path`` from ``started`` (on
        the clock every rank shares, where they do: ``shared_clock``; any thread)."""
        with self._lock:
            self.timings[path].observe(nbytes, seconds, started)

    def predict(self, path: str, nbytes: int) -> float:
        """Seconds of an allreduce of ``nbytes`` on ``path`` at the agreed figures, never under
        the path's floor on the links (where their rate is known)."""
        seconds = self.models[path].predict(nbytes)
        return seconds if self.links is None else max(seconds, self.links.floor(path, nbytes))

    def best(self, nbytes: int) -> str:
        """The path the model predicts fastest for ``nbytes``."""
        return self._fastest(nbytes).path

    def fastest_seconds(self, nbytes: float) -> float:
        """Predicted seconds of an allreduce of ``nbytes`` on the fastest path."""
        return self._fastest(nbytes).seconds

    def agree(self) -> None:
        """Combine every rank's timings (each measured call's minimum over ranks) and fit every
        path's model to the result, and its links (under the grant it takes next) into the
        job's (``agreed_links``); a collective, so every rank must call it at the same point."""
        started = self._clock()
        grant = float(self._move.next_epoch()) if self._move else 0.0
        links = link_vector(self._links_under(grant), self.paths)
        with self._lock:
            local = np.concatenate([self.timings[p].summary() for p in self.paths]
                                   + [links, [grant, self._own_agreement_s]])
        sent = self._clock()
        agreed = self._agree_fn(local)
        received = self._clock()
        if np.isfinite(agreed[-1]):
            self.agreement_s = float(agreed[-1])
        tail = len(links) + 2
        self.links = agreed_links(agreed[-tail:-2], self.paths)
        combined = agreed[:-tail].reshape(len(self.paths), -1)
        self.models = {p: self.models[p].refit(combined[i], self.shared_clock) for i, p in enumerate(self.paths)}
        if agreed[-2] > self._grant_epoch:   # every rank has seen a newer grant, offered or taken
            self._grant_epoch = int(agreed[-2])
            self._grant_moves("inagg")
            if self.news is not None:
                self.news.agreed = self._grant_epoch
        self._best.clear()
        self.stats.agreements += 1
        self._retime_slowed_classes()
        # its own work only: the exchange crosses a link and costs what the link does, so
        # budgeting it would let a slow link push the agreements far apart
        self._own_agreement_s = (sent - started) + (self._clock() - received)

    def _links_under(self, epoch: float) -> LinkShape | None:
        """This rank's links under the grant of ``epoch`` (the one it takes next), read again
        only when that grant changes: reading them asks the kernel about every interface."""
        if self._move is not None and epoch != self._own_epoch:
            self._own_links, self._own_epoch = self._move.links(), epoch
        return self._own_links

    def ran_last(self, path: str) -> None:
        """The calls right before the next one ran on ``path`` without ``choose`` (the
        backend's calibration): a probe run there needs no warm-up, as after a chosen call."""
        if path not in self.paths:
            raise ValueError(f"{path!r} is not one of this chooser's paths ({', '.join(self.paths)})")
        self._last_path = path

    # -- per call ------------------------------------------------------------------------------

    def choose(self, nbytes: int) -> tuple[str, bool]:
        """The path of the next call, and whether to time it (every rank calls this once per
        eligible allreduce, in the same order)."""
        self.calls += 1
        if self.news is not None and self.news.owed and self.news.heard(self.calls):
            self._schedule.agree_at_next_call(self.calls - 1)   # every rank saw a newer grant: agree now
            self.stats.news += 1
        entry = self._best.get(nbytes)
        if entry is None or entry.probing or self.calls >= self._schedule.next_agreement:
            return self._decide(nbytes)
        c = size_class(nbytes)
        self._account(c, entry.seconds)
        path = self.forced or entry.path
        self._record(nbytes, c, path, explored=False)
        return path, self._timed(path, c, entry.seconds)

    def run_length(self, nbytes: int, path: str) -> tuple[int, int, int]:
        """How many calls of ``nbytes`` right after the one ``choose`` just answered (with
        ``path``, measured or not) would be answered ``path`` with nothing but counting (no
        agreement, probe, exploration or confirmation due), and which of them are samples
        (timed; the others are not): the ``first``-th from now and every ``period``-th after it
        (``first`` 0: none). A caller may take them without asking, then report them with
        ``skip`` before its next ``choose``: this spares a hot loop of small calls the
        chooser's per-call Python. None while this rank holds news to hear (``GrantNews.owed``)."""
        c = size_class(nbytes)
        entry = self._best.get(nbytes)
        owed = self.news is not None and self.news.owed
        if (entry is None or owed or entry.probing or self._sampler.timed_by_time(entry.seconds)
                or (self.forced or entry.path) != path or self.timings[path].filling(c) or c in self._confirm.waiting):
            return 0, 0, 0
        calls = self._schedule.calls_before_next(self.calls)
        first, period = self._sampler.samples_ahead(self.calls, c, entry.seconds)
        return calls, (first if first <= calls else 0), period

    def skip(self, count: int) -> None:
        """``count`` calls were taken as ``run_length`` allowed, after the last ``choose``:
        counted, in the budgets, the samples and the history, as ``choose`` would have."""
        if count <= 0:
            return
        run = self._history[-1]
        nbytes, c = run[3], size_class(run[3])
        seconds = self._best[nbytes].seconds
        self._budget.earn(c, seconds, count)
        self._schedule.count(seconds, count)
        self._sampler.skip(self.calls, c, seconds, count)
        self.calls += count
        run[2] += count

    def _decide(self, nbytes: int) -> tuple[str, bool]:
        """``choose`` where counting is not enough: at an agreement, a size not seen since the
        last one, or a probe."""
        scheduled = self._agree_if_due()
        c = size_class(nbytes)
        path, seconds, probing = self._fastest(nbytes)
        self._schedule.reprice(self.calls, seconds)
        explore, warm_up = self._take_probe(nbytes, c) if probing else (None, False)
        if explore is None and scheduled:   # only a scheduled agreement explores
            explore = self._explore(nbytes, c, seconds)
        self._account(c, seconds)
        path = self.forced or explore or path
        self._record(nbytes, c, path, explored=explore is not None)
        return path, not warm_up and (explore is not None or self._timed(path, c, seconds))

    def _agree_if_due(self) -> bool:
        """Agree if this call holds an agreement; whether it is a scheduled one."""
        agreement, scheduled = self._schedule.check(self.calls)
        if agreement:
            self.agree()
            self._schedule.agreed(self.calls, scheduled, self.agreement_s)
        return scheduled

    def _account(self, c: int, seconds: float) -> None:
        """One call of size class ``c``, predicted ``seconds``: counted in the exploration
        budget, the agreements' schedule and the samples."""
        self._budget.earn(c, seconds)
        self._schedule.count(seconds)
        self._sampler.count(c, seconds)

    def _record(self, nbytes: int, c: int, path: str, explored: bool) -> None:
        """This call, of ``nbytes`` (size class ``c``), takes ``path``: counted toward its
        class's confirmation, and recorded in the history."""
        if self._confirm.waiting:
            self._count_toward_confirmation(c, path)
        self._history.append([time.time(), self.calls, 1, nbytes, path, explored])
        self._last_path = path

    def _timed(self, path: str, c: int, seconds: float) -> bool:
        """Whether to time this call on ``path``, of size class ``c`` and predicted ``seconds``:
        every call while the path's ring there fills, otherwise as ``Sampler`` says."""
        return self._sampler.timed(self.calls, c, seconds, self.timings[path].filling(c))

    # -- which path ----------------------------------------------------------------------------

    def _fastest(self, nbytes: int) -> _Best:
        """The fastest path for ``nbytes`` at the agreed figures (``_pick``), its predicted
        seconds, and whether the size's class still has probes to take; remembered per size
        until the next agreement (a training job repeats a handful of sizes)."""
        entry = self._best.get(nbytes)
        if entry is None:
            c = size_class(nbytes)
            eligible = [p for p in self.paths if p == self.prefer or self.models[p].seen[c]] or self.paths
            path, seconds = self._pick(nbytes, c, eligible)
            margins = {p: self._margin(p, nbytes) for p in self.paths if p != self.prefer}
            floors = {p: self.links.floor(p, nbytes) for p in self.paths} if self.links else None
            probing = not self.forced and self._probes.plan(self.models, self.prefer, nbytes, seconds, margins, floors)
            entry = self._best[nbytes] = _Best(path, seconds, probing)
            if not self.forced:
                self._confirm.track(c, path, self.models, path != self.prefer and self._link_bound(path, nbytes))
        return entry

    def _pick(self, nbytes: int, c: int, eligible: list[str]) -> tuple[str, float]:
        """The fastest of the ``eligible`` paths for ``nbytes`` (size class ``c``) and its
        predicted seconds: paths other than ``prefer`` compared by their predicted time times
        their handicap, ``prefer`` kept unless one of them is faster than it by that path's
        margin (``_margin``); ties: the earlier path."""
        predicted = {p: self.predict(p, nbytes) for p in eligible}
        others = [(p, s * self._handicap(p, c)) for p, s in predicted.items() if p != self.prefer]
        if self.prefer in predicted:
            kept, order = predicted[self.prefer], self.paths.index
            others = [(p, k) for p, k in others
                      if (k, order(p)) < (kept * (1 - self._margin(p, nbytes)), order(self.prefer))]
            if not others:
                return self.prefer, kept
        path = min(others, key=lambda e: e[1])[0]
        return path, predicted[path]

    def _handicap(self, path: str, c: int) -> float:
        """The factor on ``path``'s predicted time at size class ``c`` when it is compared: 2
        while fewer than ``trusted`` calls measured it there (one lucky probe or exploration
        must not win the class), else 1."""
        return 1.0 if self.models[path].samples[c] >= self.options.trusted else 2.0

    def _margin(self, path: str, nbytes: int) -> float:
        """How much faster than ``prefer`` ``path`` must be predicted at ``nbytes`` to take its
        calls: ``link_margin`` where both are predicted link-bound there (within
        ``link_bound`` of their floors), else ``margin``."""
        return self.options.link_margin if self._link_bound(path, nbytes) else self.options.margin

    def _link_bound(self, path: str, nbytes: int) -> bool:
        """Whether ``path`` and ``prefer`` are both predicted within ``link_bound`` of their
        floors at ``nbytes`` (the links' rate known): their difference is the links'."""
        if self.links is None or self.prefer is None:
            return False
        bound = self.options.link_bound
        return all(self.predict(p, nbytes) <= bound * self.links.floor(p, nbytes) for p in (path, self.prefer))

    # -- measuring paths not in use ------------------------------------------------------------

    def _take_probe(self, nbytes: int, c: int) -> tuple[str | None, bool]:
        """The path this call of ``nbytes`` (size class ``c``) probes, if any, and whether it
        is an untimed warm-up; once the class's last probe is taken, the ranks agree at the
        next call so the probes are used at once."""
        path, warm_up = self._probes.take(self.models, nbytes, self._last_path)
        if path is not None and not warm_up:
            self.stats.probes += 1
            if path == self.prefer:
                self._prefer_probes[c] = self.calls
            if not self._probes.pending(c):
                self._schedule.agree_at_next_call(self.calls)
        return path, warm_up

    def _explore(self, nbytes: int, c: int, seconds: float) -> str | None:
        """The path this scheduled agreement's call explores, if its turn has come and its
        class's budget affords it (its extra time and the agreement it brings): its old times
        there go, so this call's time is its figure, agreed on at the next call."""
        if self.forced:
            return None
        affordable = self._budget.affordable(c, seconds, self.agreement_s)
        path = self._budget.next_turn(self.best(nbytes))
        if path is None or not self.predict(path, nbytes) <= affordable:
            return None
        self._budget.spend(c, self.predict(path, nbytes) - seconds + self.agreement_s, path, self.calls)
        self.stats.explorations += 1
        with self._lock:
            self.timings[path].forget(c)
        self._schedule.agree_at_next_call(self.calls)
        return path

    def _grant_moves(self, path: str) -> None:
        """``path``'s grant moves (every rank has seen a newer one, offered or already taken):
        its figures are the old grant's, so they go (the links ``agree`` took are the new
        grant's: each rank sent those of the grant it takes next), and each
        size class it was measured at probes it again. Where the grant is only offered, the
        probe's untimed warm-up is a call on ``path``, at whose end the ranks take it
        (``inagg.hostlib.worker.communicator``), so the timed probes measure the new grant."""
        if self.forced or path not in self.paths:
            return
        measured = np.flatnonzero(self.models[path].seen)
        with self._lock:
            for c in measured:
                self.timings[path].forget(int(c))
        self.models[path] = PathModel.unseen(len(self.timings[path].summary()), self.shared_clock)
        for c in measured:
            self._probes.schedule(path, int(c), self.options.probes)

    # -- confirming a class's path on its own calls --------------------------------------------

    def _count_toward_confirmation(self, c: int, path: str) -> None:
        """A call of size class ``c`` took ``path``: once the calls its class waits for are
        taken, the ranks agree at the next call, or, where the class just left ``prefer``,
        ``prefer`` is rechecked first."""
        done = self._confirm.count(c, path)
        if done is None:
            return
        if done.left_prefer and self.prefer is not None and not self._prefer_probes_trusted(c):
            self._recheck_prefer(c, done.path)
            return
        if done.left_prefer and self.prefer is not None:   # its probes were the recheck: counted as one
            self._confirm.start_recheck(c)
        self._schedule.agree_at_next_call(self.calls)

    def _prefer_probes_trusted(self, c: int) -> bool:
        """Whether ``prefer``'s figure at size class ``c`` can stand for the recheck that
        leaving ``prefer`` takes: it is its own probes' (taken within the class's probe round
        and confirmation: both paths' probes, their warm-ups and ``per_class`` calls), so it is
        fresh, and within ``probe_ratio`` of what ``prefer``'s other sizes' line says (a
        path's first calls at a new size may be slow: gloo's slow mode on a shared machine).
        Then a new class's calls do not go back to ``prefer`` for a recheck after its
        confirmation (four calls on the slower path after the 8th: issue 36)."""
        window = 2 * (self.options.probes + 1) + self.options.per_class
        if self.calls - self._prefer_probes.get(c, -window - 1) > window:
            return False
        model = self.models[self.prefer]
        expected = model.line_elsewhere(c)
        return expected is not None and model.seconds[c] <= self.options.probe_ratio * expected

    def _recheck_prefer(self, c: int, path: str) -> None:
        """Probe ``prefer`` and ``path`` again at size class ``c``, ``trusted`` calls each in a
        run, so leaving ``prefer`` rests on fresh times of both (``prefer``'s older times there
        go at the first recheck; ``path``'s newest calls stay, a majority of its ring)."""
        if self._confirm.start_recheck(c):
            with self._lock:
                self.timings[self.prefer].forget(c)
        for p in (self.prefer, path):
            self._probes.schedule(p, c, self.options.trusted)
        for nbytes in [n for n in self._best if size_class(n) == c]:
            del self._best[nbytes]   # the class's next call plans its probes (``_fastest``)

    def _retime_slowed_classes(self) -> None:
        """Where a size class's newest agreed call on its path was slower than its other recent
        ones by ``measure_from_seconds`` or more, drop the older times (``Confirmations``)."""
        if self.forced:
            return
        for path, c in self._confirm.slowed(self.models, self.options.measure_from_seconds):
            with self._lock:
                self.timings[path].forget(c, keep_newest=True)

    # -- reports -------------------------------------------------------------------------------

    def history(self) -> list[dict]:
        """The last runs of calls, oldest first: each run's wall-clock time (of its first
        call), first call number, number of calls, payload bytes, path, and whether it explored
        (took a path the model did not choose; a run of one call)."""
        return [dict(time=t, call=c, calls=n, bytes=b, path=p, explored=e) for t, c, n, b, p, e in list(self._history)]

    def as_dict(self) -> dict:
        """The agreed figures and lines per path, and the chooser's counters."""
        credit = self._budget.credit
        return {"agreed": {p: {"alpha_s": m.alpha, "beta_s_per_byte": m.beta,
                               "measured_s": {int(n): float(t) for n, t in zip(m.nbytes[m.seen], m.seconds[m.seen])}}
                           for p, m in self.models.items()},
                "paths": list(self.paths), "calls": self.calls, "agreements": self.agreements,
                "agreement_s": self.agreement_s,
                "explorations": self.explorations, "probes": self.probed, "news": self.stats.news,
                "calibration": self.stats.calibration,
                "explore_credit_s": {1 << 2 * int(c): float(credit[c]) for c in np.flatnonzero(credit)}}

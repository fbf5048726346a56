"""When the path choice (``inagg.hostlib.pytorch.path.choice``) acts between calls: which call holds the
ranks' next agreement (``AgreementSchedule``), and which calls are timed (``Sampler``).

Both follow from call numbers, the options and agreed figures only, never from a rank's own
measurements, so every rank agrees at the same calls and times the same calls; and both count
calls by their *predicted* time, so their cost stays a fraction of the calls' own time whatever
the calls' size.
"""

from __future__ import annotations

import numpy as np

from inagg.hostlib.pytorch.path.options import FIRST_AGREEMENT, PathChoiceOptions
from inagg.hostlib.pytorch.path.timings import SIZE_CLASSES


class AgreementSchedule:
    """Which call holds the next agreement. *Scheduled* agreements come at calls 16, 32, 64,
    then every ``agree_every``, but no sooner than the calls since the last one are predicted
    to have taken ``1 / agree_budget`` times one agreement's own work: a scheduled agreement
    whose calls have come but whose time has not is put off by as many calls as that takes;
    and no later than the calls are predicted to have taken ``agree_seconds`` (dear calls).
    *Unscheduled* ones come at the next call, asked for by the chooser (a new size's probes
    are done, an exploration or a class's confirming calls were taken); they leave the
    scheduled one where it is."""

    def __init__(self, agree_every: int, agree_budget: float, agree_seconds: float = float("inf")) -> None:
        self.agree_every, self.agree_budget, self.agree_seconds = agree_every, agree_budget, agree_seconds
        self.next_agreement = FIRST_AGREEMENT   # the next agreement's call, scheduled or not
        self._next_scheduled = FIRST_AGREEMENT  # the next scheduled one's call ...
        self._floor = FIRST_AGREEMENT           # ... which coming sooner does not move before this call
        self._scheduled_at = 0                  # the call of the last scheduled one
        self._soon = False                      # an unscheduled one is due at ``next_agreement``
        self._predicted_s = 0.0                 # predicted seconds of the calls since the last scheduled one
        self._due_s = 0.0                       # ... that the next scheduled one waits for

    def count(self, seconds: float, calls: int = 1) -> None:
        """``calls`` calls predicted to take ``seconds`` each were made."""
        self._predicted_s += calls * seconds

    def agree_at_next_call(self, calls: int) -> None:
        """Ask for an unscheduled agreement at the call after call ``calls``."""
        self.next_agreement, self._soon = min(self.next_agreement, calls + 1), True

    def check(self, calls: int) -> tuple[bool, bool]:
        """Whether call ``calls`` holds an agreement, and whether that is the scheduled one; a
        scheduled one whose time has not come is put off here."""
        scheduled = calls >= self._next_scheduled
        if scheduled and self._predicted_s < self._due_s:
            scheduled = False
            self._postpone(calls)
        return scheduled or (self._soon and calls >= self.next_agreement), scheduled

    def agreed(self, calls: int, scheduled: bool, agreement_s: float) -> None:
        """The ranks agreed at call ``calls`` (``check``'s answer: ``scheduled``); one
        agreement's own work now takes ``agreement_s``, which prices the next scheduled one."""
        if scheduled:
            self._next_scheduled = self._floor = calls + min(calls, self.agree_every)
            self._scheduled_at, self._predicted_s = calls, 0.0
            self._due_s = agreement_s / self.agree_budget
        self.next_agreement, self._soon = self._next_scheduled, False

    def reprice(self, calls: int, seconds: float) -> None:
        """A put-off scheduled agreement comes sooner where calls of ``seconds`` each would
        earn its time sooner than the cheaper calls it was reckoned at (never before its
        floor); and by the call where calls of ``seconds`` reach ``agree_seconds`` (floor or
        not)."""
        if self._next_scheduled > calls and self._predicted_s < self._due_s:
            self._schedule_at(min(self._next_scheduled, max(self._floor, self._call_reaching_due(calls, seconds))))
        left = self.agree_seconds - self._predicted_s
        latest = calls + max(1, int(np.ceil(left / max(seconds, 1e-9)))) if np.isfinite(left) else self._next_scheduled
        if latest < self._next_scheduled:
            self._schedule_at(max(latest, calls + 1))

    def calls_before_next(self, calls: int) -> int:
        """How many calls after call ``calls`` come before the next agreement's."""
        return max(0, self.next_agreement - calls - 1)

    def _postpone(self, calls: int) -> None:
        """Put the scheduled agreement off, reckoning the calls to come at the mean predicted
        time of those since the last scheduled one."""
        per_call = self._predicted_s / max(1, calls - self._scheduled_at)
        self._schedule_at(self._call_reaching_due(calls, per_call))

    def _call_reaching_due(self, calls: int, per_call: float) -> int:
        """The call by which calls of ``per_call`` predicted seconds from call ``calls`` on
        bring the predicted time since the last scheduled agreement to its due."""
        return calls + max(1, int(np.ceil((self._due_s - self._predicted_s) / max(per_call, 1e-9))))

    def _schedule_at(self, call: int) -> None:
        """The next scheduled agreement at ``call`` (an unscheduled one due sooner stays due)."""
        self._next_scheduled = call
        self.next_agreement = min(self.next_agreement, call) if self._soon else call


class Sampler:
    """Which calls are timed, on top of those the chooser always times (probes, explorations,
    and every call of a class whose ring on its path is still filling). A call predicted
    under ``measure_from_seconds`` is timed when it is a *sample*: ``sample_every`` calls
    after the last sample and ``sample_seconds`` of its class's predicted time after the
    class's own last one, so the classes where the time goes are sampled most. A dearer call is
    timed once ``measure_every_seconds`` of its class's predicted time has passed since the
    class's last timed call. Only samples move the sample count, so a rank's own ring state
    never shifts its samples off the other ranks'."""

    def __init__(self, options: PathChoiceOptions) -> None:
        self._every, self._seconds = options.sample_every, options.sample_seconds
        self._from_s, self._every_s = options.measure_from_seconds, options.measure_every_seconds
        self._sampled_at = 0                          # the call of the last sample
        self._unsampled_s = np.zeros(SIZE_CLASSES)    # per class, predicted seconds since its last sample
        self._untimed_s = np.zeros(SIZE_CLASSES)      # per class, predicted seconds since its last timed call

    def timed_by_time(self, seconds: float) -> bool:
        """Whether calls predicted to take ``seconds`` are timed by time rather than sampled."""
        return seconds >= self._from_s

    def count(self, c: int, seconds: float, calls: int = 1) -> None:
        """``calls`` calls of size class ``c``, predicted ``seconds`` each, were made."""
        self._unsampled_s[c] += calls * seconds
        self._untimed_s[c] += calls * seconds

    def timed(self, calls: int, c: int, seconds: float, filling: bool) -> bool:
        """Whether call ``calls`` (size class ``c``, predicted ``seconds``) is timed, given
        whether its path's ring there is still ``filling``."""
        if self.timed_by_time(seconds):   # takes no sample's turn
            timed = self._untimed_s[c] >= self._every_s or filling
        else:
            timed = self._sample_due(calls, c) or filling
        if timed:
            self._untimed_s[c] = 0.0
        return timed

    def samples_ahead(self, calls: int, c: int, seconds: float) -> tuple[int, int]:
        """Which calls of size class ``c``, ``seconds`` predicted each, after call ``calls``
        are samples if nothing else comes between: the ``first``-th and every ``period``-th
        after it."""
        by_calls = self._every - (calls - self._sampled_at)
        by_time = int(np.ceil((self._seconds - self._unsampled_s[c]) / max(seconds, 1e-9)))
        period = max(self._every, int(np.ceil(self._seconds / max(seconds, 1e-9))), 1)
        return max(1, by_calls, by_time), period

    def skip(self, calls: int, c: int, seconds: float, count: int) -> None:
        """``count`` calls of size class ``c`` after call ``calls`` were taken without asking
        (``PathChooser.run_length``), their samples timed by the caller: counted as if asked."""
        first, period = self.samples_ahead(calls, c, seconds)
        self.count(c, seconds, count)
        if first <= count:   # samples among them: counted from the last one
            last = first + (count - first) // period * period
            self._sampled_at = calls + last
            self._unsampled_s[c] = self._untimed_s[c] = (count - last) * seconds

    def _sample_due(self, calls: int, c: int) -> bool:
        """Whether call ``calls``, of size class ``c``, is a sample (and if so, count it)."""
        if calls - self._sampled_at < self._every or self._unsampled_s[c] < self._seconds:
            return False
        self._sampled_at, self._unsampled_s[c] = calls, 0.0
        return True

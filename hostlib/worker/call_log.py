"""A rank's account of its job: every grant it used (when, from which call, where and why) and
how long its calls took, so a run can tell each job's story (``Communicator.stats``: the
emulation's summary prints it).

Call times are kept for the last CALLS_KEPT calls (a training run makes calls without end); a
median over calls older than that is taken over those still kept."""

from __future__ import annotations

import itertools
import statistics
import time
from collections import deque

from inagg.hostlib.wire.grant import Grant

CALLS_KEPT = 1 << 16


class CallLog:
    """Grants used and call durations, in the order they happened."""

    def __init__(self) -> None:
        self.began = time.monotonic()
        self.grants: list[dict] = []
        self.seconds: deque[float] = deque(maxlen=CALLS_KEPT)
        self.calls = 0   # calls timed so far

    def use(self, grant: Grant) -> None:
        """``grant`` is used from the next call on."""
        self.grants.append({"seconds": round(time.monotonic() - self.began, 3), "from_call": self.calls,
                            "mode": grant.mode, "aggregator": "%s:%d" % grant.aggregator,
                            "epoch": grant.epoch,
                            "slots": f"[{grant.slot_base},{grant.slot_base + grant.slot_count})",
                            "reason": grant.reason})

    def call(self, seconds: float) -> None:
        """A call that completed took ``seconds``."""
        self.seconds.append(seconds)
        self.calls += 1

    def median_ms(self, first: int = 0, end: int | None = None) -> float | None:
        """The median duration of calls ``first`` to ``end`` (all by default) still kept, in ms;
        None when none is."""
        kept_from = self.calls - len(self.seconds)
        end = self.calls if end is None else end
        window = list(itertools.islice(self.seconds, max(first - kept_from, 0), max(end - kept_from, 0)))
        return round(1e3 * statistics.median(window), 3) if window else None

    def story(self) -> list[dict]:
        """Each grant used, with the number of calls made under it and their median (ms)."""
        ends = [g["from_call"] for g in self.grants[1:]] + [self.calls]
        return [{**g, "calls": end - g["from_call"], "median_ms": self.median_ms(g["from_call"], end)}
                for g, end in zip(self.grants, ends)]

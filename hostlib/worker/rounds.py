"""The rounds in flight of the worker's stream: each slot's outstanding round and the checks
of its result, round-trip time, loss detection and the congestion window. The Python
specification of native/stream.cpp's ``RttEstimator``, ``LossDetector`` and ``CongestionWindow``
(tests/test_loss_detection.py, tests/test_stream.py); used by
``inagg.hostlib.worker.stream_reference.SlotStream`` and, for the window goal, by every stream.

Window: a float32 call uses at most a quarter as many slots as it has blocks
(``PRIMING_SHARE``), or 16 (``PRIMING_FREE_WINDOW``) if that is more. Within a call each rank
paces itself by its own congestion window (:class:`CongestionWindow`: DCTCP on the results'
congestion marks, per round trip), sending its blocks in order (:class:`BlockGate`); its goal
for the next call's slots follows that window and loss (:class:`WindowControl`).

Results are accepted only from the grant's aggregator and only when they answer an outstanding
round exactly (:class:`OutstandingRounds`); everything else is dropped and counted per
:class:`ResultCheck`. Loss recovery (:class:`LossDetector`): a round is resent with
FLAG_RETRANSMIT when a round sent after it has been answered and it is overdue by more than a
reordering allowance (fast retransmit, RACK's time-based loss detection, RFC 8985), or when its
RTO (:class:`RttEstimator`, Karn's rule) passes with no answer to it or to any round
ahead of it, so a loss-free window never times out behind its own queue; a round's RTO doubles
only while no result arrives at all, so random loss on a path that still delivers never backs
the whole window off. The aggregator never adds a duplicate twice and answers a duplicate of a
finished round with its stored result, so results are bit-identical with or without loss.
"""

from __future__ import annotations

import enum
import heapq
import math
from dataclasses import dataclass, field
from typing import Iterable, Iterator

from inagg.hostlib.wire.grant import Grant
from inagg.hostlib.wire.protocol import (
    HEADER_BYTES, MAX_SLOT, MSG_RESULT, RESULT_FLAGS, VERSION, round_tag, unpack_raw,
)
from inagg.hostlib.worker.call_protocol import Part, ResultCheck, misses


INITIAL_RTO = 0.05   # seconds, before the first RTT sample


# A silent path backs a round's RTO off to at most this many RTOs: in a job a round also waits on
# the other ranks' resends, which a longer backoff here would only delay
MAX_BACKOFF = 8


RTO_OVER_MIN_RTT = 32  # the RTO never exceeds this many minimum RTTs (see RttEstimator)


LOSS_MEMORY = 1.0  # seconds a fast retransmission marks the path lossy (LossDetector.timeout)


TICKS_PER_RTO_MIN = 20  # the scan tick is rto_min / 20 (RttEstimator.scan_tick)


INITIAL_WINDOW = 16  # the congestion window of a stream's first grant (slow start grows it)


GOAL_OVER_WINDOW = 2  # a rank's goal for a call's slots over the largest congestion window of its last


ALPHA_GAIN = 1 / 16   # DCTCP's g: the weight of one round trip's marked fraction (RFC 8257)


@dataclass
class Round:
    """The one outstanding round of a slot: a priming round (exponent of block ``chunk``, no
    values) or the data round of block ``chunk``. ``round_no``: the slot's round counter modulo
    ``ROUND_CYCLE`` (its set is the low bit, its round tag the rest: protocol.round_fields).
    ``sent_at``: its first transmission (the RTT sample); ``last_sent``: its latest one (loss
    detection)."""

    chunk: int
    priming: bool
    round_no: int
    offset: int
    count: int
    packet: bytes
    sent_at: float
    deadline: float
    rto: float
    retransmitted: bool = False
    last_sent: float = field(init=False)

    def __post_init__(self) -> None:
        self.last_sent = self.sent_at


class OutstandingRounds:
    """The rounds in flight, one per slot index, and the exact check of a received result.
    ``part``: the values a reduce-scatter's rank keeps (``call_protocol.Part``); a block that
    meets it must bring its values, one wholly outside it may come as the header alone (values
    elided)."""

    def __init__(self, grant: Grant, source: object, part: Part | None = None) -> None:
        self.grant = grant
        self.source = source
        self.part = part
        self.rounds: dict[int, Round] = {}

    def may_elide(self, rnd: Round) -> bool:
        """Whether ``rnd``'s result may come without its values: a data round of a block wholly
        outside this rank's reduce-scatter part (the C++ twin is ``Stream::may_elide``)."""
        if self.part is None or rnd.priming or not rnd.count:
            return False
        return misses(self.part, rnd.offset, rnd.offset + rnd.count)

    def __len__(self) -> int:
        return len(self.rounds)

    def add(self, idx: int, rnd: Round) -> None:
        """``rnd`` is now in flight on slot index ``idx``."""
        self.rounds[idx] = rnd

    def pop(self, idx: int) -> Round:
        """Slot index ``idx``'s round, answered: no longer in flight."""
        return self.rounds.pop(idx)

    def check(self, view: memoryview, n: int, source: object) -> tuple[ResultCheck, int]:
        """The verdict on a datagram and the slot index it answers."""
        if source != self.source:
            return ResultCheck.FOREIGN_SOURCE, -1
        if n < HEADER_BYTES:
            return ResultCheck.TRUNCATED, -1
        vt, flags, job, _, _, epoch, ss, count, offset = unpack_raw(view)
        g = self.grant
        if vt != (VERSION << 4) | MSG_RESULT:
            return ResultCheck.NOT_A_RESULT, -1
        if flags & ~RESULT_FLAGS:
            return ResultCheck.WRONG_FLAGS, -1
        if job != g.job_id:
            return ResultCheck.WRONG_JOB, -1
        if epoch != g.epoch:
            return ResultCheck.WRONG_EPOCH, -1
        idx = (ss & MAX_SLOT) - g.slot_base
        rnd = self.rounds.get(idx)
        if rnd is None:
            return ResultCheck.NO_ROUND, -1
        if ss >> 15 != rnd.round_no & 1:
            return ResultCheck.WRONG_SET, -1
        if round_tag(flags) != rnd.round_no >> 1:
            return ResultCheck.WRONG_ROUND, -1
        if offset != rnd.offset:
            return ResultCheck.WRONG_OFFSET, -1
        if count != rnd.count:
            return ResultCheck.WRONG_COUNT, -1
        if n == HEADER_BYTES + (4 * g.values_per_packet if count else 0):
            return ResultCheck.ACCEPTED, idx
        if n != HEADER_BYTES:
            return ResultCheck.WRONG_LENGTH, -1
        return (ResultCheck.ACCEPTED, idx) if self.may_elide(rnd) else (ResultCheck.MISSING_VALUES, -1)


@dataclass
class RttEstimator:
    """RFC 6298 style smoothed RTT -> retransmission timeout, at least ``rto_min``.

    A round's RTT also holds the wait for the other ranks' contributions, and so their loss
    recovery: the RTO is capped at ``RTO_OVER_MIN_RTT`` minimum RTTs, so it does not grow with
    that wait (a longer RTO would slow every rank's recovery: a feedback loop). The cap makes
    the RTO far shorter than the RTT of a round at the back of a deep window (which waits for
    the window's whole queue to drain); that is safe because a round's timer runs from the
    latest answer to a round ahead of it, not from its own send (:meth:`LossDetector.delivered`).
    There is no adaptive floor (as Eifel's): in a job an answer that follows a resend at once
    is most often another rank's resend completing the round, no sign that ours was early."""

    rto_min: float
    rto_max: float
    srtt: float | None = None
    rttvar: float = 0.0
    min_rtt: float = float("inf")
    rto: float = field(init=False)

    def __post_init__(self) -> None:
        self.rto = max(self.rto_min, INITIAL_RTO)

    def sample(self, rtt: float) -> None:
        """Feed one RTT sample (RFC 6298's SRTT and RTTVAR) and recompute the RTO, capped and
        floored as the class docstring says."""
        if self.srtt is None:
            self.srtt, self.rttvar = rtt, rtt / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - rtt)
            self.srtt = 0.875 * self.srtt + 0.125 * rtt
        self.min_rtt = min(self.min_rtt, rtt)
        rto = min(2 * self.srtt + 4 * self.rttvar, RTO_OVER_MIN_RTT * self.min_rtt, self.rto_max)
        self.rto = max(self.rto_min, rto)

    def reorder_window(self, lossy: bool) -> float:
        """How late a round may be behind a later-sent answered one before it counts as lost: a
        quarter of SRTT (RACK's), on a loss-free path at least a quarter of ``rto_min``, as the
        ranks' contributions to rounds sent close together reach the aggregator in any order."""
        return max(0.0 if lossy else self.rto_min, self.srtt or 0.0) / 4

    def lossy_timeout(self) -> float:
        """The timeout on a path that is losing rounds: two smoothed RTTs (the probe timeout of
        RACK-TLP, RFC 8985), at least a scan tick, at most the RTO."""
        return self.rto if self.srtt is None else min(self.rto, max(2 * self.srtt, self.scan_tick()))

    def scan_tick(self) -> float:
        """How often the stream looks for lost rounds while it waits: a loss is seen within a
        tick of its deadline, so the tick bounds every recovery from below (1 ms at the default
        ``rto_min``; a scan costs only when the socket is idle)."""
        return self.rto_min / TICKS_PER_RTO_MIN


class Loss(enum.Enum):
    """A :class:`LossDetector` verdict on a round in flight."""

    NONE = 0
    FAST = 1      # a round sent after it was answered and it is overdue: resend, RTO kept
    TIMEOUT = 2   # its deadline passed


@dataclass
class LossDetector:
    """Time-based loss detection of the rounds in flight (RACK, RFC 8985).

    Fast retransmit: the window's rounds complete roughly in the order they were sent, so an
    answered round that was sent after round X (first transmissions only, Karn) while X is still
    outstanding more than that round's RTT plus a reordering allowance after X's latest
    transmission says X (or one of the other ranks' contributions to it) was lost: resend it
    without waiting for its RTO.

    Timeout: a round's deadline is an RTO after its latest transmission *or after the latest
    answer to a round sent no later than it*, whichever is later (:meth:`delivered`; RFC 6298
    restarts its timer on every new acknowledgement the same way). A round queued behind others
    is not late while those ahead of it are being answered, however long the window's queue
    (a window of W rounds of N ranks drains W * N packets before its last answer), so an RTO
    need not cover a queue and a loss-free path does not resend the back of its window.

    An expired round is resent. Its RTO doubles (up to ``MAX_BACKOFF`` RTOs) only when no
    result at all arrived since it was last sent (the path went silent: congestion or an
    outage); while others are answered the loss is random and the round keeps the current RTO,
    so one unlucky slot does not stall behind a long backoff.

    On a silent path that has not been losing rounds (see below) a whole window expiring at
    once is far more likely a descheduled aggregator or switch, every answer still coming, than
    a lost window: there only one round is resent per timeout, as a probe (:meth:`probe`; TCP
    resends one segment on an RTO), the one waiting longest, so successive probes visit every
    silent round (each rank's oldest round may wait on another rank's loss). Its timeout
    doubles with every probe until an answer arrives; that answer restarts the timers of every
    outstanding round (they waited out the same stall), and rounds still unanswered an RTO
    later are resent as above. A stall costs
    each rank one packet per timeout, not a window.

    Which timeout (:meth:`timeout`): the RTO (at least ``rto_min``) rides out a descheduled
    aggregator or switch on a shared machine, which a loss-free path meets far more often than
    loss. A path that fast-retransmitted within ``LOSS_MEMORY`` is losing rounds for real (a
    later-sent round was answered and an earlier one was not: an aggregator answers in order,
    and a loss-free path never shows it), and there rounds whose resends are the newest sent
    (the end of a call, the control round) can only be recovered by their timers: they use
    RACK-TLP's probe timeout, two smoothed RTTs, as a silent round there is far more likely lost
    than late, and a needless resend costs one packet. There the reordering allowance is RACK's
    quarter SRTT too, without the loss-free path's floor (:meth:`RttEstimator.reorder_window`):
    under 30 % loss most rounds need a recovery on some rank before the slot's next round can
    complete, so a call's time is the sum of these waits along each slot's rounds."""

    rtt: RttEstimator
    newest_sent: float = float("-inf")  # first transmission of the newest-sent answered round
    newest_rtt: float = 0.0
    progress: float = float("-inf")     # when the last result was accepted
    lossy_until: float = float("-inf")  # the path counts as lossy until then (saw_loss)
    probe_until: float = float("-inf")  # a silent path's probe is pending until then (probe)
    probes: int = 0                     # probes sent since the last answer

    def delivered(self, rnd: Round, now: float, outstanding: Iterable[Round]) -> None:
        """``rnd`` was answered at ``now``: move the fast-retransmit reference (first
        transmissions only) and restart the timers of the ``outstanding`` rounds last sent no
        earlier than ``rnd`` was last sent: they were queued behind every copy of it, so their
        wait starts anew, for an RTO (not a backed-off one: the path delivers). An answer that
        ends a silent episode (a probe was pending) restarts every outstanding round's timer:
        they all waited out the same stall, and their answers are likely queued behind it."""
        after_silence = self.probes > 0
        self.progress = now
        self.probe_until, self.probes = float("-inf"), 0
        if not rnd.retransmitted and rnd.sent_at >= self.newest_sent:
            self.newest_sent, self.newest_rtt = rnd.sent_at, now - rnd.sent_at
        for other in outstanding:
            if after_silence or other.last_sent >= rnd.last_sent:
                other.deadline = max(other.deadline, now + self.timeout(now))

    def verdict(self, rnd: Round, now: float) -> Loss:
        """Whether ``rnd`` is lost now: its deadline passed (TIMEOUT), or a round sent after it
        was answered more than its RTT plus the reorder window ago (FAST, RACK), else NONE."""
        if now >= rnd.deadline:
            return Loss.TIMEOUT
        if rnd.last_sent < self.newest_sent and now >= rnd.last_sent + self.newest_rtt + self.rtt.reorder_window(self.lossy(now)):
            return Loss.FAST
        return Loss.NONE

    def silent(self, rnd: Round) -> bool:
        """No result at all arrived since ``rnd`` was last sent."""
        return self.progress <= rnd.last_sent

    def may_probe(self, now: float) -> bool:
        """No probe of a silent path is pending."""
        return now >= self.probe_until

    def probe(self, now: float) -> float:
        """A probe of a silent path is sent now: its timeout, doubling with every probe since
        the last answer (up to ``MAX_BACKOFF`` RTOs); no other silent round is resent before."""
        rto = min(self.rtt.rto * 2 ** (self.probes + 1), MAX_BACKOFF * self.rtt.rto, self.rtt.rto_max)
        self.probes += 1
        self.probe_until = now + rto
        return rto

    def saw_loss(self, now: float) -> None:
        """A round was fast-retransmitted: the path is lossy for ``LOSS_MEMORY``."""
        self.lossy_until = now + LOSS_MEMORY

    def lossy(self, now: float) -> bool:
        """Whether the path fast-retransmitted within ``LOSS_MEMORY``."""
        return now < self.lossy_until

    def timeout(self, now: float) -> float:
        """The timeout of a round sent or restarted now: the RTO, on a lossy path the probe
        timeout (see the class docstring)."""
        return self.rtt.lossy_timeout() if self.lossy(now) else self.rtt.rto

    def next_rto(self, rnd: Round, backoff: bool, now: float) -> float:
        """The RTO of a round resent now (``backoff``: its RTO expired on a silent path)."""
        if backoff:
            return min(2 * rnd.rto, MAX_BACKOFF * self.timeout(now), self.rtt.rto_max)
        return self.timeout(now)


@dataclass
class CongestionWindow:
    """One rank's congestion window within a call: how many data rounds it may send counted
    from its oldest block without a result, DCTCP on the results' congestion marks (RFC 8257).

    The slots of a call are agreed per call, but a queue builds and drains within a round trip
    and a call of a few MiB lasts hundreds of them, so a rank paces itself within the call by
    this window. Each accepted result counts; once a window's worth came (about one round trip)
    the fraction of them that were marked (FLAG_CONGESTION: a queue they left by was deep)
    updates ``alpha``, DCTCP's moving estimate (gain ``ALPHA_GAIN``), and a marked round trip
    cuts the window by ``alpha / 2``, a clean one raises it by one. Slow start adds one per clean
    result (doubling per round trip) until the first mark; ``alpha`` starts at 1, so the first
    marks cut the window by about half. Ranks of two jobs that share a queue see the same marks, and
    additive increase with multiplicative decrease brings their windows, and so their shares of
    the queue, together within a call.

    A block waits while it is ``size`` or more blocks after the rank's oldest block without a
    result (:class:`BlockGate`): every rank sends its blocks in the same order, so the oldest
    block one rank waits for is always sent by the others, whatever their windows."""

    size: float = INITIAL_WINDOW
    alpha: float = 1.0
    slow_start: bool = True
    acked: int = 0      # results since this round trip began
    marked: int = 0     # marked ones among them
    round: float = 0.0  # results that make this round trip: the size when it began
    peak: float = 0.0   # the largest size since the goal was last set (WindowControl)
    minimum: float = 1.0
    maximum: float = INITIAL_WINDOW

    def __post_init__(self) -> None:
        self.round = self.round or self.size

    def on_result(self, was_marked: bool) -> None:
        """One accepted result (``was_marked``: it carried FLAG_CONGESTION)."""
        self.acked += 1
        self.marked += was_marked
        if self.slow_start and not was_marked:
            self.size = min(self.size + 1, self.maximum)
        if self.acked < self.round:
            return
        self.alpha = (1 - ALPHA_GAIN) * self.alpha + ALPHA_GAIN * self.marked / self.acked
        if self.marked:
            self.size = max(self.minimum, self.size * (1 - self.alpha / 2))
            self.slow_start = False
        elif not self.slow_start:
            self.size = min(self.size + 1, self.maximum)
        self.acked = self.marked = 0
        self.round = self.size
        self.peak = max(self.peak, self.size)

    def allowed(self) -> int:
        """How many blocks from the oldest one without a result may be in flight."""
        return max(1, int(self.size))


class BlockGate:
    """The blocks of a call ready to send, smallest first, held back while the congestion
    window does not allow them (the twin of native Stream::defer and Stream::release)."""

    def __init__(self, n_blocks: int) -> None:
        self.answered = bytearray(n_blocks)
        self.oldest = 0           # the first block without a result
        self._ready: list[tuple[int, int]] = []   # (block, slot index), a heap

    def defer(self, idx: int, chunk: int) -> None:
        """Block ``chunk`` (on slot index ``idx``) is ready; sent once the window allows it."""
        heapq.heappush(self._ready, (chunk, idx))

    def answer(self, chunk: int) -> None:
        """Block ``chunk`` has its result: the oldest unanswered block moves on past it."""
        self.answered[chunk] = 1
        while self.oldest < len(self.answered) and self.answered[self.oldest]:
            self.oldest += 1

    def release(self, allowed: int) -> Iterator[tuple[int, int]]:
        """(slot index, block) of each ready block fewer than ``allowed`` after the oldest."""
        while self._ready and self._ready[0][0] < self.oldest + allowed:
            chunk, idx = heapq.heappop(self._ready)
            yield idx, chunk


@dataclass
class WindowControl:
    """One rank's goal for the slots of its next calls, from its congestion window: twice the
    largest window of its last call (``GOAL_OVER_WINDOW``), room for it to grow within the next
    one. Not its size at the call's end: the slots bound every rank's window for a whole call,
    and a window is at its lowest right after a cut.

    A grant keeps the congestion window learnt so far and starts it in slow start again (a new
    path). Loss: a call with a timeout burst halves the window it used (a buffer overflowed), as
    TCP sets ssthresh from the flight size (RFC 5681), and ends slow start; a retransmission that
    the aggregator answered twice was not needed (the result was only late: a descheduled switch
    process) and is no loss signal, as with TCP's DSACK (RFC 3708)."""

    minimum: int = 4
    maximum: int = 1
    congestion: CongestionWindow = field(default_factory=CongestionWindow)
    goal: int = 0

    def __post_init__(self) -> None:
        self.congestion.maximum = self.maximum
        self.congestion.size = min(self.congestion.size, self.maximum)
        self.goal = self._goal()

    def _goal(self) -> int:
        """The next calls' goal: ``GOAL_OVER_WINDOW`` times the largest window since the last
        goal, within [minimum, maximum]; the peak restarts from the current size."""
        c = self.congestion
        w = GOAL_OVER_WINDOW * math.ceil(max(c.peak, c.size))
        c.peak = c.size
        return max(min(self.minimum, self.maximum), min(self.maximum, w))

    def update(self, window: int, timeouts: int) -> None:
        """After a call that used ``window`` slots with ``timeouts`` loss bursts."""
        if timeouts:
            c = self.congestion
            c.size = c.peak = max(c.minimum, min(c.size, window) / 2)
            c.slow_start = False
        self.goal = self._goal()


def is_burst(backoffs: int, window: int) -> bool:
    """``backoffs`` rounds of a ``window`` timing out at once on a silent path are a burst."""
    return backoffs >= max(2, window // 2)

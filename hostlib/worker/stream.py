"""Worker side of the inagg protocol: stream a tensor through a window of aggregator slots.

This module is the executable specification of the worker's stream; ``inagg.hostlib.worker.native_stream``
runs the same protocol in C++ (``native/stream.cpp``) and shares the control vector, the
refusal codes and the result checks defined here.

The tensor is cut into blocks of K values (one packet each). Block ``c`` uses slot
``slot_base + c % W`` and rounds on each slot alternate between the slot's two shadow sets, for
the life of the grant (not per call), as the aggregator's duplicate logic requires.

Block exponents travel one round ahead (SwitchML, :class:`ExponentTracker`): the packet of block
``c`` carries this worker's exponent of block ``c + W``, and the result of block ``c`` returns
the job-wide maximum, which is the exponent every worker then uses to quantize block ``c + W``.
A float call primes every slot it uses with a header-only round that fetches the exponents of
the first W blocks (int32 tensors are summed as they are and prime no slot).

Every call, whatever its size, and even one that this rank cannot run, opens with the *control
round*: slot 0's round carries the :class:`ControlVector` of 2N int32 values (rank r writes
positions r and N + r only, so the aggregator's exact integer sum hands every rank every rank's
words): the call number, the tensor's size, dtype and reduce op or the rank's refusal
(:class:`CallError`), its window goal and the newest pending grant it has seen. Every rank
decodes the same sum the same way, so a refusal on one rank, a size or op mismatch or a call
number mismatch fails that call on every rank with the same error before any data moves, and
the next call starts aligned (or, for call numbers, fails again: never absorbed).
``agreed_epoch`` = the smallest pending epoch all ranks have seen is the grant every rank may
switch to after this call, at the same boundary; the call's window W (slots in use, the most
rounds in flight) is the smallest goal, so every rank maps blocks to the same slots.

The control packet has K lanes (count = K); the K - 2N after the control vector are spare. A
call small enough (:meth:`StreamBase.one_round_capacity`, derived from K and N) rides in them
and is done in that one round trip: int32 values as they are, float32 values as exact
fixed-point limbs (``codec.fixed_encode``: the switch's lane-wise int32 sum is the exact sum of
the ranks' floats, rounded once to float32 on every rank alike, so no exponent agreement is
needed). Whether a call rides is decided by each rank from its own size, so the ranks agree
whenever the control vector does (else the call is refused before its lanes are read). A value
the codecs cannot carry (inf, NaN, |x| >= 2**127) sends zeros and FLAG_OVERFLOW, as a bad
block does: the call fails on every rank with the same error and leaves the tensor unchanged.

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
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Protocol

import numpy as np

from inagg.hostlib.wire import codec
from inagg.hostlib.wire.grant import Grant
from inagg.hostlib.wire.protocol import (
    EXP_NONE,
    FLAG_CONGESTION,
    FLAG_FROM_HOST,
    FLAG_OVERFLOW,
    FLAG_RETRANSMIT,
    HEADER_BYTES,
    MAX_SLOT,
    MSG_RESULT,
    VERSION,
    build_contribution,
    unpack_raw,
)


class AllreduceError(RuntimeError):
    """The allreduce could not complete (no progress before the stall timeout)."""


class CallRefused(ValueError):
    """Some rank refused this call (bad input or op), or the ranks' calls do not match; raised
    with the same message on every rank."""


class Transport(Protocol):
    overhead: int

    def send(self, data: bytes) -> None: ...
    def recv_from(self, buf: bytearray, timeout: float) -> tuple[int, object]: ...
    def source_of(self, aggregator: tuple[str, int]) -> object: ...


# -- what travels in the control round ---------------------------------------------------------

class CallError(enum.IntEnum):
    """Why a rank refuses its part of a call; travels in the control vector (with a detail)."""

    NONE = 0
    DTYPE = 1         # detail: index in DTYPE_NAMES
    LAYOUT = 2        # not flat / not contiguous
    TOO_LARGE = 3
    REDUCE_OP = 4     # detail: index in OP_NAMES
    AVG_OF_INT = 5
    NOT_A_TENSOR = 6


DTYPE_NAMES = ("other", "float64", "float16", "bfloat16", "int64", "int16", "int8", "uint8", "bool",
               "complex64", "complex128", "uint16", "uint32", "uint64")
OP_NAMES = ("other", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM")
MAX_ELEMENTS = 1 << 29  # the control vector carries 4 * numel + op + dtype in an int32
CALL_BITS = 8           # call numbers are compared modulo 2**8
_GOAL_BITS = 15
_EPOCH_DELTA_BITS = 8


@dataclass(frozen=True)
class Refusal:
    """This rank's reason to refuse a call, as the control vector carries it."""

    code: CallError
    detail: int = 0

    def describe(self) -> str:
        if self.code is CallError.DTYPE:
            return (f"a {DTYPE_NAMES[self.detail]} tensor (inagg allreduces float32, float16, bfloat16 "
                    f"and int32)")
        if self.code is CallError.REDUCE_OP:
            return f"reduce op {OP_NAMES[self.detail]} (inagg supports SUM and AVG)"
        return {CallError.LAYOUT: "a tensor that is not contiguous",
                CallError.TOO_LARGE: f"a tensor of {MAX_ELEMENTS} or more elements",
                CallError.AVG_OF_INT: "AVG of an int32 tensor (AVG needs float32)",
                CallError.NOT_A_TENSOR: "an object that is neither a tensor nor an array"}[self.code]


def dtype_refusal(name: str) -> Refusal:
    """The refusal for a tensor of dtype ``name`` (numpy's or torch's name without 'torch.')."""
    return Refusal(CallError.DTYPE, DTYPE_NAMES.index(name) if name in DTYPE_NAMES else 0)


def check_array(x: np.ndarray, average: bool) -> Refusal | None:
    """The refusal for a numpy array this stream cannot allreduce, else None."""
    if not isinstance(x, np.ndarray):
        return Refusal(CallError.NOT_A_TENSOR)
    if not codec.is_float(x.dtype) and x.dtype != np.int32:
        return dtype_refusal(str(x.dtype))
    if x.ndim != 1 or not x.flags.c_contiguous:
        return Refusal(CallError.LAYOUT)
    if x.size >= MAX_ELEMENTS:
        return Refusal(CallError.TOO_LARGE)
    if average and not codec.is_float(x.dtype):
        return Refusal(CallError.AVG_OF_INT)
    return None


@dataclass(frozen=True)
class CallSpec:
    """What one rank brings to a call: its call number, tensor (size, dtype, op) or refusal,
    window goal and the newest pending grant epoch it has seen (as a delta over the grant's)."""

    call: int
    size: int = 0
    is_float: bool = False
    average: bool = False
    refusal: Refusal | None = None
    goal: int = 1
    epoch_delta: int = 0

    def describe(self) -> str:
        kind = "float" if self.is_float else "int32"
        return f"{self.size} x {kind}{' avg' if self.average else ''}"


@dataclass(frozen=True)
class Agreement:
    """The decoded sum of a call's control vector: what every rank does next."""

    window_goal: int
    epoch_delta: int  # 0: no pending grant seen by every rank


class ControlVector:
    """Encode one rank's :class:`CallSpec` into its two int32 words; decode the summed vector.

    Word r: ``-(code | detail << 4)`` for a refusal, else ``size << 2 | average << 1 | is_float``.
    Word N + r: ``(call mod 2**8) << 23 | goal << 8 | pending epoch delta`` (delta over the grant's
    epoch, capped at 255; 0 = none). The words are the first 2N lanes of the control packet;
    a small call's values follow (:meth:`StreamBase.one_round_capacity`)."""

    def __init__(self, n_workers: int) -> None:
        self.n = n_workers

    def encode(self, rank: int, spec: CallSpec) -> np.ndarray:
        v = np.zeros(2 * self.n, np.int32)
        if spec.refusal is not None:
            v[rank] = -(int(spec.refusal.code) | spec.refusal.detail << 4)
        else:
            v[rank] = spec.size << 2 | int(spec.average) << 1 | int(spec.is_float)
        v[self.n + rank] = ((spec.call % (1 << CALL_BITS)) << (_GOAL_BITS + _EPOCH_DELTA_BITS)
                            | min(spec.goal, (1 << _GOAL_BITS) - 1) << _EPOCH_DELTA_BITS
                            | min(spec.epoch_delta, (1 << _EPOCH_DELTA_BITS) - 1))
        return v

    def decode(self, summed: np.ndarray, call: int) -> Agreement:
        """Every rank's view of the call; raises :class:`CallRefused` (the same on every rank)
        when the call numbers differ, a rank refused, or the tensors differ."""
        n = self.n
        words = summed[:2 * n].tolist()    # plain ints: this runs once per call, small ones too
        first, second = words[:n], words[n:]
        calls = [w >> (_GOAL_BITS + _EPOCH_DELTA_BITS) for w in second]
        if calls.count(calls[0]) != n:
            desc = ", ".join(f"rank {r}: call {c}" for r, c in enumerate(calls))
            raise CallRefused(f"allreduce call numbers differ across ranks ({desc}, modulo "
                              f"{1 << CALL_BITS}): a rank skipped or repeated a call")
        if min(first) < 0:
            refusals = [(r, Refusal(CallError(-w & 0xF), -w >> 4)) for r, w in enumerate(first) if w < 0]
            desc = "; ".join(f"rank {r} passed {ref.describe()}" for r, ref in refusals)
            raise CallRefused(f"allreduce call {call} refused: {desc}")
        if first.count(first[0]) != n:   # the words of equal tensors are equal
            specs = [CallSpec(call, w >> 2, bool(w & 1), bool(w & 2)) for w in first]
            desc = ", ".join(f"rank {r}: {s.describe()}" for r, s in enumerate(specs))
            raise CallRefused(f"allreduce tensors differ across ranks ({desc})")
        goal_mask, delta_mask = (1 << _GOAL_BITS) - 1, (1 << _EPOCH_DELTA_BITS) - 1
        return Agreement(window_goal=min([(w >> _EPOCH_DELTA_BITS) & goal_mask for w in second]),
                         epoch_delta=min([w & delta_mask for w in second]))


# -- the stream's parts --------------------------------------------------------------------------

class ResultCheck(enum.IntEnum):
    """Verdict on a received datagram; everything but ACCEPTED is dropped and counted. The C++
    twin is ``inagg::ResultCheck`` in native/stream.hpp (tests/test_stream.py ties them)."""

    ACCEPTED = 0
    FOREIGN_SOURCE = 1   # not from the grant's aggregator
    TRUNCATED = 2
    NOT_A_RESULT = 3     # version / message type
    WRONG_JOB = 4
    WRONG_EPOCH = 5
    NO_ROUND = 6         # no outstanding round on that slot (a late duplicate, a forgery)
    WRONG_SET = 7
    WRONG_OFFSET = 8
    WRONG_COUNT = 9
    WRONG_LENGTH = 10


@dataclass
class StreamStats:
    """Counters of one worker's stream. Wire bytes include Ethernet/IPv4/UDP headers.
    ``result_drops`` counts dropped datagrams per :class:`ResultCheck` name.
    ``spurious_retransmissions``: late copies of answered rounds that the aggregator sent back
    for a retransmission (FLAG_RETRANSMIT): that retransmission was not needed (as a TCP DSACK)."""

    allreduces: int = 0
    calls: int = 0
    elements: int = 0
    packets_sent: int = 0
    packets_received: int = 0
    wire_bytes_sent: int = 0
    wire_bytes_received: int = 0
    retransmissions: int = 0
    fast_retransmissions: int = 0
    backoffs: int = 0
    bursts: int = 0
    spurious_retransmissions: int = 0
    ignored_results: int = 0
    host_results: int = 0
    congestion_marks: int = 0   # accepted results that carried FLAG_CONGESTION
    seconds: float = 0.0
    result_drops: dict = field(default_factory=dict)

    def drop(self, check: ResultCheck, flags: int) -> None:
        self.ignored_results += 1
        if flags & FLAG_RETRANSMIT and check in (ResultCheck.NO_ROUND, ResultCheck.WRONG_SET):
            self.spurious_retransmissions += 1
        name = check.name.lower()
        self.result_drops[name] = self.result_drops.get(name, 0) + 1

    def timeouts(self) -> int:
        """Loss bursts not known to be spurious: the congestion signal of the window control.
        A burst (``bursts``) is half the window or more timing out in one scan on a silent path
        (no result since those rounds were sent), as when a burst overflowed a buffer. Other
        losses are not: random loss hits rounds one by one while others are answered, and a
        smaller window would only slow its recovery."""
        return max(0, self.bursts - self.spurious_retransmissions)

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d["result_drops"] = dict(self.result_drops)
        return d


# A call uses at most max(PRIMING_FREE_WINDOW, ceil(blocks / PRIMING_SHARE)) slots, so the
# header-only priming rounds of a call with many blocks are at most about a quarter of its rounds.
PRIMING_SHARE = 4
PRIMING_FREE_WINDOW = 16
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


def call_window(slot_count: int, n_blocks: int, goal: int, is_float: bool) -> int:
    """Slots a call uses (the same on every rank: all inputs are agreed)."""
    window = min(slot_count, n_blocks, goal)
    if is_float:  # only float calls prime every slot they use
        window = min(window, max(PRIMING_FREE_WINDOW, -(-n_blocks // PRIMING_SHARE)))
    return window


@dataclass
class Round:
    """The one outstanding round of a slot: a priming round (exponent of block ``chunk``, no
    values) or the data round of block ``chunk``. ``sent_at``: its first transmission (the RTT
    sample); ``last_sent``: its latest one (loss detection)."""

    chunk: int
    priming: bool
    slot_set: int
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
    """The rounds in flight, one per slot index, and the exact check of a received result."""

    def __init__(self, grant: Grant, source: object) -> None:
        self.grant = grant
        self.source = source
        self.rounds: dict[int, Round] = {}

    def __len__(self) -> int:
        return len(self.rounds)

    def add(self, idx: int, rnd: Round) -> None:
        self.rounds[idx] = rnd

    def pop(self, idx: int) -> Round:
        return self.rounds.pop(idx)

    def check(self, view: memoryview, n: int, source: object) -> tuple[ResultCheck, int]:
        """The verdict on a datagram and the slot index it answers."""
        if source != self.source:
            return ResultCheck.FOREIGN_SOURCE, -1
        if n < HEADER_BYTES:
            return ResultCheck.TRUNCATED, -1
        vt, _, job, _, _, epoch, ss, count, offset = unpack_raw(view)
        g = self.grant
        if vt != (VERSION << 4) | MSG_RESULT:
            return ResultCheck.NOT_A_RESULT, -1
        if job != g.job_id:
            return ResultCheck.WRONG_JOB, -1
        if epoch != g.epoch:
            return ResultCheck.WRONG_EPOCH, -1
        idx = (ss & MAX_SLOT) - g.slot_base
        rnd = self.rounds.get(idx)
        if rnd is None:
            return ResultCheck.NO_ROUND, -1
        if ss >> 15 != rnd.slot_set:
            return ResultCheck.WRONG_SET, -1
        if offset != rnd.offset:
            return ResultCheck.WRONG_OFFSET, -1
        if count != rnd.count:
            return ResultCheck.WRONG_COUNT, -1
        if n != HEADER_BYTES + (4 * g.values_per_packet if count else 0):
            return ResultCheck.WRONG_LENGTH, -1
        return ResultCheck.ACCEPTED, idx



@dataclass
class Reduction:
    """What a float call's result depends on besides its inputs, when a job wants the same bits
    on every path (``inagg.hostlib.pytorch.reproducible``): blocks of ``block`` values share an exponent
    (a multiple of every K the job's paths use: each packet of K values takes the exponent of
    the block it lies in), and a call rides in the control round (exact fixed point) only up to
    ``exact_limit`` values. None: the grant's own K and capacity (each path its own)."""

    block: int | None = None
    exact_limit: int | None = None

    def rides(self, capacity: int, is_float: bool) -> int:
        """The most values of a call that ride in the control round (int32 sums are exact on
        every path)."""
        return capacity if not is_float or self.exact_limit is None else min(capacity, self.exact_limit)


class ExponentTracker:
    """One-round-ahead block exponents of a call: this rank's own (sent one round early) and
    the agreed job-wide maxima (returned with results). An int32 call has none.
    ``exponents(x, k)`` -> (int8 exponents, bool overflow mask): numpy's or the native codec's.
    ``block``: the exponents' block (``Reduction.block``), a multiple of K; each packet of K
    values takes its block's exponent (None, or a block K does not divide: K)."""

    def __init__(self, x: np.ndarray, k: int, exponents=codec.block_exponents, block: int | None = None) -> None:
        self.n_blocks = -(-x.size // k)
        self.is_float = codec.is_float(x.dtype)
        if self.is_float and block and block != k and block % k == 0:
            local, bad = exponents(x, block)
            self.local, self.bad = (np.repeat(a, block // k)[:self.n_blocks] for a in (local, bad))
        elif self.is_float:
            self.local, self.bad = exponents(x, k)
        else:
            self.local = np.full(self.n_blocks, EXP_NONE, np.int8)
            self.bad = np.zeros(self.n_blocks, bool)
        self.agreed = [EXP_NONE] * self.n_blocks

    def local_exp(self, chunk: int) -> int:
        return int(self.local[chunk]) if chunk < self.n_blocks else EXP_NONE

    def agree(self, chunk: int, exp: int) -> None:
        if self.is_float and chunk < self.n_blocks:
            self.agreed[chunk] = exp


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
    doubles with every probe until an answer arrives; that answer restarts the timers of the
    rounds queued behind it, and rounds still unanswered then are resent as above. A stall costs
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
        wait starts anew, for an RTO (not a backed-off one: the path delivers)."""
        self.progress = now
        self.probe_until, self.probes = float("-inf"), 0
        if not rnd.retransmitted and rnd.sent_at >= self.newest_sent:
            self.newest_sent, self.newest_rtt = rnd.sent_at, now - rnd.sent_at
        for other in outstanding:
            if other.last_sent >= rnd.last_sent:
                other.deadline = max(other.deadline, now + self.timeout(now))

    def verdict(self, rnd: Round, now: float) -> Loss:
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
        heapq.heappush(self._ready, (chunk, idx))

    def answer(self, chunk: int) -> None:
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


def one_round_capacity(values_per_packet: int, n_workers: int, is_float: bool) -> int:
    """The most values of a call of ``n_workers`` that ride in the control packet's spare lanes
    (K - 2N of them, after the control vector): one lane per int32 value, ``codec.fixed_limbs``
    per float32 value (an exact fixed-point encoding, so no exponent needs agreeing first)."""
    spare = max(0, values_per_packet - 2 * n_workers)
    return spare // codec.fixed_limbs(n_workers) if is_float else spare


def overflow_error(chunks: list[int], k: int) -> FloatingPointError:
    return FloatingPointError(
        f"allreduce input holds inf/NaN or |x| >= 2**127 on some rank: {len(chunks)} block(s) "
        f"of {k} values, first at element {min(chunks) * k}; those elements are left unchanged")


class StreamBase:
    """What both streams (this Python one and the native one) share: the grant, the call
    number, the control vector and its decoding, the window goal and the public ``allreduce``."""

    def __init__(self, grant: Grant, rank: int, n_workers: int, transport: Transport, *,
                 rto_min: float = 0.02, rto_max: float = 1.0, stall_timeout: float = 30.0) -> None:
        if not 0 <= rank < n_workers:
            raise ValueError(f"rank {rank} not in 0..{n_workers - 1}")
        self.rank = rank
        self.n_workers = n_workers
        self.transport = transport
        self.rto_min, self.rto_max = rto_min, rto_max
        self.stall_timeout = stall_timeout
        self.stats = StreamStats()
        self.control = ControlVector(n_workers)
        self.agreed_epoch = 0
        self.control_rtt = 0.0  # round trip of the last call's control round: a latency probe
        self.round_trips = 0    # of the last call: 1 when it rode in the control round, else 2
        self.window = 0  # slots the last call used (agreed by all ranks)
        self.window_control: WindowControl | None = None
        self.aborted = False
        self.reduction = Reduction()
        self.set_grant(grant)

    def abort(self) -> None:
        """Stop the call in progress at its next tick as if it stalled (from another thread:
        the controller failed the job, no result will come)."""
        self.aborted = True

    def set_grant(self, grant: Grant) -> None:
        """Use a new grant from the next call on. Slots of a new (job, epoch) start fresh."""
        if 2 * self.n_workers > grant.values_per_packet:
            raise ValueError(f"{self.n_workers} workers need at least {2 * self.n_workers} values "
                             f"per packet (the control vector), grant has {grant.values_per_packet}")
        self.grant = grant
        self.shift = codec.shift_for(self.n_workers)
        # a new grant is a new path: slow start again, from the congestion window learnt so far
        size = self.window_control.congestion.size if self.window_control else INITIAL_WINDOW
        self.window_control = WindowControl(maximum=min(grant.slot_count, (1 << _GOAL_BITS) - 1),
                                            congestion=CongestionWindow(size=size))

    def allreduce(self, x: np.ndarray | None, pending_epoch: int = 0, *, average: bool = False,
                  refusal: Refusal | None = None) -> np.ndarray | None:
        """Sum (``average``: mean) ``x`` (flat, int32 or one of ``codec.FLOAT_DTYPES``) over all
        workers, in place. A float16 or bfloat16 result is the float32 one (its mean for an
        average) rounded once to the tensor's format (``codec``).

        Every call takes part in the control round, even one this rank refuses (``refusal``
        given, or ``x`` unusable): then every rank raises the same :class:`CallRefused`. A call
        of at most ``one_round_capacity`` values rides in the control round itself (one round
        trip); a larger one streams its blocks after it.
        ``pending_epoch``: the newest pending grant this rank has seen (0: none); after the
        call, ``agreed_epoch`` holds the smallest such epoch over all ranks (0: none)."""
        if refusal is None:
            refusal = check_array(x, average)
        started = time.perf_counter()
        self.agreed_epoch = 0
        call = self.stats.calls
        self.stats.calls += 1
        lost_before = self.stats.timeouts()
        divisor = self.n_workers if average else 1   # applied to float results before their rounding
        delta = pending_epoch - self.grant.epoch if pending_epoch > self.grant.epoch else 0
        spec = CallSpec(call, 0 if refusal else x.size, not refusal and codec.is_float(x.dtype),
                        average, refusal, self.window_control.goal, delta)
        one_round = not refusal and 0 < x.size <= self.reduction.rides(self.one_round_capacity(spec.is_float),
                                                                        spec.is_float)
        local = None if refusal or one_round else self._exponents(x)
        lanes, flags = self._control_lanes(spec, x if one_round else None)
        summed, exp0, result_flags = self._control_round(lanes, local.local_exp(0) if local else EXP_NONE, flags)
        agreement = self.control.decode(summed, call)
        if agreement.epoch_delta:
            self.agreed_epoch = self.grant.epoch + agreement.epoch_delta
        self.round_trips = 1 if one_round or not x.size else 2
        if one_round:
            if result_flags & FLAG_OVERFLOW:
                raise overflow_error([0], self.grant.values_per_packet)
            self._decode_values(summed[2 * self.n_workers:], x, divisor)
        elif x.size:
            local.agree(0, exp0)
            overflow = self._stream_blocks(x, local, agreement.window_goal, divisor)
            self.window_control.update(self.window, max(0, self.stats.timeouts() - lost_before))
            if overflow:
                raise overflow_error(overflow, self.grant.values_per_packet)
        self.stats.allreduces += 1
        self.stats.elements += x.size
        self.stats.seconds += time.perf_counter() - started
        return x

    def one_round_capacity(self, is_float: bool) -> int:
        """This stream's ``one_round_capacity``."""
        return one_round_capacity(self.grant.values_per_packet, self.n_workers, is_float)

    def _control_lanes(self, spec: CallSpec, riding: np.ndarray | None) -> tuple[np.ndarray, int]:
        """The control packet's K lanes (this rank's control words, then the values of the call
        ``riding`` in it, else zeros) and its flags: FLAG_OVERFLOW when a value cannot ride
        (inf, NaN, too large), so the call fails on every rank as a bad block does."""
        lanes = np.zeros(self.grant.values_per_packet, np.int32)
        lanes[:2 * self.n_workers] = self.control.encode(self.rank, spec)
        if riding is not None and not self._encode_values(riding, lanes[2 * self.n_workers:]):
            return lanes, FLAG_OVERFLOW
        return lanes, 0

    def _encode_values(self, x: np.ndarray, lanes: np.ndarray) -> bool:
        """A one-round call's values into the control packet's spare lanes: int32 as they are
        (the switch sums them as the blocks'), floats as the exact fixed-point limbs of their
        float32 values. False when a float is not representable (inf, NaN, |x| >= 2**127)."""
        if not codec.is_float(x.dtype):
            lanes[:x.size] = x
            return True
        return self._fixed_encode(codec.widen(x), lanes)

    def _decode_values(self, sums: np.ndarray, x: np.ndarray, divisor: int) -> None:
        """The summed spare lanes of a one-round call into ``x``: the exact sum, for floats
        rounded once to float32, divided by ``divisor``, then rounded to ``x``'s format."""
        if not codec.is_float(x.dtype):
            x[:] = sums[:x.size]
            return
        y = self._fixed_decode(sums, np.empty(x.size, np.float32))
        if divisor != 1:
            np.divide(y, np.float32(divisor), out=y)
        codec.narrow(y, x)

    def _fixed_encode(self, x: np.ndarray, lanes: np.ndarray) -> bool:
        """``codec.fixed_encode`` of float32 ``x`` (the native stream's is its C++ twin)."""
        return codec.fixed_encode(x, self.n_workers, lanes)

    def _fixed_decode(self, sums: np.ndarray, y: np.ndarray) -> np.ndarray:
        """``codec.fixed_decode`` into float32 ``y`` (the native stream's is its C++ twin)."""
        return codec.fixed_decode(sums, self.n_workers, y)

    def _exponents(self, x: np.ndarray) -> ExponentTracker:
        return ExponentTracker(x, self.grant.values_per_packet, block=self.reduction.block)

    def _control_round(self, lanes: np.ndarray, exp0: int, flags: int) -> tuple[np.ndarray, int, int]:
        """Send the control packet's lanes on slot 0 with ``flags`` and return (summed lanes,
        agreed exponent of block 0, the result's flags); sets ``control_rtt``."""
        raise NotImplementedError

    def _stream_blocks(self, x: np.ndarray, exps: ExponentTracker, goal: int, divisor: int) -> list[int]:
        """Allreduce the blocks of ``x`` in place (float results divided by ``divisor`` before
        their rounding to ``x``'s format); returns the blocks that overflowed."""
        raise NotImplementedError

    def stall_error(self, missing: str, waiting: list[int]) -> AllreduceError:
        g = self.grant
        return AllreduceError(
            f"job {g.job_id} rank {self.rank}: no result for {self.stall_timeout:.1f}s "
            f"from {g.mode} aggregator {g.aggregator[0]}:{g.aggregator[1]}; "
            f"{missing} missing, slots waiting: {waiting[:8]}")


class SlotStream(StreamBase):
    """Blocking allreduce of flat float32/int32 arrays for one worker of one job, in Python."""

    def __init__(self, grant: Grant, rank: int, n_workers: int, transport: Transport, **kw) -> None:
        self._buf = bytearray(65536)
        super().__init__(grant, rank, n_workers, transport, **kw)
        self._rtt = RttEstimator(self.rto_min, self.rto_max)
        self._loss = LossDetector(self._rtt)
        self._next_scan = 0.0
        self._drained = True  # the last receive found the socket empty

    def set_grant(self, grant: Grant) -> None:
        super().set_grant(grant)
        self._next_set = [0] * grant.slot_count
        self._source = self.transport.source_of(grant.aggregator)

    # -- sending -----------------------------------------------------------------------------

    def _send_round(self, rounds: OutstandingRounds, idx: int, chunk: int, priming: bool,
                    values: np.ndarray | None, exp: int, flags: int, now: float) -> None:
        g = self.grant
        slot_set = self._next_set[idx]
        self._next_set[idx] = 1 - slot_set
        offset = chunk * g.values_per_packet
        pkt = build_contribution(g.job_id, self.rank, g.epoch, g.slot_base + idx, slot_set, offset,
                                 values, g.values_per_packet, exp=exp, flags=flags)
        rto = self._loss.timeout(now)
        count = 0 if values is None else len(values)
        rounds.add(idx, Round(chunk, priming, slot_set, offset, count, pkt, now, now + rto, rto))
        self._transmit(pkt)

    def _transmit(self, pkt: bytes) -> None:
        self.transport.send(pkt)
        self.stats.packets_sent += 1
        self.stats.wire_bytes_sent += len(pkt) + self.transport.overhead

    def _send_block(self, rounds: OutstandingRounds, idx: int, x: np.ndarray, exps: ExponentTracker,
                    chunk: int, window: int, now: float) -> None:
        k = self.grant.values_per_packet
        block = x[chunk * k: chunk * k + k]
        flags = 0
        if exps.is_float:
            if exps.bad[chunk]:
                flags, block = FLAG_OVERFLOW, np.zeros(block.size, np.int32)
            else:
                block = codec.quantize(block, exps.agreed[chunk], self.shift)
        self._send_round(rounds, idx, chunk, False, block, exps.local_exp(chunk + window), flags, now)

    def _resend_lost(self, rounds: OutstandingRounds, now: float) -> None:
        """Resend what :class:`LossDetector` finds lost: fast retransmits and timeouts on a
        delivering path at once; rounds that timed out on a silent path at once on a lossy path,
        else only one probe at a time (the round waiting longest; slot order on ties, as the
        native twin)."""
        lossy = self._loss.lossy(now)
        silent, probe = 0, None
        for _, rnd in sorted(rounds.rounds.items()):
            loss = self._loss.verdict(rnd, now)
            if loss is Loss.NONE:
                continue
            backoff = loss is Loss.TIMEOUT and self._loss.silent(rnd)
            silent += backoff
            if backoff and not lossy:
                if probe is None or rnd.last_sent < probe.last_sent:
                    probe = rnd
                continue
            if loss is Loss.FAST:
                self.stats.fast_retransmissions += 1
                self._loss.saw_loss(now)
            self._resend(rnd, self._loss.next_rto(rnd, backoff, now), now)
        if probe is not None:
            if not self._loss.may_probe(now):
                return  # the episode's probe is pending: the silent rounds wait
            self._resend(probe, self._loss.probe(now), now)
        if silent:
            self.stats.backoffs += 1 if probe is not None else silent
            self.stats.bursts += is_burst(silent, self.window)

    def _resend(self, rnd: Round, rto: float, now: float) -> None:
        if not rnd.retransmitted:
            rnd.packet = rnd.packet[:1] + bytes([rnd.packet[1] | FLAG_RETRANSMIT]) + rnd.packet[2:]
            rnd.retransmitted = True
        self.stats.retransmissions += 1
        rnd.rto, rnd.deadline, rnd.last_sent = rto, now + rto, now
        self._transmit(rnd.packet)

    # -- receiving ---------------------------------------------------------------------------

    def _receive(self, rounds: OutstandingRounds, timeout: float) -> tuple[int, Round | None, float]:
        """Wait up to ``timeout`` for one datagram: (slot index, its round, now) when it is an
        accepted result, (-1, None, now) otherwise (counted)."""
        got, source = self.transport.recv_from(self._buf, timeout)
        now = time.perf_counter()
        self._drained = not got and source is None
        if self._drained:
            return -1, None, now
        self.stats.packets_received += 1
        self.stats.wire_bytes_received += got + self.transport.overhead
        verdict, idx = rounds.check(memoryview(self._buf), got, source)
        if verdict is not ResultCheck.ACCEPTED:
            self.stats.drop(verdict, self._buf[1] if got > 1 else 0)
            return -1, None, now
        rnd = rounds.pop(idx)
        if self._buf[1] & FLAG_FROM_HOST:
            self.stats.host_results += 1
        marked = bool(self._buf[1] & FLAG_CONGESTION)
        self.stats.congestion_marks += marked
        self.window_control.congestion.on_result(marked)
        if not rnd.retransmitted:
            self._rtt.sample(now - rnd.sent_at)
        self._loss.delivered(rnd, now, rounds.rounds.values())
        return idx, rnd, now

    def _await(self, rounds: OutstandingRounds, progress: float,
               missing: Callable[[], str]) -> tuple[int, Round, float]:
        """Receive until some round completes; resend lost rounds every scan tick
        (:meth:`RttEstimator.scan_tick`) once nothing waits in the socket (after this process was descheduled, the
        answers of rounds that look lost may be queued there); raise the stall error (naming
        ``missing()``) after ``stall_timeout`` without progress."""
        tick = self._rtt.scan_tick()
        while True:
            now = time.perf_counter()
            if now >= self._next_scan and self._drained:
                self._resend_lost(rounds, now)
                self._next_scan = now + tick
            if self.aborted or now - progress > self.stall_timeout:
                waiting = sorted(self.grant.slot_base + i for i in rounds.rounds)
                raise self.stall_error(missing(), waiting)
            idx, rnd, now = self._receive(rounds, tick)
            if rnd is not None:
                return idx, rnd, now

    def _header_fields(self) -> tuple[int, int, np.ndarray]:
        """(flags, exp, values) of the accepted result in the receive buffer."""
        _, flags, _, _, exp, _, _, count, _ = unpack_raw(self._buf)
        return flags, exp, np.frombuffer(self._buf, ">i4", count, HEADER_BYTES)

    # -- the two phases of a call ------------------------------------------------------------

    def _control_round(self, lanes: np.ndarray, exp0: int, flags: int) -> tuple[np.ndarray, int, int]:
        rounds = OutstandingRounds(self.grant, self._source)
        start = time.perf_counter()
        self._send_round(rounds, 0, 0, True, lanes, exp0, flags, start)
        _, rnd, now = self._await(rounds, start, lambda: f"call {self.stats.calls - 1}'s control round")
        self.control_rtt = now - rnd.sent_at
        result_flags, exp, values = self._header_fields()
        return values.astype(np.int32), exp, result_flags

    def _stream_blocks(self, x: np.ndarray, exps: ExponentTracker, goal: int, divisor: int) -> list[int]:
        g = self.grant
        n_blocks = exps.n_blocks
        window = call_window(g.slot_count, n_blocks, goal, exps.is_float)
        self.window = window
        congestion = self.window_control.congestion
        rounds = OutstandingRounds(g, self._source)
        gate = BlockGate(n_blocks)
        now = time.perf_counter()
        gate.defer(0, 0)
        for i in range(1, window):
            if exps.is_float:   # prime: fetch the agreed exponent of block i
                self._send_round(rounds, i, i, True, None, exps.local_exp(i), 0, now)
            else:
                gate.defer(i, i)
        for idx, chunk in gate.release(congestion.allowed()):
            self._send_block(rounds, idx, x, exps, chunk, window, now)
        overflow: list[int] = []
        remaining = n_blocks
        progress = now
        while remaining:
            idx, rnd, progress = self._await(rounds, progress, lambda: f"{remaining} of {n_blocks} blocks")
            flags, exp, values = self._header_fields()
            nxt = rnd.chunk if rnd.priming else rnd.chunk + window
            if not rnd.priming:
                remaining -= 1
                gate.answer(rnd.chunk)
                out = x[rnd.offset: rnd.offset + rnd.count]
                if not exps.is_float:
                    out[:] = values
                elif flags & FLAG_OVERFLOW:
                    overflow.append(rnd.chunk)
                else:
                    codec.dequantize(values, exps.agreed[rnd.chunk], self.shift, out=out, divisor=divisor)
            exps.agree(nxt, exp)
            if nxt < n_blocks:
                gate.defer(idx, nxt)
            for i, chunk in gate.release(congestion.allowed()):
                self._send_block(rounds, i, x, exps, chunk, window, progress)
        return overflow

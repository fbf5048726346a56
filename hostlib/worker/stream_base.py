"""What both worker streams share (``inagg.hostlib.worker.stream``, C++, and
``inagg.hostlib.worker.stream_reference``, its Python specification): ``StreamBase``, the public
``allreduce`` that runs once per call in Python (the control round's lanes and their decoding,
the window choice, a small call riding in the control round, the errors), its counters
(``StreamStats``), the one-round-ahead block exponents (``ExponentTracker``) and the
reproducible-results settings (``Reduction``). The per-packet phases are each stream's own.

Block exponents travel one round ahead (SwitchML, :class:`ExponentTracker`): the packet of block
``c`` carries this worker's exponent of block ``c + W``, and the result of block ``c`` returns
the job-wide maximum, which is the exponent every worker then uses to quantize block ``c + W``.
A float call primes every slot it uses with a header-only round that fetches the exponents of
the first W blocks (int32 tensors are summed as they are and prime no slot).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Protocol

import numpy as np

from inagg.hostlib.wire import codec
from inagg.hostlib.wire.grant import Grant
from inagg.hostlib.wire.protocol import EXP_NONE, FLAG_OVERFLOW, FLAG_RETRANSMIT
from inagg.hostlib.worker.call_protocol import (
    BadPart, CallSpec, ControlVector, GOAL_BITS, Part, Refusal, ResultCheck, check_array, check_part,
    one_round_capacity, overflow_error,
)
from inagg.hostlib.worker.rounds import CongestionWindow, INITIAL_WINDOW, WindowControl


class AllreduceError(RuntimeError):
    """The allreduce could not complete (no progress before the stall timeout)."""


class SlotStalled(AllreduceError):
    """A call got no result for ``stuck_timeout``; its tensor is as it was before the call, so
    the call can run again from scratch (the communicator does, on a fresh epoch)."""


class Transport(Protocol):
    """What a stream sends and receives through (``inagg.hostlib.wire.transport``)."""

    overhead: int   # bytes of headers each datagram carries on the wire beyond its payload

    def send(self, data: bytes) -> None:
        """Send one datagram to the grant's aggregator."""

    def recv_from(self, buf: bytearray, timeout: float) -> tuple[int, object]:
        """Receive one datagram into ``buf`` within ``timeout`` seconds: (its length, its source)."""

    def source_of(self, aggregator: tuple[str, int]) -> object:
        """The source ``recv_from`` reports for datagrams from ``aggregator``."""


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
    elided_results: int = 0     # accepted results without values: another rank's reduce-scatter shard
    seconds: float = 0.0
    result_drops: dict = field(default_factory=dict)

    def drop(self, check: ResultCheck, flags: int) -> None:
        """Count a dropped datagram under ``check``; a late copy of a retransmitted round counts as
        a spurious retransmission too."""
        self.ignored_results += 1
        if flags & FLAG_RETRANSMIT and check in (ResultCheck.NO_ROUND, ResultCheck.WRONG_SET,
                                              ResultCheck.WRONG_ROUND):
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
        """The counters as a plain dict (``result_drops`` copied)."""
        d = dict(self.__dict__)
        d["result_drops"] = dict(self.result_drops)
        return d


# A call uses at most max(PRIMING_FREE_WINDOW, ceil(blocks / PRIMING_SHARE)) slots, so the
# header-only priming rounds of a call with many blocks are at most about a quarter of its rounds.
PRIMING_SHARE = 4


PRIMING_FREE_WINDOW = 16


def call_window(slot_count: int, n_blocks: int, goal: int, is_float: bool) -> int:
    """Slots a call uses (the same on every rank: all inputs are agreed)."""
    window = min(slot_count, n_blocks, goal)
    if is_float:  # only float calls prime every slot they use
        window = min(window, max(PRIMING_FREE_WINDOW, -(-n_blocks // PRIMING_SHARE)))
    return window


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

    def __init__(self, x: np.ndarray, k: int, exponents: Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]] = codec.block_exponents,
                 block: int | None = None) -> None:
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
        """This rank's exponent of block ``chunk`` (EXP_NONE past the last block)."""
        return int(self.local[chunk]) if chunk < self.n_blocks else EXP_NONE

    def agree(self, chunk: int, exp: int) -> None:
        """Record the job-wide exponent ``exp`` of block ``chunk`` (a float call's only)."""
        if self.is_float and chunk < self.n_blocks:
            self.agreed[chunk] = exp


class StreamBase:
    """What both streams (this Python one and the native one) share: the grant, the call
    number, the control vector and its decoding, the window goal and the public ``allreduce``."""

    def __init__(self, grant: Grant, rank: int, n_workers: int, transport: Transport, *,
                 rto_min: float = 0.02, rto_max: float = 1.0, stall_timeout: float = 30.0,
                 stuck_timeout: float | None = None) -> None:
        if not 0 <= rank < n_workers:
            raise ValueError(f"rank {rank} not in 0..{n_workers - 1}")
        self.rank = rank
        self.n_workers = n_workers
        self.transport = transport
        self.rto_min, self.rto_max = rto_min, rto_max
        if not stall_timeout > 0 or (stuck_timeout is not None and not stuck_timeout > 0):
            raise ValueError(f"stall_timeout ({stall_timeout}) and stuck_timeout ({stuck_timeout}) must be "
                             f"positive seconds (stuck_timeout: no result this long ends an attempt of a call; "
                             f"None or above stall_timeout: stall_timeout)")
        self.stall_timeout = stall_timeout
        # an attempt of a call's blocks ends after this long without a result (SlotStalled); of
        # a control round, after stall_timeout (a peer late to the call looks the same there)
        self.stuck_timeout = stall_timeout if stuck_timeout is None else min(stuck_timeout, stall_timeout)
        self.stats = StreamStats()
        self.control = ControlVector(n_workers)
        self.agreed_epoch = 0
        self.control_rtt = 0.0  # round trip of the last call's control round: a latency probe
        self.round_trips = 0    # of the last call: 1 when it rode in the control round, else 2
        self.window = 0  # slots the last call used (agreed by all ranks)
        self.window_control: WindowControl | None = None
        self.aborted = False
        self.reduction = Reduction()
        self._part: Part | None = None   # the values the running call keeps (None: all, an allreduce)
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
        self.window_control = WindowControl(maximum=min(grant.slot_count, (1 << GOAL_BITS) - 1),
                                            congestion=CongestionWindow(size=size))

    def allreduce(self, x: np.ndarray | None, pending_epoch: int = 0, *, average: bool = False,
                  refusal: Refusal | None = None, again: bool = False,
                  part: Iterable[tuple[int, int]] | None = None) -> np.ndarray | None:
        """Sum (``average``: mean) ``x`` (flat, int32 or one of ``codec.FLOAT_DTYPES``) over all
        workers, in place. A float16 or bfloat16 result is the float32 one (its mean for an
        average) rounded once to the tensor's format (``codec``).

        Every call takes part in the control round, even one this rank refuses (``refusal``
        given, or ``x`` unusable): then every rank raises the same :class:`CallRefused`. A call
        of at most ``one_round_capacity`` values rides in the control round itself (one round
        trip); a larger one streams its blocks after it.
        ``pending_epoch``: the newest pending grant this rank has seen (0: none); after the
        call, ``agreed_epoch`` holds the smallest such epoch over all ranks (0: none).

        No result for ``stuck_timeout`` in the blocks (for ``stall_timeout`` in the control
        round, where a peer late to the call looks the same) raises :class:`SlotStalled` with
        ``x`` as it was (the blocks' results are written in place: ``_restoring``);
        ``again``: run the call that stalled again, under its call number, from scratch.

        ``part``: a reduce-scatter, of which this rank keeps only the values of ``x`` in these
        ``[first, end)`` ranges (its shard; a host's leader: its ranks' shards; bad ones refuse
        the call on every rank, ``check_part``): the blocks wholly in one go with FLAG_MINE, so an
        aggregator that honours it sends their values to this rank alone and every other block's
        to its owner alone; a block wholly outside all of them answered without its values is left
        in ``x`` as it was. Only the part's values are the sum afterwards (a small call rides
        whole); no ranges (or None): an allreduce."""
        self._part = None   # an allreduce, unless _take_part finds ranges
        refusal = refusal or check_array(x, average) or self._take_part(x, part)
        started = time.perf_counter()
        self.agreed_epoch = 0
        call = self.stats.calls - 1 if again else self.stats.calls
        self.stats.calls = call + 1
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
            overflow = self._restoring(x, lambda: self._stream_blocks(x, local, agreement.window_goal, divisor))
            self.window_control.update(self.window, max(0, self.stats.timeouts() - lost_before))
            if overflow:
                raise overflow_error(overflow, self.grant.values_per_packet)
        self.stats.allreduces += 1
        self.stats.elements += x.size
        self.stats.seconds += time.perf_counter() - started
        return x

    def _take_part(self, x: np.ndarray, part: Iterable[tuple[int, int]] | None) -> Refusal | None:
        """``part`` checked, as the running call's (left None when it holds no range), or the
        call's refusal of it."""
        try:
            self._part = check_part(part or (), x.size) or None
        except BadPart as e:
            return e.refusal
        return None

    @staticmethod
    def _restoring(x: np.ndarray, stream: Callable[[], list[int]]) -> list[int]:
        """``stream()`` (the blocks of ``x``, written in place as their results come); when it
        stalls, ``x`` gets its values back before ``SlotStalled`` goes on."""
        kept = x.copy()
        try:
            return stream()
        except SlotStalled:
            np.copyto(x, kept)
            raise

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
        """The block exponents of ``x`` at the grant's K and the reduction's exponent block."""
        return ExponentTracker(x, self.grant.values_per_packet, block=self.reduction.block)

    def _control_round(self, lanes: np.ndarray, exp0: int, flags: int) -> tuple[np.ndarray, int, int]:
        """Send the control packet's lanes on slot 0 with ``flags`` and return (summed lanes,
        agreed exponent of block 0, the result's flags); sets ``control_rtt``."""
        raise NotImplementedError

    def _stream_blocks(self, x: np.ndarray, exps: ExponentTracker, goal: int, divisor: int) -> list[int]:
        """Allreduce the blocks of ``x`` in place (float results divided by ``divisor`` before
        their rounding to ``x``'s format); returns the blocks that overflowed."""
        raise NotImplementedError

    def stall_error(self, missing: str, waiting: list[int], seconds: float) -> SlotStalled:
        """The error of a call without progress for ``seconds``: the aggregator, the grant's
        epoch, what is ``missing`` and the slots still ``waiting``."""
        g = self.grant
        return SlotStalled(
            f"job {g.job_id} rank {self.rank}: no result for {seconds:.1f}s "
            f"from {g.mode} aggregator {g.aggregator[0]}:{g.aggregator[1]} (epoch {g.epoch}); "
            f"{missing} missing, slots waiting: {waiting[:8]}")

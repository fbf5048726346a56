"""Worker side of the inagg protocol: stream a tensor through a window of aggregator slots.

The tensor is cut into blocks of K values (one packet each). Block ``c`` uses slot
``slot_base + c % W`` and rounds on each slot alternate between the slot's two shadow sets, for
the life of the grant (not per call), as the aggregator's duplicate logic requires.

Block exponents travel one round ahead (SwitchML): the packet of block ``c`` carries this
worker's exponent of block ``c + W``, and the result of block ``c`` returns the job-wide maximum,
which is the exponent every worker then uses to quantize block ``c + W``. Each call opens with a
priming round per slot that fetches the exponents of the first W blocks (int32 tensors are summed
as they are and prime only slot 0).

Slot 0's priming round goes first, alone, and carries a control vector of 2N int32 values: in
position r, rank r's element count and dtype, and in position N + r rank r's window goal
(high 16 bits) and the newest pending grant epoch it has seen (low 16 bits). Its (exact,
integer) sum gives every rank the same view: a size or dtype mismatch fails the call on every
rank with the same error before any data moves (and before any other slot changes state);
``agreed_epoch`` = the smallest pending epoch all ranks have seen is the grant every rank may
switch to after this call, at the same boundary; and the call's window W (slots in use, rounds
in flight) is the smallest goal, so every rank maps blocks to the same slots.

Window: a float32 call primes every slot it uses, so it uses at most a quarter as many slots as
it has blocks (``PRIMING_SHARE``), or 16 (``PRIMING_FREE_WINDOW``) if that is more; and rounds
beyond what the path can carry are dropped in a switch's input buffer (BMv2's, the software data
plane's) and cost timeouts, so each rank's goal follows loss (:class:`WindowControl`, AIMD).
``window`` is the last call's W.

Loss recovery: every outstanding round has a deadline (RTO from an RTT estimate, Karn's rule,
doubling backoff per slot); on expiry the same packet is resent with FLAG_RETRANSMIT. The
aggregator never adds a duplicate twice and answers a duplicate of a finished round with its
stored result, so results are bit-identical with or without loss.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from . import codec
from .grant import Grant
from .protocol import (
    EXP_NONE,
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


class Transport(Protocol):
    overhead: int

    def send(self, data: bytes) -> None: ...
    def recv_into(self, buf: bytearray, timeout: float) -> int: ...


@dataclass
class StreamStats:
    """Counters of one worker's stream. Wire bytes include Ethernet/IPv4/UDP headers."""

    allreduces: int = 0
    elements: int = 0
    packets_sent: int = 0
    packets_received: int = 0
    wire_bytes_sent: int = 0
    wire_bytes_received: int = 0
    retransmissions: int = 0
    ignored_results: int = 0
    host_results: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


_PRIME = -1  # chunk index of a slot's priming round
MAX_ELEMENTS = 1 << 30  # the control vector carries 2 * numel + dtype in an int32
_EPOCH_BITS = 16  # control vector: window goal << 16 | pending epoch
# A call uses at most max(PRIMING_FREE_WINDOW, ceil(blocks / PRIMING_SHARE)) slots, so the
# header-only priming rounds of a call with many blocks are at most about a quarter of its rounds.
PRIMING_SHARE = 4
PRIMING_FREE_WINDOW = 16


@dataclass
class _Round:
    """The one outstanding round of a slot."""

    chunk: int
    slot_set: int
    offset: int
    packet: bytes
    sent_at: float
    deadline: float
    rto: float
    retransmitted: bool = False


@dataclass
class _RttEstimator:
    """RFC 6298 style smoothed RTT -> retransmission timeout."""

    rto_min: float
    rto_max: float
    srtt: float | None = None
    rttvar: float = 0.0
    rto: float = field(init=False)

    def __post_init__(self) -> None:
        self.rto = max(self.rto_min, 0.05)

    def sample(self, rtt: float) -> None:
        if self.srtt is None:
            self.srtt, self.rttvar = rtt, rtt / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - rtt)
            self.srtt = 0.875 * self.srtt + 0.125 * rtt
        self.rto = min(self.rto_max, max(self.rto_min, self.srtt + 4 * self.rttvar))


@dataclass
class WindowControl:
    """One rank's goal for the window of its next calls: AIMD on loss, as ATP's window.

    A call with a timeout halves the window it used (a switch's input buffer, BMv2's or the
    software data plane's, overflowed), as TCP sets ssthresh from the flight size (RFC 5681); a
    call that used its whole goal without one raises the goal by a quarter, up to the slots
    granted."""

    minimum: int = 4
    maximum: int = 1
    goal: int = 1 << 15

    def __post_init__(self) -> None:
        self.goal = self._clamp(self.goal)

    def _clamp(self, w: int) -> int:
        return max(min(self.minimum, self.maximum), min(self.maximum, w))

    def update(self, window: int, timeouts: int) -> None:
        if timeouts:
            self.goal = self._clamp(window // 2)
        elif window >= self.goal:
            self.goal = self._clamp(self.goal + max(1, self.goal // 4))


class SlotStream:
    """Blocking allreduce (sum) of flat float32/int32 arrays for one worker of one job."""

    def __init__(
        self,
        grant: Grant,
        rank: int,
        n_workers: int,
        transport: Transport,
        *,
        rto_min: float = 0.05,
        rto_max: float = 1.0,
        stall_timeout: float = 30.0,
    ) -> None:
        if not 0 <= rank < n_workers:
            raise ValueError(f"rank {rank} not in 0..{n_workers - 1}")
        self.rank = rank
        self.n_workers = n_workers
        self.transport = transport
        self.stall_timeout = stall_timeout
        self.stats = StreamStats()
        self._rtt = _RttEstimator(rto_min, rto_max)
        self._buf = bytearray(65536)
        self.agreed_epoch = 0
        self.control_rtt = 0.0  # round trip of the last call's control round: a latency probe
        self.window = 0  # slots the last call used (agreed by all ranks)
        self.set_grant(grant)

    def set_grant(self, grant: Grant) -> None:
        """Use a new grant from the next call on. Slots of a new (job, epoch) start fresh."""
        if 2 * self.n_workers > grant.values_per_packet:
            raise ValueError(f"{self.n_workers} workers need at least {2 * self.n_workers} values "
                             f"per packet (the control vector), grant has {grant.values_per_packet}")
        self.grant = grant
        self._next_set = [0] * grant.slot_count
        self._shift = codec.shift_for(self.n_workers)
        # the goal travels in 15 bits of the control vector (a non-negative int32)
        self.window_control = WindowControl(maximum=min(grant.slot_count, (1 << 15) - 1))

    # -- public ------------------------------------------------------------------------------

    def allreduce(self, x: np.ndarray, pending_epoch: int = 0) -> np.ndarray:
        """Sum ``x`` (flat, float32 or int32) over all workers of the job, in place.

        ``pending_epoch``: the newest pending grant this rank has seen (0: none); after the
        call, ``agreed_epoch`` holds the smallest such epoch over all ranks."""
        if x.dtype not in (np.float32, np.int32):
            raise TypeError(f"allreduce supports float32 and int32, not {x.dtype}")
        if x.ndim != 1 or not x.flags.c_contiguous:
            raise ValueError("allreduce needs a flat contiguous array")
        if x.size >= MAX_ELEMENTS:
            raise ValueError(f"allreduce of {x.size} elements: at most {MAX_ELEMENTS - 1} per call")
        started = time.perf_counter()
        self.agreed_epoch = 0
        if x.size:
            error = self._run(x, pending_epoch)
            if error is not None:
                raise error
        self.stats.allreduces += 1
        self.stats.elements += x.size
        self.stats.seconds += time.perf_counter() - started
        return x

    # -- the window protocol -----------------------------------------------------------------

    def _run(self, x: np.ndarray, pending_epoch: int) -> Exception | None:
        g = self.grant
        k = g.values_per_packet
        n = self.n_workers
        n_chunks = -(-x.size // k)
        window = 0  # agreed in the control round
        is_float = x.dtype == np.float32
        local_exp = [EXP_NONE] * n_chunks
        if is_float:
            local_exp, bad = codec.block_exponents(x, k)
            local_exp = local_exp.tolist()
            agreed = [EXP_NONE] * n_chunks
        overflow_chunks: list[int] = []
        control = np.zeros(2 * n, np.int32)
        control[self.rank] = 2 * x.size + int(is_float)
        control[n + self.rank] = (self.window_control.goal << _EPOCH_BITS) | pending_epoch
        stats = self.stats
        retransmitted_before = stats.retransmissions

        def packet_for(slot_idx: int, chunk: int, slot_set: int) -> tuple[bytes, int]:
            slot = g.slot_base + slot_idx
            if chunk == _PRIME:
                offset = slot_idx * k
                return build_contribution(g.job_id, self.rank, g.epoch, slot, slot_set, offset,
                                          control if slot_idx == 0 else None, k,
                                          exp=local_exp[slot_idx]), offset
            offset = chunk * k
            block = x[offset: offset + k]
            flags = 0
            exp = EXP_NONE
            if is_float:
                nxt = chunk + window
                exp = local_exp[nxt] if nxt < n_chunks else EXP_NONE
                if bad[chunk]:
                    flags = FLAG_OVERFLOW
                    block = np.zeros(block.size, dtype=np.int32)
                else:
                    block = codec.quantize(block, agreed[chunk], self._shift)
            return build_contribution(g.job_id, self.rank, g.epoch, slot, slot_set, offset,
                                      block, k, exp=exp, flags=flags), offset

        outstanding: dict[int, _Round] = {}
        overhead = self.transport.overhead

        def send_round(slot_idx: int, chunk: int, now: float) -> None:
            slot_set = self._next_set[slot_idx]
            pkt, offset = packet_for(slot_idx, chunk, slot_set)
            self._next_set[slot_idx] = 1 - slot_set
            rto = self._rtt.rto
            outstanding[slot_idx] = _Round(chunk, slot_set, offset, pkt, now, now + rto, rto)
            self.transport.send(pkt)
            stats.packets_sent += 1
            stats.wire_bytes_sent += len(pkt) + overhead

        now = time.perf_counter()
        send_round(0, _PRIME, now)  # alone: the control vector is checked before anything else

        buf = self._buf
        view = memoryview(buf)
        remaining = n_chunks
        last_progress = now
        tick = self._rtt.rto_min
        next_scan = now + tick
        while remaining:
            got = self.transport.recv_into(buf, tick)
            now = time.perf_counter()
            if got:
                stats.packets_received += 1
                stats.wire_bytes_received += got + overhead
                idx = self._match(view, got, outstanding)
                if idx is None:
                    stats.ignored_results += 1
                else:
                    rnd = outstanding.pop(idx)
                    _, flags, _, _, exp, _, _, count, _ = unpack_raw(view)
                    if flags & FLAG_FROM_HOST:
                        stats.host_results += 1
                    if not rnd.retransmitted:
                        self._rtt.sample(now - rnd.sent_at)
                    last_progress = now
                    vals = np.frombuffer(buf, ">i4", count, HEADER_BYTES)
                    nxt = idx if rnd.chunk == _PRIME else rnd.chunk + window
                    if rnd.chunk == _PRIME and idx == 0:
                        self.control_rtt = now - rnd.sent_at
                        error = self._check_control(vals, n)
                        if error is not None:
                            return error
                        window = min(g.slot_count, n_chunks, self._agreed_goal)
                        if is_float:  # only float calls prime every slot they use
                            window = min(window, max(PRIMING_FREE_WINDOW, -(-n_chunks // PRIMING_SHARE)))
                        self.window = window
                        for i in range(1, window):  # phase 2: the other slots
                            send_round(i, _PRIME if is_float else i, now)
                    elif rnd.chunk != _PRIME:
                        remaining -= 1
                        out = x[rnd.offset: rnd.offset + count]
                        if not is_float:
                            out[:] = vals
                        elif flags & FLAG_OVERFLOW:
                            overflow_chunks.append(rnd.chunk)
                        else:
                            codec.dequantize(vals, agreed[rnd.chunk], self._shift, out=out)
                    if is_float and nxt < n_chunks:
                        agreed[nxt] = exp
                    if nxt < n_chunks:
                        send_round(idx, nxt, now)
            if now >= next_scan:
                next_scan = now + tick
                self._resend_expired(outstanding, now)
                if now - last_progress > self.stall_timeout:
                    raise AllreduceError(
                        f"job {g.job_id} rank {self.rank}: no result for {self.stall_timeout:.1f}s "
                        f"from {g.mode} aggregator {g.aggregator[0]}:{g.aggregator[1]}; "
                        f"{remaining} of {n_chunks} blocks missing, slots waiting: "
                        f"{sorted(g.slot_base + i for i in outstanding)[:8]}"
                    )
        self.window_control.update(window, stats.retransmissions - retransmitted_before)
        if overflow_chunks:
            first = min(overflow_chunks) * k
            return FloatingPointError(
                f"allreduce input holds inf/NaN or |x| >= 2**127 on some rank: "
                f"{len(overflow_chunks)} block(s) of {k} values, first at element {first}; "
                f"those elements are left unchanged")
        return None

    def _check_control(self, summed: np.ndarray, n: int) -> ValueError | None:
        """Every rank's (size, dtype) must agree; records the agreed pending epoch."""
        shapes = summed[:n].tolist()
        if len(set(shapes)) != 1:
            desc = ", ".join(f"rank {r}: {v // 2} x {'float32' if v % 2 else 'int32'}"
                             for r, v in enumerate(shapes))
            return ValueError(f"allreduce tensors differ across ranks ({desc})")
        packed = summed[n:]
        self.agreed_epoch = int((packed & ((1 << _EPOCH_BITS) - 1)).min())
        self._agreed_goal = int((packed >> _EPOCH_BITS).min())
        return None

    def _match(self, view: memoryview, n: int, outstanding: dict[int, _Round]) -> int | None:
        """The slot index a received packet answers, or None for anything else (late or
        duplicate results, foreign packets)."""
        if n < HEADER_BYTES:
            return None
        vt, _, job, _, _, epoch, ss, count, offset = unpack_raw(view)
        g = self.grant
        idx = (ss & MAX_SLOT) - g.slot_base
        rnd = outstanding.get(idx)
        if (rnd is None or vt != (VERSION << 4) | MSG_RESULT or job != g.job_id
                or epoch != g.epoch or ss >> 15 != rnd.slot_set or offset != rnd.offset
                or n != HEADER_BYTES + (4 * g.values_per_packet if count else 0)):
            return None
        return idx

    def _resend_expired(self, outstanding: dict[int, _Round], now: float) -> None:
        for rnd in outstanding.values():
            if now < rnd.deadline:
                continue
            if not rnd.retransmitted:
                rnd.packet = rnd.packet[:1] + bytes([rnd.packet[1] | FLAG_RETRANSMIT]) + rnd.packet[2:]
                rnd.retransmitted = True
            self.stats.retransmissions += 1
            rnd.rto = min(rnd.rto * 2, self._rtt.rto_max)
            rnd.deadline = now + rnd.rto
            self.transport.send(rnd.packet)
            self.stats.packets_sent += 1
            self.stats.wire_bytes_sent += len(rnd.packet) + self.transport.overhead

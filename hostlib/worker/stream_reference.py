"""The worker's stream in Python: the executable specification of ``inagg.hostlib.worker.stream``
(native/stream.cpp), which runs the same protocol in C++ and shares the call protocol
(``inagg.hostlib.worker.call_protocol``), the rounds' loss and congestion control
(``inagg.hostlib.worker.rounds``) and the per-call part (``inagg.hostlib.worker.stream_base``)
with it. It runs RoCE jobs; both give bit-identical results (tests/test_stream.py).

The tensor is cut into blocks of K values (one packet each). Block ``c`` uses slot
``slot_base + c % W`` and rounds on each slot alternate between the slot's two shadow sets, for
the life of the grant (not per call), as the aggregator's duplicate logic requires. Each slot
counts its rounds from 0 at every grant and every contribution carries the count's round tag
beyond the set (``protocol.round_fields``): the aggregator takes only the set's next round as a
new one, so a late copy of an older round can never open a set (docs/protocol.md).

Block exponents travel one round ahead (SwitchML, ``stream_base.ExponentTracker``): the packet of block
``c`` carries this worker's exponent of block ``c + W``, and the result of block ``c`` returns
the job-wide maximum, which is the exponent every worker then uses to quantize block ``c + W``.
A float call primes every slot it uses with a header-only round that fetches the exponents of
the first W blocks (int32 tensors are summed as they are and prime no slot).

Every call opens with the control round (``call_protocol``); a small call rides in it, a larger
one then streams its blocks through its window, paced by the congestion window and recovered
from loss as ``rounds`` describes. In a reduce-scatter (``StreamBase.allreduce``'s ``part``,
ranges of the tensor) the blocks wholly in one of the rank's ranges carry FLAG_MINE, and a
result without its values is taken only for a block wholly outside all of them
(``OutstandingRounds.may_elide``) and writes nothing.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from inagg.hostlib.wire import codec
from inagg.hostlib.wire.grant import Grant
from inagg.hostlib.wire.protocol import (
    FLAG_CONGESTION, FLAG_FROM_HOST, FLAG_MINE, FLAG_OVERFLOW, FLAG_RETRANSMIT, HEADER_BYTES, ROUND_CYCLE,
    build_contribution, round_fields, unpack_raw,
)
from inagg.hostlib.worker.call_protocol import ResultCheck, holds
from inagg.hostlib.worker.rounds import (
    BlockGate, Loss, LossDetector, OutstandingRounds, Round, RttEstimator, is_burst,
)
from inagg.hostlib.worker.stream_base import ExponentTracker, StreamBase, Transport, call_window


class SlotStream(StreamBase):
    """Blocking allreduce of flat float32/int32 arrays for one worker of one job, in Python."""

    def __init__(self, grant: Grant, rank: int, n_workers: int, transport: Transport, **kw) -> None:
        self._buf = bytearray(65536)
        super().__init__(grant, rank, n_workers, transport, **kw)
        self._rtt = RttEstimator(self.rto_min, self.rto_max)
        self._loss = LossDetector(self._rtt)
        self._next_scan = 0.0
        self._drained = True  # the last receive found the socket empty
        self._got = 0         # bytes of the last datagram received

    def set_grant(self, grant: Grant) -> None:
        """``StreamBase.set_grant``; every slot of a new grant starts at round 0 (set 0, tag 0),
        as the aggregator's slot, reset by the grant's first packet, expects."""
        super().set_grant(grant)
        self._next_round = [0] * grant.slot_count
        self._source = self.transport.source_of(grant.aggregator)

    # -- sending -----------------------------------------------------------------------------

    def _send_round(self, rounds: OutstandingRounds, idx: int, chunk: int, priming: bool,
                    values: np.ndarray | None, exp: int, flags: int, now: float) -> None:
        """Send block ``chunk``'s round on slot index ``idx`` (``priming``: header only, fetching
        an exponent), as the slot's next round (its set and round tag), and hold it as outstanding
        with a fresh timeout."""
        g = self.grant
        round_no = self._next_round[idx]
        self._next_round[idx] = (round_no + 1) % ROUND_CYCLE
        slot_set, tag_flags = round_fields(round_no)
        offset = chunk * g.values_per_packet
        pkt = build_contribution(g.job_id, self.rank, g.epoch, g.slot_base + idx, slot_set, offset,
                                 values, g.values_per_packet, exp=exp, flags=flags | tag_flags)
        rto = self._loss.timeout(now)
        count = 0 if values is None else len(values)
        rounds.add(idx, Round(chunk, priming, round_no, offset, count, pkt, now, now + rto, rto))
        self._transmit(pkt)

    def _transmit(self, pkt: bytes) -> None:
        """Send ``pkt`` and count it (wire bytes with the transport's headers)."""
        self.transport.send(pkt)
        self.stats.packets_sent += 1
        self.stats.wire_bytes_sent += len(pkt) + self.transport.overhead

    def _send_block(self, rounds: OutstandingRounds, idx: int, x: np.ndarray, exps: ExponentTracker,
                    chunk: int, window: int, now: float) -> None:
        """Send block ``chunk`` quantized with its agreed exponent (a bad block: zeros and
        FLAG_OVERFLOW), carrying this rank's exponent of block ``chunk + window`` one round ahead."""
        k = self.grant.values_per_packet
        block = x[chunk * k: chunk * k + k]
        flags = FLAG_MINE if self._part and holds(self._part, chunk * k, chunk * k + block.size) else 0
        if exps.is_float:
            if exps.bad[chunk]:
                flags, block = flags | FLAG_OVERFLOW, np.zeros(block.size, np.int32)
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
        """Send ``rnd`` again, unchanged but for FLAG_RETRANSMIT (Karn: no RTT sample from it),
        with timeout ``rto``."""
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
        self._got = got
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

    def _await(self, rounds: OutstandingRounds, progress: float, missing: Callable[[], str],
               patience: float) -> tuple[int, Round, float]:
        """Receive until some round completes; resend lost rounds every scan tick
        (:meth:`RttEstimator.scan_tick`) once nothing waits in the socket (after this process was descheduled, the
        answers of rounds that look lost may be queued there); raise the stall error (naming
        ``missing()``) after ``patience`` seconds without progress."""
        tick = self._rtt.scan_tick()
        while True:
            now = time.perf_counter()
            if now >= self._next_scan and self._drained:
                self._resend_lost(rounds, now)
                self._next_scan = now + tick
            if self.aborted or now - progress > patience:
                waiting = sorted(self.grant.slot_base + i for i in rounds.rounds)
                raise self.stall_error(missing(), waiting, patience)
            idx, rnd, now = self._receive(rounds, tick)
            if rnd is not None:
                return idx, rnd, now

    def _header_fields(self) -> tuple[int, int, np.ndarray]:
        """(flags, exp, values) of the accepted result in the receive buffer (values None: elided,
        a block wholly outside this rank's reduce-scatter part)."""
        _, flags, _, _, exp, _, _, count, _ = unpack_raw(self._buf)
        if count and self._got == HEADER_BYTES:
            return flags, exp, None
        return flags, exp, np.frombuffer(self._buf, ">i4", count, HEADER_BYTES)

    # -- the two phases of a call ------------------------------------------------------------

    def _control_round(self, lanes: np.ndarray, exp0: int, flags: int) -> tuple[np.ndarray, int, int]:
        """``StreamBase._control_round``: slot 0's round with the control lanes, awaited."""
        rounds = OutstandingRounds(self.grant, self._source)
        start = time.perf_counter()
        self._send_round(rounds, 0, 0, True, lanes, exp0, flags, start)
        _, rnd, now = self._await(rounds, start, lambda: f"call {self.stats.calls - 1}'s control round",
                                  self.stall_timeout)
        self.control_rtt = now - rnd.sent_at
        result_flags, exp, values = self._header_fields()
        return values.astype(np.int32), exp, result_flags

    def _stream_blocks(self, x: np.ndarray, exps: ExponentTracker, goal: int, divisor: int) -> list[int]:
        """``StreamBase._stream_blocks``: prime the window's slots (floats), then send each block
        as the congestion window allows and its slot's previous round is answered, dequantizing
        each result in place with its agreed exponent."""
        g = self.grant
        n_blocks = exps.n_blocks
        window = call_window(g.slot_count, n_blocks, goal, exps.is_float)
        self.window = window
        congestion = self.window_control.congestion
        rounds = OutstandingRounds(g, self._source, self._part)
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
            idx, rnd, progress = self._await(rounds, progress, lambda: f"{remaining} of {n_blocks} blocks",
                                             self.stuck_timeout)
            flags, exp, values = self._header_fields()
            nxt = rnd.chunk if rnd.priming else rnd.chunk + window
            if not rnd.priming:
                remaining -= 1
                gate.answer(rnd.chunk)
                out = x[rnd.offset: rnd.offset + rnd.count]
                if exps.is_float and flags & FLAG_OVERFLOW:
                    overflow.append(rnd.chunk)
                elif values is None:
                    self.stats.elided_results += 1
                elif not exps.is_float:
                    out[:] = values
                else:
                    codec.dequantize(values, exps.agreed[rnd.chunk], self.shift, out=out, divisor=divisor)
            exps.agree(nxt, exp)
            if nxt < n_blocks:
                gate.defer(idx, nxt)
            for i, chunk in gate.release(congestion.allowed()):
                self._send_block(rounds, i, x, exps, chunk, window, progress)
        return overflow

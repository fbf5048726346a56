"""The worker's stream in C++ (``inagg.hostlib._native.Stream``, native/stream.cpp) behind the same
interface as the Python :class:`inagg.hostlib.worker.stream_reference.SlotStream`, its
specification.

Python keeps what runs once per call (``StreamBase``: the control vector and its decoding, the
window choice, the errors); the native core runs the per-packet phases with the GIL released:
the control round (with a small call's values, encoded by the C++ twin of
``codec.fixed_encode``), then the blocks (priming, one-round-ahead exponents, quantization,
exact result checks, retransmission), in sendmmsg/recvmmsg batches on the UDP socket of the
transport. Both streams speak the same wire protocol, so ranks of one job may use either.
"""

from __future__ import annotations

import numpy as np

from inagg.hostlib.native_build import _native
from inagg.hostlib.wire import codec
from inagg.hostlib.wire.grant import Grant
from inagg.hostlib.worker.stream_base import ExponentTracker, StreamBase, call_window
from inagg.hostlib.wire.transport import UdpTransport

_COUNTERS = ("packets_sent", "packets_received", "wire_bytes_sent", "wire_bytes_received",
             "retransmissions", "fast_retransmissions", "backoffs", "bursts", "spurious_retransmissions", "host_results",
             "congestion_marks", "elided_results")


def native_block_exponents(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``codec.block_exponents`` in C++ (bit-identical), without the GIL."""
    n_blocks = -(-x.size // k)
    exps, bad = np.empty(n_blocks, np.int8), np.empty(n_blocks, np.uint8)
    _native.block_exponents(codec.native_values(x), k, exps, bad)
    return exps, bad.view(bool)


class NativeSlotStream(StreamBase):
    """Blocking allreduce of flat int32 and float arrays (``codec.FLOAT_DTYPES``) for one worker
    of one job, over UDP, in C++."""

    def __init__(self, grant: Grant, rank: int, n_workers: int, transport: UdpTransport, **kw) -> None:
        self._core: _native.Stream | None = None
        super().__init__(grant, rank, n_workers, transport, **kw)

    def set_grant(self, grant: Grant) -> None:
        super().set_grant(grant)
        if self._core is None:
            self._core = _native.Stream(self.transport.sock.fileno(), self.rank, self.n_workers,
                                        self.rto_min, self.rto_max, self.stall_timeout, self.stuck_timeout)
        ip, port = self.transport.source_of(grant.aggregator)
        self._core.set_grant(grant.job_id, grant.epoch, grant.slot_base, grant.slot_count,
                             grant.values_per_packet, ip, port, self.transport.overhead)

    def abort(self) -> None:
        super().abort()
        self._core.abort()

    @staticmethod
    def _restoring(x: np.ndarray, stream) -> list[int]:
        """``stream()``: the core gives a stalled call's written blocks back itself, each kept
        just before its result overwrote it (``Stream::restore_input``: while the block is in
        cache, without the GIL), not a copy of the whole tensor before the call."""
        return stream()

    def _exponents(self, x: np.ndarray) -> ExponentTracker:
        return ExponentTracker(x, self.grant.values_per_packet, native_block_exponents, self.reduction.block)

    def _sync_stats(self) -> None:
        counters = self._core.counters()
        for name in _COUNTERS:
            setattr(self.stats, name, counters[name])
        self.stats.result_drops = counters["result_drops"]
        self.stats.ignored_results = sum(self.stats.result_drops.values())

    def _fixed_encode(self, x: np.ndarray, lanes: np.ndarray) -> bool:
        return _native.fixed_encode(x, self.n_workers, lanes)

    def _fixed_decode(self, sums: np.ndarray, y: np.ndarray) -> np.ndarray:
        _native.fixed_decode(sums, self.n_workers, y)
        return y

    def _lend_congestion(self) -> None:
        """The congestion window to the core, which updates it per result (the twin of
        ``CongestionWindow.on_result``)."""
        c = self.window_control.congestion
        self._core.set_congestion(c.size, c.alpha, c.slow_start, c.acked, c.marked, c.round, c.peak, c.minimum,
                                  c.maximum)

    def _take_congestion(self) -> None:
        c = self.window_control.congestion
        c.size, c.alpha, c.slow_start, c.acked, c.marked, c.round, c.peak = self._core.congestion()

    def _control_round(self, lanes: np.ndarray, exp0: int, flags: int) -> tuple[np.ndarray, int, int]:
        summed = np.empty_like(lanes)
        self._lend_congestion()
        ok, exp, result_flags, rtt = self._core.control_round(lanes, exp0, flags, summed)
        self._take_congestion()
        self._sync_stats()
        if not ok:
            raise self.stall_error(f"call {self.stats.calls - 1}'s control round", self._core.waiting_slots(),
                                   self.stall_timeout)
        self.control_rtt = rtt
        return summed, exp, result_flags

    def _stream_blocks(self, x: np.ndarray, exps: ExponentTracker, goal: int, divisor: int) -> list[int]:
        window = call_window(self.grant.slot_count, exps.n_blocks, goal, exps.is_float)
        self.window = window
        self._lend_congestion()
        part = list(self._part or ())
        if exps.is_float:
            ok = self._core.stream_float(codec.native_values(x), exps.local, exps.bad.view(np.uint8), exps.agreed[0],
                                         window, self.grant.values_per_packet, divisor, part)
        else:
            ok = self._core.stream_int(x, window, part)
        self._take_congestion()
        self._sync_stats()
        if not ok:
            raise self.stall_error(f"{self._core.remaining()} of {exps.n_blocks} blocks",
                                   self._core.waiting_slots(), self.stuck_timeout)
        return list(self._core.overflow())

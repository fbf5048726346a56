"""The same bits on every path: float allreduces on gloo computed as inagg's paths compute them.

inagg's sum is order-free: each rank's values become integers under an exponent all ranks
agree on, the integers' sum is exact in any order, and it is turned back into floats once
(``inagg.hostlib.wire.codec``). gloo sums floats in ring order, so a call that takes the gloo path would
otherwise give other bits than the same call on the switch or the host lane, and which path a
call takes follows timings. Here the gloo path runs inagg's arithmetic with gloo as the
transport of the integers:

* a call of at most ``Reduction.exact_limit`` values: every value as the exact fixed-point
  limbs of the control round (``codec.fixed_encode``), one int32 SUM allreduce, the exact sum
  rounded once (``codec.fixed_decode``);
* a larger one: the block exponents over ``Reduction.block`` values, a MAX allreduce of them
  (the agreement a stream makes one round ahead), each value quantized under its block's agreed
  exponent, an int32 SUM allreduce (|q| <= 2**S, so N of them never overflow), dequantized.

Each call's control vector (the exponents' MAX, the exact sum's lanes) carries one lane more: the
news that this rank has seen a newer grant of the job (``inagg.hostlib.pytorch.path.news``, a
``Ticket`` where it has), settled with whether every rank had.

AVG divides the float32 result before its one rounding to the tensor's dtype, as the streams
do. A call holding inf or NaN (which inagg's paths refuse as a bad block) is summed as floats,
as plain gloo sums it. The backend makes every path share one ``Reduction`` (the block a
multiple of every path's K, the limit the smallest path's capacity), so all paths give the
same bits (``InaggProcessGroup``; ``INAGG_REPRODUCIBLE=0`` turns this off).

Calls run in submission order on one thread with a gloo group of their own (its two allreduces
per call must meet the other ranks' in the same order, whatever else the caller's thread runs
on the backend's main gloo group); a call with nothing queued runs on the caller's thread. The
group is made at the path's first call (``connect``: the same call on every rank, as every call
here), so a job whose calls never take this path (a job on one host's tiny calls) makes none.
``fail`` (a rank gone) ends the calls submitted and every later one with its error: gloo's own
waits end with it too (``wait_gloo``), so no call waits for a rank that will not come.
"""

from __future__ import annotations

import queue
import threading
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist

from inagg.hostlib.errors import InaggError
from inagg.hostlib.native_build import _native
from inagg.hostlib.pytorch.path.news import Ticket
from inagg.hostlib.pytorch.peer_watch import wait_gloo
from inagg.hostlib.wire import codec
from inagg.hostlib.wire.protocol import EXP_NONE
from inagg.hostlib.worker.stream import native_block_exponents
from inagg.hostlib.worker.stream_base import Reduction
from inagg.hostlib.worker.tensors import numpy_view

_BAD_BLOCK = 127 + 1   # above every exponent: a block with inf/NaN on some rank wins the MAX


class FixedPointGloo:
    """One rank's fixed-point float allreduces over a gloo group of their own (module docstring)."""

    def __init__(self, connect: Callable[[], dist.ProcessGroupGloo], world_size: int, reduction: Reduction) -> None:
        """``connect``: makes a gloo group of this path's own of ``world_size`` ranks, at the
        first call (a collective: module docstring)."""
        if reduction.block is None or reduction.exact_limit is None:
            raise ValueError(f"a fixed-point gloo path needs a block and an exact limit, got {reduction}")
        self.reduction = reduction
        self.n = world_size
        self.shift = codec.shift_for(self.n)
        self._connect: Callable[[], dist.ProcessGroupGloo] | None = connect
        self._gloo: dist.ProcessGroupGloo | None = None
        self._queue: queue.Queue = queue.Queue()
        self._running = threading.Lock()   # one call at a time, in submission order
        self._queued = 0                   # submitted to the thread and not done (under _running)
        self._failure: Callable[[], BaseException] | None = None   # ``fail``'s: a fresh error each time
        self._pending: set[torch.futures.Future] = set()   # submitted, not completed (under _lock)
        self._lock = threading.Lock()
        # started by the first call queued: a job whose calls all run on their callers' threads
        # (a job on one host: its tiny calls) never waits for a thread to start (a re-init's time)
        self._thread: threading.Thread | None = None

    def allreduce(self, tensor: torch.Tensor, divisor: int, inline_if_idle: bool,
                  ticket: Ticket | None = None) -> torch.futures.Future:
        """Sum (``divisor`` = N: average) the contiguous float tensor in place; the future
        resolves to ``[tensor]``. ``inline_if_idle``: run it here when nothing is queued (a
        small call's latency), else it is queued (the caller overlaps it with its own work). A
        CUDA tensor is reduced in a host copy, taken here (after the caller's stream's work).
        ``ticket``: this rank has seen a newer grant (module docstring), settled by the call."""
        fut = torch.futures.Future()
        with self._lock:
            if self._failure is not None:
                fut.set_exception(self._failure())
                if ticket is not None:
                    ticket.settle(False)
                return fut
            self._pending.add(fut)
        host = tensor.cpu() if tensor.is_cuda else tensor
        with self._running:
            if inline_if_idle and not self._queued:
                self._settle(fut, tensor, host, divisor, ticket)
                return fut
            self._queued += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, daemon=True, name="inagg-fixed-gloo")
                self._thread.start()
        self._queue.put((fut, tensor, host, divisor, ticket))
        return fut

    def fail(self, failure: Callable[[], BaseException]) -> None:
        """End every call submitted and not done, and every later one, with ``failure()`` (an
        error of its own each: a raised error keeps the frames it passed, and so the gloo
        Works they hold, for as long as anything keeps it)."""
        with self._lock:
            self._failure = failure
            pending, self._pending = self._pending, set()
        for fut in pending:
            fut.set_exception(failure())

    def close(self) -> None:
        """Stop the thread once the calls queued before are done (after ``fail``, at once: a
        call still in gloo ends with its own wait, ``wait_gloo``); let the gloo group go."""
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(1.0 if self._failure is not None else 10.0)
        self._gloo = self._connect = None

    def _serve(self) -> None:
        while (item := self._queue.get()) is not None:
            with self._running:
                self._settle(*item)
                self._queued -= 1

    def _settle(self, fut: torch.futures.Future, tensor: torch.Tensor, host: torch.Tensor, divisor: int,
                ticket: Ticket | None) -> None:
        """Reduce ``host`` (``tensor`` or its host copy), copy a CUDA tensor's result back, and
        complete ``fut``; ``ticket`` is settled by the call's control vector (False if it failed
        before)."""
        try:
            self._reduce(host, divisor, ticket)
            if host is not tensor:
                tensor.copy_(host)
            outcome, error = [tensor], None
        except Exception as e:  # noqa: BLE001 - delivered to the caller through the future
            outcome, error = None, e
        finally:
            if ticket is not None:
                ticket.settle(False)   # no-op where the control vector settled it
        with self._lock:
            if fut not in self._pending:   # ``fail`` ended it already
                return
            self._pending.discard(fut)
        if error is None:
            fut.set_result(outcome)
        else:   # without this thread's frames: they hold the call's gloo Work (and so the group's
            # connections), and a future keeps its error in C++, beyond the reach of the collector
            fut.set_exception(error.with_traceback(None))

    def _group(self) -> dist.ProcessGroupGloo:
        """The path's gloo group, made at its first call (``connect``; module docstring)."""
        if self._gloo is None:
            if self._connect is None:
                raise InaggError("inagg's fixed-point gloo path was closed (destroy_process_group): no call runs on it")
            self._gloo, self._connect = self._connect(), None
        return self._gloo

    def _reduce(self, tensor: torch.Tensor, divisor: int, ticket: Ticket | None) -> None:
        x = numpy_view(tensor)
        exact = x.size <= self.reduction.exact_limit
        done = self._exact(x, divisor, ticket) if exact else self._blocks(x, divisor, ticket)
        if not done:   # inf/NaN on some rank: as plain gloo
            self._sum(tensor)
            if divisor != 1:
                tensor.div_(divisor)

    def _exact(self, x: np.ndarray, divisor: int, ticket: Ticket | None) -> bool:
        """The exact fixed-point sum, rounded once; False (``x`` unchanged) when some rank's
        values are not representable."""
        n_limbs = codec.fixed_limbs(self.n)
        # the last lane counts ranks with bad values, the one before the ranks with news (a ticket)
        lanes = np.zeros(x.size * n_limbs + 2, np.int32)
        lanes[-1] = not _native.fixed_encode(codec.widen(x), self.n, lanes)
        lanes[-2] = ticket is not None
        self._sum(torch.from_numpy(lanes))
        if ticket is not None:
            ticket.settle(lanes[-2] == self.n)
        if lanes[-1]:
            return False
        y = np.empty(x.size, np.float32)
        _native.fixed_decode(lanes, self.n, y)
        if divisor != 1:
            np.divide(y, np.float32(divisor), out=y)
        codec.narrow(y, x)
        return True

    def _blocks(self, x: np.ndarray, divisor: int, ticket: Ticket | None) -> bool:
        """Block floating point under agreed exponents; False (``x`` unchanged) when some rank
        has a bad block."""
        block = self.reduction.block
        local, bad = native_block_exponents(x, block)
        lanes = np.empty(local.size + 1, np.int32)   # the last lane: 0 where this rank has news (a ticket)
        exps = lanes[:-1]
        exps[:] = local
        exps[bad] = _BAD_BLOCK
        lanes[-1] = ticket is None
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.MAX
        self._wait(self._group().allreduce([torch.from_numpy(lanes)], opts))   # in place: the agreed exponents
        if ticket is not None:
            ticket.settle(lanes[-1] == 0)   # the MAX is 0 only where every rank had news
        if exps.max(initial=EXP_NONE) == _BAD_BLOCK:
            return False
        exps8 = exps.astype(np.int8)
        q = np.empty(x.size, np.int32)
        _native.quantize_blocks(codec.native_values(x), block, exps8, self.shift, q)
        self._sum(torch.from_numpy(q))
        _native.dequantize_blocks(q, block, exps8, self.shift, float(divisor), codec.native_values(x))
        return True

    def _sum(self, tensor: torch.Tensor) -> None:
        self._wait(self._group().allreduce([tensor]))

    def _wait(self, work: dist.Work) -> None:
        wait_gloo(work, lambda: self._failure() if self._failure is not None else None)

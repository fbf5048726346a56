"""Tiny calls of the host-local reduce in C++ (``native/host_tiny.cpp``): a float32 or int32
call of a few values (the backend's calls of at most ``TINY_BYTES``) on a job whose ranks all
share one host.

Design: such a call's time is its protocol's Python around two messages, not its arithmetic,
so C++ runs the whole exchange of ``inagg.hostlib.worker.host_reduce``'s protocol with the GIL
released: the same frames on the same sockets, the same rows of the shared buffer, the same
sums (the exact fixed point of a call that rides in one round; wrapping int32), so a call's
ranks may take either side, and a call in C++ gives the Python path's bits
(``tests/test_host_tiny.py`` checks it with hypothesis). C++ takes only the common case; where
it meets anything else (a rank that refuses or differs, no room, an inf or NaN, a rank dead or
silent past one ``SLICE_SECONDS``) it hands the call, as it stands, to ``HostReduce.carry_on``:
one implementation of every error and wait, the Python protocol, which stays the
specification. Per call here: a lookup of the call's kind (``TinyPlan``, worked out once), the
room in the buffer, and the call into C++.
"""

from __future__ import annotations

import time

import numpy as np

from inagg.hostlib.native_build import _native
from inagg.hostlib.worker.host_group import SLICE_SECONDS, Link
from inagg.hostlib.worker.host_reduce import HostReduce, TinyPlan

# a wait first polls without blocking for this long: a peer on another core answers within
# microseconds, and a blocked rank's wake-up costs more than that on a loaded machine
SPIN_SECONDS = 20e-6


class TinyCalls:
    """This rank's tiny calls (module docstring), on ``reduce``'s links and buffer."""

    def __init__(self, reduce: HostReduce, links: dict[int, Link], spin: float = SPIN_SECONDS) -> None:
        layout = reduce.layout
        self._reduce = reduce
        self._native = _native.HostTiny([links[i].sock.fileno() for i in sorted(links)], layout.local_index,
                                        len(layout.local), layout.world_size, spin)
        self._buffer = None   # the buffer C++ was last given (``HostReduce.buffer`` may change)
        self._reduction = reduce.reduction   # what the plans were worked out for
        self._plans: dict[tuple, TinyPlan | None] = {}

    def allreduce(self, x: np.ndarray, average: bool, k: int) -> int | None:
        """Sum (``average``: mean) ``x`` over the job's ranks in place, as
        ``HostReduce.allreduce`` does, with C++ taking the common case; returns the K of the
        next call, or None where C++ does not take such a call (nothing was done: the caller
        runs it on the Python protocol). Raises what failed, as ``HostReduce.allreduce``."""
        reduce = self._reduce
        buffer = reduce.buffer
        if buffer is None or reduce.broken is not None:
            return None
        plan = self._plan(x, average, k)
        if plan is None or plan.in_end > buffer.split or plan.out_end > buffer.nbytes - buffer.split:
            return None
        if buffer is not self._buffer:
            self._native.use(np.frombuffer(buffer.map, np.uint8))
            self._buffer = buffer
        started = time.perf_counter()
        call = reduce.calls
        reduce.calls += 1
        status = self._native.call(call, plan.word, x, plan.one_round, buffer.split + plan.wire_at,
                                   buffer.split + plan.result_at, plan.k_next, SLICE_SECONDS)
        if status < 0:
            return reduce.carry_on(call, x, average, k, status, self._native.taken(), self._native.sent(), started)
        reduce.count(x.size, x.nbytes, started)
        return status

    def _plan(self, x: np.ndarray, average: bool, k: int) -> TinyPlan | None:
        """The call's ``TinyPlan`` (None: C++ does not take it), worked out once per kind."""
        if self._reduction is not self._reduce.reduction:   # set once by the backend, before its calls
            self._reduction, self._plans = self._reduce.reduction, {}
        key = (x.size, x.dtype, average, k)
        try:
            return self._plans[key]
        except KeyError:
            plan = self._plans[key] = self._reduce.tiny_plan(x, average, k)
            return plan

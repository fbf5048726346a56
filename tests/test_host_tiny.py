"""Tiny calls of the host-local reduce in C++ (inagg.hostlib.worker.host_tiny, native/host_tiny.cpp)
against the Python protocol they speak (inagg.hostlib.worker.host_reduce), its specification:
the same bits, either side on any rank of a call, and every case C++ does not take handed to
the Python protocol, which fails it as it fails a Python call (a refusal, an inf, a silent or a
dead rank, the group's timeout)."""

from __future__ import annotations

import socket
import sys
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

from inagg.hostlib.errors import JobFailed
from inagg.hostlib.worker.call_protocol import CallRefused
from inagg.hostlib.worker.host_communicator import ONE_HOST_VALUES_PER_PACKET, HostCommunicator, open_host_group
from inagg.hostlib.worker.host_group import HostLayout, Link, RankDied, SharedBuffer
from inagg.hostlib.worker.host_reduce import HostReduce
from inagg.hostlib.worker.host_tiny import TinyCalls
from inagg.hostlib.worker.tensors import ReduceOp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_training import on_ranks  # noqa: E402

K = ONE_HOST_VALUES_PER_PACKET
TINY = 256   # values of a 1 KiB call (the backend's TINY_BYTES)


def _groups(n: int, monkeypatch) -> list[HostCommunicator]:
    """``n`` ranks of one host (threads of this process), no job: the host-local reduce alone."""
    monkeypatch.setenv("INAGG_HOST_REDUCE", "auto")
    store = dist.HashStore()
    return on_ranks(lambda r: HostCommunicator(
        open_host_group(dist.PrefixStore("host", store), r, n, timedelta(seconds=60)), None), n, 120)


def _close(comms: list[HostCommunicator]) -> None:
    on_ranks(lambda r: comms[r].group.close(), len(comms), 60)


def _call(comm: HostCommunicator, x: np.ndarray, average: bool, native: bool) -> np.ndarray | Exception:
    """``x`` summed in C++ (``native``: it must take the call) or on the Python protocol (a
    tensor, as the backend passes); the error if it failed."""
    try:
        if native:
            assert comm.tiny(x, average), "C++ declined a tiny call"
        else:
            comm.allreduce(torch.from_numpy(x), ReduceOp.AVG if average else ReduceOp.SUM)   # in x's memory
    except Exception as e:  # noqa: BLE001 - compared below
        return e
    return x


def _floats(draw, n: int) -> np.ndarray:
    """float32 values of every kind a call carries exactly: zeros (both signs), subnormals,
    magnitudes far apart, the largest finite ones."""
    bits = draw(st.lists(st.integers(0, 2**32 - 1), min_size=n, max_size=n))
    x = np.array(bits, np.uint32).view(np.float32).copy()
    x[~np.isfinite(x) | (np.abs(x) >= np.float32(2.0) ** 127)] = np.float32(1.5)
    return x


@st.composite
def _calls(draw, ranks: int):
    """One call of ``ranks`` ranks: each rank's values (float32 or int32, the same size), SUM or
    AVG, and which ranks run it in C++ (the others on the Python protocol)."""
    n = draw(st.integers(0, TINY))
    is_float = draw(st.booleans())
    xs = ([_floats(draw, n) for _ in range(ranks)] if is_float
          else [np.array(draw(st.lists(st.integers(-2**31, 2**31 - 1), min_size=n, max_size=n)), np.int32)
                for _ in range(ranks)])
    return xs, is_float and draw(st.booleans()), draw(st.lists(st.booleans(), min_size=ranks, max_size=ranks))


@pytest.mark.parametrize("ranks", [2, 3])
def test_a_tiny_call_in_cpp_gives_the_python_protocols_bits_on_either_side(monkeypatch, ranks):
    """hypothesis: each call twice, all ranks on the Python protocol, then each rank in C++ or
    in Python as drawn (the leader, the followers, all or none): the same bits on every rank."""
    comms = _groups(ranks, monkeypatch)

    @settings(max_examples=40, deadline=None)
    @given(_calls(ranks))
    def check(call) -> None:
        xs, average, native = call
        python = on_ranks(lambda r: _call(comms[r], xs[r].copy(), average, False), ranks, 60)
        mixed = on_ranks(lambda r: _call(comms[r], xs[r].copy(), average, native[r]), ranks, 60)
        for a, b in zip(python, mixed):
            assert isinstance(a, np.ndarray) and isinstance(b, np.ndarray), (a, b)
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
        assert all(p.tobytes() == python[0].tobytes() for p in python)

    try:
        check()
    finally:
        _close(comms)


def test_what_cpp_does_not_take_fails_on_every_rank_as_the_python_protocol_does(monkeypatch):
    """Three ranks, every call in C++ where it can: the first call takes the buffer shared at the
    start; sizes that differ and an inf fail the call on every rank with the Python protocol's
    error; a float16 call runs on the Python protocol; the next call is exact and C++ takes it."""
    comms = _groups(3, monkeypatch)
    try:
        first = on_ranks(lambda r: _call(comms[r], np.full(3, r + 1.0, np.float32), False, True), 3, 60)
        assert all(x.tolist() == [6.0] * 3 for x in first), first
        assert not any(on_ranks(lambda r: comms[r].tiny(np.ones(3, np.float16), False), 3, 60))
        sizes = on_ranks(lambda r: _call(comms[r], np.ones(10 + (r == 2), np.float32), False, True), 3, 60)
        assert all(isinstance(e, CallRefused) and "rank 2: 11 x float" in str(e) for e in sizes), sizes
        infs = [np.full(5, r + 1.0, np.float32) for r in range(3)]
        infs[1][2] = np.inf
        inf = on_ranks(lambda r: _call(comms[r], infs[r], False, True), 3, 60)
        assert all(isinstance(e, FloatingPointError) and "inf/NaN" in str(e) for e in inf), inf
        exact = on_ranks(lambda r: _call(comms[r], np.full(7, r + 1.0, np.float32), True, True), 3, 60)
        assert all(x.tolist() == [2.0] * 7 for x in exact), exact
    finally:
        _close(comms)


def _pair(leader: bool, timeout: float) -> tuple[TinyCalls, HostReduce, socket.socket]:
    """This rank's tiny calls on a host of two ranks whose other rank is the returned socket's
    end (alive, silent until the test speaks or closes it)."""
    mine, theirs = socket.socketpair()
    other = 1 if leader else 0
    layout = HostLayout(0 if leader else 1, ((0, 1),))
    links = {1 if leader else 0: Link(mine, other, 4242, not leader)}
    reduce = HostReduce(layout, links, timeout)
    reduce._use(SharedBuffer.create(2 << 20, 1 << 20))
    return TinyCalls(reduce, links), reduce, theirs


@pytest.mark.parametrize("leader", [True, False])
def test_a_silent_or_dead_rank_ends_a_tiny_calls_wait_as_the_python_protocols(leader):
    """A rank that says nothing: the wait ends with the group's timeout naming it, or with the
    job's failure once it is known; a rank whose socket closed is named dead. Either rank gone
    is raised by every later call (on the Python protocol: C++ declines a broken host's calls)."""
    tiny, reduce, theirs = _pair(leader, timeout=0.5)
    dead, dead_reduce, closed = _pair(leader, timeout=60)
    try:
        started = time.monotonic()
        with pytest.raises(JobFailed, match=r"no message from rank \d \(pid 4242.*timeout"):
            tiny.allreduce(np.ones(3, np.float32), False, K)
        assert time.monotonic() - started >= 0.5
        reduce.failed = RankDied(7, "rank 7 (pid 99) stopped responding")
        with pytest.raises(RankDied, match="rank 7 "):
            tiny.allreduce(np.ones(3, np.float32), False, K)
        assert tiny.allreduce(np.ones(3, np.float32), False, K) is None
        with pytest.raises(RankDied, match="rank 7 "):
            reduce.allreduce(np.ones(3, np.float32), False, None, K)
        closed.close()
        with pytest.raises(RankDied, match=r"rank \d \(pid 4242.*died"):
            dead.allreduce(np.ones(3, np.int32), False, K)
        with pytest.raises(RankDied, match=r"rank \d \(pid 4242.*died"):
            dead_reduce.allreduce(np.ones(3, np.int32), False, None, K)
    finally:
        for r, sock in ((reduce, theirs), (dead_reduce, closed)):
            sock.close()
            for link in r.links.values():
                link.close()

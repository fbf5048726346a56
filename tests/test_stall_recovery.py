"""No stall ends a job (issue 38, item 3), against the real processes on loopback: a slot is made
to stall for real, and the 2-rank job running into it finishes exact on a fresh epoch, or, when
the stall comes back there, on the host aggregator; when it comes back there too, the call
fails on every rank naming what was tried, its tensor as it was.

The stall: before the ranks' own first packet reaches slot 1 of an epoch, each rank's socket
sends the slot a round of that epoch with another offset (what a late copy of an older round, a
corrupted slot or another job's packets leave), until the aggregator answers that round. The
slot then holds a complete round, so every real packet of the next one is refused as BAD_ROUND,
and every resend with it: no resend can clear it, as with item 3's lost undo on Tofino. A rank's
packets reach the aggregator in the order its socket sent them, so the forged round is always
there before the rank's own packets."""

import logging
import os
import select
import tempfile
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist

from inagg.bmv2_env.emulation.loopback import LoopbackDeployment
from inagg.hostlib.wire.protocol import MSG_RESULT, build_contribution, unpack_header
from inagg.hostlib.worker.communicator import Communicator, JobFailed
from test_training import on_ranks

STUCK = 3.0       # seconds without a result that make a stall (generous at load 20+: nothing else is slow)
STALLED_SLOT = 1  # the slot index a call's priming reaches first after slot 0's control round
FORGED_OFFSET = 1000   # in packets: an offset no call of this test reaches


def start_job(dep: LoopbackDeployment, n: int, native: bool) -> list[Communicator]:
    store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), n)
    return on_ranks(lambda r: Communicator(store, r, n, dep.controller, bind_ip=dep.worker_ip(r),
                                           stuck_timeout=STUCK, native=native), n)


def stall_slot(comm: Communicator, timeout: float = 60.0) -> None:
    """From ``comm``'s own socket, send its grant's slot STALLED_SLOT the slot's first round (set
    0, tag 0) at FORGED_OFFSET until the aggregator answers it: every rank of the job does at once,
    so the round completes (an aggregator that has not learnt the grant yet drops it: sent again)."""
    g, sock = comm.grant, comm.transport.sock
    k = g.values_per_packet
    packet = build_contribution(g.job_id, comm.rank, g.epoch, g.slot_base + STALLED_SLOT, 0, FORGED_OFFSET * k,
                                np.ones(k, np.int32), k)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sock.sendto(packet, g.aggregator)
        while select.select([sock], [], [], 0.1)[0]:
            try:
                data = sock.recv(65536)
            except BlockingIOError:
                break
            h = unpack_header(data)
            if h.msg_type == MSG_RESULT and h.epoch == g.epoch and h.offset == FORGED_OFFSET * k:
                return
    raise AssertionError(f"rank {comm.rank}: the aggregator never answered the forged round in {timeout}s")


class StallAgain(logging.Handler):
    """On each rank's move (logged on ``inagg.fallbacks`` once the rank holds its new grant, before
    the call runs again), stall the new grant's slot too when its mode is in ``again``; records
    every move: its message and (rank, epoch left, mode, epoch taken)."""

    def __init__(self, comms: list[Communicator], again: set[str]) -> None:
        super().__init__(logging.DEBUG)
        self.comms, self.again, self.moves, self.messages = comms, again, [], []

    def handle(self, record: logging.LogRecord) -> bool:
        """``emit`` without the handler's lock: both ranks' handlers wait for each other's forged
        packet."""
        self.emit(record)
        return True

    def emit(self, record: logging.LogRecord) -> None:
        _job, rank, _call, epoch, _why, mode, new_epoch, _reason = record.args
        self.moves.append((rank, epoch, mode, new_epoch))
        self.messages.append(record.getMessage())
        if mode in self.again:
            stall_slot(self.comms[rank])


def run_stalled_call(again: set[str], target: str = "soft", native: bool = True):
    """A 2-rank job (``native``: its C++ stream, else the Python one) on a ``target``-shaped
    loopback switch whose first call meets a stalled slot (``again``: each new grant of those
    modes stalls too); returns its ranks, the call's tensors, its outcomes (the tensors, or the
    errors) and the log of the moves."""
    fallbacks = logging.getLogger("inagg.fallbacks")
    with LoopbackDeployment(2, target=target) as dep:
        comms = start_job(dep, 2, native)
        handler = StallAgain(comms, again)
        level = fallbacks.level
        fallbacks.addHandler(handler)
        fallbacks.setLevel(logging.DEBUG)
        try:
            assert [c.grant.mode for c in comms] == ["switch", "switch"]
            on_ranks(lambda r: stall_slot(comms[r]), 2)
            n = 8 * comms[0].grant.values_per_packet + 5
            tensors = [contribution(n, r) for r in range(2)]
            futs = [c.allreduce_async(t) for c, t in zip(comms, tensors)]
            results = [call_outcome(f) for f in futs]
            if not any(isinstance(r, Exception) for r in results):
                after = [c.allreduce_async(torch.full((n,), float(r + 1))) for r, c in enumerate(comms)]
                assert all(f.wait().tolist() == [3.0] * n for f in after)
            return comms, tensors, results, handler
        finally:
            fallbacks.removeHandler(handler)
            fallbacks.setLevel(level)
            for c in comms:
                c.close()


def call_outcome(future):
    """The call's result tensor, or the exception it raised."""
    try:
        return future.wait()
    except Exception as e:  # noqa: BLE001 - the outcome under test
        return e


def contribution(n: int, rank: int) -> torch.Tensor:
    """Rank ``rank``'s tensor: small integers, so the sum is exact on every path."""
    return torch.arange(n, dtype=torch.float32) % 97 + rank


def expected_sum(n: int) -> torch.Tensor:
    return contribution(n, 0) + contribution(n, 1)


@pytest.mark.parametrize("target,native", [("soft", True), ("soft", False), ("tofino", True)])
def test_a_stalled_slot_moves_the_job_to_a_fresh_epoch_and_the_call_is_exact(target, native):
    comms, _, results, handler = run_stalled_call(set(), target, native)
    n = results[0].numel()
    assert all(torch.equal(r, expected_sum(n)) for r in results)
    assert [c.grant.mode for c in comms] == ["switch", "switch"]
    assert comms[0].grant.epoch == comms[1].grant.epoch
    assert all(c.stats()["grant_changes"] >= 1 for c in comms)
    fresh, = {new for _, _, _, new in handler.moves}           # both ranks took the same fresh epoch
    assert sorted(handler.moves) == [(0, 1, "switch", fresh), (1, 1, "switch", fresh)]
    assert comms[0].grant.epoch >= fresh > 1                   # (a later growth may move it on)
    said = handler.messages[0]
    assert "stalled at epoch 1" in said and "no result for" in said and "slots waiting" in said, said


def test_a_stall_that_survives_the_fresh_epoch_ends_on_the_host_aggregator_exact():
    comms, _, results, handler = run_stalled_call({"switch"})
    n = results[0].numel()
    assert all(torch.equal(r, expected_sum(n)) for r in results)
    assert [c.grant.mode for c in comms] == ["host", "host"]
    assert comms[0].grant.epoch == comms[1].grant.epoch >= 3
    reason = comms[0].grant.reason
    assert "stall" in reason and "fresh epoch" in reason, reason
    fresh, = {new for _, epoch, _, new in handler.moves if epoch == 1}
    host = comms[0].grant.epoch
    assert sorted(handler.moves) == [(r, e, mode, new) for r in range(2)
                                     for e, mode, new in ((1, "switch", fresh), (fresh, "host", host))]


def test_a_stall_on_the_host_aggregator_too_fails_the_call_naming_both_tries_input_kept():
    _, tensors, results, handler = run_stalled_call({"switch", "host"})
    for r, (outcome, tensor) in enumerate(zip(results, tensors)):
        assert isinstance(outcome, JobFailed), outcome
        assert "stalled again on the host aggregator" in str(outcome), outcome
        assert "after a fresh epoch and the host aggregator" in str(outcome), outcome
        assert torch.equal(tensor, contribution(tensor.numel(), r))     # as it was before the call
    assert sorted({(epoch, mode) for _, epoch, mode, _ in handler.moves})[0] == (1, "switch")
    assert {mode for _, _, mode, _ in handler.moves} == {"switch", "host"}

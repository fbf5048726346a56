"""No stall ends a job (issue 38, item 3), against the real processes on loopback: a slot is made
to stall for real, and the 2-rank job running into it finishes exact on a fresh epoch, or, when
the stall comes back there, on the host aggregator.

The stall: before the ranks' own first packet reaches slot 1 of an epoch, each rank's socket
sends the slot a round of that epoch with another offset (what a late copy of an older round, a
corrupted slot or another job's packets leave). The slot completes that round, so every real
packet of the round is refused as BAD_ROUND and every resend with it: no resend can clear it,
as with item 3's lost undo on Tofino. A rank's packets reach the switch in the order its socket
sent them, so its forged packet is always the first of its packets on the slot."""

import logging
import os
import tempfile

import numpy as np
import pytest
import torch
import torch.distributed as dist

from inagg.bmv2_env.emulation.loopback import LoopbackDeployment
from inagg.hostlib.wire.protocol import build_contribution
from inagg.hostlib.worker.communicator import Communicator
from test_training import on_ranks

STUCK = 2.0     # seconds without a result that make a stall (generous at load 20+: nothing else is slow)
STALLED_SLOT = 1  # the slot index a call's priming reaches first after slot 0's control round


def start_job(dep: LoopbackDeployment, n: int, native: bool) -> list[Communicator]:
    store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), n)
    return on_ranks(lambda r: Communicator(store, r, n, dep.controller, bind_ip=dep.worker_ip(r),
                                           stuck_timeout=STUCK, native=native), n)


def stall_slot(comm: Communicator, epoch: int) -> None:
    """Send, from ``comm``'s own socket, a full round of ``epoch`` on its grant's slot
    STALLED_SLOT at an offset no call of this test uses (the slot's first round: set 0, tag 0)."""
    g = comm.grant
    k = g.values_per_packet
    packet = build_contribution(g.job_id, comm.rank, epoch, g.slot_base + STALLED_SLOT, 0, 1000 * k,
                                np.ones(k, np.int32), k)
    comm.transport.sock.sendto(packet, g.aggregator)


class StallAgain(logging.Handler):
    """On each rank's move to a fresh switch epoch (logged on ``inagg.fallbacks`` before the call
    runs again), stall that epoch's slot too (``again``); records every move: its message and
    (rank, epoch left, mode, epoch taken)."""

    def __init__(self, comms: list[Communicator], again: bool) -> None:
        super().__init__(logging.DEBUG)
        self.comms, self.again, self.moves, self.messages = comms, again, [], []

    def emit(self, record: logging.LogRecord) -> None:
        _job, rank, _call, epoch, _why, mode, new_epoch, _reason = record.args
        self.moves.append((rank, epoch, mode, new_epoch))
        self.messages.append(record.getMessage())
        if self.again and mode == "switch":
            stall_slot(self.comms[rank], new_epoch)


def run_stalled_call(again: bool, target: str = "soft",
                     native: bool = True) -> tuple[list[Communicator], list[torch.Tensor], StallAgain]:
    """A 2-rank job (``native``: its C++ stream, else the Python one) on a ``target``-shaped
    loopback switch whose first call meets a stalled slot (``again``: each fresh switch epoch's
    slot stalls too); returns its ranks, the call's results and the log of the moves."""
    fallbacks = logging.getLogger("inagg.fallbacks")
    with LoopbackDeployment(2, target=target) as dep:
        comms = start_job(dep, 2, native)
        handler = StallAgain(comms, again)
        level = fallbacks.level
        fallbacks.addHandler(handler)
        fallbacks.setLevel(logging.DEBUG)
        try:
            assert [c.grant.mode for c in comms] == ["switch", "switch"]
            for c in comms:
                stall_slot(c, c.grant.epoch)
            n = 8 * comms[0].grant.values_per_packet + 5
            tensors = [torch.arange(n, dtype=torch.float32) % 97 + r for r in range(2)]
            futs = [c.allreduce_async(t) for c, t in zip(comms, tensors)]
            results = [f.wait() for f in futs]
            after = [c.allreduce_async(torch.full((n,), float(r + 1))) for r, c in enumerate(comms)]
            assert all(f.wait().tolist() == [3.0] * n for f in after)
            return comms, results, handler
        finally:
            fallbacks.removeHandler(handler)
            fallbacks.setLevel(level)
            for c in comms:
                c.close()


def expected_sum(n: int) -> torch.Tensor:
    return 2 * (torch.arange(n, dtype=torch.float32) % 97) + 1


@pytest.mark.parametrize("target,native", [("soft", True), ("soft", False), ("tofino", True)])
def test_a_stalled_slot_moves_the_job_to_a_fresh_epoch_and_the_call_is_exact(target, native):
    comms, results, handler = run_stalled_call(False, target, native)
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
    comms, results, handler = run_stalled_call(again=True)
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

"""Lost second passes end to end (issue 38, item 3: "undo and harvest passes that are lost are
survivable by design"), on both chips: the real controller deploys to a Tofino-shaped software
switch running the model of the chip's compiled program (``--engine tofino-model``), whose
recirculation ports lose the passes ``--recirc-loss`` schedules; the workers are the real
``Communicator`` (in this process, where the test reaches their sockets and stats) and, for the
neighbour job, rank processes (tests/rank_process.py). Every assertion is on results and counts
(the switch's recirculation counters and the job's stall moves as ``inaggctl jobs`` and the
listing give them, the workers' moves and resends), never on times.

A lost undo: rank 1's link into the switch is slow (``--delay``, DELAY_MS), so in the first call
rank 0's packet opens slot 1's round long before rank 1's arrives; between them a packet of
another round from rank 1's socket (a late copy, as issue 38 has it) is ``bad_round`` for a sender
new to the round, and its undo pass, which would take rank 1's bit out again, is lost. Rank 1's
real packet is then a duplicate, and so is every resend: no result until the ranks report the
stall and the controller moves the job to a fresh epoch, where the call runs again, exact. The
same sequence with nothing lost completes at once (the undo pass works: no stall)."""

from __future__ import annotations

import logging
import os
import tempfile
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist

from inagg.bmv2_env.emulation.loopback import LoopbackDeployment
from inagg.bmv2_env.softswitch.recirc_loss import PASSES, RecircLoss, parse_schedules
from inagg.bmv2_env.softswitch.switch import parse_args
from inagg.bmv2_env.softswitch.tna_compiled import pack
from inagg.hostlib.jobservice.client import ControllerClient
from inagg.hostlib.wire.protocol import build_contribution
from inagg.hostlib.worker.communicator import Communicator
from test_liveness import start_job
from test_metrics import inaggctl
from test_training import on_ranks

CHIPS = ("tofino", "tofino2")
STUCK = 5.0          # seconds without a result that make a stall: test_stall_recovery.py's 3 s, plus 2 DELAY_MS
DELAY_MS = 1000      # rank 1's link into the switch: the stray packet lands in the middle of it
STALLED_SLOT = 1     # the slot a call's priming reaches first after slot 0's control round
STRAY_OFFSET = 1000  # in packets: an offset no call of this test reaches
N = 8 * 64 + 5        # values a call of the job under test sums: 9 packets at the Tofino K = 64


class Moves(logging.Handler):
    """Every move a rank of this process logs on ``inagg.fallbacks``: (job, rank, epoch left,
    mode taken, epoch taken), and the message."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.moves: list[tuple[int, int, int, str, int]] = []
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        job, rank, _call, epoch, _why, mode, new_epoch, _reason = record.args
        self.moves.append((job, rank, epoch, mode, new_epoch))
        self.messages.append(record.getMessage())


def deployment(chip: str, n_hosts: int, *switch_args: str, slow_host: int | None = None) -> LoopbackDeployment:
    """A loopback deployment whose switch runs the Tofino model of ``chip`` with ``switch_args``
    (``--recirc-loss``); ``slow_host``: that host's link into the switch DELAY_MS long."""
    dep = LoopbackDeployment(n_hosts, target=chip, engine="tofino-model")
    if slow_host is not None:
        switch_args += ("--delay", f"{dep.device_port(slow_host)}:in:{DELAY_MS}")
    dep.switch_args = switch_args
    return dep


def in_process_job(dep: LoopbackDeployment, hosts: list[int]) -> list[Communicator]:
    """The job under test, rank r on host ``hosts[r]``: it declares its N float32 values per
    iteration, so its window stays what its 9 blocks use and a neighbour finds room on the switch."""
    store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), len(hosts))
    return on_ranks(lambda r: Communicator(store, r, len(hosts), dep.controller, bind_ip=dep.worker_ip(hosts[r]),
                                           stuck_timeout=STUCK, bytes_per_iteration=4 * N), len(hosts))


def tensor(n: int, rank: int) -> torch.Tensor:
    """Rank ``rank``'s tensor: small integers, so the sum is exact on every path."""
    return torch.arange(n, dtype=torch.float32) % 97 + rank


def exact_sum(n: int) -> torch.Tensor:
    return tensor(n, 0) + tensor(n, 1)


def send_stray(comm: Communicator) -> None:
    """From ``comm``'s own socket, a packet of another round to its slot STALLED_SLOT (set 0, tag
    0, STRAY_OFFSET): ``bad_round`` where the slot's round is open without this rank."""
    g = comm.grant
    k = g.values_per_packet
    comm.transport.sock.sendto(build_contribution(g.job_id, comm.rank, g.epoch, g.slot_base + STALLED_SLOT, 0,
                                                  STRAY_OFFSET * k, np.ones(k, np.int32), k), g.aggregator)


def call(comms: list[Communicator]) -> list[torch.Tensor]:
    return [f.wait() for f in [c.allreduce_async(tensor(N, r)) for r, c in enumerate(comms)]]


def oks(rank) -> int:
    """How many "ok" lines (ten exact calls each) a rank process printed so far."""
    return sum(line.startswith("ok") for line in rank.lines)


def call_with_stray(comms: list[Communicator]) -> list[torch.Tensor]:
    """Both ranks' call; half a DELAY_MS in, while rank 0's slot-1 packet has opened the round
    and rank 1's is still on its slow link, the stray from rank 1's socket (behind rank 1's
    control packet on that link, ahead of its slot-1 packet)."""
    futs = [c.allreduce_async(tensor(N, r)) for r, c in enumerate(comms)]
    time.sleep(DELAY_MS / 2000)
    send_stray(comms[1])
    return [f.wait() for f in futs]


def listing(dep: LoopbackDeployment):
    client = ControllerClient(dep.controller)
    try:
        return client.list_jobs(dep.admin_token)
    finally:
        client.close()


def recirculation_lost(dep: LoopbackDeployment) -> int:
    return sum(r.lost for r in listing(dep).recirculation)


def run_with_moves(body):
    """``body()`` with every rank's move recorded (``Moves``)."""
    fallbacks, moves = logging.getLogger("inagg.fallbacks"), Moves()
    level = fallbacks.level
    fallbacks.addHandler(moves)
    fallbacks.setLevel(logging.DEBUG)
    try:
        return body(), moves
    finally:
        fallbacks.removeHandler(moves)
        fallbacks.setLevel(level)


@pytest.mark.parametrize("chip", CHIPS)
def test_a_lost_undo_stalls_the_job_which_moves_to_a_fresh_epoch_exact_while_its_neighbour_runs_on(chip):
    """The neighbour (rank processes on hosts 2 and 3, each checking every result exact; it
    declares its 1000 float32 values, so either job finds room on the switch whichever comes
    first) runs on the same switch through the stall and the move, and keeps making exact calls."""
    with deployment(chip, 4, "--recirc-loss", "undo:1", slow_host=1) as dep:
        neighbour = start_job(dep, 2, [2, 3], declared=4 * 1000)
        comms = in_process_job(dep, [0, 1])
        try:
            assert comms[0].grant.values_per_packet == 64 and comms[0].grant.mode == "switch"
            for rank in neighbour:
                rank.wait_for("ok", 120)
            before = [oks(rank) for rank in neighbour]
            results, moves = run_with_moves(lambda: call_with_stray(comms))
            assert all(torch.equal(r, exact_sum(N)) for r in results)
            job = comms[0].grant.job_id
            fresh, = {new for *_, new in moves.moves}
            assert sorted(moves.moves) == [(job, 0, 1, "switch", fresh), (job, 1, 1, "switch", fresh)]
            assert "stalled at epoch 1" in moves.messages[0] and "slots waiting: [1]" in moves.messages[0]
            assert all(c.stats()["grant_changes"] >= 1 and c.grant.epoch >= fresh for c in comms)
            jobs = {j.job_id: j for j in listing(dep).jobs}
            assert jobs[job].stall_moves == 1 and jobs[job].active.mode == "switch"
            other, = (j for j in jobs.values() if j.job_id != job)                   # the neighbour:
            assert other.stall_moves == 0 and other.active.mode == "switch" and not other.failure
            assert all(not line.startswith("error") for rank in neighbour for line in rank.lines)
            assert all(oks(rank) > b for rank, b in zip(neighbour, before))
            assert recirculation_lost(dep) == 1                                       # the one undo
            printed = inaggctl(dep, "jobs")
            assert "stall_moves=1" in printed and "recirculation:" in printed and " 1 lost" in printed, printed
        finally:
            for c in comms:
                c.close()
            for rank in neighbour:
                rank.stop()


@pytest.mark.parametrize("chip", CHIPS)
def test_the_same_stray_with_no_pass_lost_is_undone_and_nothing_stalls(chip):
    """The control of the test above: the undo pass arrives, rank 1's real packet joins."""
    with deployment(chip, 2, slow_host=1) as dep:
        comms = in_process_job(dep, [0, 1])
        try:
            results, moves = run_with_moves(lambda: call_with_stray(comms))
            assert all(torch.equal(r, exact_sum(N)) for r in results)
            assert moves.moves == [] and recirculation_lost(dep) == 0
            assert [j.stall_moves for j in listing(dep).jobs] == [0]
        finally:
            for c in comms:
                c.close()


@pytest.mark.parametrize("chip", CHIPS)
def test_lost_result_and_answer_passes_are_recovered_by_resends_and_nothing_stalls(chip):
    """The first three results' passes lost (no rank gets those results), then the first
    answer-retire pass (the resend that would retire the round) and Tofino 1's first answer
    pass (a harvested round's answer to the second rank's resend): the resends recover each,
    every call is exact, no rank reports a stall. Tofino 2 answers a harvested round from its
    first pass, so it has no answer pass to lose."""
    loss = ("--recirc-loss", "result:1,2,3", "--recirc-loss", "answer-retire:1", "--recirc-loss", "answer:1")
    with deployment(chip, 2, *loss) as dep:
        comms = in_process_job(dep, [0, 1])
        try:
            results, moves = run_with_moves(lambda: [call(comms) for _ in range(4)])
            assert all(torch.equal(r, exact_sum(N)) for call_results in results for r in call_results)
            assert moves.moves == [] and [j.stall_moves for j in listing(dep).jobs] == [0]
            assert recirculation_lost(dep) == (5 if chip == "tofino" else 4)
            assert sum(c.stats()["retransmissions"] for c in comms) >= 2 * 3   # each rank, each lost result
        finally:
            for c in comms:
                c.close()


# -- the option: its schedules, and what it refuses --------------------------------------------

def passes(hook: RecircLoss, kind: str, count: int) -> list[bool]:
    """Whether ``hook`` loses each of ``count`` passes of ``kind`` (a bridged header naming it)."""
    wire = pack("bridged", {"hdr.bridged.harvest": PASSES[kind]}) + bytes(64)
    return [hook(0x144, wire) for _ in range(count)]


def test_a_schedule_loses_exactly_its_passes_and_a_share_the_same_passes_for_a_seed():
    hook = RecircLoss(parse_schedules(["undo:2,3", "result:0%"]))
    assert passes(hook, "undo", 5) == [False, True, True, False, False]
    assert passes(hook, "result", 5) == [False] * 5 and passes(hook, "answer", 3) == [False] * 3
    assert hook.lost == {"undo": 2}
    shares = [passes(RecircLoss(parse_schedules(["result:30%"]), seed), "result", 1000) for seed in (7, 7, 8)]
    assert shares[0] == shares[1] != shares[2] and 200 < sum(shares[0]) < 400
    assert all(passes(RecircLoss(parse_schedules(["answer:100%"])), "answer", 20))


@pytest.mark.parametrize("argv,says", [
    (["--recirc-loss", "undo:1"], "needs --engine tofino-model"),
    (["--engine", "tofino-model", "--recirc-loss", "harvest:1"], "no pass named 'harvest'"),
    (["--engine", "tofino-model", "--recirc-loss", "undo:150%"], "percentage in 0..100"),
    (["--engine", "tofino-model", "--recirc-loss", "undo:0"], "counted from 1"),
    (["--engine", "tofino-model", "--recirc-loss", "undo"], "expected PASS:PCT%"),
    (["--engine", "tofino-model", "--recirc-loss", "undo:1", "--recirc-loss", "undo:5%"], "'undo' twice"),
])
def test_a_bad_recirc_loss_is_refused_naming_what_to_write(argv, says, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--no-p4", *argv])
    assert says in capsys.readouterr().err

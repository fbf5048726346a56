"""Lost recirculation passes (issue 38, item 3) on the Tofino model of each chip, lost at the
model's recirculation ports (``TofinoModelPipeline.recirc_loss``, where a full queue would drop
them on a chip): a lost undo pass stalls its set (the round can never complete; every resend
is DUP_PENDING) until the job moves to a fresh epoch, whose first packets reset the slot, and
the call then completes exact; a lost harvest pass (a result, or Tofino 1's DUP_DONE answer) is
recovered by the workers' resends. A fuzz of workers that keep the protocol (resend what has
no result, move the job to a fresh epoch where a call makes no progress, as the controller does
on a reported stall: docs/controller.md, "A stalled slot") over ports that lose passes at
random: every result any worker receives is the true sum of its round, and every call ends.
The end-to-end path of a stall (real processes, the worker's report, the controller's move)
is tests/test_stall_recovery.py's."""

from __future__ import annotations

import random

import numpy as np
import pytest

from inagg.bmv2_env.softswitch import tna_slot_model
from inagg.bmv2_env.softswitch.pipeline_reference import JOB_TABLE
from inagg.bmv2_env.softswitch.state import Action
from inagg.bmv2_env.softswitch.tna_slot_model import TofinoModelPipeline
from inagg.hostlib.wire.protocol import unpack_header
from test_tna_slot_model import CHIPS, JOBS, K, frame, make


@pytest.fixture(params=CHIPS)
def chip(request) -> str:
    return request.param


def harvest_code(wire: bytes) -> int:
    """The bridged header's harvest code (p4/tofino/types.p4: byte 3, bits 3-1)."""
    return wire[3] >> 1 & 7


def lose(model, codes: set[int], times: int = 1) -> list[int]:
    """Make the model's recirculation ports lose the next ``times`` passes with a harvest code
    in ``codes``; returns the list of the codes lost so far."""
    lost = []

    def hook(port: int, wire: bytes) -> bool:
        if harvest_code(wire) in codes and len(lost) < times:
            lost.append(harvest_code(wire))
            return True
        return False
    model.recirc_loss = hook
    return lost


def move_epoch(model, job_id: int, epoch: int) -> None:
    """What the controller writes when it moves a stalled job to a fresh epoch: its job_table
    row with the new epoch (controller/switch.py: JobAdmission)."""
    row = model.tables[JOB_TABLE].lookup((job_id,))
    params = dict(row.params)
    params["epoch"] = epoch
    model.tables[JOB_TABLE].put((job_id,), Action(row.name, tuple(params.items())))
    model.sync_jobs()


def sums(out) -> list[list[int]]:
    return [np.frombuffer(d, ">i4", K, 42 + 16).tolist() for _, d in out]


def test_a_lost_undo_stalls_the_set_until_a_fresh_epoch_and_the_call_is_then_exact(chip):
    """Rank 1's late copy of another round finds set 0 open with round 0 (rank 0's): BAD_ROUND,
    and its undo pass is lost, so rank 1's bit stays in the set. Its real contribution is then
    taken for a duplicate (DUP_PENDING), every resend too: no result, never a wrong one. The
    job moves to epoch 2 (the workers' stall report); the call again from scratch: exact."""
    model = make(TofinoModelPipeline, chip)
    lost = lose(model, {tna_slot_model.HARVEST_UNDO})
    assert model.process(*frame(1, 0, [1] * K, slot=1)) == []                       # round 0 opens
    assert model.process(*frame(1, 1, [5] * K, slot=1, offset=9 * K)) == []         # BAD_ROUND
    assert lost == [tna_slot_model.HARVEST_UNDO] and model.engine.maps[0][1][1] == 0b011
    for resend in range(3):
        assert model.process(*frame(1, 1, [2] * K, slot=1, flags=int(resend > 0))) == []
        assert model.engine.last_outcome == tna_slot_model.Outcome.DUP_PENDING
        assert model.process(*frame(1, 2, [3] * K, slot=1, flags=int(resend > 0))) == []
    move_epoch(model, 1, 2)
    out = [o for r in range(3) for o in model.process(*frame(1, r, [r + 1] * K, slot=1, epoch=2))]
    assert sorted(p for p, _ in out) == list(JOBS[1]["ports"]) and sums(out) == [[6] * K] * 3


def test_a_lost_harvest_pass_is_recovered_by_the_resends(chip):
    """The completing packet's harvest pass is lost: no worker gets the result, the other set
    is not retired; each worker's resend is answered with the exact sums (the first retiring
    it), and the next round on the other set completes exact."""
    model = make(TofinoModelPipeline, chip)
    lost = lose(model, {tna_slot_model.HARVEST_RESULT})
    assert [model.process(*frame(1, r, [r + 1] * K, slot=2)) for r in range(3)] == [[]] * 3
    assert lost == [tna_slot_model.HARVEST_RESULT]
    answers = [model.process(*frame(1, r, [r + 1] * K, slot=2, flags=1)) for r in range(3)]
    assert [sums(a) for a in answers] == [[[6] * K]] * 3
    out = [o for r in range(3) for o in model.process(*frame(1, r, [10 * r] * K, slot=2, round_no=1, offset=K))]
    assert sums(out) == [[30] * K] * 3


def test_a_lost_answer_pass_is_recovered_by_the_next_resend(chip):
    """A DUP_DONE answer of a harvested round: on Tofino 1 it recirculates, and where its pass
    is lost the worker's next resend is answered; on Tofino 2 it leaves its first pass, so
    there is nothing to lose."""
    model = make(TofinoModelPipeline, chip)
    for r in range(3):
        model.process(*frame(1, r, [r + 1] * K, slot=2))
    lost = lose(model, {tna_slot_model.HARVEST_ANSWER})
    first = model.process(*frame(1, 0, [1] * K, slot=2, flags=1))
    assert sums(first) == ([] if chip == "tofino" else [[6] * K])
    assert lost == ([tna_slot_model.HARVEST_ANSWER] if chip == "tofino" else [])
    assert sums(model.process(*frame(1, 0, [1] * K, slot=2, flags=1))) == [[6] * K]


# -- the fuzz: workers that keep the protocol, ports that lose passes ----------------------------

SLOTS, CALLS, FORGED = 4, 6, 1000   # job 1's slots; calls; offsets from FORGED * K: no call's


class Ranks:
    """Job 1's three workers as the protocol has them: rank r sends call c's round on each slot
    (set and tag of round c, offset (c * SLOTS + slot) * K, values c * 100 + slot * 10 + r + 1)
    and resends (FLAG_RETRANSMIT) what has no result yet; it starts call c + 1 once it has every
    result of c. Every result any rank receives is checked against the true sum of the round its
    offset names."""

    def __init__(self, model, rng: random.Random) -> None:
        self.model, self.rng, self.epoch = model, rng, 1
        self.call = [0, 0, 0]
        self.pending = [set(range(SLOTS)) for _ in range(3)]
        self.sent: set[tuple[int, int, int]] = set()
        self.results = 0

    def send(self, rank: int, slot: int, forged: bool = False) -> bool:
        """One contribution (``forged``: at an offset no call uses, a corrupted packet); whether
        a rank received a result it was waiting for."""
        c = self.call[rank]
        offset = (FORGED + self.rng.randrange(8) if forged else c * SLOTS + slot) * K
        key = (rank, slot, c)
        flags = int(key in self.sent and not forged)
        self.sent.add(key)
        port, data = frame(1, rank, [c * 100 + slot * 10 + rank + 1] * K, slot=slot,
                           round_no=c + self.rng.randrange(2) if forged else c, offset=offset,
                           epoch=self.epoch, flags=flags)
        return any(self.receive(p, d) for p, d in self.model.process(port, data))

    def receive(self, port: int, data: bytes) -> bool:
        h = unpack_header(data[42:])
        call, slot = divmod(h.offset // K, SLOTS)
        true = 3 * (call * 100 + slot * 10) + 6
        assert np.frombuffer(data, ">i4", K, 42 + 16).tolist() == [true] * K, (h, port)
        self.results += 1
        rank = JOBS[1]["ports"].index(port)
        if call != self.call[rank] or slot not in self.pending[rank]:
            return False
        self.pending[rank].discard(slot)
        if not self.pending[rank]:
            self.call[rank] += 1
            self.pending[rank] = set(range(SLOTS)) if self.call[rank] < CALLS else set()
        return True

    def fresh_epoch(self) -> None:
        """The stall reported: the job on a fresh epoch, every rank again from the earliest
        call a rank is on (from scratch: the slots reset by the new owner tag)."""
        self.epoch += 1
        move_epoch(self.model, 1, self.epoch)
        first = min(self.call)
        self.call = [first] * 3
        self.pending = [set(range(SLOTS)) if first < CALLS else set() for _ in range(3)]
        self.sent = set()


def run_fuzz(chip: str, seed: int) -> tuple[Ranks, list[int]]:
    """One fuzz run (below): the workers after their six calls, and the codes of the passes
    the ports lost."""
    rng = random.Random(seed)
    model = make(TofinoModelPipeline, chip)
    lost = []

    def drop(port: int, wire: bytes) -> bool:
        if rng.random() < 0.3:
            lost.append(harvest_code(wire))
            return True
        return False
    model.recirc_loss = drop
    ranks, idle = Ranks(model, rng), 0
    for _sweep in range(2000):
        if min(ranks.call) == CALLS:
            break
        progress = False
        for rank in rng.sample(range(3), 3):
            for slot in sorted(ranks.pending[rank]):
                progress |= ranks.send(rank, slot, forged=rng.random() < 0.03)
        idle = 0 if progress else idle + 1
        if idle == 4:
            ranks.fresh_epoch()
            idle = 0
    assert min(ranks.call) == CALLS, (seed, ranks.call, ranks.epoch)
    return ranks, lost


def test_ports_that_lose_passes_never_give_a_wrong_sum_and_every_call_ends(chip):
    """Four runs: each pass lost with probability 0.3 at the recirculation ports (results,
    answers, undos), and now and then a corrupted contribution (an offset no call uses: its
    BAD_ROUND undo pass, or a bogus round it opens, stalls its set). No result is wrong (Ranks
    checks each), and the six calls end, resends recovering lost results and fresh epochs the
    stalls (after four rounds of resends with no result, as the workers' stuck_timeout);
    across the runs undo passes were lost and the job moved to fresh epochs."""
    runs = [run_fuzz(chip, seed) for seed in range(4)]
    assert all(ranks.results >= 3 * SLOTS * CALLS for ranks, _ in runs)
    lost = {code for _, codes in runs for code in codes}
    assert {tna_slot_model.HARVEST_RESULT, tna_slot_model.HARVEST_UNDO} <= lost
    assert max(ranks.epoch for ranks, _ in runs) > 1

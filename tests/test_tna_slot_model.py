"""The executable model of the TNA slot logic (bmv2_env/softswitch/tna_slot_model.py): held to the
P4's register actions and to the stages bf-p4c placed them in (the committed context.json),
then run frame by frame beside the reference engine at the TNA's K (both check the round tag:
docs/tofino.md, "Round identity"): the issue-25 replay, the conformance cases' orders, and a
random differential fuzz (loss, duplication, reordering behind the next round and copies up to
13 rounds late, forged and malformed frames) must give the same frames and counters, and the
late copies never a wrong sum. Each test runs on the program built for each chip (``chip``:
Tofino 1 and Tofino 2, p4/out/<chip>/). Tofino 2's reduce-scatter results (the round's owner
alone gets the values) are held to the reference engine too; Tofino 1 sends every block whole.

In process, no network namespace: both are SoftPipelines with the Tofino P4Info; only the slot
logic differs (the reference engine, the BMv2 program's specification, vs the TNA model)."""

from __future__ import annotations

import dataclasses
import json
import random
import re
import struct
from pathlib import Path

import numpy as np
import pytest

from inagg.controller.config import default_program
from inagg.controller.program import read_artifact
from inagg.bmv2_env.softswitch import tna_compiled, tna_slot_model
from inagg.bmv2_env.softswitch.pipeline_reference import (
    JOB_TABLE, REPLICA_TABLE, WORKER_TABLE, SoftPipeline, build_frame,
)
from inagg.bmv2_env.softswitch.state import Action, Replica
from inagg.bmv2_env.softswitch.tna_slot_model import TofinoModelPipeline, register_actions, register_stages
from inagg.hostlib.wire.protocol import (
    EXP_NONE, FLAG_MINE, FLAG_RETRANSMIT, HEADER_BYTES, ROUND_CYCLE, ROUND_TAGS, UDP_PORT, Outcome,
    build_contribution,
    ipv4_checksum, pack_header, round_fields, round_tag, unpack_header,
)

ROOT = Path(__file__).resolve().parents[1]
CHIPS = ("tofino", "tofino2")
PROGRAMS = {chip: default_program(chip) for chip in CHIPS}
K = PROGRAMS["tofino"].p4info.values_per_packet
SWITCH_IP, SWITCH_MAC = 0x0A0000FE, 0xFE


@pytest.fixture(params=CHIPS)
def chip(request) -> str:
    return request.param


def test_both_chips_carry_the_same_k():
    assert {c: p.p4info.values_per_packet for c, p in PROGRAMS.items()} == {c: 64 for c in CHIPS}


def source_for(chip: str, text: str) -> str:
    """``text`` as bf-p4c reads it for ``chip`` (the shared reading of tna_compiled)."""
    return tna_compiled.p4_source(chip, text)


def test_register_actions_are_the_p4s(chip):
    """Every RegisterAction of the TNA program for the chip, by register, is one the model runs."""
    src = "\n".join(source_for(chip, p.read_text()) for p in sorted((ROOT / "p4" / "tofino").glob("*.p4")))
    found: dict[str, set[str]] = {}
    for reg, name in re.findall(r"RegisterAction<.*?>\((\w+)\)\s+(\w+)\s*=", src):
        found.setdefault(reg, set()).add(name)
    macro = re.search(r"#define MAP_ACTIONS\(REG\)(.*?)\n\n", src, re.S).group(1)
    for reg in re.findall(r"^\s*MAP_ACTIONS\((\w+)\)", src, re.M):
        found.setdefault(reg, set()).update(f"{reg}_{a}" for a in re.findall(r"REG##_(\w+) =", macro))
    assert found == {r: set(a) for r, a in register_actions(chip).items()}


def test_register_stages_are_the_compilers(chip):
    """The stage of each register in the committed bf-p4c output for the chip is the model's."""
    context = json.loads(read_artifact(PROGRAMS[chip].files["context"]))
    placed = {}
    for t in context["tables"]:
        if t.get("table_type") == "stateful":
            name = t["name"].split(".")
            short = name[-2] if name[-1] == "pair" else name[-1]
            placed[short] = sorted({s["stage_number"] for s in t["stage_tables"]})
    assert placed == {r: [s] for r, s in register_stages(K, chip).items()}, "the P4 or its placement changed: update tna_slot_model.py"


# -- a test bed in process: job 1 three ranks on ports 1-3, job 2 two ranks on ports 2-3 --------

JOBS = {1: dict(job_index=0, slot_base=0, slot_count=4, ports=(1, 2, 3)),
        2: dict(job_index=1, slot_base=8, slot_count=2, ports=(2, 3))}


def worker_address(port: int, rank: int, job_id: int) -> tuple[int, int, int]:
    return 0x0A000000 + port, port, 50000 + 100 * job_id + rank   # IPv4, MAC, UDP port


def make(pipeline_cls, chip: str = "tofino") -> SoftPipeline:
    """A pipeline on the chip's P4Info with the test bed's jobs."""
    p = pipeline_cls(PROGRAMS[chip].p4info)
    for job_id, j in JOBS.items():
        p.tables[JOB_TABLE].put((job_id,), Action("InaggIngress.admission.admit", (
            ("job_index", j["job_index"]), ("slot_base", j["slot_base"]), ("slot_count", j["slot_count"]),
            ("slot_end", j["slot_base"] + j["slot_count"]), ("n_workers", len(j["ports"])), ("epoch", 1),
            ("mcast_grp", job_id), ("encap", 1))))
        for rank, port in enumerate(j["ports"]):
            ip, mac, udp = worker_address(port, rank, job_id)
            p.tables[WORKER_TABLE].put((job_id, rank), Action("InaggIngress.admission.bind_worker", (
                ("port", port), ("addr", ip), ("mac", mac), ("udp_port", udp))))
            p.tables[REPLICA_TABLE].put((job_id, rank + 1), Action(
                "InaggEgress.replica_rewrite.set_worker_address", (("mac", mac), ("addr", ip), ("udp_port", udp))))
        p.pre.groups[job_id] = tuple(Replica(port, r + 1) for r, port in enumerate(j["ports"]))
    p.sync_jobs()
    return p


def frame(job_id, rank, values, *, slot, slot_set=0, round_no=None, offset=0, epoch=1, exp=EXP_NONE,
          flags=0, port=None, raw=None):
    """(ingress port, frame) of a contribution: round ``round_no`` of its slot (set and round
    tag), else the first round of ``slot_set``; ``port`` other than the rank's: forged."""
    own = JOBS[job_id]["ports"][rank]
    ip, mac, udp = worker_address(own, rank, job_id)
    slot_set, tag_flags = round_fields(slot_set if round_no is None else round_no)
    payload = raw if raw is not None else build_contribution(
        job_id, rank, epoch, slot, slot_set, offset,
        None if values is None else np.asarray(values, np.int32), K, exp=exp, flags=flags | tag_flags)
    eth = SWITCH_MAC.to_bytes(6, "big") + mac.to_bytes(6, "big") + b"\x08\x00"
    iph = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, 0, 0, 0, 0, 64, 17, 0,
                                ip.to_bytes(4, "big"), SWITCH_IP.to_bytes(4, "big")))
    udp_ports = struct.pack("!HH", udp, UDP_PORT)
    return (port or own), build_frame(eth, iph, udp_ports, payload)


def run_both(sequence, chip):
    """Per step, (outputs of the reference engine's pipeline, of the chip's model's); and the
    counters."""
    ref, model = make(SoftPipeline, chip), make(TofinoModelPipeline, chip)
    steps = []
    for port, data in sequence:
        a, b = sorted(ref.process(port, data)), sorted(model.process(port, data))
        steps.append((a, b))
    return steps, ref.counters, model.counters


# the chip's own counters: the reference engine has no recirculation to count
_CHIP_ONLY = {tna_slot_model.RECIRC_SENT, tna_slot_model.RECIRC_ARRIVED}


def assert_same(sequence, chip):
    steps, ref_c, model_c = run_both(sequence, chip)
    for i, (a, b) in enumerate(steps):
        assert a == b, f"step {i} ({unpack_header(sequence[i][1][42:58]) if len(sequence[i][1]) >= 58 else 'short'}): engine {a} vs model {b}"
    for name in set(ref_c.arrays) - _CHIP_ONLY:
        assert np.array_equal(ref_c.arrays[name], model_c.arrays[name]), name
    return steps


def _sums(outputs):
    return [np.frombuffer(data, ">i4", K, 42 + 16).tolist() for _, data in outputs]


def test_issue_25_replay_late_duplicate_then_retransmit(chip):
    """3 workers; round 0 on set 0 completes (111); rank 0 starts round 1 on set 1; its round-0
    packet arrives late (STALE: dropped, counted, changes nothing); rank 0 retransmits round 1
    (DUP_PENDING); ranks 1 and 2 complete round 1: 222, then round 2 on set 0: 333."""
    r0 = [frame(1, r, [10 ** r] * K, slot=2, offset=0) for r in range(3)]
    r1 = [frame(1, r, [2 * 10 ** r] * K, slot=2, slot_set=1, offset=K) for r in range(3)]
    r2 = [frame(1, r, [3 * 10 ** r] * K, slot=2, round_no=2, offset=2 * K) for r in range(3)]
    steps = assert_same([*r0, r1[0], r0[0], r1[0], r1[1], r1[2], *r2], chip)
    results = [_sums(b) for _, b in steps if b]
    assert results == [[[111] * K] * 3, [[222] * K] * 3, [[333] * K] * 3]
    model = make(TofinoModelPipeline, chip)
    for port, data in [*r0, r1[0], r0[0]]:
        model.process(port, data)
    assert model.engine.last_outcome.label == "stale_round"
    assert model.counters.arrays["InaggIngress.job_counters.job_drops"][5] == 1   # job 0, stale_round


def contribution_values(job_id, rank, slot, round_id, offset):
    """A worker's values for one round identity (``round_id``: the round's set and tag, 2 * tag
    + set; a resend carries the same ones)."""
    vals = [((job_id * 7 + slot * 13 + rank * 101 + round_id * 1009 + offset * 31 + i * 17) % 2001) - 1000
            for i in range(K)]
    vals[0] = 2**31 - 1 if rank == 0 else vals[0]    # sums wrap
    return vals


def true_sum(job_id, slot, round_id, offset):
    n = len(JOBS[job_id]["ports"])
    rows = [np.asarray(contribution_values(job_id, r, slot, round_id, offset), np.int32) for r in range(n)]
    with np.errstate(over="ignore"):
        return np.sum(rows, axis=0, dtype=np.int32).tolist()


def assert_never_a_wrong_result(sequence, chip):
    """Every result the model sends carries the true sum of its round as the TNA program tells
    rounds apart (every worker's values for that offset and set, once each: ``Workers``)."""
    steps, _, _ = run_both(sequence, chip)
    for i, (_, b) in enumerate(steps):
        for _, data in b:
            h = unpack_header(data[42:58])
            round_id = h.slot_set
            if h.count:
                assert _sums([(0, data)])[0] == true_sum(h.job_id, h.slot, round_id, h.offset), f"step {i}: {h}"
    return steps


def test_bad_round_is_dropped_and_dup_done_answers_the_stored_round(chip):
    """An other-round packet of a worker already in the round changes nothing (the engine's
    frames, step for step); a DUP_DONE answer is the stored round."""
    seq = [frame(1, 0, [1] * K, slot=3, offset=256),
           frame(1, 1, [2] * K, slot=3, offset=256),
           frame(1, 1, [2] * K, slot=3, offset=320),          # rank 1 in the round, other offset
           frame(1, 2, [3] * K, slot=3, offset=256),          # completes: 6
           frame(1, 2, [3] * K, slot=3, offset=320),          # done round, other offset: bad_round
           frame(1, 2, [3] * K, slot=3, offset=256, flags=1)]  # DUP_DONE: the stored sum
    steps = assert_same(seq, chip)
    assert [len(b) for _, b in steps] == [0, 0, 0, 3, 0, 1]
    assert _sums(steps[5][1]) == [[6] * K]


def test_bad_round_of_a_worker_not_yet_in_the_round_is_undone(chip):
    """The one write a dropped packet makes (slot_state.p4): its sender's contributor bit; its
    second pass (HARVEST_UNDO) takes it out again, so the sender's real packet joins the round,
    as in the engine (which reads everything before writing)."""
    v = [contribution_values(1, r, 3, 0, 256) for r in range(3)]
    seq = [frame(1, 0, v[0], slot=3, offset=256),
           frame(1, 1, v[1], slot=3, offset=320),             # another offset: bad_round
           frame(1, 1, v[1], slot=3, offset=256),             # the real one: ADD
           frame(1, 2, v[2], slot=3, offset=256)]
    steps = assert_same(seq, chip)
    assert [len(b) for _, b in steps] == [0, 0, 0, 3]
    model = make(TofinoModelPipeline, chip).engine
    model.process(seq[0][1][42:], ("rank", 0))
    recirculated = model.first_pass(seq[1][1][42:], ("rank", 1))
    assert model.last_outcome.label == "bad_round" and recirculated.meta.harvest == tna_slot_model.HARVEST_UNDO
    assert model.maps[0][3][1] == 0b011                    # set between the passes ...
    assert model.second_pass(recirculated) == [] and model.maps[0][3][1] == 0b001   # ... and undone


def test_tag_refusals_are_the_p4s_rows():
    """TAG_REFUSALS is slot_state.p4's rows for a packet whose tag is not its set's, on each
    chip, row for row (next: round_diff TAG_BEHIND; a "_" row follows that one, or the opener
    rows: 0)."""
    kinds = {"OPEN": tna_slot_model.OPEN, "NEW": tna_slot_model.NEW, "REPEAT": tna_slot_model.REPEAT}
    harvest = {"NONE": tna_slot_model.HARVEST_NONE, "UNDO": tna_slot_model.HARVEST_UNDO}
    for chip in CHIPS:
        rows = re.findall(r"\(KIND_(\w+), _, _, _, _, _, (_|TAG_BEHIND)\): refuse_round\(SLOT_(\w+), DROP_\w+, HARVEST_(\w+)\)",
                          source_for(chip, (ROOT / "p4" / "tofino" / "slot_state.p4").read_text()))
        assert {(kinds[k], int(n == "TAG_BEHIND")): (Outcome[o], harvest[h]) for k, n, o, h in rows} == tna_slot_model.TAG_REFUSALS
        assert len(rows) == len(tna_slot_model.TAG_REFUSALS)


# Per row of TAG_REFUSALS (the decision rows for a packet whose tag is not its set's): the
# packets before it (rank, round of slot 3; rounds 0 and 1 complete first where "done"), and
# the packet the row decides.
TAG_ROW_CASES = {
    (tna_slot_model.OPEN, 0): (True, [], (2, 0)),          # round 0 late past round 1: set 0 empty
    (tna_slot_model.NEW, 1): (False, [(0, 0)], (1, 2)),    # round 2 into set 0 while round 0 runs
    (tna_slot_model.NEW, 0): (True, [(0, 2)], (1, 0)),     # round 0 late into round 2
    (tna_slot_model.REPEAT, 1): (False, [(0, 0)], (0, 2)), # rank 0 in round 0 sends round 2
    (tna_slot_model.REPEAT, 0): (True, [(0, 2)], (0, 0)),  # rank 0 in round 2, a copy of round 0
}


@pytest.mark.parametrize("row", list(tna_slot_model.TAG_REFUSALS), ids=lambda r: f"{r[0]}-next{r[1]}")
def test_each_chip_refuses_a_packet_whose_round_tag_is_not_its_sets(chip, row):
    """Each row of TAG_REFUSALS (slot_state.p4's rows): the packet's kind and tag relation, its
    outcome, and its second pass, whose undo leaves the set's map as before."""
    model = make(TofinoModelPipeline, chip).engine
    done, before, (rank, round_no) = TAG_ROW_CASES[row]
    for r in (0, 1) if done else ():
        for w in range(3):
            model.process(frame(1, w, [1] * K, slot=3, round_no=r, offset=K * r)[1][42:], ("rank", w))
    for w, r in before:
        model.process(frame(1, w, [1] * K, slot=3, round_no=r, offset=K * r)[1][42:], ("rank", w))
    map_before = model.maps[0][3][1]
    late = model.first_pass(frame(1, rank, [7] * K, slot=3, round_no=round_no, offset=K * round_no)[1][42:],
                            ("rank", rank))
    taken, key = model.tag_row(late.meta) if late else (None, None)
    outcome, harvest = tna_slot_model.TAG_REFUSALS[row]
    assert model.last_outcome == outcome
    if harvest == tna_slot_model.HARVEST_NONE:
        assert late is None
    else:
        assert (taken, key) == (False, row) and late.meta.harvest == harvest
        assert model.second_pass(late) == []
    assert model.maps[0][3][1] == map_before


def _a_completed_round(model):
    """Ranks 0-2 of job 1 complete slot 1: the last packet after its first pass, and the true
    sums."""
    rows = [np.arange(K, dtype=np.int32) * (r + 1) for r in range(3)]
    for r in range(2):
        assert model.first_pass(frame(1, r, rows[r], slot=1)[1][42:], ("rank", r)) is None
    last = model.first_pass(frame(1, 2, rows[2], slot=1)[1][42:], ("rank", 2))
    return last, np.sum(rows, axis=0, dtype=np.int32)


@pytest.mark.parametrize("chip, returned", [("tofino", K // 2), ("tofino2", K)])
def test_a_result_carries_what_each_pairs_alu_returns_then_its_harvest_pass(chip, returned):
    """On Tofino 1 a pair's ALU returns one word a pass: the completing packet's first pass
    carries the first half of the sums, its harvest pass (the recirculated result) the second
    half. On Tofino 2 it returns both: the first pass carries every sum, and the harvest pass
    (which retires the other set) reads no pair."""
    model = make(TofinoModelPipeline, chip).engine
    last, total = _a_completed_round(model)
    assert model.returned == returned
    assert last.meta.harvest == tna_slot_model.HARVEST_RESULT and last.recirculate
    assert last.values[:returned].tolist() == total[:returned].tolist()
    if chip == "tofino2":
        model.pairs[:] = 0                     # the harvest pass must not need them
    (emit,) = model.second_pass(last)
    assert emit.ranks == (0, 1, 2) and _sums([(0, bytes(42) + emit.data)]) == [total.tolist()]


def _a_resend_of_a_harvested_round(model, chip: str):
    """A completed round of slot 1, harvested, then rank 0's resend of it: its first pass
    (a DUP_DONE answer; recirculated on Tofino 1 only) and the round's sums."""
    last, total = _a_completed_round(model)
    model.second_pass(last)
    answer = model.first_pass(frame(1, 0, [9] * K, slot=1, flags=1)[1][42:], ("rank", 0))
    assert answer.meta.harvest == tna_slot_model.HARVEST_ANSWER
    assert answer.recirculate == (chip == "tofino")
    return answer, total


def test_a_dup_done_answer_of_a_harvested_round_takes_one_pass_on_tofino_2(chip):
    """A resend of a finished, harvested round is answered with the stored sums: on Tofino 2
    in its first pass (both words returned, nothing to retire), on Tofino 1 after a harvest
    pass that reads the second words."""
    model = make(TofinoModelPipeline, chip).engine
    answer, total = _a_resend_of_a_harvested_round(model, chip)
    returned = total.tolist() if chip == "tofino2" else total[:K // 2].tolist() + [9] * (K // 2)
    assert answer.values.tolist() == returned
    (emit,) = model.process(frame(1, 0, [9] * K, slot=1, flags=1)[1][42:], ("rank", 0))
    assert emit.ranks == (0,) and _sums([(0, bytes(42) + emit.data)]) == [total.tolist()]


def test_a_lost_harvest_is_recovered_by_the_retransmits(chip):
    """A result whose recirculated harvest pass is lost (a full recirculation queue) leaves the
    other set unretired: the workers' retransmits are answered (DUP_DONE), the first of them
    retiring it (HARVEST_ANSWER_RETIRE: the other set's map equals this round's), and the next
    round on the other set completes with the right sum."""
    model = make(TofinoModelPipeline, chip).engine
    def send(rnd, rank, flags=0):
        port, data = frame(1, rank, [rnd * 10 + rank] * K, slot=2, round_no=rnd, offset=K * rnd, flags=flags)
        return model.process(data[42:], ("rank", rank))
    for rank in range(3):
        send(0, rank)                                          # round 0 on set 0: all in
    for rank in range(2):
        send(1, rank)
    port, data = frame(1, 2, [12] * K, slot=2, slot_set=1, offset=K)
    assert model.first_pass(data[42:], ("rank", 2)).meta.harvest == tna_slot_model.HARVEST_RESULT  # lost
    assert model.maps[0][2][1] == 0b111                        # set 0 still holds round 0
    answers = [send(1, rank, flags=1) for rank in range(3)]    # every worker resends round 1
    assert [len(a) for a in answers] == [1, 1, 1] and model.maps[0][2][1] == 0
    assert all(_sums([(0, bytes(42) + e.data)]) == [[33] * K] for a in answers for e in a)
    assert [len(send(2, rank)) for rank in range(3)] == [0, 0, 1]   # round 2 on set 0
    assert _sums([(0, bytes(42) + send(2, 0, flags=1)[0].data)]) == [[63] * K]


def _odd(rng, job_id, rank, values, kw):
    """A forged or malformed variant of a contribution, or None."""
    odd = rng.randrange(24)
    if odd == 0:
        return frame(job_id, rank, values, **{**kw, "epoch": 2})
    if odd == 1:
        own = JOBS[job_id]["ports"][rank]
        return frame(job_id, rank, values, **{**kw, "port": rng.choice([p for p in (1, 2, 3, 4) if p != own])})
    if odd == 2:
        return frame(job_id, rank, values, **{**kw, "slot": rng.choice([5, 6, 12])})   # no job's
    if odd == 3:
        raw = pack_header(1, 1, 0, job_id, rank, EXP_NONE, 1, 0, kw["slot"], K + 1, 0) + bytes(4 * K)
        return frame(job_id, rank, None, raw=raw, **kw)
    if odd == 4:
        port, data = frame(job_id, rank, values, **kw)
        return port, data[:rng.choice([20, 50, len(data) - 4])]    # always short
    return None


class Workers:
    """Workers as the protocol has them: a worker sends round r + 1 of a slot (other set) only
    once round r is complete (every rank's round-r packet delivered); it resends its current
    round (a lost packet, a lost result) at will. Round r's offset is K * (r % 3), so a set sees
    one offset again. A worker's values are those of its round's identity: with ``by_tag`` its
    set and round tag (what tells rounds apart when copies arrive rounds late), else its set.
    With ``marks`` a packet is now and then marked FLAG_MINE (a reduce-scatter's: one mark
    makes its sender the round's owner, two a shared round)."""

    def __init__(self, rng, bad_rounds, by_tag=False, marks=False):
        self.rng, self.bad_rounds, self.by_tag = rng, bad_rounds, by_tag
        self.flags = [0, 0, 1, 4, 8] + ([FLAG_MINE, FLAG_MINE, FLAG_MINE | 1] if marks else [])
        self.cur: dict = {}          # (job, slot, rank) -> round
        self.delivered: dict = {}    # (job, slot, round) -> ranks delivered
        self.complete: dict = {}     # (job, slot) -> the latest complete round

    def step(self):
        rng = self.rng
        job_id = rng.choice([1, 1, 2])
        j = JOBS[job_id]
        slot, rank = j["slot_base"] + rng.randrange(2), rng.randrange(len(j["ports"]))
        r = self.cur.get((job_id, slot, rank), 0)
        if len(self.delivered.get((job_id, slot, r), ())) == len(j["ports"]) and rng.random() < 0.7:
            r = self.cur[(job_id, slot, rank)] = r + 1          # result received: next round
        other = self.bad_rounds and rng.random() < 0.1
        kw = dict(slot=slot, round_no=r, offset=K * ((r + other) % 3),
                  exp=rng.choice([EXP_NONE, -2, 5]), flags=rng.choice(self.flags))
        values = None if r % 5 == 4 else contribution_values(job_id, rank, slot, r % (ROUND_CYCLE if self.by_tag else 2),
                                                                kw["offset"])
        odd = _odd(rng, job_id, rank, values, kw)
        if odd is not None:
            return (job_id, slot, -1), odd
        if rng.random() < 0.1:
            return None                                          # lost
        if not other:
            self.delivered.setdefault((job_id, slot, r), set()).add(rank)
        if len(self.delivered.get((job_id, slot, r), ())) == len(j["ports"]):
            self.complete[(job_id, slot)] = max(self.complete.get((job_id, slot), -1), r)
        return (job_id, slot, r), frame(job_id, rank, values, **kw)


def fuzz_sequence(seed: int, steps: int, bad_rounds: bool = False, late: int = 0, marks: bool = False):
    """Frames as a network delivers the workers' packets: lost, duplicated, and late copies.
    ``late`` 0: a copy of round r only while round r + 1 is under way; else a copy of any round
    up to ``late`` rounds of its slot behind the slot's newest (one that arrives after round
    r + 1 completed: every target drops it as stale, by its round tag). ``marks``: reduce-scatter
    marks too (``Workers``)."""
    rng, out, rounds = random.Random(seed), [], []
    workers = Workers(rng, bad_rounds, by_tag=bool(late), marks=marks)
    while len(out) < steps:
        if out and rng.random() < 0.2:
            candidates = [i for i in range(max(0, len(out) - 30), len(out)) if _late_ok(workers, rounds[i], late)]
            if candidates:
                i = rng.choice(candidates)
                out.append(out[i])
                rounds.append(rounds[i])
            continue
        f = workers.step()
        if f is not None:
            rounds.append(f[0])
            out.append(f[1])
    return out


def _late_ok(workers, rnd, late: int) -> bool:
    """Whether a copy of round ``rnd`` = (job, slot, round) may arrive now (``fuzz_sequence``)."""
    if not late:
        return rnd[2] >= workers.complete.get(rnd[:2], -1)
    newest = max((r for (j, s, _), r in workers.cur.items() if (j, s) == rnd[:2]), default=0)
    return rnd[2] >= 0 and newest - rnd[2] <= late


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_differential_fuzz_model_matches_the_reference_engine(chip, seed):
    """Loss, duplicates, late copies behind the next rounds, forged and malformed frames:
    the same frames and counters, step for step."""
    steps = assert_same(fuzz_sequence(seed, 1500), chip)
    assert sum(bool(b) for _, b in steps) > 50      # rounds do complete


@pytest.mark.parametrize("seed", [4, 5])
def test_differential_fuzz_with_other_round_packets(chip, seed):
    """With other-round packets too (their map bit undone by their second pass): the same
    frames and counters, and every result the true sum of its round."""
    sequence = fuzz_sequence(seed, 1500, bad_rounds=True)
    steps = assert_same(sequence, chip)
    assert_never_a_wrong_result(sequence, chip)
    assert sum(bool(b) for _, b in steps) > 20


@pytest.mark.parametrize("seed, bad_rounds, late", [(9, False, 0), (10, True, 0), (12, False, 2 * ROUND_TAGS - 3)])
def test_tofino_2_elides_as_the_reference_engine_in_the_fuzz_with_marks(seed, bad_rounds, late):
    """The fuzz with reduce-scatter marks (owned, shared and unmarked rounds, their resends and
    DUP_DONE answers, other-round packets, copies up to 13 rounds late): the model of the
    compiled Tofino 2 program sends the reference engine's frames, header-only results
    included, and counts the same."""
    steps = assert_same(fuzz_sequence(seed, 1500, bad_rounds, late, marks=True), "tofino2")
    sizes = {len(d) for _, b in steps for _, d in b}
    assert {RESULT_HEADER_FRAME, RESULT_HEADER_FRAME + 4 * K} <= sizes


@pytest.mark.parametrize("seed, bad_rounds", [(6, False), (7, True), (8, False)])
def test_late_copies_of_any_round_never_change_a_sum(seed, bad_rounds):
    """Copies up to 2 * ROUND_TAGS - 3 rounds of their slot late, past the next round's completion
    too (issue 38): the reference engine, which checks the round tag as every target does,
    never sends a wrong sum."""
    sequence = fuzz_sequence(seed, 1500, bad_rounds, late=2 * ROUND_TAGS - 3)
    ref = make(SoftPipeline, "tofino")
    results = 0
    for i, (port, data) in enumerate(sequence):
        for _, out in ref.process(port, data):
            h = unpack_header(out[42:58])
            results += 1
            if h.count:
                round_id = 2 * round_tag(h.flags) + h.slot_set
                assert _sums([(0, out)])[0] == true_sum(h.job_id, h.slot, round_id, h.offset), f"step {i}: {h}"
    assert results > 50


@pytest.mark.parametrize("seed", [6, 8])
def test_the_model_holds_the_reference_engine_with_late_copies(chip, seed):
    """The same late copies on each chip's model: frame for frame the reference engine, which
    checks the round tag as both chips do (docs/tofino.md, "Round identity")."""
    steps = assert_same(fuzz_sequence(seed, 1500, late=2 * ROUND_TAGS - 3), chip)
    assert sum(bool(b) for _, b in steps) > 50


# -- what bf-p4c built: the result's rewrites and parses, from each chip's committed build ---------

def compiled(chip):
    return make(TofinoModelPipeline, chip).compiled


def test_the_compiled_ingress_parser_reads_a_first_pass_where_the_frame_has_it(chip):
    """A contribution on a host port through the chip's compiled ingress parser: no bridged
    header, and every field of its Ethernet, IPv4, UDP and inagg headers read where the frame
    has it (bf-p4c compiles some selects to their first case: this catches one at start, which
    Tofino 2's start compiled to before it read the bridged header: parser.p4)."""
    port, data = frame(1, 0, [5] * K, slot=1)
    parsed = compiled(chip).parse("ingress", data, port & 0x7F)
    assert parsed.headers == {"ethernet": 0, "ipv4": 14, "udp": 34, "inagg": 42}
    expected = {**tna_compiled.unpack("ethernet", data), **tna_compiled.unpack("ipv4", data, 14),
                **tna_compiled.unpack("udp", data, 34), **tna_compiled.unpack("inagg", data, 42)}
    assert parsed.phv == {k: v for k, v in expected.items() if k in parsed.phv}
    assert len(parsed.phv) > len(expected) // 2      # most fields are the PHV's, not tagalong


def test_the_compiled_recirculate_swaps_source_and_destination(chip):
    """The first pass's compiled action (context.json's primitives, run as one VLIW
    instruction): every address and port swapped, the message a result, the second pass's code
    bridged. (``dst = src; src = dst`` compiles to ``dst <- src`` alone: both the worker's.)"""
    phv = {"hdr.ethernet.dst_addr": 0xAA, "hdr.ethernet.src_addr": 0xBB, "hdr.ipv4.dst_addr": 1,
           "hdr.ipv4.src_addr": 2, "hdr.udp.dst_port": UDP_PORT, "hdr.udp.src_port": 50000,
           "hdr.udp.checksum": 0x1234, "hdr.inagg.msg_type": 1, "meta.harvest": tna_slot_model.HARVEST_RESULT}
    actions = [tna_slot_model.RECIRCULATE] + ([tna_slot_model.ANSWER_AT_ONCE] if chip == "tofino2" else [])
    for action in actions:
        p = dict(phv)
        compiled(chip).run(action, p)
        assert (p["hdr.ethernet.dst_addr"], p["hdr.ethernet.src_addr"]) == (0xBB, 0xAA), action
        assert (p["hdr.ipv4.dst_addr"], p["hdr.ipv4.src_addr"]) == (2, 1), action
        assert (p["hdr.udp.dst_port"], p["hdr.udp.src_port"]) == (50000, UDP_PORT), action
        assert (p["hdr.udp.checksum"], p["hdr.inagg.msg_type"]) == (0, 2), action
        assert p["hdr.bridged.harvest"] == tna_slot_model.HARVEST_RESULT, action


def _result_wire(chip):
    """A completed round's packet as its first pass (the compiled recirculate) leaves it."""
    model = make(TofinoModelPipeline, chip)
    for r in range(2):
        model.process(*frame(1, r, [r + 1] * K, slot=1))
    port, data = frame(1, 2, [3] * K, slot=1)
    return model, port, data


def test_the_compiled_parsers_take_a_result_on_its_second_pass_and_in_egress(chip):
    """The compiled ingress parser, from the recirculation port, takes the bridged header and
    the inagg header of a result whose UDP destination is now the worker's; the compiled egress
    parser takes a result's inagg header (ReplicaRewrite keys on it). Each takes every field of
    those headers, those bf-p4c extracts in slices too (the Ethernet addresses, Tofino 2's
    ingress epoch and egress IPv4 addresses), each where the packet carries it."""
    c = compiled(chip)
    phv = {"hdr.ethernet.dst_addr": 0xBB0000000001, "hdr.ethernet.src_addr": 0xAA0000000002,
           "hdr.ethernet.ether_type": 0x0800, "hdr.ipv4.version": 4, "hdr.ipv4.ihl": 5,
           "hdr.ipv4.protocol": 17, "hdr.ipv4.src_addr": 0x0A000001, "hdr.ipv4.dst_addr": 0x0A000002,
           "hdr.udp.src_port": UDP_PORT, "hdr.udp.dst_port": 50001,
           "hdr.inagg.version": 1, "hdr.inagg.msg_type": 2, "hdr.inagg.count": K, "hdr.inagg.epoch": 0x1234,
           "hdr.inagg.offset": 0x00010203, "hdr.bridged.harvest": tna_slot_model.HARVEST_RESULT}
    headers = ("bridged", "ethernet", "ipv4", "udp", "inagg")
    wire = b"".join(tna_compiled.pack(h, phv) for h in headers) + bytes(4 * K)
    sent = {k: v for h in headers for k, v in tna_compiled.unpack(h, tna_compiled.pack(h, phv)).items()}
    second = c.parse("ingress", wire, c.recirc_port)
    assert set(headers) <= set(second.headers), second.headers
    assert second.headers["inagg"] == 4 + 14 + 20 + 8 and second.phv == sent
    egress = c.parse("egress", wire)
    assert set(headers[1:]) <= set(egress.headers), egress.headers
    assert {k: v for k, v in sent.items() if not k.startswith("hdr.bridged")} == egress.phv


def test_a_result_leaves_the_switch_addressed_to_each_worker(chip):
    """The completing packet through the compiled rewrite, second-pass parse, replication and
    egress: one copy per worker, from the aggregator's address to the worker's, exact sums."""
    model, port, data = _result_wire(chip)
    out = sorted(model.process(port, data))
    assert [p for p, _ in out] == [1, 2, 3]
    for rank, (p, d) in enumerate(out):
        ip, mac, udp = worker_address(p, rank, 1)
        assert int.from_bytes(d[0:6], "big") == mac and int.from_bytes(d[6:12], "big") == SWITCH_MAC
        assert struct.unpack_from("!4s4s", d, 26) == (SWITCH_IP.to_bytes(4, "big"), ip.to_bytes(4, "big"))
        assert struct.unpack_from("!HH", d, 34) == (UDP_PORT, udp)
        assert d[42] & 0xF == 2 and _sums([(p, d)]) == [[6] * K]
        assert ipv4_checksum(d[14:34]) == 0


def test_each_pass_to_recirculation_and_back_is_counted_by_pipe(chip):
    """recirc_sent counts the first passes ResultReplication recirculates and recirc_arrived
    the second passes back, both by the pipe of the contribution's port (ports 1-3: pipe 0), so
    a pipe's difference is what its recirculation port lost: a completed round counts one of
    each; a retransmit of the harvested round one more on Tofino 1 (its answer recirculates)
    and none on Tofino 2 (answered from its first pass)."""
    model, port, data = _result_wire(chip)
    model.process(port, data)
    def counts():
        return [model.counters.arrays[n].tolist() for n in (tna_slot_model.RECIRC_SENT, tna_slot_model.RECIRC_ARRIVED)]
    assert counts() == [[1, 0, 0, 0]] * 2
    assert len(model.process(*frame(1, 0, [1] * K, slot=1, flags=1))) == 1
    assert counts() == [[2 if chip == "tofino" else 1, 0, 0, 0]] * 2


def test_a_harvest_pass_after_teardown_touches_nothing_of_the_slots_new_owner(chip):
    """Job 1 is torn down (placed again: epoch 2) while its completed round's result
    recirculates; the new owner's first packets claim the slot. The old harvest pass then
    retires nothing, marks nothing harvested and sends nothing (Tofino 1 would have read the
    new owner's lanes into it); the new owner's round completes with its own exact sums."""
    model = make(TofinoModelPipeline, chip).engine
    last, _ = _a_completed_round(model)
    model.replace_jobs({**model.jobs, 1: dataclasses.replace(model.jobs[1], epoch=2)})
    rows = [np.full(K, 1000 * (r + 1), np.int32) for r in range(3)]
    for r in range(2):
        assert model.first_pass(frame(1, r, rows[r], slot=1, epoch=2)[1][42:], ("rank", r)) is None
    maps, seen = [list(m) for m in model.maps], list(model.seen)
    assert model.second_pass(last) == []
    assert [list(m) for m in model.maps] == maps and model.seen == seen
    done = model.first_pass(frame(1, 2, rows[2], slot=1, epoch=2)[1][42:], ("rank", 2))
    (emit,) = model.second_pass(done) if done.recirculate else model._send(done)
    assert _sums([(0, bytes(42) + emit.data)]) == [[6000] * K]


def test_a_dup_done_answer_after_teardown_leaks_nothing_of_the_slots_new_owner(chip):
    """Tofino 1: a resend of job 1's harvested round is answered (DUP_DONE) through a harvest
    pass that reads the second half of the lanes; the job is torn down (placed again: epoch 2)
    while that pass recirculates, and the new owner's first packets store their values in the
    slot's lanes. The pass's owner check (map<s>_undo with me = 0: answer_set0) finds another
    owner: it changes no map, marks nothing, and the answer is dropped instead of carrying the
    new owner's values; the new owner's round completes exact. Tofino 2 answers from the first
    pass: there is no pass to tear down under."""
    model = make(TofinoModelPipeline, chip).engine
    answer, _ = _a_resend_of_a_harvested_round(model, chip)
    model.replace_jobs({**model.jobs, 1: dataclasses.replace(model.jobs[1], epoch=2)})
    rows = [np.full(K, 1000 * (r + 1), np.int32) for r in range(3)]
    for r in range(2):
        assert model.first_pass(frame(1, r, rows[r], slot=1, epoch=2)[1][42:], ("rank", r)) is None
    maps, seen = [list(m) for m in model.maps], list(model.seen)
    if chip == "tofino":
        assert model.second_pass(answer) == []
        assert [list(m) for m in model.maps] == maps and model.seen == seen
    done = model.first_pass(frame(1, 2, rows[2], slot=1, epoch=2)[1][42:], ("rank", 2))
    (emit,) = model.second_pass(done)
    assert _sums([(0, bytes(42) + emit.data)]) == [[6000] * K]


def test_a_dup_done_answers_owner_check_changes_no_bit_while_the_owner_holds(chip):
    """The same answer without a teardown: its owner check finds the owner, takes no bit out
    of the set's map (me = 0 on a HARVEST_ANSWER pass), and the answer carries every sum."""
    model = make(TofinoModelPipeline, chip).engine
    last, total = _a_completed_round(model)
    model.second_pass(last)
    maps = [list(m) for m in model.maps]
    (emit,) = model.process(frame(1, 0, [9] * K, slot=1, flags=1)[1][42:], ("rank", 0))
    assert [list(m) for m in model.maps] == maps
    assert emit.ranks == (0,) and _sums([(0, bytes(42) + emit.data)]) == [total.tolist()]


def test_a_parser_branch_the_compiler_dropped_drops_the_result(chip):
    """The walk follows the compiled states: with the egress parser's rows toward parse_ipv4
    gone (what this bf-p4c did to a branch on a bridged field), a result's inagg header is no
    longer taken and ReplicaRewrite cannot address it."""
    c = compiled(chip)
    program = json.loads((PROGRAMS[chip].p4info_path.parent / "parser.json").read_text())
    egress = program["egress"]
    for state, rows in egress["states"].items():
        egress["states"][state] = [r for r in rows if not r["next"].startswith("parse_ipv4")]
    cut = tna_compiled.CompiledParser(egress, tna_compiled.p4_parser(chip, "InaggEgressParser"))
    phv = {"hdr.ethernet.ether_type": 0x0800, "hdr.ipv4.ihl": 5, "hdr.ipv4.protocol": 17,
           "hdr.udp.src_port": UDP_PORT, "hdr.inagg.msg_type": 2}
    wire = b"".join(tna_compiled.pack(h, phv) for h in ("bridged", "ethernet", "ipv4", "udp", "inagg"))
    assert "inagg" in c.parse("egress", wire).headers
    assert "inagg" not in cut.parse(wire).headers


# -- reduce-scatter: a round's values to its owner alone (Tofino 2's round_owner) ---------------

RESULT_HEADER_FRAME = 42 + HEADER_BYTES   # Ethernet, IPv4, UDP and the inagg header


def _reduce_scatter_round(marks, *, slot=1, round_no=0, flags=0):
    """Job 1's round on ``slot``: rank r's contribution (r + 1 in every lane) marked FLAG_MINE
    where r is in ``marks``."""
    return [frame(1, r, [r + 1] * K, slot=slot, round_no=round_no,
                  flags=flags | (FLAG_MINE if r in marks else 0)) for r in range(3)]


def _assert_sent(out, owner):
    """``out`` (port, frame) per rank, ranks 0-2: the owner's (every rank's when None) with the
    sums, every other the result's header alone (its count kept) with IPv4 and UDP lengths and
    checksum to match."""
    for rank, (_, d) in enumerate(sorted(out)):
        whole = owner is None or rank == owner
        assert len(d) == RESULT_HEADER_FRAME + (4 * K if whole else 0), rank
        assert struct.unpack_from("!H", d, 16)[0] == len(d) - 14       # IPv4 total length
        assert struct.unpack_from("!H", d, 38)[0] == len(d) - 34       # UDP length
        assert ipv4_checksum(d[14:34]) == 0 and unpack_header(d[42:58]).count == K
        if whole:
            assert _sums([(0, d)]) == [[6] * K]


@pytest.mark.parametrize("marks, owner", [({1}, 1), ({0, 2}, None), (set(), None)],
                         ids=["owned", "shared", "unmarked"])
def test_tofino_2_sends_a_reduce_scatter_rounds_values_to_its_owner_alone(marks, owner):
    """On the model of the compiled Tofino 2 program, as on the soft switch (the same frames):
    a round marked by one rank gives it the sums and every other rank the header alone,
    lengths shortened; a round marked twice (shared) or never goes whole to every rank."""
    steps = assert_same(_reduce_scatter_round(marks), "tofino2")
    assert [len(b) for _, b in steps] == [0, 0, 3]
    _assert_sent(steps[-1][1], owner)


def test_tofino_1_sends_every_block_to_every_rank():
    """Tofino 1 keeps no owner (docs/tofino.md, "Reduce-scatter results"): every rank gets the
    values of a round that one rank marked."""
    model = make(TofinoModelPipeline, "tofino")
    out = [model.process(port, data) for port, data in _reduce_scatter_round({1})][-1]
    _assert_sent(out, None)


def test_a_resend_of_an_owned_round_follows_the_owners_rule():
    """DUP_DONE answers of an owned round, on Tofino 2: a resend of the harvested round
    (answered from its first pass) gives the owner the sums and another rank the header alone,
    as on the soft switch; so do the answers after a lost harvest, the first of which retires
    through its second pass (HARVEST_ANSWER_RETIRE)."""
    rnd = _reduce_scatter_round({1})
    resends = _reduce_scatter_round({1}, flags=FLAG_RETRANSMIT)
    steps = assert_same([*rnd, resends[1], resends[0]], "tofino2")
    (owner_answer,), (other_answer,) = steps[3][1], steps[4][1]
    assert len(owner_answer[1]) == RESULT_HEADER_FRAME + 4 * K and _sums([owner_answer]) == [[6] * K]
    assert len(other_answer[1]) == RESULT_HEADER_FRAME
    model = make(TofinoModelPipeline, "tofino2")
    model.recirc_loss = lambda via, wire: model.counters.arrays[tna_slot_model.RECIRC_SENT].sum() == 1
    assert [model.process(port, data) for port, data in rnd][-1] == []     # the harvest pass lost
    answers = [model.process(port, data) for port, data in (resends[0], resends[1], resends[2])]
    assert [len(a) for a in answers] == [1, 1, 1]
    assert [len(a[0][1]) for a in answers] == [RESULT_HEADER_FRAME, RESULT_HEADER_FRAME + 4 * K, RESULT_HEADER_FRAME]

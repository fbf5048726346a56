"""Differential test of the two data planes: one random frame sequence (valid, duplicated,
reordered, forged, malformed, trailers, reduce-scatter marks, ordinary traffic, both encapsulations, the frames
a ToR of an aggregation tree exchanges with its parent: partial sums up, results down, and hosts
forging an aggregator's frames, which SourceGuard drops on ports 1-3) sent frame by
frame to the software switch (both its engines) and to BMv2 must give the same frames out of the
same ports after every frame, and the same counters at the end.

BMv2 runs live when simple_switch_grpc is installed; without it the software switch is held to
BMv2's outputs recorded in tests/fixtures/dataplane_differential.json. Re-record (needs BMv2 and
root) after a change of the P4 program or of this generator:

    .venv/bin/python tests/test_dataplane_differential.py --record
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
import select
import sys
import time
from ipaddress import IPv4Address
from pathlib import Path

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import ARP, Ether

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_dataplane_conformance import (  # noqa: E402 - the conformance suite's test bed
    JOB1, JOB2, JOB3, JOB4, JOB5, JOBS, K, SWITCH_IP, SWITCH_MAC, contribution, forged_result, host,
    parent_result, roce_contribution,
)
import test_tna_slot_model as model_cases  # noqa: E402 - the model's protocol-keeping fuzz

from inagg.bmv2_env.emulation.testbed import (  # noqa: E402
    SOFT_ENGINES, TOFINO_TARGETS, Dataplane, bmv2_missing, have_netns, program_testbed,
)
from inagg.controller.switch import (  # noqa: E402
    JobCounters, SourceGuard, SwitchConnection, SwitchJob, WorkerBinding,
)
from inagg.hostlib.wire.protocol import EXP_NONE, FLAG_MINE, ROUND_TAGS, pack_header  # noqa: E402

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "dataplane_differential.json"
SEED = 13
STEPS = 200
MODEL_STEPS = 1500    # the Tofino model's comparison (generated live, nothing recorded)


# -- the random frame sequence ----------------------------------------------------------------

def _values(rng: random.Random) -> list[int]:
    return [rng.choice([0, 1, -1, 3, 2**31 - 1, -2**31]) for _ in range(K)]


def _contribution(rng: random.Random) -> tuple[bytes, int]:
    """A plausible contribution of job 1, 2, 4 (two ranks on one host) or 5 (a ToR's job in a
    tree), often on the same few slots so rounds complete, now and then marked FLAG_MINE (a
    reduce-scatter's: its round's owner alone gets the values), with the odd forged or
    malformed field."""
    job = rng.choice([JOB1, JOB1, JOB2, JOB4, JOB5, JOB5])
    rank = rng.randrange(len(job.workers))
    slot = job.slot_base + rng.choice([0, 0, 1, 2])
    kw = dict(slot=slot, round_no=rng.choice([0, 0, 0, 1, 2, 3]), offset=rng.choice([0] * 7 + [K]),
              exp=rng.choice([EXP_NONE, -2, 5]), flags=rng.choice([0, 0, 1, 4, 8, FLAG_MINE, FLAG_MINE]))
    values = None if rng.random() < 0.1 else _values(rng)
    odd = rng.randrange(14)
    if odd == 0:
        kw["epoch"] = 2                                             # stale epoch
    elif odd == 1:
        kw["src_port"] = rng.choice([1, 2, 3, 4])                   # forged ingress port
    elif odd == 2:
        kw["slot"] = rng.choice([JOB1, JOB2, JOB3]).slot_base + 5   # maybe another job's slot
    elif odd == 3:
        raw = pack_header(1, 1, 0, job.job_id, rank, EXP_NONE, 1, 0, slot, K + 1, 0) + bytes(4 * K)
        return contribution(job, rank, None, raw=raw, **kw)         # count > K
    elif odd == 4:
        frame, port = contribution(job, rank, values, **kw)
        return frame[:rng.choice([20, 45, 50, 60, 100])], port      # truncated frame
    elif odd == 5:
        frame, port = contribution(job, rank, values, **kw)
        return frame[:42] + bytes([rng.choice([0x21, 0x12])]) + frame[43:], port  # version/type
    elif odd == 6:
        frame, port = contribution(job, rank, values, **kw)
        return frame[:16] + b"\x00\x30" + frame[18:], port          # IPv4 total length wrong
    elif odd == 7:
        kw["eth_src"] = host(rng.choice([1, 2, 3, 4]))[0]           # maybe another host's MAC
    elif odd == 8:
        kw["udp_sport"] = rng.choice([w.udp_port for w in JOB4.workers])  # maybe another rank's port
    frame, port = contribution(job, rank, values, **kw)
    if rng.random() < 0.2:
        frame += rng.randbytes(rng.randrange(1, 9))                 # padding / trailer
    return frame, port


def _from_parent(rng: random.Random) -> tuple[bytes, int]:
    """A result from job 5's parent: mostly for a round its ToR sent up, now and then from
    another port or MAC, for another round or retransmitted."""
    kw = dict(slot=JOB5.slot_base + rng.choice([0, 0, 1, 2]), slot_set=rng.choice([0, 0, 0, 1]),
              offset=rng.choice([0] * 7 + [K]), flags=rng.choice([0, 0, 1, 8, 0x81, 0x10]))
    odd = rng.randrange(8)
    if odd == 0:
        kw["src_port"] = rng.choice([1, 2, 3])
    elif odd == 1:
        kw["src_mac"] = host(4)[0]
    values = None if rng.random() < 0.1 else _values(rng)
    return parent_result(values, **kw)


def _forged_aggregator(rng: random.Random) -> tuple[bytes, int]:
    """A host passing itself off as an aggregator (issue 37): a result to a worker from the
    switch's or the host aggregator's address, on any port (SourceGuard drops it on ports 1-3;
    port 4 is open), or a worker's own contribution marked as a switch's partial sum."""
    job = rng.choice([JOB1, JOB2, JOB4])
    rank = rng.randrange(len(job.workers))
    if rng.random() < 0.25:
        return contribution(job, rank, _values(rng), slot=job.slot_base + rng.choice([0, 1]),
                            flags=0x80)
    mac, ip = rng.choice([(SWITCH_MAC, SWITCH_IP), host(4)])
    return forged_result(job, rank, _values(rng), slot=job.slot_base + rng.choice([0, 1]),
                         src_ip=ip, src_mac=mac), rng.choice([1, 2, 3, 4])


def _other(rng: random.Random) -> tuple[bytes, int]:
    """Ordinary traffic, an unadmitted job, a RoCE contribution of job 3, job 5's parent, or a
    host forging an aggregator's frames."""
    kind = rng.randrange(7)
    if kind == 6:
        return _forged_aggregator(rng)
    if kind >= 4:
        return _from_parent(rng)
    src, dst = rng.sample([1, 2, 3, 4], 2)
    if kind == 0:
        return bytes(Ether(src=host(src)[0], dst=host(dst)[0]) / IP(src=host(src)[1], dst=host(dst)[1])
                     / UDP(sport=7, dport=9) / b"hello"), src
    if kind == 1:
        return bytes(Ether(src=host(src)[0], dst="ff:ff:ff:ff:ff:ff")
                     / ARP(psrc=host(src)[1], pdst=host(dst)[1])), src
    rank = rng.randrange(2)
    values = None if kind == 2 and rng.random() < 0.3 else _values(rng)
    return roce_contribution(JOB3, rank, values, slot=JOB3.slot_base + rng.randrange(2))


def frame_sequence(seed: int = SEED, steps: int = STEPS) -> list[tuple[int, bytes]]:
    """``steps`` (ingress port, frame): new frames and replays of earlier ones (duplicates and
    reordered retransmissions)."""
    rng = random.Random(seed)
    out: list[tuple[int, bytes]] = []
    while len(out) < steps:
        r = rng.random()
        if out and r < 0.15:
            out.append(rng.choice(out[-12:]))
        else:
            frame, port = _other(rng) if r < 0.3 else _contribution(rng)
            out.append((port, frame))
    return out


# -- running it --------------------------------------------------------------------------------

def _barrier(port: int, step: int) -> bytes:
    """A broadcast frame the switch floods to every port but ``port``, marked with the step."""
    return bytes(Ether(src=host(port)[0], dst="ff:ff:ff:ff:ff:ff", type=0x88B5)
                 / f"inagg-barrier {step} {port}".encode())


def _frames_out(dp: Dataplane, port: int, step: int) -> dict[int, list[bytes]]:
    """The frames the switch sends after one frame in from ``port``. Two flooded barriers
    follow, one after the other: the first from ``port`` itself (a port's frames enter the
    pipeline in order, frames of two ports in either order: a barrier sent at once from another
    port overtook the frame 1 run in 6, and its output was counted a step late); once it is
    out everywhere else, the frame has been processed, and the second, from another port,
    leaves by ``port`` behind everything the frame caused there (each port's queue is FIFO)."""
    got: dict[int, list[bytes]] = {p: [] for p in dp.socks}
    by_fd = {s.fileno(): p for p, s in dp.socks.items()}
    deadline = time.time() + 30.0   # the Python engine on a loaded 2-core CI
    for source in (port, next(p for p in dp.socks if p != port)):
        barrier = _barrier(source, step)
        waiting = {q for q in dp.socks if q != source}
        dp.send(source, barrier)
        while waiting:
            assert time.time() < deadline, f"step {step}: barrier from port {source} missing on {waiting}"
            ready, _, _ = select.select(list(dp.socks.values()), [], [], 0.1)
            for s in ready:
                data, addr = s.recvfrom(65535)
                out = by_fd[s.fileno()]
                if addr[2] == 4:  # PACKET_OUTGOING: our own sends
                    continue
                if data == barrier:
                    waiting.discard(out)
                else:
                    got[out].append(data)
    return got


def _digest(frame: bytes) -> str:
    return hashlib.sha256(frame).hexdigest()[:16]


def run(target: str, sequence: list[tuple[int, bytes]], jobs=JOBS, guard: bool = True) -> dict:
    """Send ``sequence`` frame by frame to a fresh ``target`` switch holding ``jobs`` (with
    ``guard``, SourceGuard on ports 1-3 as the conformance suite has it): per step the digests
    of the frames out of each port (sorted), and the counters at the end."""
    dp = Dataplane(target).start()
    sw = None
    try:
        sw = SwitchConnection(dp.grpc_addr, program=dp.program)
        sw.push_pipeline()
        program_testbed(sw, jobs, 4, (SWITCH_IP, host(4)[1]) if guard else None)
        dp.drain()
        steps = []
        for i, (port, frame) in enumerate(sequence):
            dp.send(port, frame)
            got = _frames_out(dp, port, i)
            steps.append({str(p): sorted(_digest(f) for f in fs) for p, fs in got.items() if fs})
        counters = JobCounters(sw)
        return {"steps": steps,
                "counters": {str(j.job_id): counters.job(j.job_index) for j in jobs},
                "global_drops": counters.global_drops(),
                **({"guard_drops": SourceGuard(sw).drops()} if guard else {})}
    finally:
        if sw is not None:
            sw.close()
        dp.stop()


def recorded() -> tuple[list[tuple[int, bytes]], dict]:
    data = json.loads(FIXTURE.read_text())
    sequence = [(p, base64.b64decode(f)) for p, f in data["frames"]]
    return sequence, data["bmv2"]


def record() -> None:
    sequence = frame_sequence()
    bmv2 = run("bmv2", sequence)
    FIXTURE.parent.mkdir(exist_ok=True)
    FIXTURE.write_text(json.dumps({
        "seed": SEED, "frames": [(p, base64.b64encode(f).decode()) for p, f in sequence],
        "bmv2": bmv2}, indent=0, sort_keys=True) + "\n")


def _first_difference(soft: dict, bmv2: dict, sequence, names=("soft", "bmv2")) -> str:
    a_name, b_name = names
    for i, (a, b) in enumerate(zip(soft["steps"], bmv2["steps"])):
        if a != b:
            port, frame = sequence[i]
            return f"step {i} (port {port}, frame {frame.hex()}): {a_name} {a} vs {b_name} {b}"
    return f"counters: {a_name} {soft['counters']} {soft['global_drops']} vs {b_name} " \
           f"{bmv2['counters']} {bmv2['global_drops']}"


@pytest.fixture(scope="module")
def reference():
    """(frames, BMv2's outputs): live when BMv2 is here, else the recorded ones."""
    if have_netns():
        pytest.skip(have_netns())
    if bmv2_missing():
        return recorded()
    sequence = frame_sequence()
    return sequence, run("bmv2", sequence)


def test_recording_is_of_this_generator():
    """The fixture replays exactly the frames the generator makes (else: re-record)."""
    sequence, _ = recorded()
    assert sequence == frame_sequence(json.loads(FIXTURE.read_text())["seed"])


@pytest.mark.parametrize("target", [t for t in SOFT_ENGINES if t not in TOFINO_TARGETS])
def test_soft_switch_matches_bmv2(reference, target):
    """Both engines of the software switch (native, and the Python reference)."""
    sequence, bmv2 = reference
    soft = run(target, sequence)
    assert soft == bmv2, _first_difference(soft, bmv2, sequence)
    assert any(bmv2["steps"]) and bmv2["counters"][str(JOB1.job_id)]["results"] > 0
    assert set(bmv2["guard_drops"]) == {"aggregator_addr", "result"}   # the sequence forges both


# -- the executable model of the TNA program (inagg.bmv2_env.softswitch.tna_slot_model), in the software
# switch, beside BMv2 and the native engine: test_tna_slot_model's fuzz, whose workers keep the
# protocol (round r + 1 of a slot only after round r's result). The random generator above
# does not: a worker there moves to the other set before its round completed, which BMv2
# answers by clearing its bit in the old set and the TNA program, which keeps a set's map
# until the other set's round completes, does not (docs/tofino.md).

def model_jobs() -> tuple[SwitchJob, ...]:
    """test_tna_slot_model's test bed (job 1: ranks on ports 1-3, job 2: on ports 2-3) as jobs."""
    jobs = []
    for job_id, j in model_cases.JOBS.items():
        ranks = []
        for rank, port in enumerate(j["ports"]):
            ip, mac, udp = model_cases.worker_address(port, rank, job_id)
            ranks.append(WorkerBinding(rank, port, str(IPv4Address(ip)), f"00:00:00:00:00:{mac:02x}", udp))
        jobs.append(SwitchJob(job_id, j["job_index"], 1, j["slot_base"], j["slot_count"], tuple(ranks)))
    return tuple(jobs)


# seed: with other-round packets. None here: a packet whose offset differs from its round's can
# open that round, after which the fuzz's workers go on without their result, and the TNA
# program treats a sender that breaks the protocol differently, not wrongly (docs/tofino.md);
# test_tna_slot_model holds the model to the reference engine with the fuzz's other-round packets.
MODEL_SEEDS = {1: False, 3: False}


@pytest.fixture(scope="module")
def model_references():
    """{seed: (frames, {target: outputs})}: the native engine and, when it is here, BMv2, both
    at K = 64 (BMv2's and Tofino's)."""
    if have_netns():
        pytest.skip(have_netns())
    targets = ["soft"] + ([] if bmv2_missing() else ["bmv2"])
    out = {}
    for seed, bad_rounds in MODEL_SEEDS.items():
        sequence = model_cases.fuzz_sequence(seed, MODEL_STEPS, bad_rounds)
        out[seed] = sequence, {t: run(t, sequence, model_jobs(), guard=False) for t in targets}
    return out


@pytest.fixture(scope="module")
def late_copies():
    """(test_tna_slot_model's fuzz with copies of any round up to 13 rounds of their slot late,
    past the next round's completion too (issue 38), the native engine's outputs on it)."""
    if have_netns():
        pytest.skip(have_netns())
    sequence = model_cases.fuzz_sequence(6, MODEL_STEPS, late=2 * ROUND_TAGS - 3)
    return sequence, run("soft", sequence, model_jobs(), guard=False)


@pytest.mark.parametrize("target", ["bmv2", *TOFINO_TARGETS])
def test_late_copies_give_each_target_the_soft_switchs_frames(late_copies, target):
    """The late copies: BMv2 and the model of the TNA program as built for each chip (both
    check the round tag: docs/tofino.md, "Round identity") send the native engine's frames
    step for step and count the same (test_tna_slot_model holds the reference engine's results
    to the true sums on this sequence)."""
    got = _sends_the_soft_switchs_frames(target, *late_copies)
    assert got["counters"]["1"]["drops"]["stale_round"] > 0 and got["counters"]["1"]["results"] > 50


@pytest.fixture(scope="module")
def marked():
    """(test_tna_slot_model's fuzz with reduce-scatter marks: owned, shared and unmarked rounds,
    their resends; the native engine's outputs on it)."""
    if have_netns():
        pytest.skip(have_netns())
    sequence = model_cases.fuzz_sequence(11, MODEL_STEPS, marks=True)
    return sequence, run("soft", sequence, model_jobs(), guard=False)


@pytest.mark.parametrize("target", ["bmv2", "tofino2-model"])
def test_reduce_scatter_marks_give_bmv2_and_tofino_2_the_soft_switchs_frames(marked, target):
    """FLAG_MINE frames: BMv2 (round_owner.p4, result_elision.p4) and the model of the compiled
    Tofino 2 program (round_owner, elide_values) send each round's values to its owner alone,
    the native engine's frames step for step, and count the same. (Tofino 1 keeps no owner:
    every rank gets every block, docs/tofino.md.)"""
    got = _sends_the_soft_switchs_frames(target, *marked)
    assert got["counters"]["1"]["results"] > 50


def _sends_the_soft_switchs_frames(target: str, sequence, soft: dict) -> dict:
    """``target``'s outputs on ``sequence`` (the model jobs, no guard), held equal to the native
    engine's ``soft`` step for step (ATP's collisions counter left out on the TNA models)."""
    if target == "bmv2" and bmv2_missing():
        pytest.skip(bmv2_missing())
    got = run(target, sequence, model_jobs(), guard=False)
    if target != "bmv2":
        soft = without_collisions(soft)   # ATP's counter: not in the TNA program
    assert got == soft, _first_difference(got, soft, sequence, (target, "soft"))
    return got


def without_collisions(outputs: dict) -> dict:
    """``outputs`` with each job's ``collisions`` counter left out (BMv2's and the soft
    switch's, ATP's pool: docs/atp.md); every other counter stays compared."""
    counters = {job: {k: v for k, v in c.items() if k != "collisions"} for job, c in outputs["counters"].items()}
    return {**outputs, "counters": counters}


@pytest.mark.parametrize("target", list(TOFINO_TARGETS))
@pytest.mark.parametrize("seed", list(MODEL_SEEDS))
def test_tna_slot_model_matches_bmv2_and_the_soft_switch(model_references, seed, target):
    """Loss, duplicates, late copies behind the next round, forged and malformed frames: the model of the program as built for each chip, its
    second passes and all, sends the same frames out of the same ports as BMv2 and the native
    engine, step by step, and counts the same."""
    sequence, references = model_references[seed]
    model = run(target, sequence, model_jobs(), guard=False)   # TNA guards forwarded frames only
    for name, reference in references.items():
        reference = without_collisions(reference)   # ATP's counter: not in the TNA program
        assert model == reference, _first_difference(model, reference, sequence, (target, name))
    assert model["counters"]["1"]["results"] > 50


if __name__ == "__main__":
    if sys.argv[1:] == ["--record"]:
        record()
    else:
        sys.exit(__doc__)

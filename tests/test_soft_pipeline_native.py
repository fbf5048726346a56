"""The software switch's C++ pipeline (native/switch_pipeline.cpp, bmv2_env/softswitch/pipeline.py)
against its reference, bmv2_env/softswitch/pipeline_reference.py::SoftPipeline.

Both are programmed through their own P4Runtime server with the same entries, then fed the same
random frames: contributions of UDP and RoCE jobs (mostly plausible, some forged: wrong port,
rank, epoch, slot, encapsulation, job; some malformed: truncated, a byte flipped, a trailer),
results from the parent of a job of an aggregation tree (docs/trees.md), ordinary traffic and
noise, with control-plane changes in between (a new epoch, a replica entry removed, a multicast
group changed, an uplink moved or removed). Every frame must give the same frames out (ports,
bytes, order) on both, and in the end every P4 counter must agree.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from inagg.bmv2_env.softswitch.pipeline import NativePipeline
from inagg.bmv2_env.softswitch.p4runtime_server import SoftSwitchState, serve
from inagg.bmv2_env.softswitch.pipeline_reference import SoftPipeline, build_frame
from inagg.bmv2_env.emulation.testbed import program_testbed
from inagg.controller.config import default_program
from inagg.controller.switch import (
    DELETE, INSERT, MODIFY, JobAdmission, JobCounters, ReplicaRewrite, ResultReplication, SourceGuard,
    SwitchConnection, SwitchError, SwitchJob, TreeUplink, UplinkBinding, WorkerBinding,
)
from inagg.hostlib.wire.protocol import (
    EXP_NONE, MSG_RESULT, SWITCH_VALUES_PER_PACKET as K, UDP_PORT, Outcome, ipv4, mac, pack_header,
)
from inagg.hostlib.wire.roce import frame as roce_frame

SWITCH_IP, SWITCH_MAC = "10.0.0.254", "00:00:00:00:00:fe"


def worker(rank, port, udp_port=0, **roce):
    return WorkerBinding(rank, port, f"10.0.0.{port}", f"00:00:00:00:00:0{port}", udp_port, **roce)


JOB_A = SwitchJob(1, 0, 1, 0, 4, (worker(0, 1, 50000), worker(1, 2, 50001), worker(2, 3, 50002)))
JOB_B = SwitchJob(2, 1, 1, 4, 2, (worker(0, 2, 51000), worker(1, 3, 51001)))
JOB_R = SwitchJob(3, 2, 1, 6, 2, (worker(0, 1, qp=0x100, rkey=0xA000),
                                  worker(1, 3, qp=0x101, rkey=0xA001)), encap="roce")
PARENT_IP, PARENT_MAC = "10.0.1.254", "00:00:00:00:01:fe"
UPLINK = UplinkBinding(4, 1, 20, PARENT_MAC, PARENT_IP, UDP_PORT, SWITCH_MAC, SWITCH_IP, UDP_PORT)
JOB_T = SwitchJob(4, 3, 1, 8, 2, (worker(0, 1, 54000), worker(1, 2, 54001)), uplink=UPLINK)
JOBS = {1: JOB_A, 2: JOB_B, 3: JOB_R, 4: JOB_T}
STRANGER = worker(0, 4, 40000)


def switch_pair(tmp, target: str):
    """(state, connection) of a Python and a native software switch running ``target``'s
    P4Info, P4Runtime servers up."""
    made = []
    try:
        for make in (SoftPipeline, NativePipeline):
            program = default_program(target)
            state = SoftSwitchState(0, program.p4info, make)
            addr = f"unix:{tmp}/{target}-{make.__name__}.sock"
            made.append((state, serve(state, addr), SwitchConnection(addr, program=program)))
        yield [(state, sw) for state, _, sw in made]
    finally:
        for _, server, sw in made:
            sw.close()
            server.stop(grace=0)


@pytest.fixture(scope="module")
def switches(tmp_path_factory):
    yield from switch_pair(tmp_path_factory.mktemp("p4rt"), "soft")


@pytest.fixture(scope="module")
def tna_switches(tmp_path_factory):
    """The pair with the TNA program's P4Info (Tofino 1): its host_port_table is ternary rows."""
    yield from switch_pair(tmp_path_factory.mktemp("p4rt"), "tofino")


def rarely(draw, usual, *odd):
    """``usual`` most of the time, else one of ``odd``."""
    return draw(st.sampled_from(odd)) if odd and draw(st.integers(0, 19)) == 0 else usual


@st.composite
def contribution_frames(draw):
    """(ingress port, frame) of a contribution, mostly plausible."""
    job_id = rarely(draw, draw(st.sampled_from([1, 1, 2, 3, 4, 4])), 9)
    job = JOBS.get(job_id, JOB_A)
    rank = draw(st.integers(0, len(job.workers) - 1))
    w = rarely(draw, job.workers[rank], STRANGER, *JOB_A.workers)
    count = rarely(draw, draw(st.sampled_from([K, K, 0])), 5, K + 1)
    values = draw(st.lists(st.sampled_from([0, 1, -1, 7, 2**31 - 1, -2**31]), min_size=count,
                           max_size=count))
    slot = rarely(draw, job.slot_base + draw(st.integers(0, 1)), job.slot_base + job.slot_count, 0)
    inagg = pack_header(rarely(draw, 1, 2), rarely(draw, 1, 2), draw(st.integers(0, 255)), job_id,
                        rarely(draw, rank, 7), draw(st.sampled_from([EXP_NONE, -3, 5])),
                        rarely(draw, 1, 2), draw(st.integers(0, 1)), slot, count,
                        rarely(draw, 64 * slot, 0))
    if count:
        inagg += np.array(values, ">i4").tobytes() + bytes(4 * max(0, K - count))
    if rarely(draw, job.encap, "udp", "roce") == "roce":
        f = roce_frame(inagg, dst_mac=SWITCH_MAC, src_mac=w.mac, src_ip=w.ip, dst_ip=SWITCH_IP,
                       src_port=0xC000 | rank, dst_qp=0x11, psn=draw(st.integers(0, 2**24 - 1)),
                       rkey=0x5555)
    else:
        f = udp_frame(w.mac, w.ip, w.udp_port, inagg)
    return rarely(draw, w.port, 1, 2, 3, 4), mangle(draw, f)


def udp_frame(src_mac: str, src_ip: str, sport: int, inagg: bytes) -> bytes:
    """An inagg packet to the switch's aggregator address over UDP."""
    eth = mac(SWITCH_MAC).to_bytes(6, "big") + mac(src_mac).to_bytes(6, "big") + b"\x08\x00"
    ip = bytearray(b"\x45\x00\x00\x00\x00\x00\x40\x00\x40\x11\x00\x00"
                   + ipv4(src_ip).to_bytes(4, "big") + ipv4(SWITCH_IP).to_bytes(4, "big"))
    return build_frame(eth, ip, sport.to_bytes(2, "big") + UDP_PORT.to_bytes(2, "big"), inagg)


def mangle(draw, f: bytes) -> bytes:
    """Now and then: truncated, one byte changed, or bytes appended."""
    f = bytearray(f)
    how = rarely(draw, "", "cut", "flip", "trailer")
    if how == "cut":
        f = f[:draw(st.integers(0, len(f)))]
    elif how == "flip" and f:
        i = draw(st.integers(0, len(f) - 1))
        f[i] = draw(st.integers(0, 255))
    elif how == "trailer":
        f += draw(st.binary(min_size=1, max_size=8))
    return bytes(f)


@st.composite
def tree_round(draw):
    """A round of JOB_T as its workers and parent play it, with the odd loss, resend, duplicate
    or forgery: both ranks' contributions, maybe a resend (DUP_UPSTREAM), the parent's result
    (its slots 20, 21 hold the job's rounds on slots 8, 9; sometimes from a stranger, for
    another round or slot), maybe the result again and a worker's resend (DUP_DONE)."""
    i, s, count = draw(st.integers(0, 1)), draw(st.integers(0, 1)), draw(st.sampled_from([K, 0]))
    offset = 64 * (JOB_T.slot_base + i)
    values = [draw(st.integers(-9, 9))] * count

    def worker_frame(rank, flags=0):
        w = JOB_T.workers[rank]
        inagg = pack_header(1, 1, flags, JOB_T.job_id, rank, 2, 1, s, JOB_T.slot_base + i, count, offset)
        return w.port, udp_frame(w.mac, w.ip, w.udp_port, inagg + np.array(values, ">i4").tobytes())

    slot = rarely(draw, UPLINK.slot_base + i, JOB_T.slot_base + i, UPLINK.slot_base + 2)
    result = pack_header(1, MSG_RESULT, draw(st.integers(0, 255)), JOB_T.job_id, 1, 4, 1, s, slot,
                         count, rarely(draw, offset, offset + 64)) + np.array(values, ">i4").tobytes()
    src_mac, sport = rarely(draw, (PARENT_MAC, UDP_PORT), ("00:00:00:00:00:04", UDP_PORT), (PARENT_MAC, 1))
    from_parent = (rarely(draw, 4, 3), mangle(draw, udp_frame(src_mac, PARENT_IP, sport, result)))
    frames = [worker_frame(0), worker_frame(1)]
    frames += [worker_frame(1, flags=1)] * draw(st.integers(0, 1)) + [from_parent] * draw(st.integers(0, 2))
    frames += [worker_frame(0, flags=1)] * draw(st.integers(0, 1))
    return [f for f in frames if draw(st.integers(0, 9))]      # now and then one is lost


@st.composite
def other_frames(draw):
    """Ordinary traffic (to a host, broadcast, to nobody) and noise, and now and then a host
    claiming an aggregator's address (SourceGuard drops it on ports 1-3)."""
    if draw(st.integers(0, 3)) == 0:
        src = draw(st.sampled_from([SWITCH_IP, "10.0.0.4"]))
        inagg = pack_header(1, MSG_RESULT, 0, JOB_A.job_id, 0, 2, 1, 0, JOB_A.slot_base, 0, 0)
        return draw(st.integers(1, 4)), mangle(draw, udp_frame("00:00:00:00:00:01", src, UDP_PORT, inagg))
    dst = draw(st.sampled_from(["00:00:00:00:00:02", "ff:ff:ff:ff:ff:ff", "00:00:00:00:00:99"]))
    f = mac(dst).to_bytes(6, "big") + mac("00:00:00:00:00:01").to_bytes(6, "big") + b"\x08\x06"
    f += draw(st.binary(max_size=40))
    return draw(st.integers(1, 4)), draw(st.sampled_from([f, f[:draw(st.integers(0, 20))]]))


def control_updates(sw, change):
    """The P4Runtime updates of one control-plane change."""
    if change == "epoch":
        return JobAdmission(sw).updates(MODIFY, SwitchJob(**{**JOB_B.__dict__, "epoch": 2}))[:1]
    if change == "drop_replica":
        return ReplicaRewrite(sw).updates(DELETE, JOB_A)[1:2]
    if change == "uplink":      # the parent's slots and this switch's rank there change
        moved = UplinkBinding(**{**UPLINK.__dict__, "rank": 0, "slot_base": 21})
        return TreeUplink(sw).updates(MODIFY, SwitchJob(**{**JOB_T.__dict__, "uplink": moved}))
    if change == "root":        # no uplink any more: this switch completes the rounds
        return TreeUplink(sw).updates(DELETE, JOB_T)
    return [ResultReplication(sw).update(MODIFY, JOB_A.mcast_grp, [(1, 1), (3, 3), (4, 2)])]


steps = st.lists(st.one_of(contribution_frames(), contribution_frames(), tree_round(), other_frames(),
                           st.sampled_from(["epoch", "drop_replica", "group", "uplink", "root"])),
                 min_size=5, max_size=120)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps)
def test_native_pipeline_matches_the_python_reference(switches, sequence):
    for _, sw in switches:
        sw.push_pipeline()  # a fresh pipeline: empty tables, slots and counters
        program_testbed(sw, JOBS.values(), 4, (SWITCH_IP, "10.0.0.4"))   # SourceGuard on 1-3
    (py, _), (native, _) = [(state.pipeline, sw) for state, sw in switches]
    assert isinstance(py, SoftPipeline) and isinstance(native, NativePipeline)
    done = set()
    for step in sequence:
        if isinstance(step, str):
            if step not in done:  # each change once: a second DELETE would be refused
                done |= {step, "uplink"} if step == "root" else {step}
                for _, sw in switches:
                    sw.write(control_updates(sw, step))
            continue
        for port, frame in step if isinstance(step, list) else [step]:
            out = py.process(port, frame)
            assert native.process(port, frame) == out, (port, frame.hex())
            event(f"frames out: {min(len(out), 3)}")
            if py.engine.last_outcome in (Outcome.PARENT_RESULT, Outcome.DUP_UPSTREAM, Outcome.DUP_RESULT):
                event(f"tree: {py.engine.last_outcome.label}")
    for name, cells in py.counters.arrays.items():
        assert np.array_equal(native.counters.arrays[name], cells), name


@st.composite
def forged_frames(draw):
    """A frame a host forges on any port: from an aggregator's address or a worker's, an inagg
    RESULT or contribution, FLAG_FROM_SWITCH or not (the TNA guard's rows match on each)."""
    src = draw(st.sampled_from([SWITCH_IP, "10.0.0.4", "10.0.0.1"]))
    inagg = pack_header(1, draw(st.sampled_from([1, MSG_RESULT])), draw(st.sampled_from([0, 0x80, 0x81])),
                        draw(st.sampled_from([JOB_A.job_id, 9])), 0, 2, 1, 0, JOB_A.slot_base, 0, 0)
    return draw(st.integers(1, 4)), mangle(draw, udp_frame("00:00:00:00:00:01", src, UDP_PORT, inagg))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(forged_frames(), other_frames(), contribution_frames(), st.just("reopen")),
                min_size=5, max_size=60))
def test_native_guard_rows_match_the_python_reference(tna_switches, sequence):
    """The TNA program's SourceGuard rows (controller/switch.py: SourceGuard.port_updates) in
    the native core (GuardRow) against the Python reference's ternary lookup; "reopen" deletes
    port 3's rows (a port open again), the next one writes them back."""
    for _, sw in tna_switches:
        sw.push_pipeline()
        program_testbed(sw, [JOB_A, JOB_B], 4, (SWITCH_IP, "10.0.0.4"))   # SourceGuard on 1-3
    (py, _), (native, _) = [(state.pipeline, sw) for state, sw in tna_switches]
    guarded = True
    for step in sequence:
        if step == "reopen":
            guarded = not guarded
            for _, sw in tna_switches:
                sw.write(SourceGuard(sw).port_updates(INSERT if guarded else DELETE, 3, SWITCH_IP,
                                                      "10.0.0.4", False))
            continue
        port, frame = step
        out = py.process(port, frame)
        assert native.process(port, frame) == out, (port, frame.hex())
    for name, cells in py.counters.arrays.items():
        assert np.array_equal(native.counters.arrays[name], cells), name


def test_refused_write_is_undone_in_the_core_too(switches):
    """A job the slot pool cannot hold is refused; the native core's job_table copy is rolled
    back with the Python state, so the job's packets are still forwarded, not admitted."""
    overlapping = SwitchJob(**{**JOB_B.__dict__, "slot_base": 2})
    for _, sw in switches:
        sw.push_pipeline()
        program_testbed(sw, [JOB_A], 4)
        with pytest.raises(SwitchError, match="overlap job 1"):
            sw.write(JobAdmission(sw).updates(INSERT, overlapping)[:1])
    assert [state.pipeline.job_ids() for state, _ in switches] == [[1], [1]]
    inagg = pack_header(1, 1, 0, 2, 0, EXP_NONE, 1, 0, 4, 0, 0)
    to_host = build_frame(mac("00:00:00:00:00:03").to_bytes(6, "big") + bytes(6) + b"\x08\x00",
                          bytearray(b"\x45" + bytes(8) + b"\x11" + bytes(10)),
                          (1).to_bytes(2, "big") + UDP_PORT.to_bytes(2, "big"), inagg)
    (py, _), (native, _) = [(state.pipeline, sw) for state, sw in switches]
    assert native.process(2, to_host) == py.process(2, to_host) == [(3, to_host)]


def test_both_cores_answer_the_tna_programs_recirculation_counters(tna_switches):
    """The TNA P4Info has recirc_sent and recirc_arrived; a software switch never recirculates,
    so both cores answer them over P4Runtime with cells that stay zero (the controller's
    ``JobCounters.recirculation`` finds no traffic), never an error."""
    for _, sw in tna_switches:
        sw.push_pipeline()
        assert JobCounters(sw).recirculation() == {}

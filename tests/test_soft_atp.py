"""ATP's aggregator sharing in the software switch's pipeline (docs/atp.md): both pipelines, the
Python reference (``SoftPipeline``) and the C++ core (``NativePipeline``), each programmed
through its own P4Runtime server as the controller writes it (forwarding, SourceGuard, atp_table's
pool, job_table's admit_atp and the workers' bindings), in front of the host aggregator's
engine, frame by frame.

Workers address the host aggregator (port 4); the switch takes their frames to its UDP port as
inagg, claims a pool aggregator per round, forwards collided and mirrored contributions on,
sends complete sums up from its own aggregator address, and frees an aggregator when the host's
result passes back (a release addressed to the switch stops there). Three jobs on a pool too
small for all, and a tenant beside a neighbour that floods the pool, must get every sum exact
with collisions counted; both pipelines must send the same frames for every frame, including
random, forged and malformed ATP traffic.
"""

from __future__ import annotations

import random
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inagg.bmv2_env.emulation.testbed import program_testbed
from inagg.bmv2_env.softswitch.p4runtime_server import SoftSwitchState, serve
from inagg.bmv2_env.softswitch.pipeline import NativePipeline
from inagg.bmv2_env.softswitch.pipeline_reference import AtpPool, SoftPipeline, build_frame
from inagg.controller.config import default_program
from inagg.controller.switch import (
    DELETE, INSERT, MODIFY, AtpPoolBinding, JobAdmission, SwitchConnection, SwitchError, SwitchJob,
    WorkerBinding,
)
from inagg.hostlib.aggregator.engine_reference import AggregationEngine, JobConfig
from inagg.hostlib.wire.protocol import (
    EXP_NONE, FLAG_FROM_HOST, FLAG_FROM_SWITCH, MSG_RESULT, UDP_PORT, ipv4, mac, pack_header,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from atp_pool import Worker, check_exact  # noqa: E402  the workers of the engine-level study

SWITCH_IP, SWITCH_MAC = "10.0.0.254", "00:00:00:00:00:fe"
HOST_IP, HOST_MAC, HOST_PORT, HOST_SWITCH_PORT = "10.0.0.4", "00:00:00:00:00:04", 42666, 4
W = 4                                    # each job's window at the host aggregator


def atp_pool(count: int, host_port: int = HOST_PORT) -> AtpPoolBinding:
    """A pool of ``count`` aggregators from slot 8; the host aggregator on port 4."""
    return AtpPoolBinding(HOST_IP, host_port, 8, count, SWITCH_MAC, SWITCH_IP, UDP_PORT)


def switch_job(job_id: int, n: int) -> SwitchJob:
    """Job ``job_id``'s n ranks, spread over the hosts on ports 1-3, a UDP port each."""
    workers = tuple(WorkerBinding(r, 1 + r % 3, f"10.0.0.{1 + r % 3}", f"00:00:00:00:00:0{1 + r % 3}",
                                  50000 + 100 * job_id + r) for r in range(n))
    return SwitchJob(job_id, job_id, 1, W * (job_id - 1), W, workers)


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """{pipeline class: (state, connection)}: both software switches, P4Runtime servers up."""
    tmp, made = tmp_path_factory.mktemp("p4rt"), {}
    try:
        for make in (SoftPipeline, NativePipeline):
            program = default_program("soft")
            state = SoftSwitchState(0, program.p4info, make)
            addr = f"unix:{tmp}/{make.__name__}.sock"
            made[make] = (state, serve(state, addr), SwitchConnection(addr, program=program))
        yield {make: (state, sw) for make, (state, _, sw) in made.items()}
    finally:
        for _, server, sw in made.values():
            sw.close()
            server.stop(grace=0)


def atp_switch(servers, make, sizes: tuple[int, ...], pool: int):
    """A fresh pipeline of class ``make``: forwarding for ports 1-4 (SourceGuard on 1-3), jobs
    1, 2, ... of ``sizes`` workers bound in worker_table and admitted as ATP jobs."""
    state, sw = servers[make]
    sw.push_pipeline()
    program_testbed(sw, [], 4, (SWITCH_IP, HOST_IP))
    jobs = [switch_job(j, n) for j, n in enumerate(sizes, 1)]
    sw.write([JobAdmission(sw).atp_pool_update(INSERT, atp_pool(pool))])
    sw.write([u for job in jobs for u in JobAdmission(sw).atp_updates(INSERT, job)])
    return state.pipeline, jobs


def host_engine(jobs: list[SwitchJob]) -> AggregationEngine:
    """The host aggregator's engine: each job's window of W slots, its switch the ATP peer."""
    host = AggregationEngine(W * len(jobs), default_program("soft").p4info.values_per_packet, host_mode=True)
    for job in jobs:
        host.set_job(host_config(job))
    return host


def host_config(job: SwitchJob) -> JobConfig:
    members = tuple((w.ip, w.udp_port) for w in job.workers)
    return JobConfig(job.job_id, job.epoch, job.slot_base, job.slot_count, members,
                     atp_peer=(SWITCH_IP, UDP_PORT))


def udp(src: tuple[str, str, int], dst: tuple[str, str, int], inagg: bytes) -> bytes:
    """An IPv4/UDP frame from (MAC, IP, port) ``src`` to ``dst``."""
    eth = mac(dst[0]).to_bytes(6, "big") + mac(src[0]).to_bytes(6, "big") + b"\x08\x00"
    ip = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, 0, 0, 0, 0, 64, 17, 0, ipv4(src[1]).to_bytes(4, "big"),
                               ipv4(dst[1]).to_bytes(4, "big")))
    return build_frame(eth, ip, src[2].to_bytes(2, "big") + dst[2].to_bytes(2, "big"), inagg)


HOST = (HOST_MAC, HOST_IP, HOST_PORT)


class Network:
    """Workers, the switch's pipeline(s) and the host aggregator, frame by frame. Every frame
    into the switch goes through each pipeline given, which must all send the same frames."""

    def __init__(self, pipelines, jobs: list[SwitchJob], workers: list[Worker], host: AggregationEngine | None = None,
                 where: dict | None = None) -> None:
        """``host``: the host aggregator's engine (default: ``host_engine(jobs)``); ``where``:
        the addresses of "host" and "switch" ((MAC, IP, UDP port)) and "host_port" (the switch
        port of the host aggregator), default this module's."""
        self.pipelines, self.host = pipelines, host or host_engine(jobs)
        self.where = where or {"host": HOST, "switch": (SWITCH_MAC, SWITCH_IP, UDP_PORT),
                               "host_port": HOST_SWITCH_PORT}
        self.by_address = {(b.ip, b.udp_port, job.job_id): w for job in jobs for w, b in
                           zip(sorted((w for w in workers if w.cfg.job_id == job.job_id), key=lambda w: w.rank),
                               job.workers)}
        self.binding = {(b.ip, b.udp_port): b for job in jobs for b in job.workers}

    def switch(self, port: int, frame: bytes) -> list[tuple[int, bytes]]:
        outs = [p.process(port, frame) for p in self.pipelines]
        assert all(o == outs[0] for o in outs), (port, frame.hex())
        return outs[0]

    def contribution(self, w: Worker, inagg: bytes) -> tuple[int, bytes]:
        b = self.binding[w.cfg.members[w.rank]]
        return b.port, udp((b.mac, b.ip, b.udp_port), self.where["host"], inagg)

    def deliver(self, port: int, frame: bytes) -> list[tuple[int, bytes]]:
        """One frame out of switch port ``port``: into the host aggregator (its answers come
        back into the switch on port 4) or into the worker it is addressed to."""
        src_ip, dst_ip = (str(ipv4_text(frame[26:30])), str(ipv4_text(frame[30:34])))
        sport, dport = struct.unpack_from("!HH", frame, 34)
        inagg = frame[42:]
        host, host_port = self.where["host"], self.where["host_port"]
        if port != host_port:
            self.by_address[(dst_ip, dport, struct.unpack_from("!H", inagg, 2)[0])].receive(inagg)
            return []
        out = []
        for emit in self.host.process(inagg, (src_ip, sport)):
            if emit.upstream:                             # a release, to the switch alone
                out.append(udp(host, self.where["switch"], emit.data))
            for rank in emit.ranks:
                b = emit.job.members[rank]
                out.append(udp(host, (self.binding[b].mac, b[0], b[1]), emit.data))
        return [(host_port, f) for f in out]

    def run(self, workers: list[Worker], rng: random.Random, hold: float, max_batches: int = 400) -> None:
        """Batches: each worker's ready blocks, shuffled, a share ``hold`` held back a batch;
        a switch's output is delivered at once. Ends when every worker has every result."""
        flight: list[tuple[int, bytes]] = []
        for _ in range(max_batches):
            flight += [self.contribution(w, p) for w in workers for p in w.ready()]
            if not flight and all(len(w.results) == len(w.values) for w in workers):
                return
            if not flight:
                flight = [self.contribution(w, p) for w in workers for p in w.unanswered()]
            batch, flight = flight, []
            rng.shuffle(batch)
            for item in batch:
                if rng.random() < hold:
                    flight.append(item)
                    continue
                for out in self.switch(*item):
                    flight += self.deliver(*out)
        raise AssertionError("the jobs did not finish")


def ipv4_text(raw: bytes) -> str:
    return ".".join(str(b) for b in raw)


def make_workers(jobs: list[SwitchJob], blocks: dict[int, int], rng: random.Random) -> list[Worker]:
    k = default_program("soft").p4info.values_per_packet
    return [Worker(host_config(job), r, np.array(
                [[rng.randrange(-2**20, 2**20) for _ in range(k)] for _ in range(blocks[job.job_id])], np.int32))
            for job in jobs for r in range(len(job.workers))]


def both(servers, sizes, pool):
    (py, jobs), (native, _) = (atp_switch(servers, make, sizes, pool) for make in (SoftPipeline, NativePipeline))
    return py, native, jobs


def test_three_jobs_on_a_pool_too_small_get_exact_sums(servers):
    """Jobs of 2, 3 and 4 workers, 3 * W rounds in flight on a pool of 3: rounds collide and
    complete at the host or on the switch; every sum exact, the same frames from both
    pipelines, and the drained pool free again."""
    rng = random.Random(3)
    py, native, jobs = both(servers, (2, 3, 4), pool=3)
    workers = make_workers(jobs, {1: 12, 2: 12, 3: 12}, rng)
    Network([py, native], jobs, workers).run(workers, rng, hold=0.25)
    check_exact(workers)
    ctrs = py.engine.counters
    assert sum(c.collisions for c in ctrs.values()) > 0
    assert sum(c.results for c in ctrs.values()) > 0          # ...and the switch summed some
    for name, cells in py.counters.arrays.items():            # the P4 counters, both alike
        assert np.array_equal(native.counters.arrays[name], cells), name
    collisions = py.counters.arrays["InaggIngress.job_counters.job_collisions"]
    assert [collisions[j] for j in (1, 2, 3)] == [ctrs[j].collisions for j in (1, 2, 3)]
    assert py.engine.atp_held == 0 == native.core.atp_held()


def test_a_tenant_beside_a_flooding_neighbour_is_exact(servers):
    """A 2-worker tenant beside a 4-worker neighbour sending 8 times its blocks on a pool of
    2: the tenant's every sum is exact, whether its rounds won an aggregator or not."""
    rng = random.Random(5)
    py, native, jobs = both(servers, (2, 4), pool=2)
    workers = make_workers(jobs, {1: 6, 2: 48}, rng)
    Network([py, native], jobs, workers).run(workers, rng, hold=0.1)
    check_exact(workers)
    assert py.engine.counters[1].collisions + py.engine.counters[2].collisions > 0


def test_a_release_to_the_switch_frees_its_aggregator_and_stops_there(servers):
    """A late copy of an answered round claims a free aggregator (FIRST, mirrored up); the
    host answers with a release addressed to the switch: it frees the aggregator, and no frame
    leaves the switch for it."""
    rng = random.Random(7)
    py, native, jobs = both(servers, (2,), pool=2)
    workers = make_workers(jobs, {1: 2 * W}, rng)
    net = Network([py, native], jobs, workers)
    net.run(workers, rng, hold=0.0)
    late = net.contribution(workers[0], workers[0].packet(0))     # round 0, long answered
    up = net.switch(*late)
    assert [p for p, _ in up] == [HOST_SWITCH_PORT] and py.engine.atp_held == 1 == native.core.atp_held()
    (release,) = net.deliver(*up[0])
    assert ipv4_text(release[1][30:34]) == SWITCH_IP
    assert net.switch(*release) == []
    assert py.engine.atp_held == 0 == native.core.atp_held()


def test_frames_of_other_jobs_pass_untouched(servers):
    """A frame to the host aggregator's port of a job the switch does not hold as ATP, and
    a frame of an ATP job to the inagg port, are forwarded as any frame."""
    py, native, jobs = both(servers, (2,), pool=2)
    b = jobs[0].workers[0]
    other = udp((b.mac, b.ip, b.udp_port), HOST, pack_header(1, 1, 0, 9, 0, EXP_NONE, 1, 0, 0, 0, 0))
    inagg_port = udp((b.mac, b.ip, b.udp_port), (HOST_MAC, HOST_IP, UDP_PORT),
                     pack_header(1, 1, 0, 1, 0, EXP_NONE, 1, 0, 0, 0, 0))
    for frame in (other, inagg_port):
        assert py.process(b.port, frame) == native.process(b.port, frame) == [(HOST_SWITCH_PORT, frame)]


@pytest.mark.parametrize("make", [SoftPipeline, NativePipeline], ids=lambda m: m.__name__)
@pytest.mark.parametrize("pool, why", [
    (atp_pool(2, host_port=UDP_PORT), "cannot tell ATP frames apart"),
    (AtpPoolBinding(HOST_IP, HOST_PORT, 65000, 8, SWITCH_MAC, SWITCH_IP, UDP_PORT), "outside the"),
])
def test_a_bad_pool_is_refused_naming_the_problem(servers, make, pool, why):
    """A pool the switch cannot run is refused with the reason, and the switch keeps its pool;
    so are ATP jobs left without a pool."""
    pipeline, jobs = atp_switch(servers, make, (2,), pool=2)
    _, sw = servers[make]
    with pytest.raises(SwitchError, match=why):
        sw.write([JobAdmission(sw).atp_pool_update(MODIFY, pool)])
    with pytest.raises(SwitchError, match="remove them before the pool"):
        sw.write([JobAdmission(sw).atp_pool_update(DELETE, atp_pool(2))])
    assert pipeline.job_ids() == [1] and pipeline.atp_pool == AtpPool(8, 2, *atp_pool_fields())


def atp_pool_fields() -> tuple:
    return ipv4(HOST_IP), HOST_PORT, mac(SWITCH_MAC), ipv4(SWITCH_IP), UDP_PORT


def test_the_pool_goes_after_its_jobs(servers):
    """Deleting the ATP jobs, then the pool, leaves a switch with neither; frames to the host
    aggregator's port are then ordinary traffic."""
    pipeline, jobs = atp_switch(servers, NativePipeline, (2,), pool=2)
    _, sw = servers[NativePipeline]
    sw.write(JobAdmission(sw).atp_updates(DELETE, jobs[0]))
    sw.write([JobAdmission(sw).atp_pool_update(DELETE, atp_pool(2))])
    assert pipeline.job_ids() == [] and pipeline.atp_pool is None
    b = jobs[0].workers[0]
    frame = udp((b.mac, b.ip, b.udp_port), HOST, pack_header(1, 1, 0, 1, 0, EXP_NONE, 1, 0, 0, 0, 0))
    assert pipeline.process(b.port, frame) == [(HOST_SWITCH_PORT, frame)]


@st.composite
def atp_frames(draw):
    """(ingress port, frame) of ATP traffic, mostly plausible: a worker's contribution of a
    block (any round, rank, flags), the host aggregator's result or release, a forged result,
    a truncated or mangled frame."""
    job = switch_job(draw(st.sampled_from([1, 1, 2, 9])), 3)
    rank = draw(st.integers(0, 3))
    b = job.workers[rank % 3]
    k = default_program("soft").p4info.values_per_packet
    c = draw(st.integers(0, 3 * W))
    slot_set, tag = c // W & 1, ((c // W >> 1) % 4) << 2
    count = draw(st.sampled_from([k, k, 0, 3]))
    kind = draw(st.sampled_from(["contribution"] * 4 + ["result", "release", "forged"]))
    msg = MSG_RESULT if kind != "contribution" else 1
    flags = tag | (FLAG_FROM_HOST if msg == MSG_RESULT else draw(st.sampled_from([0, 0, FLAG_FROM_SWITCH, 1])))
    inagg = pack_header(1, msg, flags, job.job_id, rank, EXP_NONE, draw(st.sampled_from([1, 1, 2])), slot_set,
                        job.slot_base + c % W, count if msg != MSG_RESULT or kind == "result" else 0, c * k)
    inagg += np.arange(count, dtype=">i4").tobytes() if count else b""
    if kind == "contribution":
        port, frame = b.port, udp((b.mac, b.ip, b.udp_port), HOST, inagg)
    else:
        dst = (SWITCH_MAC, SWITCH_IP, UDP_PORT) if kind == "release" else (b.mac, b.ip, b.udp_port)
        src = ("00:00:00:00:00:05", "10.0.0.5", HOST_PORT) if kind == "forged" else HOST
        port, frame = HOST_SWITCH_PORT, udp(src, dst, inagg)
    cut = draw(st.sampled_from([len(frame)] * 6 + [40, 50, len(frame) - 1]))
    return port, frame[:cut]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(atp_frames(), min_size=5, max_size=80), st.sampled_from([1, 2, 3]))
def test_native_atp_pipeline_matches_the_reference(servers, frames, pool):
    py, native, _ = both(servers, (2, 3), pool=pool)
    for port, frame in frames:
        assert native.process(port, frame) == py.process(port, frame), (port, frame.hex())
        assert native.core.atp_held() == py.engine.atp_held
    for name, cells in py.counters.arrays.items():
        assert np.array_equal(native.counters.arrays[name], cells), name

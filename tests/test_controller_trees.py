"""The controller places jobs that span switches on their aggregation trees (docs/trees.md),
against software switches it programs over P4Runtime: per-rank grants, one window on every
switch of the tree taken in one transaction, the degradations (a full spine: the ToRs aggregate
under the host aggregator; a full ToR: the host aggregator aggregates it all), switch and
controller restarts. Allreduces are run by carrying each rank's frames, built from its own
grant, through the switches' pipelines over the configured links, the host aggregator's
real engine answering on its port."""

import numpy as np
import pytest

from inagg.hostlib.aggregator.server import apply_snapshot, host_engine
from inagg.controller.config import default_program, parse_config
from inagg.controller.controller import Controller
from inagg.controller.service import serve as serve_controller
from inagg.controller.switch import SwitchConnection
from inagg.hostlib.jobservice.client import ControllerClient, ControllerError
from inagg.bmv2_env.softswitch.p4runtime_server import SoftSwitchState, serve as serve_switch
from inagg.bmv2_env.softswitch.pipeline import NativePipeline
from inagg.hostlib.wire.protocol import UDP_PORT, build_contribution

from test_controller import wait_until
from tree_frames import frame_source, results, run, udp_frame

PROGRAM = default_program("soft")
K = PROGRAM.p4info.values_per_packet
ADMIN = "s3cret"
AGG = ("00:00:00:00:00:64", "10.0.0.100", 42666)      # the host aggregator, on the spine's port 9
AGG_PORT = ("spine", 9)
TORS = 4


def hosts(net: int) -> dict:
    return {f"10.0.{net}.{h}": {"port": h, "mac": f"00:00:00:00:{net:02x}:{h:02x}"} for h in range(1, 5)}


def switch_entries(tmp_path) -> list[dict]:
    """4 ToRs (hosts 10.0.t.1-4 on ports 1-4, the spine on port 5), the spine (ToR t on port
    t, the host aggregator on port 9) and "solo", linked to none."""
    def entry(name, net, **keys):
        return {"name": name, "grpc": f"unix:{tmp_path}/{name}.sock", "target": "soft",
                "aggregator": f"10.0.{net}.254:{UDP_PORT}", "aggregator_mac": f"00:00:00:00:{net:02x}:fe", **keys}
    tors = [entry(f"tor{t}", t, hosts=hosts(t), links={"spine": 5}) for t in range(1, TORS + 1)]
    spine = entry("spine", 0, hosts={AGG[1]: {"port": 9, "mac": AGG[0]}},
                  links={f"tor{t}": t for t in range(1, TORS + 1)})
    return tors + [spine, entry("solo", 9, hosts=hosts(9))]


class Fabric:
    """The switches (in-process P4Runtime servers, restartable), the controller and a client."""

    def __init__(self, tmp_path, min_window: int) -> None:
        self.config = parse_config({
            "listen": f"unix:{tmp_path}/ctl.sock", "admin_token": ADMIN, "database": str(tmp_path / "ctl.sqlite"),
            # no test here renews a lease: 70 placements took over 60 s at load 17
            "lease_seconds": 3600, "rank_lease_seconds": 3600, "min_window": min_window,
            "switch_check_seconds": 0.2, "host_aggregator": f"{AGG[1]}:{AGG[2]}", "host_values_per_packet": K,
            "switches": switch_entries(tmp_path)})
        self.states, self.servers = {}, {}
        for s in self.config.switches:
            self.start_switch(s.name)
        self.start_controller()
        self.client = ControllerClient(self.config.listen)

    def start_switch(self, name: str) -> SoftSwitchState:
        """A fresh switch process stand-in: no pipeline, no entries."""
        grpc = next(s.grpc for s in self.config.switches if s.name == name)
        self.states[name] = SoftSwitchState(0, PROGRAM.p4info, NativePipeline)
        self.servers[name] = serve_switch(self.states[name], grpc)
        return self.states[name]

    def stop_switch(self, name: str) -> None:
        self.servers[name].stop(grace=0).wait()

    def start_controller(self) -> None:
        self.ctl = Controller(self.config)
        self.srv = serve_controller(self.ctl, self.config.listen)

    def stop_controller(self) -> None:
        self.srv.stop(grace=0)
        self.ctl.close()

    def close(self) -> None:
        self.client.close()
        self.stop_controller()
        for server in self.servers.values():
            server.stop(grace=0)

    def pipelines(self) -> dict:
        return {name: state.pipeline for name, state in self.states.items()}

    def job(self, ips: list[str], name: str, transport: str = "udp") -> tuple[int, str]:
        """A job whose rank r is at ``ips[r]`` (UDP port 47000 + r), every rank joined."""
        job_id, token = self.client.create_job(len(ips), 256, 0.1, name, transport=transport)
        for rank, ip in enumerate(ips):
            self.join(job_id, token, rank, ip)
        return job_id, token

    def join(self, job_id: int, token: str, rank: int, ip: str, **kw) -> None:
        self.client.join(job_id, token, rank, f"{ip}:{47000 + rank}", **kw)

    def grant(self, job: tuple[int, str], rank: int | None = None):
        stream = self.client.watch(*job, rank)
        try:
            return next(stream)
        finally:
            stream.cancel()

    def listing(self, job_id: int):
        return next(j for j in self.client.list_jobs(ADMIN).jobs if j.job_id == job_id)

    def host_aggregator(self):
        """The host aggregator's engine serving the controller's host jobs, as a responder."""
        stream = self.client.watch_host_jobs(ADMIN)
        snapshot = next(stream)
        stream.cancel()
        engine = host_engine(self.config.host_slots, K)
        assert apply_snapshot(engine, snapshot.jobs) == {}
        macs = {s.aggregator.split(":")[0]: s.aggregator_mac for s in self.config.switches}
        macs.update({ip: h.mac for s in self.config.switches for ip, h in s.hosts.items()})

        def answer(frame: bytes) -> list[bytes]:
            _, ip, port = frame_source(frame)
            return [udp_frame(AGG, (macs[m[0]], *m), e.data)
                    for e in engine.process(frame[42:], (ip, port)) for m in (e.job.members[r] for r in e.ranks)]
        return answer

    def allreduce(self, job: tuple[int, str], ips: list[str], blocks: int, seed: int = 0) -> dict[int, np.ndarray]:
        """Every rank sends ``blocks`` blocks of K values (its own grant's slots, switch and
        address; a host grant names no MAC: the host aggregator's, as a worker's neighbour
        table has it); what each rank's host port got back, by rank, checked complete."""
        rng = np.random.default_rng(seed)
        data = {r: rng.integers(-2**20, 2**20, blocks * K, dtype=np.int32) for r in range(len(ips))}
        frames, at = [], {}
        for rank, ip in enumerate(ips):
            g = self.grant(job, rank)
            sw = next(s for s in self.config.switches if ip in s.hosts)
            at[(sw.name, sw.hosts[ip].port)] = rank
            agg_ip, agg_port = g.aggregator.split(":")
            for i in range(blocks):
                inagg = build_contribution(job[0], rank, g.epoch, g.slot_base + i, 0, i * K,
                                           data[rank][i * K:(i + 1) * K], K)
                frames.append((sw.name, sw.hosts[ip].port, udp_frame(
                    (sw.hosts[ip].mac, ip, 47000 + rank), (g.aggregator_mac or AGG[0], agg_ip, int(agg_port)), inagg)))
        got = results(run(self.config, self.pipelines(), frames, responders={AGG_PORT: self.host_aggregator()}), K)
        assert set(got) == set(at)
        out = {at[where]: np.concatenate([by_offset[i * K] for i in range(blocks)]) for where, by_offset in got.items()}
        want = sum(d.astype(np.int64) for d in data.values())
        for rank in out:
            assert np.array_equal(out[rank], want), f"rank {rank}'s result differs from the sum"
        return out


@pytest.fixture
def fabric(tmp_path, request):
    f = Fabric(tmp_path, getattr(request, "param", 8))
    yield f
    f.close()


def entries(f: Fabric, name: str, table: str) -> list:
    sw = SwitchConnection(next(s.grpc for s in f.config.switches if s.name == name), election_id=(0, 0))
    try:
        return sw.table_entries(table)
    finally:
        sw.close()


ACROSS = ["10.0.1.1", "10.0.1.2", "10.0.2.1", "10.0.2.2"]    # 2 ranks on tor1, 2 on tor2
ONE_SWITCH = ["10.0.9.1", "10.0.9.2", "10.0.9.3", "10.0.9.4"]


def test_a_job_across_two_tors_sums_exactly_and_as_the_same_job_on_one_switch(fabric):
    tree, solo = fabric.job(ACROSS, "tree"), fabric.job(ONE_SWITCH, "solo")
    grants = [fabric.grant(tree, r) for r in range(4)]
    assert [g.aggregator for g in grants] == [f"10.0.{t}.254:{UDP_PORT}" for t in (1, 1, 2, 2)]
    assert {(g.mode, g.epoch, g.slot_count) for g in grants} == {("switch", 1, 8)}
    assert grants[0].reason == "aggregation tree over spine, tor1 (ranks 0, 1), tor2 (ranks 2, 3); root spine"
    assert fabric.grant(solo, 0).reason == ""                      # one switch: today's grant
    blocks = 8
    on_tree = fabric.allreduce(tree, ACROSS, blocks)
    on_one = fabric.allreduce(solo, ONE_SWITCH, blocks)
    assert all(np.array_equal(on_tree[r], on_one[r]) for r in range(4))
    c = fabric.listing(tree[0]).counters
    assert (c["tor1.aggregated"], c["tor2.aggregated"], c["spine.aggregated"]) == (2 * blocks,) * 3
    assert (c["tor1.results"], c["spine.results"], c["results"]) == (blocks,) * 3   # sent up; multicast
    assert [k["job_id"] for k, _, _ in entries(fabric, "tor3", "job_table")] == []  # off the tree


def test_the_tree_takes_one_window_on_each_of_its_switches_and_gives_them_back(fabric):
    job = fabric.job(ACROSS, "tree")
    assert {name: len(entries(fabric, name, "job_table")) for name in ("tor1", "tor2", "spine", "tor3")} == \
        {"tor1": 1, "tor2": 1, "spine": 1, "tor3": 0}
    up = {name: entries(fabric, name, "uplink_table") for name in ("tor1", "tor2", "spine")}
    assert [p["rank"] for _, _, p in up["tor1"] + up["tor2"]] == [0, 1] and up["spine"] == []
    for rank in range(4):
        fabric.client.leave(*job, rank)
    assert all([e for e in entries(fabric, name, t) if e[0]["job_id"]] == []   # job 0: the id mark
               for name in ("tor1", "tor2", "spine") for t in ("job_table", "uplink_table", "worker_table"))


@pytest.mark.parametrize("fabric", [512], indirect=True)      # two windows per switch
def test_a_full_spine_leaves_the_tors_aggregating_under_the_host_aggregator_and_full_tors_the_host(fabric):
    fabric.job(ACROSS, "first")
    fabric.job(["10.0.3.1", "10.0.4.1"], "second")                 # the spine is full now
    third = fabric.job(["10.0.1.3", "10.0.2.3"], "third")
    assert fabric.listing(third[0]).active.mode == "host"          # its root: the host aggregator
    assert [fabric.grant(third, r).aggregator for r in (0, 1)] == [f"10.0.{t}.254:{UDP_PORT}" for t in (1, 2)]
    assert fabric.grant(third, 0).reason.endswith("root the host aggregator")
    assert entries(fabric, "spine", "job_table") and len(entries(fabric, "spine", "job_table")) == 2
    fabric.allreduce(third, ["10.0.1.3", "10.0.2.3"], blocks=4)
    fourth = fabric.job(["10.0.1.4", "10.0.2.4"], "fourth")        # tor1 and tor2 are full too
    g = fabric.grant(fourth, 0)
    assert g.mode == "host" and g.aggregator == f"{AGG[1]}:{AGG[2]}"
    assert "its aggregation tree (spine, tor1, tor2) had no room for it" in g.reason
    fabric.allreduce(fourth, ["10.0.1.4", "10.0.2.4"], blocks=4)   # through both ToRs and the spine by MAC


def test_seventy_jobs_fill_the_spine_then_aggregate_on_their_tors_under_the_host_aggregator(fabric):
    """70 two-rank jobs, each across a pair of ToRs (tor1+tor2, tor3+tor4): the spine's 64 job
    rows go first (each ToR holds 32 then); jobs 65.. aggregate on their ToRs with the host
    aggregator as their root; nothing fails."""
    jobs = []
    for i in range(70):
        a, b = (1, 2) if i % 2 == 0 else (3, 4)
        jobs.append(fabric.job([f"10.0.{a}.1", f"10.0.{b}.1"], f"j{i}"))
    listing = {j.job_id: j for j in fabric.client.list_jobs(ADMIN).jobs}
    assert [listing[j].active.mode for j, _ in jobs] == ["switch"] * 64 + ["host"] * 6
    assert {fabric.grant(job, r).mode for job in jobs for r in (0, 1)} == {"switch"}
    stream = fabric.client.watch_host_jobs(ADMIN)
    host = next(stream).jobs
    stream.cancel()
    assert [(h.job_id, list(h.workers)) for h in host] == [
        (j, [f"10.0.{a}.254:{UDP_PORT}", f"10.0.{a + 1}.254:{UDP_PORT}"]) for (j, _), a in zip(jobs[64:], (1, 3) * 3)]
    assert len(entries(fabric, "spine", "job_table")) == 64 and len(entries(fabric, "tor1", "job_table")) == 35
    assert not any(j.failure for j in listing.values())


def test_a_restarted_tor_is_given_its_part_of_the_tree_back(fabric):
    job = fabric.job(ACROSS, "tree")
    before = {t: entries(fabric, "tor2", t) for t in ("job_table", "worker_table", "uplink_table", "l2_table")}
    fabric.stop_switch("tor2")
    state = fabric.start_switch("tor2")
    assert wait_until(lambda: state.pipeline is not None and len(state.pipeline.tables[
        "InaggIngress.tree_uplink.uplink_table"].entries) == 1)
    assert {t: entries(fabric, "tor2", t) for t in before} == before
    fabric.allreduce(job, ACROSS, blocks=4, seed=1)


def test_a_restarted_controller_keeps_the_trees_and_their_grants(fabric):
    tree = fabric.job(ACROSS, "tree")
    fabric.job(["10.0.3.1", "10.0.4.1"], "other")
    grants = [fabric.grant(tree, r) for r in range(4)]
    fabric.stop_controller()
    fabric.start_controller()
    assert [fabric.grant(tree, r) for r in range(4)] == grants
    third = fabric.job(["10.0.1.3", "10.0.2.3"], "third")          # the restored rows and windows are held
    assert {fabric.grant(third, 0).slot_base, fabric.grant(tree, 0).slot_base} == {0, 8}
    fabric.allreduce(tree, ACROSS, blocks=2)


def test_a_switch_refusing_its_part_rolls_the_whole_tree_back(fabric):
    job_id, token = fabric.client.create_job(4, 256, 0.1, "tree")
    for rank, ip in enumerate(ACROSS[:3]):
        fabric.join(job_id, token, rank, ip)
    fabric.stop_switch("tor2")
    with pytest.raises(ControllerError, match="ABORTED: join of job .* failed and was rolled back"):
        fabric.join(job_id, token, 3, ACROSS[3])
    assert entries(fabric, "tor1", "job_table") == [] and entries(fabric, "spine", "job_table") == []
    state = fabric.start_switch("tor2")
    assert wait_until(lambda: state.pipeline is not None)
    fabric.join(job_id, token, 3, ACROSS[3])
    fabric.allreduce((job_id, token), ACROSS, blocks=2)


def test_a_tree_is_not_drained_and_a_roce_job_across_switches_runs_on_the_host(fabric):
    tree = fabric.job(ACROSS, "tree")
    with pytest.raises(ControllerError, match="a tree is not drained"):
        fabric.client.drain(ADMIN, tree[0])
    roce_id, token = fabric.client.create_job(2, 256, 0.1, "roce", transport="roce")
    for rank, ip in enumerate(["10.0.1.3", "10.0.2.3"]):
        fabric.join(roce_id, token, rank, ip, roce_qp=0x300 + rank)
    g = fabric.grant((roce_id, token), 0)
    assert g.mode == "host" and "aggregation trees carry UDP jobs only" in g.reason

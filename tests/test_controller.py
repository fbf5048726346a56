"""The controller against the software data plane's P4Runtime server (and its own gRPC API)."""


import logging
import threading

import grpc
import pytest

from inagg.bmv2_env.softswitch.p4runtime_server import SoftSwitchState, serve as serve_switch
from inagg.hostlib.jobservice.client import ControllerClient, ControllerError, to_grant
from inagg.controller.config import default_program, parse_config
from inagg.controller.controller import Controller
from inagg.controller.service import run_forever, serve as serve_controller
from inagg.controller.switch import PRIORITY, ResultReplication, SourceGuard, SwitchConnection

ADMIN = "s3cret"


def controller_env(tmp_path, switch_keys: dict | None = None, **overrides):
    """A soft switch (in process, restartable), a controller on it and a client; yields a dict
    of handles. ``switch_keys``: keys of the switch's config entry (``target: tofino`` makes the
    soft switch Tofino-shaped); ``overrides``: controller config keys."""
    sw_addr = f"unix:{tmp_path}/sw.sock"
    switch_keys = switch_keys or {}
    target = switch_keys.get("target", "soft")
    program = default_program(target if target in ("tofino", "tofino2") else "soft")
    switch = {"state": SoftSwitchState(0, program.p4info)}
    switch["server"] = serve_switch(switch["state"], sw_addr)
    config = parse_config({
        "listen": f"unix:{tmp_path}/ctl.sock", "admin_token": ADMIN,
        "database": str(tmp_path / "ctl.sqlite"), "lease_seconds": 60, "rank_lease_seconds": 60, "min_window": 512,
        "switch_check_seconds": 0.2, "host_aggregator": "10.0.0.100:42666",
        "switches": [{"name": "s1", "grpc": sw_addr, "aggregator": "10.0.0.254:42602",
                      "hosts": {f"10.0.0.{i}": {"port": i, "mac": f"00:00:00:00:00:0{i}"} for i in range(1, 5)},
                      **switch_keys}],
        **overrides,
    })
    running = {}

    def start():
        ctl = Controller(config)
        running["ctl"], running["srv"] = ctl, serve_controller(ctl, config.listen)
        return ctl

    def stop():
        running["srv"].stop(grace=0)
        running["ctl"].close()

    def stop_switch():
        switch["server"].stop(grace=0).wait()

    def start_switch():
        """A fresh switch process stand-in: no pipeline, no entries."""
        switch["state"] = SoftSwitchState(0, program.p4info)
        switch["server"] = serve_switch(switch["state"], sw_addr)
        return switch["state"]

    start()
    client = ControllerClient(config.listen)
    yield {"start": start, "stop": stop, "client": client, "state": switch["state"], "sw_addr": sw_addr,
           "ctl": lambda: running["ctl"], "stop_switch": stop_switch, "start_switch": start_switch}
    client.close()
    stop()
    switch["server"].stop(grace=0)


@pytest.fixture
def env(tmp_path):
    yield from controller_env(tmp_path)


def first_grants(client, job_id, token, n=1):
    stream = client.watch(job_id, token)
    out = [next(stream) for _ in range(n)]
    stream.cancel()
    return out


def new_job(client, hosts, name):
    job_id, token = client.create_job(len(hosts), 64 << 20, 0.1, name)
    for rank, h in enumerate(hosts):
        client.join(job_id, token, rank, f"10.0.0.{h}:{47000 + rank}")
    return job_id, token


def activate_all(client, job_id, token, epoch, boundary):
    """Every rank of the job asks to activate ``epoch`` at ``boundary``; the last reply."""
    n = {j.job_id: j.n_workers for j in client.list_jobs(ADMIN).jobs}[job_id]
    return [client.activate(job_id, token, epoch, boundary, rank) for rank in range(n)][-1]


def settle(client, jobs):
    """Activate every pending grant, as the jobs' workers would at their next boundary."""
    for _ in range(6):
        progressed = False
        for job_id, token in jobs:
            info = {j.job_id: j for j in client.list_jobs(ADMIN).jobs}.get(job_id)
            if info is not None and info.HasField("pending"):
                activate_all(client, job_id, token, info.pending.epoch, boundary=10)
                progressed = True
        if not progressed:
            return


def table(sw, name):
    return {k["job_id"]: p for k, _, p in sw.table_entries(name)} if name == "job_table" else sw.table_entries(name)


def test_pipeline_forwarding_and_flood_group_installed(env):
    sw = SwitchConnection(env["sw_addr"], election_id=(0, 0))
    try:
        assert sw.installed_program() == "inagg"
        macs = {k["dst_addr"]: p["port"] for k, a, p in sw.table_entries("l2_table") if a == "forward"}
        assert macs == {i: i for i in range(1, 5)}
        assert sorted(ResultReplication(sw).groups()[1]) == [(p, 0) for p in range(1, 5)]
    finally:
        sw.close()


@pytest.mark.parametrize("target", ["soft", "tofino", "tofino2"])
def test_source_guard_is_installed_on_every_host_port(tmp_path, target):
    """Issue 37: every port a configured host is on is guarded against frames from the
    switch's aggregator address and the host aggregator's; the host aggregator's own port (its
    IP is one of the hosts) may send results. BMv2's shape: one entry per port naming both
    addresses; the TNA program's (both chips): the rows whose matches are those comparisons."""
    hosts = {f"10.0.0.{i}": {"port": i, "mac": f"00:00:00:00:00:0{i}"} for i in range(1, 4)}
    hosts["10.0.0.100"] = {"port": 4, "mac": "00:00:00:00:00:64"}
    keys = {"hosts": hosts, **({"target": target, "device_ports": {str(p): p for p in range(1, 5)}}
                               if target != "soft" else {})}
    env = controller_env(tmp_path, keys)
    e = next(env)
    sw = SwitchConnection(e["sw_addr"], election_id=(0, 0),
                          program=default_program(target) if target != "soft" else None)
    try:
        assert e["ctl"]().fabric.switches["s1"].capacity.guard
        switch_ip, host_agg = 0x0A0000FE, 0x0A000064
        entries = sw.table_entries("host_port_table")
        if target == "soft":
            want = {p: ("guard_host_port", {"aggregator_addr": switch_ip, "host_aggregator": host_agg,
                                            "is_aggregator": int(p == 4)}) for p in range(1, 5)}
            assert {k["port"]: (a, p) for k, a, p in entries} == want
        else:
            assert {(k["port"], k[PRIORITY]): (tuple(sorted(set(k) - {"port", PRIORITY})), a, p["reason"])
                    for k, a, p in entries} == {
                **{(p, 4): (("ipv4_valid", "src_addr"), "refuse", 0) for p in range(1, 5)},
                **{(p, 3): (("ipv4_valid", "src_addr"), "refuse", 0) for p in range(1, 4)},
                **{(p, 2): (("inagg_valid", "msg_type"), "refuse", 1) for p in range(1, 4)},
                **{(p, 1): (("flags", "inagg_valid"), "refuse", 1) for p in range(1, 5)}}
            assert {k["src_addr"] for k, _, _ in entries if "src_addr" in k} == \
                {(switch_ip, 0xFFFFFFFF), (host_agg, 0xFFFFFFFF)}
        assert first_grants(e["client"], *new_job(e["client"], [1, 2], "t"))[0].mode == "switch"
        assert SourceGuard(sw).drops() == {}
    finally:
        sw.close()
        next(env, None)


def test_jobs_fill_switch_third_falls_back_to_host_then_is_upgraded(env, caplog):
    caplog.set_level(logging.INFO, logger="inagg.controller")
    c = env["client"]
    j1 = new_job(c, [1, 2], "a")
    j2 = new_job(c, [2, 3], "b")
    settle(c, [j1, j2])
    g1, g2 = first_grants(c, *j1)[0], first_grants(c, *j2)[0]
    assert g1.mode == g2.mode == "switch" and not g1.pending
    assert set(range(g1.slot_base, g1.slot_base + g1.slot_count)).isdisjoint(
        range(g2.slot_base, g2.slot_base + g2.slot_count))
    assert g1.aggregator == "10.0.0.254:42602" and g1.values_per_packet == 64
    j3 = new_job(c, [3, 4], "c")
    g3 = first_grants(c, *j3)[0]
    assert g3.mode == "host" and g3.aggregator == "10.0.0.100:42666" and g3.values_per_packet == 4096
    host_jobs = next(c.watch_host_jobs(ADMIN))
    assert [(h.job_id, list(h.workers)) for h in host_jobs.jobs] == [(j3[0], ["10.0.0.3:47000", "10.0.0.4:47001"])]

    sw = SwitchConnection(env["sw_addr"], election_id=(0, 0))
    try:
        jobs = table(sw, "job_table")
        assert set(jobs) == {j1[0], j2[0]}
        assert jobs[j1[0]]["slot_base"] == g1.slot_base and jobs[j1[0]]["epoch"] == g1.epoch
        groups = ResultReplication(sw).groups()
        assert sorted(groups[jobs[j1[0]]["mcast_grp"]]) == [(1, 1), (2, 2)]
        listed = {j.job_id: j for j in c.list_jobs(ADMIN).jobs}
        assert listed[j1[0]].counters["packets"] == 0 and "packets" not in listed[j3[0]].counters

        c.release(ADMIN, j1[0])                       # j1 leaves: j3 is offered the switch
        pending = first_grants(c, *j3, n=2)[1]
        assert pending.pending and pending.mode == "switch" and pending.epoch > g3.epoch
        reply = activate_all(c, *j3, pending.epoch, boundary=7)
        assert reply.activated and reply.grant.mode == "switch" and reply.grant.epoch == pending.epoch
        assert set(table(sw, "job_table")) == {j2[0], j3[0]}
        assert len(next(c.watch_host_jobs(ADMIN)).jobs) == 0
        end = pending.slot_base + pending.slot_count - 1
        assert (f"job {j3[0]} epoch {pending.epoch} active at boundary 7: switch slots {pending.slot_base}-{end} "
                f"(upgrade, was the host aggregator)") in caplog.messages
    finally:
        sw.close()


def test_activation_answer_is_the_same_for_every_rank(env):
    c = env["client"]
    j1 = new_job(c, [1, 2], "a")
    settle(c, [j1])                       # j1 grows to the whole pool
    assert first_grants(c, *j1)[0].slot_count == 1024
    new_job(c, [2, 3], "b")               # j1 must shrink: pending grant
    pending = first_grants(c, *j1, n=2)[1]
    assert pending.pending
    answers = [activate_all(c, *j1, pending.epoch, boundary=3).activated for _ in range(2)]
    stale = [activate_all(c, *j1, pending.epoch + 9, boundary=4).activated for _ in range(2)]
    assert answers == [True, True] and stale == [False, False]
    assert first_grants(c, *j1)[0].epoch == pending.epoch


def test_a_static_deployment_keeps_each_job_on_one_window(tmp_path):
    """``sharing = "static"`` in the config: a job alone keeps its one minimum window (dynamic
    sharing grows it to the whole pool, above), and a second job takes another without a grant
    change for the first."""
    env = controller_env(tmp_path, sharing="static")
    c = next(env)["client"]
    try:
        j1 = new_job(c, [1, 2], "a")
        settle(c, [j1])
        assert first_grants(c, *j1)[0].slot_count == 512
        j2 = new_job(c, [3, 4], "b")
        settle(c, [j1, j2])
        g1, g2 = first_grants(c, *j1)[0], first_grants(c, *j2)[0]
        assert (g1.slot_count, g1.epoch, g2.mode, g2.slot_count) == (512, 1, "switch", 512)
    finally:
        next(env, None)
    with pytest.raises(ValueError, match="config: sharing 'fair': write one of dynamic, static"):
        parse_config({"host_aggregator": "10.0.0.100:42666", "sharing": "fair"})


def test_a_grant_changes_only_once_every_rank_asked(env):
    """A rank asks only after it has every result of the boundary's call; until the last rank
    asked, the switch keeps the old epoch (a rank that lost its last result may still resend)."""
    c = env["client"]
    j1 = new_job(c, [1, 2], "a")
    settle(c, [j1])
    active = first_grants(c, *j1)[0]
    new_job(c, [2, 3], "b")                                   # j1 must shrink: pending grant
    pending = first_grants(c, *j1, n=2)[1]
    for _ in range(2):                                        # rank 0 asks (and asks again)
        reply = c.activate(*j1, pending.epoch, 5, 0)
        assert not reply.activated and reply.waiting_for == 1 and reply.grant.epoch == active.epoch
    sw = SwitchConnection(env["sw_addr"], election_id=(0, 0))
    try:
        assert table(sw, "job_table")[j1[0]]["epoch"] == active.epoch
    finally:
        sw.close()
    reply = c.activate(*j1, pending.epoch, 5, 1)              # the last rank: decided
    assert reply.activated and reply.waiting_for == 0 and reply.grant.epoch == pending.epoch
    assert c.activate(*j1, pending.epoch, 5, 0).activated     # the first rank's next ask: the same
    with pytest.raises(ControllerError, match="INVALID_ARGUMENT: an activation names the asking rank"):
        c.activate(*j1, pending.epoch, 6, None)


def test_restart_keeps_grants_and_switch_state(env):
    c = env["client"]
    j1 = new_job(c, [1, 2], "a")
    j2 = new_job(c, [2, 3], "b")
    settle(c, [j1, j2])
    before = [first_grants(c, *j)[0] for j in (j1, j2)]
    sw = SwitchConnection(env["sw_addr"], election_id=(0, 0))
    try:
        entries = sorted(map(str, sw.table_entries("job_table")))
        env["stop"]()
        env["start"]()
        after = [first_grants(c, *j)[0] for j in (j1, j2)]
        assert after == before
        assert sorted(map(str, sw.table_entries("job_table"))) == entries
        assert env["state"].pipeline is not None        # pipeline kept, not pushed again
    finally:
        sw.close()


def test_a_host_lane_job_runs_on_the_host_aggregator_beside_the_same_ranks_on_the_switch(env):
    """The inagg backend's two jobs for one set of ranks: the main one on the switch, the host
    lane (host_only) on the host aggregator, listed to the aggregator with its workers; both
    as they were after a controller restart."""
    c = env["client"]
    main = new_job(c, [1, 2], "m")
    lane_id, lane_token = c.create_job(2, 64 << 20, 0.1, "m/host", host_only=True)
    for rank, h in enumerate([1, 2]):
        c.join(lane_id, lane_token, rank, f"10.0.0.{h}:{48000 + rank}")
    settle(c, [main, (lane_id, lane_token)])
    for _ in range(2):
        g_main, g_lane = first_grants(c, *main)[0], first_grants(c, lane_id, lane_token)[0]
        assert (g_main.mode, g_lane.mode) == ("switch", "host")
        assert g_lane.aggregator == "10.0.0.100:42666" and "asked for the host aggregator" in g_lane.reason
        host_jobs = {j.job_id: list(j.workers) for j in env["ctl"]().host_jobs().jobs}
        assert host_jobs == {lane_id: ["10.0.0.1:48000", "10.0.0.2:48001"]}
        env["stop"]()
        env["start"]()


def test_a_job_across_tofino_pipes_runs_on_the_host_aggregator_and_says_why(tmp_path):
    """Tofino registers are per pipe (pipe = device port >> 7): hosts 1, 2 are in pipe 0,
    3, 4 in pipe 1. A job within a pipe goes to the switch, one across pipes to the host
    aggregator with the reason; so does a RoCE job (the Tofino program carries UDP only)."""
    ports = {"target": "tofino", "device_ports": {"1": 0, "2": 4, "3": 128, "4": 132}}
    env = controller_env(tmp_path, ports)
    e = next(env)
    try:
        c = e["client"]
        across, within = new_job(c, [2, 3], "across"), new_job(c, [3, 4], "within")
        roce, roce_token = c.create_job(2, 64 << 20, 0.1, "roce", transport="roce")
        for rank in range(2):
            c.join(roce, roce_token, rank, f"10.0.0.{rank + 1}:47000", roce_qp=0x300 + rank)
        assert first_grants(c, *within)[0].mode == "switch"
        g = first_grants(c, *across)[0]
        assert g.mode == "host" and "ports on switch s1 are in pipes 0, 1" in g.reason
        g = first_grants(c, roce, roce_token)[0]
        assert g.mode == "host" and "carries udp only, not the job's roce" in g.reason
    finally:
        next(env, None)


def test_switch_grants_carry_the_configured_aggregator_mac(tmp_path):
    """The switch answers no ARP for its aggregator address: its MAC (config) is in every switch
    grant, which the worker checks against its neighbour table; host grants carry none."""
    env = controller_env(tmp_path, {"aggregator_mac": "02:00:00:00:00:fe"})
    e = next(env)
    try:
        c = e["client"]
        job, token = new_job(c, [1, 2], "j")
        g = first_grants(c, job, token)[0]
        assert (g.mode, g.aggregator_mac) == ("switch", "02:00:00:00:00:fe")
        assert to_grant(g).aggregator_mac == "02:00:00:00:00:fe"
        c.drain(ADMIN, job)
        assert first_grants(c, job, token, 2)[1].aggregator_mac == ""
    finally:
        next(env, None)
    bad = {"host_aggregator": "10.0.0.100:42666", "switches": [
        {"grpc": "unix:x", "aggregator": "10.0.0.254:42602", "hosts": {}, "aggregator_mac": "02:00"}]}
    with pytest.raises(ValueError, match=r"switches\[0\].aggregator_mac: bad MAC '02:00'"):
        parse_config(bad)


def test_calls_without_the_token_are_refused(env):
    c = env["client"]
    job_id, token = c.create_job(2)
    with pytest.raises(ControllerError, match="PERMISSION_DENIED"):
        c.join(job_id, "forged", 0, "10.0.0.1:1")
    with pytest.raises(ControllerError, match="PERMISSION_DENIED"):
        c.list_jobs("wrong")
    with pytest.raises(ControllerError, match="rank 5 not in 0..1"):
        c.join(job_id, token, 5, "10.0.0.1:1")
    with pytest.raises(ControllerError, match="expected HOST:PORT"):
        c.join(job_id, token, 0, "10.0.0.1")
    stream = c.watch(job_id, "forged")
    with pytest.raises(grpc.RpcError) as e:
        next(stream)
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED


def roce_replicas(sw, job_id):
    """(replica, action, qp, rkey) of a job's replica_table entries, sorted."""
    return sorted((k["replica"], a, p["qp"], p["rkey"]) for k, a, p in sw.table_entries("replica_table")
                  if k["job_id"] == job_id)


def test_roce_job_gets_roce_switch_entries_and_keeps_them_across_restart(env):
    """A RoCEv2 job: every rank must give its QP; its switch grant says RoCE, the switch admits
    it with ENCAP_ROCE and addresses results to each worker's QP and rkey; a restart (from the
    store) programs the same."""
    c = env["client"]
    job_id, token = c.create_job(2, 64 << 20, 0.1, "r", transport="roce")
    with pytest.raises(ControllerError, match="uses RoCEv2: rank 0 must give its QP"):
        c.join(job_id, token, 0, "10.0.0.1:47000")
    for rank in range(2):
        c.join(job_id, token, rank, f"10.0.0.{rank + 1}:47000", roce_qp=0x300 + rank, roce_rkey=9 + rank)
    settle(c, [(job_id, token)])
    grant = first_grants(c, job_id, token)[0]
    assert (grant.mode, grant.transport) == ("switch", "roce")
    sw = SwitchConnection(env["sw_addr"], election_id=(0, 0))
    try:
        assert table(sw, "job_table")[job_id]["encap"] == 2
        replicas = roce_replicas(sw, job_id)
        assert replicas == [(1, "set_roce_worker_address", 0x300, 9), (2, "set_roce_worker_address", 0x301, 10)]
        env["stop"]()
        env["start"]()
        assert first_grants(c, job_id, token)[0] == grant
        assert roce_replicas(sw, job_id) == replicas
    finally:
        sw.close()
    c.drain(ADMIN, job_id)
    pending = first_grants(c, job_id, token, 2)[1]
    assert (pending.mode, pending.transport) == ("host", "udp")   # the host aggregator speaks UDP


def test_transport_mistakes_are_refused(env):
    c = env["client"]
    with pytest.raises(ControllerError, match="transport must be one of udp, roce, got 'rdma'"):
        c.create_job(2, transport="rdma")
    job_id, token = c.create_job(2)
    with pytest.raises(ControllerError, match="not RoCEv2: rank 0 gave a QP"):
        c.join(job_id, token, 0, "10.0.0.1:1", roce_qp=5)


def test_store_written_before_roce_gains_its_columns(tmp_path):
    """An older controller's SQLite store (no transport/QP columns) opens, and its jobs read
    back as UDP jobs with their workers."""
    import sqlite3

    from inagg.controller.store import Store

    db = sqlite3.connect(tmp_path / "old.sqlite")
    db.executescript("""
        CREATE TABLE jobs (job_id INTEGER PRIMARY KEY, name TEXT NOT NULL, token TEXT NOT NULL,
                           switch TEXT, job_index INTEGER, state TEXT);
        CREATE TABLE workers (job_id INTEGER NOT NULL, rank INTEGER NOT NULL, address TEXT NOT NULL,
                              mac TEXT NOT NULL, PRIMARY KEY (job_id, rank));
        INSERT INTO jobs VALUES (4, 'old', 'tok', 's1', 0, '{}');
        INSERT INTO workers VALUES (4, 0, '10.0.0.1:5000', '');
    """)
    db.commit()
    db.close()
    job, = Store(tmp_path / "old.sqlite").jobs()
    assert (job["job_id"], job["transport"], job["workers"]) == (4, "udp", [(0, "10.0.0.1:5000", "", 0, 0)])


def test_a_restarted_roce_worker_rejoins_with_a_new_qp(env):
    """A worker that restarts gets a new QP: rejoining at the same address is accepted and the
    switch addresses its results to the new QP; moving to another address is refused."""
    c = env["client"]
    job_id, token = c.create_job(2, 64 << 20, 0.1, "r", transport="roce")
    for rank in range(2):
        c.join(job_id, token, rank, f"10.0.0.{rank + 1}:47000", roce_qp=0x300 + rank)
    settle(c, [(job_id, token)])
    c.join(job_id, token, 1, "10.0.0.2:47000", roce_qp=0x999, roce_rkey=5)
    sw = SwitchConnection(env["sw_addr"], election_id=(0, 0))
    try:
        qps = {replica: (qp, rkey) for replica, _, qp, rkey in roce_replicas(sw, job_id)}
        assert qps == {1: (0x300, 0), 2: (0x999, 5)}
    finally:
        sw.close()
    with pytest.raises(ControllerError, match="rank 1 cannot move from 10.0.0.2:47000 to 10.0.0.3:47000"):
        c.join(job_id, token, 1, "10.0.0.3:47000", roce_qp=0x999)


# -- one tenant cannot wedge or crash the controller ------------------------------------------

def wait_until(predicate, timeout=20.0):
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("kwargs, message", [
    ({"iteration_seconds": float("nan")}, "iteration_seconds must be a finite number"),
    ({"iteration_seconds": float("inf")}, "iteration_seconds must be a finite number"),
    ({"iteration_seconds": -1.0}, "iteration_seconds must be a finite number"),
    ({"name": "x" * 129}, "name is 129 characters long; at most 128"),
    ({"name": "a\0b"}, "name holds a control character"),
    ({"name": "x" * (3 << 20)}, "RESOURCE_EXHAUSTED"),          # the request itself is too large
    ({"bytes_per_iteration": 1 << 60}, "bytes_per_iteration must be 0.."),
])
def test_bad_job_requests_are_refused(env, kwargs, message):
    c = env["client"]
    with pytest.raises(ControllerError, match=message):
        c.create_job(2, **{"bytes_per_iteration": 1 << 20, "iteration_seconds": 0.1, **kwargs})


@pytest.mark.parametrize("address, mac, message", [
    ("h" * 300 + ":5000", "", "address is 305 characters long"),
    ("h" * 100_000 + ":5000", "", "RESOURCE_EXHAUSTED"),
    ("10.0.0.1\0:5000", "", "control character"),
    ("bad_host!:5000", "", "bad host 'bad_host!'"),
    ("10.0.0.1:0", "", "port 0"),
    ("10.0.0.1:5000", "zz:00", "bad MAC 'zz:00'"),
])
def test_bad_join_requests_are_refused(env, address, mac, message):
    c = env["client"]
    job_id, token = c.create_job(2)
    with pytest.raises(ControllerError, match=message):
        c.join(job_id, token, 0, address, mac)


def test_a_nan_demand_never_reaches_placement_and_other_jobs_keep_working(env):
    c = env["client"]
    with pytest.raises(ControllerError, match="INVALID_ARGUMENT"):
        c.create_job(2, 1 << 20, float("nan"), "nan")
    j1 = new_job(c, [1, 2], "a")
    j2 = new_job(c, [3, 4], "b")
    settle(c, [j1, j2])
    assert [first_grants(c, *j)[0].mode for j in (j1, j2)] == ["switch", "switch"]
    c.release(ADMIN, j1[0])   # listed as ended (its ranks are told) until its lease runs out
    listed = {j.job_id: j.failure for j in c.list_jobs(ADMIN).jobs}
    assert listed == {j1[0]: "ended by the operator (ReleaseJob)", j2[0]: ""}


def test_unknown_job_and_wrong_token_get_the_same_answer(env):
    c = env["client"]
    job_id, _ = c.create_job(2)
    answers = []
    for probe in (job_id, job_id + 1000):
        with pytest.raises(ControllerError) as e:
            c.heartbeat(probe, "guess")
        answers.append(str(e.value).replace(str(probe), "N"))
    assert answers[0] == answers[1] and "PERMISSION_DENIED" in answers[0]


def test_out_of_range_ranks_and_boundaries_are_refused(env):
    c = env["client"]
    job_id, token = new_job(c, [1, 2], "a")
    with pytest.raises(ControllerError, match="INVALID_ARGUMENT: boundary .* is not below 2\\^63"):
        c.activate(job_id, token, 1, 1 << 63, 0)
    with pytest.raises(ControllerError, match="INVALID_ARGUMENT: rank 7 not in 0..1"):
        c.leave(job_id, token, 7)
    with pytest.raises(ControllerError, match="INVALID_ARGUMENT: rank 7 not in 0..1"):
        c.heartbeat(job_id, token, 7)
    assert first_grants(c, job_id, token)[0].mode == "switch"      # the job is untouched


def test_drain_and_activate_of_an_unplaced_job_are_refused(env):
    c = env["client"]
    job_id, token = c.create_job(2)
    c.join(job_id, token, 0, "10.0.0.1:5000")
    with pytest.raises(ControllerError, match="FAILED_PRECONDITION: job .* is not placed"):
        c.drain(ADMIN, job_id)
    with pytest.raises(ControllerError, match="FAILED_PRECONDITION: job .* has no grant yet"):
        c.activate(job_id, token, 1, 1, 0)
    with pytest.raises(ControllerError, match="NOT_FOUND"):
        c.drain(ADMIN, job_id + 1000)


def test_two_ranks_of_a_job_cannot_share_one_address(env):
    c = env["client"]
    job_id, token = c.create_job(2)
    c.join(job_id, token, 0, "10.0.0.9:5000")
    with pytest.raises(ControllerError, match="rank 1's address 10.0.0.9:5000 is rank 0's already"):
        c.join(job_id, token, 1, "10.0.0.9:5000")
    c.join(job_id, token, 1, "10.0.0.9:5001")       # its own port: fine
    assert first_grants(c, job_id, token)[0].mode == "host"


def test_many_small_jobs_fill_the_job_rows_then_run_on_host(tmp_path):
    """70 one-rank jobs with the default minimum window: 128 windows fit the slot pool, but the
    switch has 64 job rows (job_table size in the P4Info); jobs 65.. run on host, nothing fails."""
    env = controller_env(tmp_path, min_window=8)
    e = next(env)
    try:
        c = e["client"]
        jobs = []
        for i in range(70):                          # each can use one minimum window only
            jobs.append(c.create_job(1, 256, 0.1, f"j{i}"))
            c.join(*jobs[-1], 0, f"10.0.0.{1 + i % 4}:{47000 + i}")
        modes = [first_grants(c, *j)[0].mode for j in jobs]
        assert modes == ["switch"] * 64 + ["host"] * 6
        c.release(ADMIN, jobs[0][0])                 # a row frees: the first host job is offered it
        pending = first_grants(c, *jobs[64], n=2)[1]
        assert pending.mode == "switch" and c.activate(*jobs[64], pending.epoch, 1, 0).activated
        assert len([j for j in c.list_jobs(ADMIN).jobs if not j.failure]) == 69
        sw = SwitchConnection(e["sw_addr"], election_id=(0, 0))
        try:
            assert len(table(sw, "job_table")) == 64
        finally:
            sw.close()
    finally:
        next(env, None)


def test_listing_and_heartbeat_answer_while_a_storm_waits_for_the_lock(env):
    """ListJobs answers from the listing the last change published, Heartbeat renews without
    the lock: with the controller's lock held (as a long placement holds it) and a storm of
    CreateJob + JoinJob queued behind it, both still answer (were they to wait for the lock
    they could not: the test holds it until they return), the listing showing the state before
    the storm with the switch's counters; once the lock goes, the storm's jobs are listed."""
    from concurrent.futures import ThreadPoolExecutor

    c, ctl = env["client"], env["ctl"]()
    running = new_job(c, [1, 2], "running")

    def storm_job(i: int) -> None:
        job = c.create_job(1, 256, 0.1, f"storm{i}")
        c.join(*job, 0, f"10.0.0.{1 + i % 4}:{48000 + i}")

    with ThreadPoolExecutor(20) as pool:
        with ctl.lock:
            storm = [pool.submit(storm_job, i) for i in range(20)]
            listed = c.list_jobs(ADMIN).jobs
            c.heartbeat(*running, 0)
            assert not any(f.done() for f in storm)
        assert [(j.job_id, j.active.mode) for j in listed] == [(running[0], "switch")]
        assert listed[0].counters["packets"] == 0
        for f in storm:
            f.result()
    names = sorted(j.name for j in c.list_jobs(ADMIN).jobs if j.HasField("active"))
    assert names == sorted(["running"] + [f"storm{i}" for i in range(20)])


def test_a_switch_failure_rolls_back_the_change_and_blocks_no_other_job(env):
    """While the switch is down, completing a switch job is refused (ABORTED) and nothing of
    it is kept; a host-only job is placed meanwhile. The restarted switch is re-programmed (the
    pipeline and every entry) and the refused rank's retry is placed."""
    c = env["client"]
    running = c.create_job(2, 256, 0.1, "running")          # one minimum window each
    for rank in range(2):
        c.join(*running, rank, f"10.0.0.{rank + 1}:5000")
    job_id, token = c.create_job(2, 256, 0.1, "late")
    c.join(job_id, token, 0, "10.0.0.3:5000")
    env["stop_switch"]()
    with pytest.raises(ControllerError, match="ABORTED: join of job .* failed and was rolled back"):
        c.join(job_id, token, 1, "10.0.0.4:5001")
    listed = {j.job_id: j for j in c.list_jobs(ADMIN).jobs}      # ListJobs still answers
    assert listed[job_id].joined == 1 and not listed[job_id].HasField("active")
    host_only = new_job(c, [7, 8], "elsewhere")                    # on no switch: unaffected
    assert first_grants(c, *host_only)[0].mode == "host"
    state = env["start_switch"]()
    assert wait_until(lambda: state.pipeline is not None and len(state.pipeline.tables[
        "InaggIngress.admission.job_table"].entries) == 1)
    c.join(job_id, token, 1, "10.0.0.4:5001")
    settle(c, [running, (job_id, token)])
    assert first_grants(c, job_id, token)[0].mode == "switch"
    sw = SwitchConnection(env["sw_addr"], election_id=(0, 0))
    try:
        assert set(table(sw, "job_table")) == {running[0], job_id}
        assert len(ResultReplication(sw).groups()) == 3               # flood group + one per job
    finally:
        sw.close()


def test_a_silent_rank_fails_its_job_and_frees_its_slots(tmp_path):
    # a 2 s rank lease: rank 0's first beat (after the stream's first read) comes well inside it
    # under load, so only rank 1, which never beats, is named
    env = controller_env(tmp_path, rank_lease_seconds=2.0)
    e = next(env)
    try:
        c = e["client"]
        job_id, token = new_job(c, [1, 2], "a")
        stream = c.watch(job_id, token)
        # under load the rank lease may run out before the stream's first read: then the first
        # grant it gives is the failure already
        first = next(stream)
        assert first.mode == "switch" or "rank 1 (10.0.0.2:47001) stopped" in first.failure, first
        import time
        with pytest.raises(ControllerError, match="FAILED_PRECONDITION: job .* failed: rank 1"):
            for _ in range(100):              # rank 0 beats, rank 1 is silent
                c.heartbeat(job_id, token, 0)
                time.sleep(0.1)
        failed = first if first.failure else next(g for g in stream if g.failure)
        stream.cancel()
        assert "rank 1 (10.0.0.2:47001) stopped" in failed.failure and "rank 0" not in failed.failure
        sw = SwitchConnection(e["sw_addr"], election_id=(0, 0))
        try:
            assert table(sw, "job_table") == {}
        finally:
            sw.close()
    finally:
        next(env, None)


def test_a_roce_job_needs_one_ip_per_rank(env):
    """RoCEv2 senders' UDP source port is the flow label's, so the switch binds a RoCEv2 rank by
    port, IP and MAC only: two ranks on one IP are refused at join."""
    c = env["client"]
    job_id, token = c.create_job(2, transport="roce")
    c.join(job_id, token, 0, "10.0.0.1:5000", roce_qp=5000)
    with pytest.raises(ControllerError, match="uses RoCEv2: rank 1 shares IP 10.0.0.1 with rank 0"):
        c.join(job_id, token, 1, "10.0.0.1:5001", roce_qp=5001)


def test_the_lease_thread_survives_a_failed_expiry_and_retries(tmp_path):
    """A job's lease runs out while its switch is down: ending it fails (logged, rolled back)
    and the lease thread goes on; once the switch is back the job is ended and its entries go."""
    lease = 3.0
    env = controller_env(tmp_path, lease_seconds=lease)
    e = next(env)
    try:
        c = e["client"]
        job_id, token = c.create_job(2, 256, 0.1, "quiet")
        for rank in range(2):
            c.join(job_id, token, rank, f"10.0.0.{rank + 1}:5000")
        import time
        c.heartbeat(job_id, token)        # the lease runs from here: the switch stops well inside it
        e["stop_switch"]()
        time.sleep(1.5 * lease)                           # expiry attempts fail meanwhile
        ctl = e["ctl"]()
        with ctl.lock:        # between transactions: one in flight has the job out until it rolls back
            assert job_id in ctl.jobs
        state = e["start_switch"]()
        # generous bounds: the keeper's reconnect and the next expiry attempt under a loaded CI
        assert wait_until(lambda: job_id not in e["ctl"]().jobs, timeout=90)
        assert wait_until(lambda: state.pipeline is not None and not state.pipeline.tables[
            "InaggIngress.admission.job_table"].entries, timeout=90)
    finally:
        next(env, None)


def test_a_job_taking_a_used_job_row_starts_from_zero_counters(env):
    """Job 1's packets are counted in its row; after it leaves, job 2 gets that row and its
    counters start at zero (the controller zeroes the row before admitting it)."""
    import numpy as np
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether

    from inagg.hostlib.wire.protocol import SWITCH_VALUES_PER_PACKET, UDP_PORT, build_contribution

    c = env["client"]
    j1 = c.create_job(2, 256, 0.1, "first")
    for rank in range(2):
        c.join(*j1, rank, f"10.0.0.{rank + 1}:5000")
    grant = first_grants(c, *j1)[0]
    payload = build_contribution(j1[0], 0, grant.epoch, grant.slot_base, 0, 0,
                                 np.ones(SWITCH_VALUES_PER_PACKET, np.int32), SWITCH_VALUES_PER_PACKET)
    frame = bytes(Ether(src="00:00:00:00:00:01", dst="00:00:00:00:00:fe") / IP(src="10.0.0.1", dst="10.0.0.254")
                  / UDP(sport=5000, dport=UDP_PORT, chksum=0) / payload)
    for _ in range(3):
        env["state"].pipeline.process(1, frame)
    listed = {j.job_id: j for j in c.list_jobs(ADMIN).jobs}
    assert listed[j1[0]].counters["packets"] == 3 and listed[j1[0]].counters["aggregated"] == 1
    c.release(ADMIN, j1[0])
    j2 = c.create_job(2, 256, 0.1, "second")
    for rank in range(2):
        c.join(*j2, rank, f"10.0.0.{rank + 3}:5000")
    listed = {j.job_id: j for j in c.list_jobs(ADMIN).jobs}
    assert listed[j2[0]].active.mode == "switch"
    assert listed[j2[0]].counters["packets"] == 0 and listed[j2[0]].counters["duplicates"] == 0


def report_all(client, job_id, token, epoch, boundary, n=2):
    """Every rank of the job reports a stall of the call before ``boundary`` in ``epoch``; the
    replies."""
    return [client.report_stall(job_id, token, epoch, boundary, rank, "no result for 2.0s") for rank in range(n)]


def test_a_stall_moves_the_job_to_a_fresh_epoch_then_the_host_aggregator_then_fails_it(env):
    """Once every rank reported it: a fresh epoch on the same slots (the switch's job_table says
    it), then, the stall back at that boundary, the host aggregator with the reason; a third
    fails the job naming what was tried."""
    c = env["client"]
    j1 = new_job(c, [1, 2], "a")
    active = first_grants(c, *j1)[0]
    first, last = report_all(c, *j1, active.epoch, 7)
    assert first.waiting_for == 1 and first.grant.epoch == active.epoch          # not before every rank
    fresh = last.grant
    assert last.waiting_for == 0 and fresh.mode == "switch" and fresh.epoch > active.epoch   # above its pending one
    assert (fresh.slot_base, fresh.slot_count) == (active.slot_base, active.slot_count)
    assert c.report_stall(*j1, active.epoch, 7, 0, "late").grant.epoch == fresh.epoch   # a late ask: the move
    assert {j.job_id: j for j in c.list_jobs(ADMIN).jobs}[j1[0]].stall_moves == 1       # the listing counts it
    with pytest.raises(ControllerError, match="INVALID_ARGUMENT: job 1 has no epoch 99 yet"):
        c.report_stall(*j1, 99, 7, 0, "no result")
    sw = SwitchConnection(env["sw_addr"], election_id=(0, 0))
    try:
        assert table(sw, "job_table")[j1[0]]["epoch"] == fresh.epoch
    finally:
        sw.close()
    host = report_all(c, *j1, fresh.epoch, 7)[-1].grant
    assert host.mode == "host" and host.epoch > fresh.epoch
    assert "stall at boundary 7 came back on a fresh epoch" in host.reason, host.reason
    assert {j.job_id: j for j in c.list_jobs(ADMIN).jobs}[j1[0]].stall_moves == 2
    c.report_stall(*j1, host.epoch, 7, 0, "no result for 2.0s")
    with pytest.raises(ControllerError, match="FAILED_PRECONDITION.*stalled again on the host aggregator.*after a fresh "
                                              "epoch and the host aggregator"):
        c.report_stall(*j1, host.epoch, 7, 1, "no result for 2.0s")
    assert "stalled again" in {j.job_id: j for j in c.list_jobs(ADMIN).jobs}[j1[0]].failure


def test_a_restarted_controller_remembers_what_a_stall_did(env):
    """The moves a stall made and the reason the job stays on the host aggregator are in the
    database: after a restart the job's grant still gives the reason, and the stall coming back
    at that boundary fails the job as it would have without the restart (never a fresh epoch
    again)."""
    c = env["client"]
    j1 = new_job(c, [1, 2], "a")
    fresh = report_all(c, *j1, first_grants(c, *j1)[0].epoch, 7)[-1].grant
    host = report_all(c, *j1, fresh.epoch, 7)[-1].grant
    env["stop"]()
    env["start"]()
    again = first_grants(c, *j1)[0]
    assert again.mode == "host" and again.epoch == host.epoch and again.reason == host.reason
    c.report_stall(*j1, host.epoch, 7, 0, "no result for 2.0s")
    with pytest.raises(ControllerError, match="stalled again on the host aggregator.*after a fresh epoch and the host"):
        c.report_stall(*j1, host.epoch, 7, 1, "no result for 2.0s")


def test_ranks_stalled_in_different_calls_fail_the_job_at_once(env):
    """A rank that finished a call cannot send it again: no move can end that stall."""
    c = env["client"]
    j1 = new_job(c, [1, 2], "a")
    epoch = first_grants(c, *j1)[0].epoch
    assert c.report_stall(*j1, epoch, 5, 0, "no result").waiting_for == 1
    with pytest.raises(ControllerError, match="rank 0 at boundary 5, rank 1 at boundary 6"):
        c.report_stall(*j1, epoch, 6, 1, "no result")
    with pytest.raises(ControllerError, match="FAILED_PRECONDITION"):
        c.report_stall(*j1, epoch, 6, 0, "no result")


def test_a_background_step_that_fails_once_the_controller_stopped_logs_no_error(caplog):
    """A keeper's step in flight while the controller closes its switch sessions fails on the
    closed channel: no error, the thread ends; a failure while running is logged and retried."""
    stopped, calls = threading.Event(), []

    def step() -> None:
        calls.append(len(calls))
        if len(calls) == 2:
            stopped.set()       # as Controller.close does, then its channels close under the step
        raise RuntimeError("CANCELLED: Channel closed!")

    thread = run_forever("keeper-s1", 0.01, stopped, step)
    thread.join(30)
    assert not thread.is_alive() and calls == [0, 1]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == ["keeper-s1: step failed"]

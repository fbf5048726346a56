"""The controller against the software data plane's P4Runtime server (and its own gRPC API)."""


import grpc
import pytest

from bmv2_env.p4runtime_server import SoftSwitchState, serve as serve_switch
from controller.client import ControllerClient, ControllerError
from controller.config import default_program, parse_config
from controller.service import Controller, serve as serve_controller
from controller.switch import ResultReplication, SwitchConnection

ADMIN = "s3cret"


@pytest.fixture
def env(tmp_path):
    state = SoftSwitchState(0, default_program("soft").p4info)
    switch = serve_switch(state, f"unix:{tmp_path}/sw.sock")
    config = parse_config({
        "listen": f"unix:{tmp_path}/ctl.sock", "admin_token": ADMIN,
        "database": str(tmp_path / "ctl.sqlite"), "lease_seconds": 60, "min_window": 512,
        "host_aggregator": "10.0.0.100:42666",
        "switches": [{"name": "s1", "grpc": f"unix:{tmp_path}/sw.sock", "aggregator": "10.0.0.254:42602",
                      "hosts": {f"10.0.0.{i}": {"port": i, "mac": f"00:00:00:00:00:0{i}"} for i in range(1, 5)}}],
    })
    running = {}

    def start():
        ctl = Controller(config)
        running["ctl"], running["srv"] = ctl, serve_controller(ctl, config.listen)
        return ctl

    def stop():
        running["srv"].stop(grace=0)
        running["ctl"].close()

    start()
    client = ControllerClient(config.listen)
    yield {"start": start, "stop": stop, "client": client, "state": state, "sw_addr": f"unix:{tmp_path}/sw.sock"}
    client.close()
    stop()
    switch.stop(grace=0)


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


def settle(client, jobs):
    """Activate every pending grant, as the jobs' workers would at their next boundary."""
    for _ in range(6):
        progressed = False
        for job_id, token in jobs:
            info = {j.job_id: j for j in client.list_jobs(ADMIN).jobs}.get(job_id)
            if info is not None and info.HasField("pending"):
                client.activate(job_id, token, info.pending.epoch, boundary=10)
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


def test_jobs_fill_switch_third_falls_back_to_host_then_is_upgraded(env):
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
        reply = c.activate(*j3, pending.epoch, boundary=7)
        assert reply.activated and reply.grant.mode == "switch" and reply.grant.epoch == pending.epoch
        assert set(table(sw, "job_table")) == {j2[0], j3[0]}
        assert len(next(c.watch_host_jobs(ADMIN)).jobs) == 0
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
    answers = [c.activate(*j1, pending.epoch, boundary=3).activated for _ in range(2)]
    stale = [c.activate(*j1, pending.epoch + 9, boundary=4).activated for _ in range(2)]
    assert answers == [True, True] and stale == [False, False]
    assert first_grants(c, *j1)[0].epoch == pending.epoch


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

    from controller.store import Store

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

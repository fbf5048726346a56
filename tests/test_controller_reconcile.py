"""The controller reconciles a switch against what it knows it wrote (controller/switch_state.py):
a placement writes only its own entries and reads nothing; the switch is read back in full where
that knowledge may be wrong: a write that failed, another primary elected, a switch restarted,
and the keeper's audit, which finds and repairs what was changed behind the controller's back.
Against the software switch's real P4Runtime service, which counts what it is asked."""

import logging
import shutil

import pytest

from inagg.bmv2_env.softswitch.p4runtime_server import P4RuntimeService, SoftSwitchState, serve as serve_switch
from inagg.controller.config import default_program, parse_config
from inagg.controller.controller import Controller
from inagg.controller.metrics import ControllerCollector
from inagg.controller.service import serve as serve_controller
from inagg.controller.switch import DELETE, INSERT, MODIFY, SwitchConnection
from inagg.controller.switch_state import SwitchState
from inagg.hostlib.jobservice.client import ControllerClient, ControllerError

from test_controller import wait_until
from test_soft_p4runtime_bmv2 import bmv2_p4runtime

ADMIN = "s3cret"
PROGRAM = default_program("soft")


class CountingService(P4RuntimeService):
    """The soft switch's P4Runtime service, keeping the updates it was asked to write and
    counting its Read calls."""

    def __init__(self, state: SoftSwitchState) -> None:
        super().__init__(state)
        self.written: list = []
        self.reads = 0

    def Write(self, request, context):
        self.written.extend(request.updates)
        return super().Write(request, context)

    def Read(self, request, context):
        self.reads += 1
        yield from super().Read(request, context)


class Env:
    """One soft switch (restartable) behind a counting service, or BMv2 at ``bmv2`` (its
    P4Runtime address), a controller on it, a client."""

    def __init__(self, tmp_path, audit_seconds: float, bmv2: str | None = None) -> None:
        self.addr = bmv2 or f"unix:{tmp_path}/sw.sock"
        self.program = default_program("bmv2" if bmv2 else "soft")
        self.config = parse_config({
            "listen": f"unix:{tmp_path}/ctl.sock", "admin_token": ADMIN, "database": str(tmp_path / "ctl.sqlite"),
            "lease_seconds": 3600, "rank_lease_seconds": 3600, "min_window": 8, "sharing": "static",
            "switch_check_seconds": 0.1, "switch_audit_seconds": audit_seconds,
            "host_aggregator": "10.0.0.100:42666",
            "switches": [{"name": "s1", "grpc": self.addr, "target": "bmv2" if bmv2 else "soft", "aggregator": "10.0.0.254:42602",
                          "hosts": {f"10.0.0.{i}": {"port": i, "mac": f"00:00:00:00:00:0{i}"}
                                    for i in range(1, 9)}}]})
        self.service = None
        if bmv2 is None:
            self.start_switch()
        self.ctl = Controller(self.config)
        self.srv = serve_controller(self.ctl, self.config.listen)
        self.client = ControllerClient(self.config.listen)
        self.runtime = self.ctl.fabric.switches["s1"]
        self.look = SwitchConnection(self.addr, election_id=(0, 0), program=self.program)   # a backup: reads

    def start_switch(self) -> None:
        """A fresh switch process stand-in: no pipeline, no entries."""
        self.state = SoftSwitchState(0, PROGRAM.p4info)
        self.service = CountingService(self.state)
        self.server = serve_switch(self.state, self.addr, self.service)

    def stop_switch(self) -> None:
        self.service.close()
        self.server.stop(grace=0).wait()

    def close(self) -> None:
        self.look.close()
        self.client.close()
        self.srv.stop(grace=0)
        self.ctl.close()
        if self.service is not None:
            self.stop_switch()

    def job(self, hosts: list[int], name: str) -> int:
        job_id, token = self.client.create_job(len(hosts), 256, 0.1, name)
        for rank, h in enumerate(hosts):
            self.client.join(job_id, token, rank, f"10.0.0.{h}:5000")
        return job_id

    def held(self) -> SwitchState:
        """What the switch holds, read now (by a backup session, not the controller's)."""
        return SwitchState.read(self.look, self.runtime.tables())

    def behind_the_back(self, kind: int, table: str, key: dict, action=None, params=None) -> None:
        """Change one entry in the switch's tables directly, as no controller would."""
        u = self.look.table_update(kind, table, key, action, params)
        with self.state.lock:
            self.state.pipeline.tables.write(kind, u.entity.table_entry)


@pytest.fixture
def env(tmp_path):
    e = Env(tmp_path, audit_seconds=3600)
    yield e
    e.close()


def job_keys(held: SwitchState, job_id: int) -> set:
    return {k for k in held.tables if dict(k[1]).get("job_id") == job_id}


def test_a_placement_writes_only_its_own_entries_and_reads_nothing(env):
    for i in range(3):
        env.job([2 * i + 1, 2 * i + 2], f"j{i}")
    reads, written, full_reads = env.service.reads, len(env.service.written), env.runtime.full_reads
    job_id = env.job([7, 8], "new")
    assert env.service.reads == reads and env.runtime.full_reads == full_reads
    updates = env.service.written[written:]
    tables = [(u.type, *env.look.decode_entry(u.entity.table_entry)[:2]) for u in updates
              if u.entity.HasField("table_entry")]
    held = env.held()
    row = env.ctl.jobs[job_id].rows["s1"]
    mark = [(kind, table, key) for kind, table, key in tables if key.get("job_id") == 0]
    own = [(kind, table, key) for kind, table, key in tables if key.get("job_id") == job_id]
    assert [(kind, table) for kind, table, _ in mark] == [(MODIFY, "worker_table")]   # the id mark
    assert sorted(repr(e[1:]) for e in own) == sorted(repr((t, dict(k))) for t, k in job_keys(held, job_id))
    assert len(own) + len(mark) == len(tables) and {kind for kind, _, _ in own} == {INSERT}
    assert [u.entity.packet_replication_engine_entry.multicast_group_entry.multicast_group_id
            for u in updates if u.entity.HasField("packet_replication_engine_entry")] == [0x100 + row]
    counters = [u for u in updates if u.entity.HasField("counter_entry")]
    assert counters and updates[:len(counters)] == counters             # its row's counters reset first
    assert len(updates) == len(counters) + 1 + len(tables)                # nothing else


def test_drift_behind_the_controllers_back_is_repaired_at_the_next_audit(tmp_path, caplog):
    env = Env(tmp_path, audit_seconds=0.3)
    try:
        job_id = env.job([1, 2], "j")
        before = env.held()
        replica = next(k for k in before.tables if k[0] == "replica_table" and dict(k[1])["job_id"] == job_id)
        with caplog.at_level(logging.WARNING, logger="inagg.controller"):
            with env.state.lock:                      # both at once: one audit finds them
                env.behind_the_back(DELETE, "replica_table", dict(replica[1]))
                env.behind_the_back(INSERT, "l2_table", {"dst_addr": 0xAA}, "forward", {"port": 3})
            assert wait_until(lambda: env.held() == before)
        assert env.runtime.drift_repairs == 2
        line = next(r.getMessage() for r in caplog.records if "behind the controller's back" in r.getMessage())
        assert line.startswith("switch s1: 2 entries changed behind the controller's back (l2_table")
        assert "replica_table" in line and "deleted" in line and "added" in line
        samples = {s.labels["kind"]: s.value for family in ControllerCollector(env.ctl).collect()
                   for s in family.samples if s.name == "inagg_switch_programming_total"}
        assert samples["drift_repairs"] == 2 and samples["full_reads"] >= 2 and samples["updates_written"] > 0
    finally:
        env.close()


def test_another_primarys_writes_are_repaired_once_the_controller_is_primary_again(env, caplog):
    another_primary_deletes_a_row_and_it_comes_back(env, caplog)


@pytest.mark.skipif(shutil.which("simple_switch_grpc") is None, reason="BMv2 (simple_switch_grpc) is not installed")
def test_on_bmv2_placements_read_nothing_and_another_primarys_writes_are_repaired(tmp_path, caplog):
    with bmv2_p4runtime() as address:
        env = Env(tmp_path, audit_seconds=3600, bmv2=address)
        try:
            env.job([1, 2], "first")
            full_reads = env.runtime.full_reads
            env.job([3, 4], "second")
            assert env.runtime.full_reads == full_reads and len(env.held().groups) == 3
            another_primary_deletes_a_row_and_it_comes_back(env, caplog)
        finally:
            env.close()


def another_primary_deletes_a_row_and_it_comes_back(env: Env, caplog) -> None:
    """A controller with a higher election id deletes a row of a new job and leaves: the
    controller, primary again, reads the switch back and rewrites it, saying so."""
    job_id = env.job([1, 2], "j")
    before = env.held()
    other = SwitchConnection(env.addr, election_id=(0, 2), program=env.program)
    try:
        assert wait_until(lambda: not env.runtime.sw.primary)
        other.write([other.table_update(DELETE, "replica_table", {"job_id": job_id, "replica": 1})])
    finally:
        other.close()
    with caplog.at_level(logging.WARNING, logger="inagg.controller"):
        assert wait_until(lambda: env.held() == before)
    assert env.runtime.drift_repairs == 1
    assert any("under another primary" in r.getMessage() for r in caplog.records)


def test_a_failed_write_falls_back_to_a_full_read_back(env):
    """An entry the controller does not know of makes its next write fail (ALREADY_EXISTS);
    the rollback reads the switch back in full and removes it, and the retry is placed."""
    first = env.job([1, 2], "first")
    job_id, token = env.client.create_job(2, 256, 0.1, "second")
    env.client.join(job_id, token, 0, "10.0.0.3:5000")
    key, action, params = next(e for e in env.look.table_entries("replica_table") if e[0]["job_id"] == first)
    env.behind_the_back(INSERT, "replica_table", {"job_id": job_id, "replica": 1}, action, params)
    full_reads = env.runtime.full_reads
    with pytest.raises(ControllerError, match="ABORTED"):
        env.client.join(job_id, token, 1, "10.0.0.4:5000")
    assert env.runtime.full_reads == full_reads + 1
    assert not job_keys(env.held(), job_id)
    env.client.join(job_id, token, 1, "10.0.0.4:5000")
    assert len(job_keys(env.held(), job_id)) == 5      # job_table, 2 worker_table, 2 replica_table


def test_a_restarted_switch_is_read_back_and_filled_again(env):
    env.job([1, 2], "j")
    before, full_reads = env.held(), env.runtime.full_reads
    env.stop_switch()
    env.start_switch()
    env.look.close()
    env.look = SwitchConnection(env.addr, election_id=(0, 0), program=env.program)
    assert wait_until(lambda: env.state.pipeline is not None and env.held() == before)
    assert env.runtime.full_reads == full_reads + 1 and env.runtime.restarts == 1


@pytest.mark.parametrize("value", [0, -1, "often", True])
def test_a_bad_audit_period_is_refused_naming_the_key(value):
    with pytest.raises(ValueError, match=r"switch_audit_seconds .*: write a number of seconds above 0"):
        parse_config({"host_aggregator": "10.0.0.100:42666", "switch_audit_seconds": value})

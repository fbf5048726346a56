"""The software switch answers a standard P4Runtime client as BMv2's ``simple_switch_grpc``
does: one sequence of writes and reads, sent through the generated ``p4.v1`` stubs to both,
must get the same answers step by step: the entities read (as text, in BMv2's canonical
minimal-width bytestrings; a group's replicas as a set), the gRPC status code of a refused call
and the code of each refused update. The steps cover job_table (every entry, by key, an absent
key, a padded key, the default entry), worker_table and l2_table by key and default, the const
table slot_decision (its entries, its default, a refused insert), owner_decision's entries, counters,
multicast groups, and the codes for a bad table or counter id, a wrong device, a missing group,
a pipeline not yet set. Where the software switch answers otherwise on purpose, ``DIFFERENT``
pins both answers.

BMv2 runs live when ``simple_switch_grpc`` is installed (its P4Runtime server alone: no ports,
no root); without it the software switch is held to BMv2's answers recorded in
tests/fixtures/p4runtime_bmv2_answers.json. Re-record (needs BMv2) after a change of the P4
program or of the steps:

    .venv/bin/python tests/test_soft_p4runtime_bmv2.py --record
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import grpc
import pytest
from google.protobuf import text_format
from google.rpc import code_pb2, status_pb2
from p4.v1 import p4runtime_pb2

from inagg.controller.config import default_program
from inagg.controller.p4info import P4Type
from inagg.controller.switch import (
    DELETE, INSERT, MODIFY, Forwarding, JobAdmission, ResultReplication, SwitchConnection, SwitchJob,
    WorkerBinding,
)
from inagg.bmv2_env.softswitch.p4runtime_server import SoftSwitchState, serve
from inagg.bmv2_env.softswitch.pipeline import NativePipeline
from inagg.bmv2_env.softswitch.pipeline_reference import SoftPipeline

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "p4runtime_bmv2_answers.json"

# Steps the software switch answers otherwise on purpose: name -> (BMv2's answer, its own). A
# counter index out of range is OUT_OF_RANGE, gRPC's code for it; BMv2 says UNKNOWN.
DIFFERENT = {
    "write: a counter index out of range": ({"code": "UNKNOWN", "updates": ["UNKNOWN"]},
                                            {"code": "UNKNOWN", "updates": ["OUT_OF_RANGE"]}),
    "read: a counter index out of range": ({"code": "UNKNOWN"}, {"code": "OUT_OF_RANGE"}),
    # a const table's entries are the program's: PERMISSION_DENIED, as for its const default action
    "write: insert into the const table slot_decision": ({"code": "UNKNOWN", "updates": ["UNKNOWN"]},
                                                         {"code": "UNKNOWN", "updates": ["PERMISSION_DENIED"]}),
}

JOB1 = SwitchJob(1, 0, 1, 0, 8, (WorkerBinding(0, 1, "10.0.0.1", "00:00:00:00:00:01", 5000),
                                 WorkerBinding(1, 2, "10.0.0.2", "00:00:00:00:00:02", 5001)))
# multi-byte values with a leading zero byte at full width (slot_base 300 in 16 bits: 01 2c)
JOB2 = SwitchJob(2, 1, 3, 300, 16, (WorkerBinding(0, 3, "10.0.0.3", "00:00:00:00:00:03", 40000),))


# -- the steps ----------------------------------------------------------------------------------

def _entity(**fields) -> p4runtime_pb2.Entity:
    return p4runtime_pb2.Entity(**fields)


def _table_query(sw: SwitchConnection, table: str, key: dict[str, bytes] | None = None,
                 default: bool = False) -> p4runtime_pb2.Entity:
    """A table entry read: every entry, the one of ``key`` (raw bytestrings) or the default."""
    t = sw.p4info.obj(P4Type.table, table)
    entry = p4runtime_pb2.TableEntry(table_id=t.preamble.id, is_default_action=default)
    ids = {mf.name: mf.id for mf in t.match_fields}
    for name, value in (key or {}).items():
        entry.match.add(field_id=ids[name]).exact.value = value
    return _entity(table_entry=entry)


def _counter_query(sw: SwitchConnection, counter: str | int, index: int | None = None) -> p4runtime_pb2.Entity:
    cid = counter if isinstance(counter, int) else sw.p4info.id(P4Type.counter, counter)
    entry = p4runtime_pb2.CounterEntry(counter_id=cid)
    if index is not None:
        entry.index.index = index
    return _entity(counter_entry=entry)


def _group_query(group: int) -> p4runtime_pb2.Entity:
    e = p4runtime_pb2.Entity()
    e.packet_replication_engine_entry.multicast_group_entry.multicast_group_id = group
    return e


def _read(*entities: p4runtime_pb2.Entity, device_id: int = 0) -> p4runtime_pb2.ReadRequest:
    return p4runtime_pb2.ReadRequest(device_id=device_id, entities=entities)


def _write(sw: SwitchConnection, updates, device_id: int = 0) -> p4runtime_pb2.WriteRequest:
    req = p4runtime_pb2.WriteRequest(device_id=device_id, updates=updates)
    req.election_id.high, req.election_id.low = sw.election_id
    return req


def _counter_update(sw: SwitchConnection, counter: str, index: int, packets: int) -> p4runtime_pb2.Update:
    u = p4runtime_pb2.Update(type=MODIFY)
    u.entity.counter_entry.CopyFrom(_counter_query(sw, counter, index).counter_entry)
    u.entity.counter_entry.data.packet_count = packets
    return u


def _default_update(sw: SwitchConnection, table: str, action: str, params: dict[str, int]) -> p4runtime_pb2.Update:
    u = sw.table_update(MODIFY, table, {}, action, params)
    u.entity.table_entry.is_default_action = True
    return u


def pipeline_steps(sw: SwitchConnection) -> list[tuple[str, str, object]]:
    """(name, rpc, request): reads before the pipeline is set, setting it, other devices."""
    R = p4runtime_pb2.GetForwardingPipelineConfigRequest
    push = p4runtime_pb2.SetForwardingPipelineConfigRequest(
        device_id=0, action=p4runtime_pb2.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT)
    push.election_id.high, push.election_id.low = sw.election_id
    push.config.p4info.CopyFrom(sw.p4info.message)
    push.config.p4_device_config = sw.program.device_config()
    elsewhere = p4runtime_pb2.SetForwardingPipelineConfigRequest()
    elsewhere.CopyFrom(push)
    elsewhere.device_id = 5
    return [
        ("read: before a pipeline is set", "Read", _read(_table_query(sw, "job_table"))),
        ("pipeline config before one is set", "GetForwardingPipelineConfig", R(device_id=0)),
        ("set the pipeline", "SetForwardingPipelineConfig", push),
        ("set the pipeline of another device", "SetForwardingPipelineConfig", elsewhere),
        ("pipeline config of another device", "GetForwardingPipelineConfig", R(device_id=5)),
    ]


def _const_insert(sw: SwitchConnection) -> p4runtime_pb2.Update:
    """An insert of one more entry into slot_decision, whose entries are const."""
    t = sw.p4info.obj(P4Type.table, "slot_decision")
    action = sw.p4info.obj(P4Type.action, "set_outcome")
    entry = p4runtime_pb2.TableEntry(table_id=t.preamble.id, priority=1)
    entry.match.add(field_id=t.match_fields[0].id).ternary.CopyFrom(
        p4runtime_pb2.FieldMatch.Ternary(value=b"\x01", mask=b"\x01"))
    entry.action.action.action_id = action.preamble.id
    entry.action.action.params.add(param_id=action.params[0].id, value=b"\x01")
    return p4runtime_pb2.Update(type=INSERT, entity=_entity(table_entry=entry))


def write_steps(sw: SwitchConnection) -> list[tuple[str, p4runtime_pb2.WriteRequest]]:
    """Two jobs, a group, hosts, a counter and a default action written; then refusals."""
    admit = JobAdmission(sw)
    fwd = Forwarding(sw)
    bad_table = sw.table_update(INSERT, "job_table", {"job_id": 7}, "admit", {})
    bad_table.entity.table_entry.table_id = 123
    bad_counter = _counter_update(sw, "global_drops", 0, 1)
    bad_counter.entity.counter_entry.counter_id = 123
    return [
        ("admit jobs 1 and 2", _write(sw, admit.updates(INSERT, JOB1) + admit.updates(INSERT, JOB2))),
        ("job 1's group", _write(sw, [ResultReplication(sw).job_update(INSERT, JOB1)])),
        ("hosts and flooding", _write(sw, [fwd.host_update(INSERT, "00:00:00:00:00:01", 1)]
                                      + fwd.flood_updates(INSERT, [1, 2, 3]))),
        ("count job 1's packets", _write(sw, [_counter_update(sw, "job_packets", 0, 5)])),
        ("l2 default floods", _write(sw, [_default_update(sw, "l2_table", "flood", {"group": 0xFFFF})])),
        ("admit job 1 again, job 3 new", _write(sw, admit.updates(INSERT, JOB1)[:1] + [
            sw.table_update(INSERT, "job_table", {"job_id": 3}, "NoAction")])),
        ("delete an absent job", _write(sw, [sw.table_update(DELETE, "job_table", {"job_id": 9})])),
        ("insert into a bad table id", _write(sw, [bad_table])),
        ("a counter index out of range", _write(sw, [_counter_update(sw, "global_drops", 2, 1)])),
        ("a bad counter id", _write(sw, [bad_counter])),
        ("modify an absent group", _write(sw, [ResultReplication(sw).update(MODIFY, 7, [(1, 1)])])),
        ("insert into the const table slot_decision", _write(sw, [_const_insert(sw)])),
        ("write to another device", _write(sw, [fwd.host_update(INSERT, "00:00:00:00:00:02", 2)], 5)),
    ]


def read_steps(sw: SwitchConnection) -> list[tuple[str, p4runtime_pb2.ReadRequest]]:
    """Reads of what write_steps left, by table, key, default entry, counter and group."""
    return [
        ("job_table", _read(_table_query(sw, "job_table"))),
        ("job_table job_id=2", _read(_table_query(sw, "job_table", {"job_id": b"\x02"}))),
        ("job_table job_id=9 (absent)", _read(_table_query(sw, "job_table", {"job_id": b"\x09"}))),
        ("job_table job_id=1 padded", _read(_table_query(sw, "job_table", {"job_id": b"\x00\x01"}))),
        ("job_table default", _read(_table_query(sw, "job_table", default=True))),
        ("worker_table job 1 rank 1", _read(_table_query(sw, "worker_table", {"job_id": b"\x01", "worker_id": b"\x01"}))),
        ("l2_table", _read(_table_query(sw, "l2_table"))),
        ("l2_table default", _read(_table_query(sw, "l2_table", default=True))),
        ("slot_decision (const entries)", _read(_table_query(sw, "slot_decision"))),
        ("slot_decision default", _read(_table_query(sw, "slot_decision", default=True))),
        ("owner_decision (const entries)", _read(_table_query(sw, "owner_decision"))),
        ("job and worker tables at once", _read(_table_query(sw, "job_table", {"job_id": b"\x01"}),
                                                _table_query(sw, "worker_table"))),
        ("job_packets index 0", _read(_counter_query(sw, "job_packets", 0))),
        ("global_drops", _read(_counter_query(sw, "global_drops"))),
        ("a counter index out of range", _read(_counter_query(sw, "global_drops", 2))),
        ("a bad counter id", _read(_counter_query(sw, 123, 0))),
        ("group of job 1", _read(_group_query(JOB1.mcast_grp))),
        ("every group", _read(_group_query(0))),
        ("an absent group", _read(_group_query(7))),
        ("a bad table id", _read(_entity(table_entry=p4runtime_pb2.TableEntry(table_id=123)))),
        ("job_table by a key too wide", _read(_table_query(sw, "job_table", {"job_id": b"\x01\x00\x00"}))),
        ("worker_table by half its key", _read(_table_query(sw, "worker_table", {"job_id": b"\x01"}))),
        ("job_table default, a key given", _read(_table_query(sw, "job_table", {"job_id": b"\x01"}, True))),
        ("another device", _read(_table_query(sw, "job_table"), device_id=5)),
    ]


# -- running them ---------------------------------------------------------------------------------

def _update_codes(e: grpc.RpcError) -> list[str]:
    """The canonical code of each update of a refused Write (P4Runtime spec 12.3)."""
    codes = []
    for key, value in e.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            for detail in status_pb2.Status.FromString(value).details:
                err = p4runtime_pb2.Error()
                detail.Unpack(err)
                codes.append(code_pb2.Code.Name(err.canonical_code))
    return codes


def _text(entity: p4runtime_pb2.Entity) -> str:
    """An entity as one line of text; a group's replicas sorted (BMv2 lists them by its own
    order, not the written one; replication does not depend on it)."""
    if entity.HasField("packet_replication_engine_entry"):
        replicas = entity.packet_replication_engine_entry.multicast_group_entry.replicas
        in_order = sorted((r.egress_port, r.instance) for r in replicas)
        del replicas[:]
        for port, instance in in_order:
            replicas.add(egress_port=port, instance=instance)
    return text_format.MessageToString(entity, as_one_line=True)


def _answer(sw: SwitchConnection, rpc: str, req):
    """The entities a Read gives (as sorted text: P4Runtime promises no order), "OK" for any
    other call that succeeds, or the status code (and each update's, of a refused Write)."""
    try:
        reply = getattr(sw.stub, rpc)(req, timeout=sw.timeout)
        if rpc == "Read":
            return sorted(_text(ent) for rep in reply for ent in rep.entities)
    except grpc.RpcError as e:
        return {"code": e.code().name, "updates": _update_codes(e)} if rpc == "Write" else {"code": e.code().name}
    return "OK"


def answers(address: str) -> dict:
    """Every step's answer from the P4Runtime server at ``address`` (it runs BMv2's program)."""
    sw = SwitchConnection(address, program=default_program("bmv2"), timeout=10)
    try:
        steps = pipeline_steps(sw)
        steps += [(f"write: {name}", "Write", req) for name, req in write_steps(sw)]
        steps += [(f"read: {name}", "Read", req) for name, req in read_steps(sw)]
        return {name: _answer(sw, rpc, req) for name, rpc, req in steps}
    finally:
        sw.close()


# -- the two servers ------------------------------------------------------------------------------

def _free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def bmv2_p4runtime() -> Iterator[str]:
    """simple_switch_grpc with no ports, its P4Runtime on a Unix socket (and its Thrift port and
    notification socket its own, which are machine-wide by default); yields the address."""
    tmp = Path(tempfile.mkdtemp(prefix="inagg-bmv2-p4rt-"))
    sock = tmp / "p4rt.sock"
    log = open(tmp / "switch.log", "w")
    proc = subprocess.Popen(["simple_switch_grpc", "--thrift-port", str(_free_tcp_port()),
                             "--notifications-addr", f"ipc://{tmp}/notify.ipc", "--device-id", "0",
                             "--no-p4", "--", "--grpc-server-addr", f"unix:{sock}"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 30
        while not sock.exists():
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"simple_switch_grpc did not start: {(tmp / 'switch.log').read_text()}")
            time.sleep(0.05)
        yield f"unix:{sock}"
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


def bmv2_answers() -> dict:
    with bmv2_p4runtime() as address:
        return answers(address)


def record() -> None:
    FIXTURE.parent.mkdir(exist_ok=True)
    FIXTURE.write_text(json.dumps(bmv2_answers(), indent=1) + "\n")


@pytest.fixture(scope="module")
def bmv2():
    """BMv2's answers: live when simple_switch_grpc is installed, else the recorded ones."""
    if shutil.which("simple_switch_grpc") is None:
        return json.loads(FIXTURE.read_text())
    return bmv2_answers()


def test_the_recording_is_current(bmv2):
    """The recorded answers are what BMv2 answers now (else: re-record)."""
    if shutil.which("simple_switch_grpc") is None:
        pytest.skip("BMv2 is not installed: the recording is all there is to compare with")
    assert json.loads(FIXTURE.read_text()) == bmv2


@pytest.mark.parametrize("engine", [SoftPipeline, NativePipeline], ids=["python", "native"])
def test_soft_switch_answers_as_bmv2(bmv2, engine, tmp_path):
    srv = serve(SoftSwitchState(0, default_program("soft").p4info, engine), f"unix:{tmp_path}/p4rt.sock")
    try:
        soft = answers(f"unix:{tmp_path}/p4rt.sock")
    finally:
        srv.stop(grace=0)
    assert list(soft) == list(bmv2), "other steps than BMv2's answers: re-record"
    expected = {**bmv2, **{name: ours for name, (_, ours) in DIFFERENT.items()}}
    differ = {name: {"soft": soft.get(name), "expected": want} for name, want in expected.items()
              if soft.get(name) != want}
    assert not differ, json.dumps(differ, indent=1)


def test_the_deliberate_differences_are_what_bmv2_answers(bmv2):
    """DIFFERENT says truly what BMv2 answers where the software switch answers otherwise."""
    assert {name: bmv2[name] for name in DIFFERENT} == {name: theirs for name, (theirs, _) in DIFFERENT.items()}


if __name__ == "__main__":
    if sys.argv[1:] == ["--record"]:
        record()
    else:
        sys.exit(__doc__)

"""The software data plane's P4Runtime service, driven by the controller's client code."""

import grpc
import pytest
from google.protobuf import text_format
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from inagg.bmv2_env.softswitch.pipeline import NativePipeline
from inagg.bmv2_env.softswitch.p4runtime_server import SoftSwitchState, serve
from inagg.bmv2_env.softswitch.pipeline_reference import SoftPipeline
from inagg.controller.config import default_program
from inagg.controller.program import Program
from inagg.controller.switch import (
    INSERT, PRIORITY, JobAdmission, PipelineMismatch, SourceGuard, SwitchConnection, SwitchError, SwitchJob,
    WorkerBinding,
)


@pytest.fixture(params=[SoftPipeline, NativePipeline], ids=["python", "native"])
def server(tmp_path, request):
    state = SoftSwitchState(0, default_program("soft").p4info, request.param)
    addr = f"unix:{tmp_path}/p4rt.sock"
    srv = serve(state, addr)
    yield addr, state
    srv.stop(grace=0)


def job(job_id, index, base, count, n=2):
    return SwitchJob(job_id, index, 1, base, count,
                     tuple(WorkerBinding(r, r + 1, f"10.0.0.{r + 1}", f"00:00:00:00:00:0{r + 1}", 5000 + r)
                           for r in range(n)))


def test_pipeline_push_and_verify(server):
    addr, state = server
    sw = SwitchConnection(addr)
    try:
        assert sw.installed_program() is None
        assert sw.ensure_pipeline() is True
        assert sw.installed_program() == "inagg"
        assert sw.ensure_pipeline() is False     # already there: nothing pushed again
    finally:
        sw.close()


def test_other_program_is_refused(server, tmp_path):
    addr, _ = server
    other = default_program("soft").p4info.message
    other.pkg_info.name = "basic"
    (tmp_path / "other.txtpb").write_text(text_format.MessageToString(other))
    (tmp_path / "x.json").write_text("{}")
    sw = SwitchConnection(addr)
    try:
        with pytest.raises(PipelineMismatch, match="runs program 'inagg', not 'basic'"):
            sw.push_pipeline(Program("soft", tmp_path / "other.txtpb", {"bmv2_json": tmp_path / "x.json"}))
    finally:
        sw.close()


def test_backup_controller_cannot_write(server):
    addr, _ = server
    primary = SwitchConnection(addr, election_id=(0, 5))
    backup = SwitchConnection(addr, election_id=(0, 2))
    try:
        primary.push_pipeline()
        with pytest.raises(SwitchError, match="not the primary"):
            backup.write(JobAdmission(backup).updates(INSERT, job(1, 0, 0, 4)))
        primary.write(JobAdmission(primary).updates(INSERT, job(1, 0, 0, 4)))
        assert len(backup.table_entries("job_table")) == 1   # reads are open to backups
    finally:
        backup.close()
        primary.close()


def test_write_errors_name_the_problem_and_keep_accepted_state(server):
    addr, state = server
    sw = SwitchConnection(addr)
    try:
        sw.push_pipeline()
        sw.write(JobAdmission(sw).updates(INSERT, job(1, 0, 0, 8)))
        with pytest.raises(SwitchError, match="ALREADY_EXISTS|exists"):
            sw.write(JobAdmission(sw).updates(INSERT, job(1, 0, 0, 8))[:1])
        with pytest.raises(SwitchError, match="overlap job 1"):
            sw.write(JobAdmission(sw).updates(INSERT, job(2, 1, 4, 8))[:1])
        with pytest.raises(SwitchError, match="outside the pool"):
            sw.write(JobAdmission(sw).updates(INSERT, job(3, 2, 1020, 8))[:1])
        assert [k["job_id"] for k, _, _ in sw.table_entries("job_table")] == [1]
        assert state.pipeline.job_ids() == [1]
        with pytest.raises(ValueError, match="does not fit in 8 bits"):
            sw.write(JobAdmission(sw).updates(INSERT, job(4, 300, 100, 8)))
    finally:
        sw.close()


def test_unsupported_requests_get_a_grpc_status(server):
    addr, _ = server
    sw = SwitchConnection(addr)
    try:
        stub = p4runtime_pb2_grpc.P4RuntimeStub(grpc.insecure_channel(addr))
        req = p4runtime_pb2.ReadRequest(device_id=0)
        req.entities.add().table_entry.table_id = 0
        with pytest.raises(grpc.RpcError) as e:
            list(stub.Read(req))
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION   # no pipeline yet
        sw.push_pipeline()
        req = p4runtime_pb2.ReadRequest(device_id=0)
        req.entities.add().register_entry.register_id = 0
        with pytest.raises(grpc.RpcError) as e:
            list(stub.Read(req))
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
        req = p4runtime_pb2.ReadRequest(device_id=3)
        with pytest.raises(grpc.RpcError) as e:
            list(stub.Read(req))
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION   # as BMv2: no pipeline there
        with pytest.raises(SwitchError, match="not supported"):
            u = p4runtime_pb2.Update(type=p4runtime_pb2.Update.INSERT)
            u.entity.register_entry.register_id = 1
            sw.write([u])
    finally:
        sw.close()


def test_unreachable_switch_is_a_clear_error(tmp_path):
    with pytest.raises(SwitchError, match="no P4Runtime server answered at unix:"):
        SwitchConnection(f"unix:{tmp_path}/nothing.sock")


def test_a_refused_batch_names_each_failed_update_and_never_hangs(server):
    """The switch answers a partly refused Write with one p4.v1.Error per update (P4Runtime
    12.3); the client decodes them itself (p4runtime-shell's iterator looped forever on this)."""
    addr, _ = server
    sw = SwitchConnection(addr, timeout=5)
    try:
        sw.push_pipeline()
        ups = JobAdmission(sw).updates(INSERT, job(1, 0, 0, 8))
        sw.write(ups[:1])
        with pytest.raises(SwitchError) as e:
            sw.write(ups)                       # update 0 exists already; 1 and 2 are fine
        assert "update 0: ALREADY_EXISTS" in str(e.value) and "update 1" not in str(e.value)
        assert len(sw.table_entries("worker_table")) == 2   # the good updates were applied
    finally:
        sw.close()


def test_a_stream_whose_requests_never_end_ends_when_the_service_closes():
    """A StreamChannel ends when its request iterator does, which gRPC's server once never
    told it (its serving thread died stopping): closing the service ends the stream anyway, so
    the server's executor, which the interpreter joins at exit, is free."""
    import threading

    from inagg.bmv2_env.softswitch.p4runtime_server import P4RuntimeService

    service = P4RuntimeService(SoftSwitchState(0, default_program("soft").p4info, SoftPipeline))
    never = threading.Event()

    def requests():   # a client stream that neither sends nor ends
        never.wait()
        yield from ()

    ended = threading.Event()
    stream = threading.Thread(target=lambda: (list(service.StreamChannel(requests(), None)), ended.set()),
                              daemon=True)
    stream.start()
    assert not ended.wait(0.7)   # open while the service is
    service.close()
    assert ended.wait(2), "the stream outlived the service"
    never.set()


@pytest.mark.parametrize("make", [SoftPipeline, NativePipeline], ids=["python", "native"])
def test_ternary_rows_are_written_read_back_and_refused_when_malformed(tmp_path, make):
    """The TNA program's host_port_table takes ternary rows with a priority (SourceGuard's on
    Tofino); they read back as written, and a row with value bits outside its mask, or with no
    priority, is refused naming the field or the rule."""
    program = default_program("tofino")
    state = SoftSwitchState(0, program.p4info, make)
    addr = f"unix:{tmp_path}/p4rt.sock"
    srv = serve(state, addr)
    sw = SwitchConnection(addr, program=program)
    try:
        sw.push_pipeline()
        rows = SourceGuard(sw).port_updates(INSERT, 3, "10.0.0.254", "10.0.0.100", False)
        sw.write(rows)
        written = [sw.decode_entry(u.entity.table_entry)[1:] for u in rows]
        read = sw.table_entries("host_port_table")
        assert len(written) == len(read) == 4 and all(e in read for e in written)
        bad = sw.table_update(INSERT, "host_port_table", {"port": 5, "src_addr": (0x0A0000FF, 0xFF), PRIORITY: 9},
                              "source_guard.refuse", {"reason": 0})
        with pytest.raises(SwitchError, match="src_addr: a ternary match needs a non-zero mask covering"):
            sw.write([bad])
        bad = sw.table_update(INSERT, "host_port_table", {"port": 5, "src_addr": (0xFF, 0xFF)},
                              "source_guard.refuse", {"reason": 0})
        with pytest.raises(SwitchError, match="a ternary table's entries need a priority above 0"):
            sw.write([bad])
    finally:
        sw.close()
        srv.stop(grace=0)

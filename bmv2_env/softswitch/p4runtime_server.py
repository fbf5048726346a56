"""The P4Runtime service of the software data plane: what the controller needs, and a gRPC
error for everything else (never a silent success).

Implemented: StreamChannel arbitration (primary = highest election id per device), Capabilities,
Set/GetForwardingPipelineConfig (only the inagg program it runs is accepted, at any K its ports
carry: the pipeline takes K from the pushed P4Info; for the Tofino program's P4Info only that
P4Info itself, with a well-formed Tofino device config), Write/Read of table entries
and multicast groups, Read and MODIFY of indexed counter entries. Not implemented, as in BMv2:
register entries; also not implemented here: packet-in/out, digests, action profiles, meters.

Toward a client it answers as BMv2's simple_switch_grpc (tests/test_soft_p4runtime_bmv2.py
runs the same calls against both): reads as state.py describes; a Read or
GetForwardingPipelineConfig of another device, or before a pipeline is set, FAILED_PRECONDITION;
a Write or SetForwardingPipelineConfig of another device PERMISSION_DENIED (BMv2 has no primary
controller there). Unlike BMv2, arbitration for another device is refused (NOT_FOUND): a
controller with a wrong device id learns it at once.
"""

from __future__ import annotations

import logging
import queue
import threading
from concurrent import futures
from typing import Callable, Union

import grpc
from google.rpc import code_pb2, status_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from inagg.controller.p4info import P4Info, same_p4info, same_program
from inagg.controller.tofino.config import TofinoDeviceConfig
from inagg.hostlib.wire.grant import MAX_IPV4_DATAGRAM, values_for_mtu

from inagg.bmv2_env.softswitch.pipeline import NativePipeline
from inagg.bmv2_env.softswitch.pipeline_reference import ATP_TABLE, JOB_TABLE, UPLINK_TABLE, WORKER_TABLE, SoftPipeline
from inagg.bmv2_env.softswitch.state import StatusError

Pipeline = Union[SoftPipeline, NativePipeline]

log = logging.getLogger("inagg.soft_switch.p4runtime")
API_VERSION = "1.4.1"
MAX_MESSAGE_BYTES = 256 << 20
_STREAM_POLL_SECONDS = 0.5   # how often an open StreamChannel looks whether the service is closing


def _election(eid) -> tuple[int, int]:
    return (eid.high, eid.low)


class SoftSwitchState:
    """What the P4Runtime service manages: the pipeline (once configured) and its lock.
    ``make_pipeline`` builds a fresh pipeline for each committed config (from the pushed P4Info,
    whose K it runs): the Python reference (SoftPipeline) or the C++ core (NativePipeline,
    attached to the packet loop). ``max_values_per_packet``: the largest K the ports carry."""

    def __init__(self, device_id: int, program: P4Info,
                 make_pipeline: Callable[[P4Info], Pipeline] = SoftPipeline,
                 max_values_per_packet: int = values_for_mtu(MAX_IPV4_DATAGRAM)) -> None:
        self.device_id = device_id
        self.program = program          # the only program this data plane can run (K aside)
        self.max_values_per_packet = max_values_per_packet
        self.make_pipeline = make_pipeline
        self.lock = threading.RLock()
        self.pipeline: Pipeline | None = None
        self.config: p4runtime_pb2.ForwardingPipelineConfig | None = None


class P4RuntimeService(p4runtime_pb2_grpc.P4RuntimeServicer):
    def __init__(self, state: SoftSwitchState) -> None:
        self.state = state
        self._streams: dict[int, tuple[tuple[int, int], queue.Queue]] = {}
        self._streams_lock = threading.Lock()
        self._next_stream = 0
        self._closing = threading.Event()

    def close(self) -> None:
        """End every open StreamChannel within ``_STREAM_POLL_SECONDS`` (before the server stops).
        A stream ends when its request iterator does; a call arriving while gRPC's server was
        stopping killed its serving thread once ("cannot schedule new futures after shutdown"),
        no stream was ever told it ended, and its handler held the executor, which the
        interpreter joins at exit: a local deployment's switch lived on after its job."""
        self._closing.set()

    # -- arbitration -------------------------------------------------------------------------

    def _primary(self) -> tuple[int, int] | None:
        with self._streams_lock:
            ids = [eid for eid, _ in self._streams.values()]
        return max(ids) if ids else None

    def _notify(self) -> None:
        primary = self._primary()
        with self._streams_lock:
            streams = list(self._streams.values())
        for eid, q in streams:
            msg = p4runtime_pb2.StreamMessageResponse()
            msg.arbitration.device_id = self.state.device_id
            msg.arbitration.election_id.high, msg.arbitration.election_id.low = primary
            ok = eid == primary
            msg.arbitration.status.code = code_pb2.OK if ok else code_pb2.ALREADY_EXISTS
            msg.arbitration.status.message = "primary" if ok else "backup"
            q.put(msg)

    def _arbitrate(self, sid: int, arb, out: queue.Queue) -> bool:
        """Stream ``sid``'s arbitration update: it joins the election, or a StatusError for the
        stream to end with goes to ``out`` (False)."""
        if arb.device_id != self.state.device_id:
            out.put(StatusError(grpc.StatusCode.NOT_FOUND, f"no device {arb.device_id}"))
            return False
        if arb.role.name:
            out.put(StatusError(grpc.StatusCode.UNIMPLEMENTED, "roles are not supported"))
            return False
        eid = _election(arb.election_id)
        with self._streams_lock:
            taken = any(e == eid for s, (e, _) in self._streams.items() if s != sid)
            if not taken:
                self._streams[sid] = (eid, out)
        if taken:
            out.put(StatusError(grpc.StatusCode.INVALID_ARGUMENT,
                                f"election id {eid} is used by another client"))
            return False
        self._notify()
        return True

    def StreamChannel(self, request_iterator, context):
        out: queue.Queue = queue.Queue()
        with self._streams_lock:
            sid = self._next_stream
            self._next_stream += 1

        def reader() -> None:
            try:
                for req in request_iterator:
                    if not req.HasField("arbitration"):
                        out.put(StatusError(grpc.StatusCode.UNIMPLEMENTED,
                                            f"stream message '{req.WhichOneof('update')}' is not supported"))
                        return
                    if not self._arbitrate(sid, req.arbitration, out):
                        return
            except grpc.RpcError:
                pass
            finally:
                out.put(None)

        threading.Thread(target=reader, daemon=True).start()
        try:
            while True:
                try:
                    msg = out.get(timeout=_STREAM_POLL_SECONDS)
                except queue.Empty:
                    if self._closing.is_set():
                        break
                    continue
                if msg is None:
                    break
                if isinstance(msg, StatusError):
                    context.abort(msg.code, str(msg))
                yield msg
        finally:
            with self._streams_lock:
                was = self._streams.pop(sid, None)
            if was is not None and self._streams:
                self._notify()

    def _check_device(self, device_id: int) -> None:
        """A read of another device: BMv2 knows every device id and answers as for one that runs
        no pipeline."""
        if device_id != self.state.device_id:
            raise StatusError(grpc.StatusCode.FAILED_PRECONDITION,
                              f"device {device_id} runs no pipeline: this switch is device "
                              f"{self.state.device_id}")

    def _check_primary(self, device_id: int, election_id) -> None:
        """A change needs the primary controller of this device (of another one: PERMISSION_DENIED,
        as BMv2 answers, whose other devices have no primary)."""
        if device_id != self.state.device_id:
            raise StatusError(grpc.StatusCode.PERMISSION_DENIED,
                              f"no primary controller for device {device_id}: this switch is device "
                              f"{self.state.device_id}")
        primary = self._primary()
        if primary is None or _election(election_id) != primary:
            raise StatusError(grpc.StatusCode.PERMISSION_DENIED,
                              "not the primary controller for this device")

    # -- pipeline ----------------------------------------------------------------------------

    def Capabilities(self, request, context):
        return p4runtime_pb2.CapabilitiesResponse(p4runtime_api_version=API_VERSION)

    def SetForwardingPipelineConfig(self, request, context):
        A = p4runtime_pb2.SetForwardingPipelineConfigRequest
        try:
            self._check_primary(request.device_id, request.election_id)
            if request.action not in (A.VERIFY, A.VERIFY_AND_COMMIT, A.VERIFY_AND_SAVE, A.COMMIT):
                raise StatusError(grpc.StatusCode.UNIMPLEMENTED,
                                  f"pipeline action {A.Action.Name(request.action)} is not supported")
            if request.action != A.COMMIT:
                self._verify(request.config)
            with self.state.lock:
                if request.action in (A.VERIFY_AND_COMMIT, A.COMMIT):
                    config = request.config if request.action != A.COMMIT else self.state.config
                    if config is None:
                        raise StatusError(grpc.StatusCode.FAILED_PRECONDITION, "nothing saved to commit")
                    self.state.config = config
                    self.state.pipeline = self.state.make_pipeline(P4Info(config.p4info))
                    log.info("pipeline %s committed", self.state.program.program_name)
                elif request.action == A.VERIFY_AND_SAVE:
                    self.state.config = request.config
        except StatusError as e:
            context.abort(e.code, str(e))
        return p4runtime_pb2.SetForwardingPipelineConfigResponse()

    def _verify(self, config) -> None:
        program = self.state.program
        if config.p4info.pkg_info.name != program.program_name:
            raise StatusError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"this software data plane runs program '{program.program_name}', "
                f"not '{config.p4info.pkg_info.name or '(unnamed)'}'")
        tofino = program.message.pkg_info.arch in ("tna", "t2na")
        same = same_p4info if tofino else same_program   # Tofino's K is compiled into its lanes
        if not same(config.p4info, program.message):
            raise StatusError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"P4Info of '{program.program_name}' differs from the one this data plane runs: "
                f"rebuild or update the controller")
        self._verify_values_per_packet(P4Info(config.p4info))
        if tofino:
            self._verify_tofino_config(config.p4_device_config)

    def _verify_values_per_packet(self, pushed: P4Info) -> None:
        """The pushed K must be one this data plane's ports carry in one packet."""
        try:
            k = pushed.values_per_packet
        except KeyError as e:
            raise StatusError(grpc.StatusCode.INVALID_ARGUMENT, str(e.args[0])) from None
        if not 1 <= k <= self.state.max_values_per_packet:
            raise StatusError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"@inagg_values_per_packet({k}): this data plane's ports carry 1.."
                f"{self.state.max_values_per_packet} values per packet")

    def _verify_tofino_config(self, data: bytes) -> None:
        """A Tofino-shaped switch takes the device configs a Tofino's P4Runtime servers take:
        bf_switchd's (PI's packing) or Stratum's (controller/tofino/config.py), all checked."""
        try:
            _, config = TofinoDeviceConfig.unpack(data)
        except ValueError as e:
            raise StatusError(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None
        if config.program != self.state.program.program_name:
            raise StatusError(grpc.StatusCode.INVALID_ARGUMENT,
                              f"tofino device config is for program '{config.program}', "
                              f"not '{self.state.program.program_name}'")

    def GetForwardingPipelineConfig(self, request, context):
        """The config committed (FAILED_PRECONDITION before one is, as BMv2 answers)."""
        R = p4runtime_pb2.GetForwardingPipelineConfigRequest
        try:
            self._check_device(request.device_id)
            with self.state.lock:
                self._pipeline()
                config = self.state.config
        except StatusError as e:
            context.abort(e.code, str(e))
        rep = p4runtime_pb2.GetForwardingPipelineConfigResponse()
        if request.response_type in (R.ALL, R.COOKIE_ONLY, R.P4INFO_AND_COOKIE, R.DEVICE_CONFIG_AND_COOKIE):
            rep.config.cookie.CopyFrom(config.cookie)
        if request.response_type in (R.ALL, R.P4INFO_AND_COOKIE):
            rep.config.p4info.CopyFrom(config.p4info)
        if request.response_type in (R.ALL, R.DEVICE_CONFIG_AND_COOKIE):
            rep.config.p4_device_config = config.p4_device_config
        return rep

    # -- entities ----------------------------------------------------------------------------

    def _pipeline(self) -> Pipeline:
        if self.state.pipeline is None:
            raise StatusError(grpc.StatusCode.FAILED_PRECONDITION,
                              "no forwarding pipeline config has been set")
        return self.state.pipeline

    def Write(self, request, context):
        W = p4runtime_pb2.WriteRequest
        try:
            self._check_primary(request.device_id, request.election_id)
            if request.atomicity != W.CONTINUE_ON_ERROR:
                raise StatusError(grpc.StatusCode.UNIMPLEMENTED,
                                  "only CONTINUE_ON_ERROR atomicity is supported")
            with self.state.lock:
                pipeline = self._pipeline()
                with pipeline.writing():
                    errors = [self._write_one(pipeline, u) for u in request.updates]
        except StatusError as e:
            context.abort(e.code, str(e))
        if any(err is not None for err in errors):
            status = status_pb2.Status(code=code_pb2.UNKNOWN, message="write failed")
            for err in errors:
                detail = p4runtime_pb2.Error(canonical_code=code_pb2.OK)
                if err is not None:
                    detail.canonical_code = err.code.value[0]
                    detail.message = str(err)
                status.details.add().Pack(detail)
            context.set_trailing_metadata((("grpc-status-details-bin", status.SerializeToString()),))
            failed = [str(e) for e in errors if e is not None]
            more = f" (and {len(failed) - 3} more)" if len(failed) > 3 else ""
            context.abort(grpc.StatusCode.UNKNOWN, "; ".join(failed[:3]) + more)
        return p4runtime_pb2.WriteResponse()

    def _write_one(self, pipeline: Pipeline, update) -> StatusError | None:
        entity = update.entity
        kind = entity.WhichOneof("entity")
        try:
            if kind == "table_entry":
                undo = pipeline.tables.write(update.type, entity.table_entry)
                name = pipeline.tables.table_name(entity.table_entry.table_id)
                if name in (JOB_TABLE, WORKER_TABLE, UPLINK_TABLE, ATP_TABLE):
                    try:
                        pipeline.sync_jobs()
                    except StatusError:
                        undo()
                        pipeline.sync_jobs()
                        raise
            elif kind == "packet_replication_engine_entry" and entity.packet_replication_engine_entry.HasField("multicast_group_entry"):
                pipeline.pre.write(update.type, entity.packet_replication_engine_entry.multicast_group_entry)
            elif kind == "counter_entry":
                pipeline.counters.write(update.type, entity.counter_entry)
            else:
                raise StatusError(grpc.StatusCode.UNIMPLEMENTED,
                                  f"writing {kind or 'an empty entity'} is not supported")
        except StatusError as e:
            log.info("write refused: %s", e)
            return e
        return None

    def Read(self, request, context):
        try:
            self._check_device(request.device_id)
            with self.state.lock:
                pipeline = self._pipeline()
                rep = p4runtime_pb2.ReadResponse()
                for entity in request.entities:
                    rep.entities.extend(_read_one(pipeline, entity))
        except StatusError as e:
            context.abort(e.code, str(e))
        yield rep


def _group_entity(entry: p4runtime_pb2.MulticastGroupEntry) -> p4runtime_pb2.Entity:
    ent = p4runtime_pb2.Entity()
    ent.packet_replication_engine_entry.multicast_group_entry.CopyFrom(entry)
    return ent


def _read_one(pipeline: Pipeline, entity: p4runtime_pb2.Entity) -> list[p4runtime_pb2.Entity]:
    """What the pipeline holds of one queried entity (reads answer as BMv2's: state.py)."""
    kind = entity.WhichOneof("entity")
    if kind == "table_entry":
        return [p4runtime_pb2.Entity(table_entry=e) for e in pipeline.tables.read(entity.table_entry)]
    if kind == "counter_entry":
        return [p4runtime_pb2.Entity(counter_entry=e) for e in pipeline.counters.read(entity.counter_entry)]
    pre = entity.packet_replication_engine_entry
    if kind == "packet_replication_engine_entry" and pre.HasField("multicast_group_entry"):
        return [_group_entity(e) for e in pipeline.pre.read(pre.multicast_group_entry)]
    raise StatusError(grpc.StatusCode.UNIMPLEMENTED, f"reading {kind or 'an empty entity'} is not supported")


def serve(state: SoftSwitchState, address: str, service: P4RuntimeService | None = None) -> grpc.Server:
    """Start the gRPC server (``host:port`` or ``unix:/path``) with ``service`` (a new one if
    not given: an owner that stops the server calls its ``close`` first); raises if it cannot
    bind."""
    # a Tofino device config (tofino.bin + context.json) is several MB; P4Runtime servers take
    # large pipelines (gRPC's 4 MB default would refuse it)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8),
                         options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)])
    p4runtime_pb2_grpc.add_P4RuntimeServicer_to_server(service or P4RuntimeService(state), server)
    if server.add_insecure_port(address) == 0 and not address.startswith("unix:"):
        raise OSError(f"cannot listen on {address}")
    server.start()
    return server

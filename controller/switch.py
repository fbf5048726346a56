"""P4Runtime programming of one inagg switch (BMv2, the software data plane or Tofino).

``SwitchConnection`` is the session (arbitration, pipeline push/verify, write/read) on the
P4Runtime gRPC stub itself, every call with a deadline: p4runtime-shell's client loops forever
on some write errors (its ``P4RuntimeErrorIterator``), which would wedge the controller while it
holds its lock. Write errors are decoded here from the status details (one ``p4.v1.Error`` per
update). The stream channel is watched: ``lost`` is set when it ends, so the controller can
notice a restarted switch and program it again, and ``mastership`` counts the times the session
became primary, so the controller knows when another primary may have written meanwhile. The
classes after it mirror the P4 controls they program, with the same names: JobAdmission,
TreeUplink, ResultReplication, ReplicaRewrite, Forwarding, JobCounters.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Iterable, Iterator

import grpc
from google.rpc import code_pb2, status_pb2
from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from inagg.hostlib.wire.protocol import (
    DROP_REASONS, ENCAP_CODE, FLAG_FROM_SWITCH, GLOBAL_DROP_REASONS, GUARD_DROP_REASONS, MSG_RESULT,
    ipv4, mac,
)

from inagg.controller.p4info import P4Info, P4Type, encode, same_p4info
from inagg.controller.config import DEFAULT_PUSH_TIMEOUT, default_program
from inagg.controller.program import Program

# Retry a switch that is not up yet (started beside the controller, or restarting) every 50 ms
# at first, backing off to 1 s: gRPC's default waits 1 s before its first retry.
_CHANNEL_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 50), ("grpc.min_reconnect_backoff_ms", 50),
                    ("grpc.max_reconnect_backoff_ms", 1000)]
# Seconds any one P4Runtime call may take before the controller gives up on it.
DEFAULT_RPC_TIMEOUT = 10.0
# (SetForwardingPipelineConfig has its own: config.DEFAULT_PUSH_TIMEOUT.)
# The key of a table entry with ternary fields holds its priority under this name (no match
# field has it).
PRIORITY = "$priority"


class SwitchError(RuntimeError):
    """A switch refused a request or could not be reached; the message says which and why."""


class PipelineMismatch(SwitchError):
    """The switch runs another program (or another build of ours)."""


def write_error_text(e: grpc.RpcError) -> str:
    """The per-update errors of a refused Write (P4Runtime spec 12.3: ``p4.v1.Error`` details in
    the ``grpc-status-details-bin`` trailer), or the status itself when there are none."""
    details = []
    for key, value in e.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            for i, any_msg in enumerate(status.details):
                err = p4runtime_pb2.Error()
                if any_msg.Unpack(err) and err.canonical_code != code_pb2.OK:
                    details.append(f"update {i}: {code_pb2.Code.Name(err.canonical_code)}: {err.message}")
    return "; ".join(details) if details else f"{e.code().name}: {e.details()}"


class SwitchConnection:
    """One P4Runtime session with one device. Several can live in one process."""

    def __init__(self, address: str, device_id: int = 0, election_id: tuple[int, int] = (0, 1),
                 program: Program | None = None, timeout: float = DEFAULT_RPC_TIMEOUT,
                 push_timeout: float = DEFAULT_PUSH_TIMEOUT) -> None:
        self.address = address
        self.device_id = device_id
        self.election_id = election_id
        self.timeout = timeout
        self.push_timeout = push_timeout   # SetForwardingPipelineConfig's deadline
        self.program = program or default_program("bmv2")
        self.p4info: P4Info = self.program.p4info
        self.lost = threading.Event()   # the stream channel ended: the switch went away
        self.primary = False
        # times this session became primary: another controller may have written in between
        self.mastership = 0
        self.channel = grpc.insecure_channel(address, options=_CHANNEL_OPTIONS)
        self.stub = p4runtime_pb2_grpc.P4RuntimeStub(self.channel)
        self._requests: queue.Queue = queue.Queue()
        self._arbitrated: queue.Queue = queue.Queue()
        try:
            grpc.channel_ready_future(self.channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            self.channel.close()
            raise SwitchError(f"no P4Runtime server answered at {address} (device {device_id})") from None
        self._stream = self.stub.StreamChannel(iter(self._requests.get, None))
        threading.Thread(target=self._watch_stream, daemon=True, name=f"p4rt-{address}").start()
        arb = p4runtime_pb2.StreamMessageRequest()
        arb.arbitration.device_id = device_id
        arb.arbitration.election_id.high, arb.arbitration.election_id.low = election_id
        self._requests.put(arb)
        try:
            outcome = self._arbitrated.get(timeout=timeout)
        except queue.Empty:
            outcome = "no arbitration answer"
        if isinstance(outcome, str):
            self.close()
            raise SwitchError(f"no P4Runtime server answered at {address} (device {device_id}): "
                              f"{outcome}")

    def _watch_stream(self) -> None:
        """Follow arbitration updates; mark the session lost when the stream ends."""
        try:
            for msg in self._stream:
                if msg.HasField("arbitration"):
                    primary = msg.arbitration.status.code == code_pb2.OK
                    self.mastership += primary and not self.primary
                    self.primary = primary
                    self._arbitrated.put(True)
        except grpc.RpcError as e:
            self._arbitrated.put(f"{e.code().name}: {e.details()}")
        finally:
            self._arbitrated.put("stream closed")
            self.lost.set()

    def close(self) -> None:
        self._requests.put(None)
        self._stream.cancel()
        self.channel.close()

    # -- pipeline ----------------------------------------------------------------------------

    def push_pipeline(self, program: Program | None = None) -> None:
        """SetForwardingPipelineConfig with the program's P4Info and its target's device config
        (controller/program.py); ``program`` defaults to this session's."""
        program = program or self.program
        req = p4runtime_pb2.SetForwardingPipelineConfigRequest(
            device_id=self.device_id,
            action=p4runtime_pb2.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT)
        req.election_id.high, req.election_id.low = self.election_id
        req.config.p4info.CopyFrom(program.p4info.message)
        req.config.p4_device_config = program.device_config()
        try:
            self.stub.SetForwardingPipelineConfig(req, timeout=self.push_timeout)
        except grpc.RpcError as e:
            raise PipelineMismatch(f"switch {self.address} refused the {program.target} pipeline "
                                   f"'{program.p4info.program_name}': {e.code().name}: {e.details()}") from None

    def installed_p4info(self) -> p4info_pb2.P4Info | None:
        """The P4Info of the program the switch runs, or None when it runs none."""
        R = p4runtime_pb2.GetForwardingPipelineConfigRequest
        req = R(device_id=self.device_id, response_type=R.P4INFO_AND_COOKIE)
        try:
            rep = self.stub.GetForwardingPipelineConfig(req, timeout=self.timeout)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.FAILED_PRECONDITION:  # BMv2: none set yet
                return None
            raise SwitchError(f"switch {self.address}: cannot read its pipeline: "
                              f"{e.code().name}: {e.details()}") from None
        return rep.config.p4info if rep.config.p4info.tables else None

    def installed_program(self) -> str | None:
        """Name of the program the switch runs, or None when it runs none; PipelineMismatch when
        it runs another program or another build of ours."""
        p4info = self.installed_p4info()
        if p4info is None:
            return None
        if not same_p4info(p4info, self.p4info.message):
            raise PipelineMismatch(
                f"switch {self.address} runs '{p4info.pkg_info.name or '(unnamed)'}', not this "
                f"build of '{self.p4info.program_name}' (P4Info differs)")
        return p4info.pkg_info.name

    def ensure_pipeline(self) -> bool:
        """Push the pipeline unless ours is already there; True when it was pushed."""
        if self.installed_program() is None:
            self.push_pipeline()
            return True
        return False

    def restore_pipeline(self) -> bool:
        """Push our pipeline when the switch runs none or another one (it was restarted, or
        someone replaced the program under us); True when it was pushed."""
        try:
            if self.installed_program() is not None:
                return False
        except PipelineMismatch:
            pass
        self.push_pipeline()
        return True

    # -- entities ----------------------------------------------------------------------------

    def write(self, updates: Iterable[p4runtime_pb2.Update]) -> None:
        req = p4runtime_pb2.WriteRequest(device_id=self.device_id)
        req.election_id.high, req.election_id.low = self.election_id
        req.updates.extend(updates)
        if not req.updates:
            return
        try:
            self.stub.Write(req, timeout=self.timeout)
        except grpc.RpcError as e:
            raise SwitchError(f"switch {self.address} refused a write: {write_error_text(e)}") from None

    def read(self, *entities: p4runtime_pb2.Entity) -> Iterator[p4runtime_pb2.Entity]:
        """What the switch holds of ``entities``, asked in one request."""
        req = p4runtime_pb2.ReadRequest(device_id=self.device_id)
        for entity in entities:
            req.entities.add().CopyFrom(entity)
        try:
            replies = list(self.stub.Read(req, timeout=self.timeout))
        except grpc.RpcError as e:
            raise SwitchError(f"switch {self.address} refused a read: "
                              f"{e.code().name}: {e.details()}") from None
        for rep in replies:
            yield from rep.entities

    def table_update(self, kind: int, table: str, key: dict, action: str | None = None,
                     params: dict[str, int] | None = None) -> p4runtime_pb2.Update:
        """One update of ``table``'s entry ``key``: field -> value, or (value, mask) for a
        ternary field (a don't-care one left out), and ``PRIORITY`` -> the entry's priority in
        a table with ternary fields (``decode_entry`` gives keys in the same form)."""
        t = self.p4info.obj(P4Type.table, table)
        e = p4runtime_pb2.TableEntry(table_id=t.preamble.id, priority=key.get(PRIORITY, 0))
        fields = {mf.name: mf for mf in t.match_fields}
        for name, value in key.items():
            if name == PRIORITY:
                continue
            mf = fields[name]
            m = e.match.add(field_id=mf.id)
            if isinstance(value, tuple):
                m.ternary.value, m.ternary.mask = (encode(v, mf.bitwidth) for v in value)
            else:
                m.exact.value = encode(value, mf.bitwidth)
        if action is not None:
            a = self.p4info.obj(P4Type.action, action)
            e.action.action.action_id = a.preamble.id
            widths = {p.name: p for p in a.params}
            for name, value in (params or {}).items():
                p = widths[name]
                e.action.action.params.add(param_id=p.id, value=encode(value, p.bitwidth))
        u = p4runtime_pb2.Update(type=kind)
        u.entity.table_entry.CopyFrom(e)
        return u

    def table_entries(self, table: str) -> list[tuple[dict, str, dict[str, int]]]:
        """(key, action name, params) of every entry of ``table``."""
        q = p4runtime_pb2.Entity()
        q.table_entry.table_id = self.p4info.id(P4Type.table, table)
        return [self.decode_entry(ent.table_entry)[1:] for ent in self.read(q)]

    def decode_entry(self, te: p4runtime_pb2.TableEntry) -> tuple[str, dict, str, dict[str, int]]:
        """(table, key, action, params) of a TableEntry, with short names; the key as
        ``table_update`` takes it."""
        t = self.p4info.by_id(te.table_id)
        names = {mf.id: mf.name for mf in t.match_fields}
        key: dict = {names[m.field_id]: int.from_bytes(m.exact.value, "big") if m.HasField("exact") else
                     (int.from_bytes(m.ternary.value, "big"), int.from_bytes(m.ternary.mask, "big"))
                     for m in te.match}
        if te.priority:
            key[PRIORITY] = te.priority
        a = self.p4info.by_id(te.action.action.action_id)
        pnames = {p.id: p.name for p in a.params}
        params = {pnames[p.param_id]: int.from_bytes(p.value, "big") for p in te.action.action.params}
        return t.preamble.name.split(".")[-1], key, a.preamble.name.split(".")[-1], params

    def counter(self, name: str, index: int | None = None) -> dict[int, int]:
        """Packet counts of an indexed counter: {index: packets}."""
        c = self.p4info.obj(P4Type.counter, name)
        q = p4runtime_pb2.Entity()
        q.counter_entry.counter_id = c.preamble.id
        if index is not None:
            q.counter_entry.index.index = index
        return {e.counter_entry.index.index: e.counter_entry.data.packet_count for e in self.read(q)}

    def counter_cells(self, cells: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """Packet counts of ``(counter, index)`` cells, read in one request: counters read one
        request each drift apart while traffic flows (a job's results read after its aggregated
        contributions came out 5.7 % more than half of them, at 2 workers, for rounds that
        completed between the two reads)."""
        ids = {name: self.p4info.obj(P4Type.counter, name).preamble.id for name in {n for n, _ in cells}}
        queries = []
        for name, index in cells:
            q = p4runtime_pb2.Entity()
            q.counter_entry.counter_id = ids[name]
            q.counter_entry.index.index = index
            queries.append(q)
        by_id = {i: n for n, i in ids.items()}
        return {(by_id[e.counter_entry.counter_id], e.counter_entry.index.index): e.counter_entry.data.packet_count
                for e in self.read(*queries)}


INSERT, MODIFY, DELETE = (p4runtime_pb2.Update.INSERT, p4runtime_pb2.Update.MODIFY,
                          p4runtime_pb2.Update.DELETE)


@dataclass(frozen=True)
class WorkerBinding:
    """Where rank r of a job lives, as the switch sees it."""

    rank: int
    port: int
    ip: str
    mac: str
    udp_port: int
    qp: int = 0  # RoCEv2 jobs: the worker's receive QP and memory key for results
    rkey: int = 0


@dataclass(frozen=True)
class UplinkBinding:
    """Where a switch below the root of a job's aggregation tree sends its partial sums
    (docs/trees.md): the port toward the parent, its rank there, the job's first slot there,
    the parent's aggregator address, and this switch's own (the one its children send to)."""

    port: int
    rank: int
    slot_base: int
    mac: str
    ip: str
    udp_port: int
    src_mac: str
    src_ip: str
    src_udp_port: int


@dataclass(frozen=True)
class SwitchJob:
    """A job admitted to the switch: its grant and its workers (in a tree: this switch's
    children, workers or switches one level down) and, below the root, its uplink."""

    job_id: int
    job_index: int
    epoch: int
    slot_base: int
    slot_count: int
    workers: tuple[WorkerBinding, ...]
    encap: str = "udp"  # how its packets carry the inagg header: "udp" or "roce"
    uplink: UplinkBinding | None = None
    atp: bool = False   # an ATP job (docs/atp.md): its window is the host aggregator's, its rounds share atp_table's pool

    @property
    def mcast_grp(self) -> int:
        return MCAST_JOB_BASE + self.job_index


@dataclass(frozen=True)
class AtpPoolBinding:
    """The switch's ATP pool (atp_table, docs/atp.md): slots [pool_base, pool_base +
    pool_count) for the ATP jobs of the host aggregator at host_ip:host_port, and the switch's
    aggregator address, the source of the sums it sends up (the host aggregator's ``atp_peer``
    for those jobs)."""

    host_ip: str
    host_port: int
    pool_base: int
    pool_count: int
    switch_mac: str
    switch_ip: str
    switch_udp_port: int


# Multicast group ids: the flood group is 1; job groups start above it.
MCAST_FLOOD = 1
MCAST_JOB_BASE = 0x100


# admit parameters a target adds to BMv2's, each derived from the job: bounds the controller
# precomputes because the target's action cannot (p4/tofino/job_admission.p4: slot_end).
DERIVED_ADMIT_PARAMS = {"slot_end": lambda job: job.slot_base + job.slot_count}


MARK_JOB = 0   # the job id of the high-water mark's worker_table entry (JobAdmission.mark_update)


class JobAdmission:
    """Programs job_table and worker_table (p4/include/job_admission.p4)."""

    def __init__(self, sw: SwitchConnection) -> None:
        self.sw = sw

    def admit_params(self, job: SwitchJob) -> dict[str, int]:
        """admit's action data for ``job``: the parameters of both targets, and the derived
        ones this switch's P4Info declares."""
        params = {"job_index": job.job_index, "slot_base": job.slot_base, "slot_count": job.slot_count,
                  "n_workers": len(job.workers), "epoch": job.epoch, "mcast_grp": job.mcast_grp,
                  "encap": ENCAP_CODE[job.encap]}
        declared = {p.name for p in self.sw.p4info.obj(P4Type.action, "admit").params}
        params.update({name: derive(job) for name, derive in DERIVED_ADMIT_PARAMS.items() if name in declared})
        return params

    def updates(self, kind: int, job: SwitchJob) -> list[p4runtime_pb2.Update]:
        admit = None if kind == DELETE else "admit"
        params = None if kind == DELETE else self.admit_params(job)
        ups = [self.sw.table_update(kind, "job_table", {"job_id": job.job_id}, admit, params)]
        return ups + self.worker_updates(kind, job)

    def worker_updates(self, kind: int, job: SwitchJob) -> list[p4runtime_pb2.Update]:
        """worker_table: each rank's binding (``binding``)."""
        return [self.sw.table_update(kind, "worker_table", {"job_id": job.job_id, "worker_id": w.rank},
                                     None if kind == DELETE else "bind_worker",
                                     None if kind == DELETE else self.binding(job.encap, w))
                for w in job.workers]

    def atp_updates(self, kind: int, job: SwitchJob) -> list[p4runtime_pb2.Update]:
        """An ATP job (docs/atp.md): job_table's ``admit_atp`` (its window is at the host
        aggregator, whose slots its workers address) and its ranks' bindings. The switch takes
        its rounds to atp_table's pool, which must be written first and deleted last."""
        params = None if kind == DELETE else {
            "job_index": job.job_index, "slot_base": job.slot_base, "slot_count": job.slot_count,
            "n_workers": len(job.workers), "epoch": job.epoch}
        return [self.sw.table_update(kind, "job_table", {"job_id": job.job_id},
                                     None if kind == DELETE else "admit_atp", params)] + self.worker_updates(kind, job)

    def atp_pool_update(self, kind: int, pool: AtpPoolBinding) -> p4runtime_pb2.Update:
        """atp_table's one row: the ATP pool and the host aggregator it serves."""
        params = None if kind == DELETE else {
            "pool_base": pool.pool_base, "pool_count": pool.pool_count, "host_port": pool.host_port,
            "switch_mac": mac(pool.switch_mac), "switch_addr": ipv4(pool.switch_ip),
            "switch_udp_port": pool.switch_udp_port}
        return self.sw.table_update(kind, "atp_table", {"host_addr": ipv4(pool.host_ip)},
                                    None if kind == DELETE else "set_atp_pool", params)

    def mark_update(self, kind: int, next_job_id: int) -> p4runtime_pb2.Update:
        """The controller's job-id high-water mark, kept on the switch: a ``worker_table`` entry
        of job 0 (no job has id 0, so no packet is ever checked against it: job 0 misses
        ``job_table`` and is forwarded untouched) whose ``addr`` is the next job id. It
        outlives the controller's database, so a controller whose database was lost never hands
        out an id the switch's slot tags may still carry (``mark_of``)."""
        return self.sw.table_update(kind, "worker_table", {"job_id": MARK_JOB, "worker_id": 0}, "bind_worker",
                                    {"port": 0, "addr": next_job_id, "mac": 0, "udp_port": 0})

    @staticmethod
    def mark_of(key: dict[str, int], params: dict[str, int]) -> int | None:
        """The next job id a ``worker_table`` entry holds if it is the mark (``mark_update``)."""
        return params.get("addr", 0) if key.get("job_id") == MARK_JOB else None

    @staticmethod
    def binding(encap: str, w: WorkerBinding) -> dict[str, int]:
        """The sender rank ``w`` must be: ingress port, IPv4 and MAC source, and UDP source port
        (0, any, for RoCEv2: its source port comes from the flow label, not the worker)."""
        return {"port": w.port, "addr": ipv4(w.ip), "mac": mac(w.mac),
                "udp_port": 0 if encap == "roce" else w.udp_port}


class TreeUplink:
    """Programs uplink_table (p4/include/tree_uplink.p4): a job's uplink on a switch below the
    root of its aggregation tree; nothing for a job this switch completes."""

    def __init__(self, sw: SwitchConnection) -> None:
        self.sw = sw

    def updates(self, kind: int, job: SwitchJob) -> list[p4runtime_pb2.Update]:
        up = job.uplink
        if up is None:
            return []
        params = None if kind == DELETE else {
            "port": up.port, "rank": up.rank, "slot_base": up.slot_base, "mac": mac(up.mac),
            "addr": ipv4(up.ip), "udp_port": up.udp_port, "src_mac": mac(up.src_mac),
            "src_addr": ipv4(up.src_ip), "src_udp_port": up.src_udp_port}
        return [self.sw.table_update(kind, "uplink_table", {"job_id": job.job_id},
                                     None if kind == DELETE else "set_uplink", params)]


class ResultReplication:
    """Programs the job's multicast group (the PRE used by result_replication.p4)."""

    def __init__(self, sw: SwitchConnection) -> None:
        self.sw = sw

    def update(self, kind: int, group: int, replicas: Iterable[tuple[int, int]]) -> p4runtime_pb2.Update:
        u = p4runtime_pb2.Update(type=kind)
        g = u.entity.packet_replication_engine_entry.multicast_group_entry
        g.multicast_group_id = group
        if kind != DELETE:
            for port, instance in replicas:
                g.replicas.add(egress_port=port, instance=instance)
        return u

    def job_update(self, kind: int, job: SwitchJob) -> p4runtime_pb2.Update:
        # one replica per worker; instance = rank + 1 tells ReplicaRewrite whom it is for
        return self.update(kind, job.mcast_grp, [(w.port, w.rank + 1) for w in job.workers])

    def groups(self) -> dict[int, list[tuple[int, int]]]:
        q = p4runtime_pb2.Entity()
        q.packet_replication_engine_entry.multicast_group_entry.multicast_group_id = 0
        out = {}
        for e in self.sw.read(q):
            g = e.packet_replication_engine_entry.multicast_group_entry
            out[g.multicast_group_id] = [(r.egress_port, r.instance) for r in g.replicas]
        return out


class ReplicaRewrite:
    """Programs replica_table (p4/include/replica_rewrite.p4)."""

    def __init__(self, sw: SwitchConnection) -> None:
        self.sw = sw

    def updates(self, kind: int, job: SwitchJob) -> list[p4runtime_pb2.Update]:
        return [self.sw.table_update(
            kind, "replica_table", {"job_id": job.job_id, "replica": w.rank + 1},
            *((None, None) if kind == DELETE else self.address(job.encap, w)))
            for w in job.workers]

    @staticmethod
    def address(encap: str, w: WorkerBinding) -> tuple[str, dict[str, int]]:
        """The action and parameters that address a result to worker ``w``."""
        if encap == "roce":
            return "set_roce_worker_address", {"mac": mac(w.mac), "addr": ipv4(w.ip),
                                               "qp": w.qp, "rkey": w.rkey}
        return "set_worker_address", {"mac": mac(w.mac), "addr": ipv4(w.ip), "udp_port": w.udp_port}


class Forwarding:
    """Programs l2_table (p4/include/forwarding.p4) and the flood group."""

    def __init__(self, sw: SwitchConnection) -> None:
        self.sw = sw

    def host_update(self, kind: int, host_mac: str, port: int) -> p4runtime_pb2.Update:
        return self.sw.table_update(kind, "l2_table", {"dst_addr": mac(host_mac)},
                                    None if kind == DELETE else "forward",
                                    None if kind == DELETE else {"port": port})

    def flood_updates(self, kind: int, ports: Iterable[int]) -> list[p4runtime_pb2.Update]:
        return [
            ResultReplication(self.sw).update(kind, MCAST_FLOOD, [(p, 0) for p in ports]),
            self.sw.table_update(kind, "l2_table", {"dst_addr": 0xFFFFFFFFFFFF},
                                 None if kind == DELETE else "flood",
                                 None if kind == DELETE else {"group": MCAST_FLOOD}),
        ]


class SourceGuard:
    """Programs host_port_table and reads guard_drops: on each port that faces hosts, frames
    claiming an aggregator's address or carrying a result are dropped; ports to other switches
    get no entry. The table has one of two shapes, told apart by its P4Info: BMv2's
    (p4/include/source_guard.p4: exact on the port, the addresses as guard_host_port's data,
    compared by the program) and the TNA program's (p4/tofino/source_guard.p4: ternary on the
    port and the headers, the comparisons being the rows' matches, each row refusing with its
    GUARD_DROP reason)."""

    def __init__(self, sw: SwitchConnection) -> None:
        self.sw = sw

    def port_updates(self, kind: int, port: int, aggregator_ip: str, host_aggregator_ip: str,
                     is_aggregator: bool) -> list[p4runtime_pb2.Update]:
        """Guard device port ``port``: no frame from it may come from ``aggregator_ip`` (the
        switch's aggregator address) and, unless the host aggregator sits there
        (``is_aggregator``), none from ``host_aggregator_ip`` and no result."""
        table = self.sw.p4info.obj(P4Type.table, "host_port_table")
        if any(mf.match_type == p4info_pb2.MatchField.TERNARY for mf in table.match_fields):
            return self._rows(kind, port, aggregator_ip, host_aggregator_ip, is_aggregator)
        params = {"aggregator_addr": ipv4(aggregator_ip), "host_aggregator": ipv4(host_aggregator_ip),
                  "is_aggregator": int(is_aggregator)}
        return [self.sw.table_update(kind, "host_port_table", {"port": port},
                                     None if kind == DELETE else "guard_host_port",
                                     None if kind == DELETE else params)]

    def _rows(self, kind: int, port: int, aggregator_ip: str, host_aggregator_ip: str,
              is_aggregator: bool) -> list[p4runtime_pb2.Update]:
        """The TNA shape's rows for ``port``, highest priority first (the table in
        p4/tofino/source_guard.p4): the switch's address, the host aggregator's (not on its
        port, and not when it is the switch's), a RESULT (not on its port), FLAG_FROM_SWITCH."""
        one, reasons = (1, 1), {r: i for i, r in enumerate(GUARD_DROP_REASONS)}
        rows = [(4, {"ipv4_valid": one, "src_addr": (ipv4(aggregator_ip), 0xFFFFFFFF)}, "aggregator_addr")]
        if not is_aggregator:
            if host_aggregator_ip != aggregator_ip:
                rows.append((3, {"ipv4_valid": one, "src_addr": (ipv4(host_aggregator_ip), 0xFFFFFFFF)},
                             "aggregator_addr"))
            rows.append((2, {"inagg_valid": one, "msg_type": (MSG_RESULT, 0xF)}, "result"))
        rows.append((1, {"inagg_valid": one, "flags": (FLAG_FROM_SWITCH, FLAG_FROM_SWITCH)}, "result"))
        return [self.sw.table_update(kind, "host_port_table", {"port": port, **match, PRIORITY: priority},
                                     None if kind == DELETE else "source_guard.refuse",
                                     None if kind == DELETE else {"reason": reasons[why]})
                for priority, match, why in rows]

    def drops(self) -> dict[str, int]:
        """Frames dropped on host ports, by GUARD_DROP reason (only the reasons that occurred)."""
        counts = self.sw.counter("guard_drops")
        return {r: counts.get(i, 0) for i, r in enumerate(GUARD_DROP_REASONS) if counts.get(i, 0)}


def reserved_loopback_ports(p4info: P4Info) -> list[int]:
    """The pipe-local ports the program takes second passes on besides its recirculation port
    (@inagg_recirculation_ports' base and mask); [] for a program without recirc_spread."""
    known = p4info.recirculation_ports
    if known is None:
        return []
    _, base, mask = known
    return [p for p in range(128) if p & mask == base & mask]


def check_no_traffic_on_reserved_ports(p4info: P4Info, users: dict[int, str]) -> None:
    """A ValueError naming each host or link (``users``: device port -> who) on a port the
    program reserves for loopback: its parser would take that port's frames for second passes."""
    reserved = reserved_loopback_ports(p4info)
    bad = [f"{who} (device port {port})" for port, who in sorted(users.items()) if port & 0x7F in reserved]
    if bad:
        raise ValueError(f"{', '.join(bad)}: on a port the Tofino program reserves for loopback "
                         f"(pipe-local {reserved[0]}-{reserved[-1]}, where its parser takes second "
                         f"passes): attach it to another port (docs/tofino.md, step 5)")


def recirculation_rows(p4info: P4Info, loopback: Iterable[int]) -> dict[tuple[int, int], int]:
    """recirc_spread's rows (p4/tofino/recirc_spread.p4) for the device ports ``loopback`` the
    operator put in loopback: (pipe, slot's low bits) -> port. A pipe with loopback ports
    spreads its slots over its recirculation port and them, round robin over the low bits in
    port order (with 2^bits rows, each port takes every len(ports)-th low value); a pipe with
    none gets no row (the table's default: its recirculation port). Every pass of a slot takes
    its row's port, so their order is that port's FIFO. A ValueError names a port the program
    cannot take second passes on (not one it reserves for loopback, @inagg_recirculation_ports)."""
    ports = sorted(set(loopback))
    if not ports:
        return {}
    known = p4info.recirculation_ports
    if known is None:
        raise ValueError(f"loopback ports {ports}: the program {p4info.program_name} has no "
                         f"recirc_spread table (only the Tofino program spreads recirculation)")
    local, _, _ = known
    reserved = reserved_loopback_ports(p4info)
    wrong = [p for p in ports if (p & 0x7F) not in reserved]
    if wrong:
        raise ValueError(f"loopback device port(s) {wrong}: the program takes second passes only "
                         f"on pipe-local ports {reserved[0]}-{reserved[-1]} of each pipe "
                         f"(p4/tofino/types.p4, LOOPBACK_BASE): put those in loopback and name them")
    low = 1 << p4info.obj(P4Type.table, "recirc_spread").match_fields[1].bitwidth
    rows = {}
    for pipe in sorted({p >> 7 for p in ports}):
        spread = [pipe << 7 | local] + [p for p in ports if p >> 7 == pipe]
        rows.update({(pipe, i): spread[i % len(spread)] for i in range(low)})
    return rows


class RecircSpread:
    """Programs recirc_spread from the switch's loopback ports (``recirculation_rows``)."""

    def __init__(self, sw: SwitchConnection) -> None:
        self.sw = sw

    def updates(self, kind: int, loopback: Iterable[int]) -> list[p4runtime_pb2.Update]:
        return [self.sw.table_update(kind, "recirc_spread", {"pipe": pipe, "slot_low": low},
                                     None if kind == DELETE else "via",
                                     None if kind == DELETE else {"port": port})
                for (pipe, low), port in recirculation_rows(self.sw.p4info, loopback).items()]


_JOB_COUNTS = ("packets", "aggregated", "duplicates", "results")   # job_<name>, one cell per job
_RECIRC = ("recirc_sent", "recirc_arrived")   # the TNA program's, one cell per pipe


class JobCounters:
    """Reads the counters of p4/include/job_counters.p4."""

    def __init__(self, sw: SwitchConnection) -> None:
        self.sw = sw

    def counts(self) -> tuple[str, ...]:
        """The one-cell-per-job counters (job_<name>) of this switch's program: ATP's
        ``collisions`` where its P4Info has it."""
        has = self.sw.p4info.has(P4Type.counter, "job_collisions")
        return _JOB_COUNTS + (("collisions",) if has else ())

    def job(self, job_index: int) -> dict:
        """Job row ``job_index``'s counters, read together (``SwitchConnection.counter_cells``)."""
        base = job_index * self.sw.p4info.drop_row_length
        drop_cells = [("job_drops", base + i) for i in range(len(DROP_REASONS))]
        names = self.counts()
        row = [(f"job_{name}", job_index) for name in names]
        counts = self.sw.counter_cells(row + drop_cells)
        return {**{name: counts.get(cell, 0) for name, cell in zip(names, row)},
                "drops": {r: n for r, cell in zip(DROP_REASONS, drop_cells) if (n := counts.get(cell, 0))}}

    def reset_updates(self, job_index: int) -> list[p4runtime_pb2.Update]:
        """Zero every counter of job row ``job_index``: a job taking a row must not inherit the
        counts of the job that held it before."""
        cells = [(f"job_{name}", job_index) for name in self.counts()]
        row = self.sw.p4info.drop_row_length   # the program's row (Tofino pads it to 8)
        cells += [("job_drops", job_index * row + i) for i in range(row)]
        ups = []
        for name, index in cells:
            u = p4runtime_pb2.Update(type=MODIFY)
            u.entity.counter_entry.counter_id = self.sw.p4info.id(P4Type.counter, name)
            u.entity.counter_entry.index.index = index
            u.entity.counter_entry.data.packet_count = 0
            ups.append(u)
        return ups

    def global_drops(self) -> dict[str, int]:
        counts = self.sw.counter("global_drops")
        return {r: counts.get(i, 0) for i, r in enumerate(GLOBAL_DROP_REASONS) if counts.get(i, 0)}

    def recirculation(self) -> dict[int, dict[str, int]]:
        """Per pipe, the passes sent to its recirculation port, those that came back and the
        difference (``lost``: what the port dropped, plus any pass in flight during the read),
        read together; where the P4Info has the counters (the TNA program's recirc_sent and
        recirc_arrived, by pipe: p4/tofino/job_counters.p4), else {} (BMv2's program
        recirculates nothing). Pipes with no traffic are left out."""
        if not all(self.sw.p4info.has(P4Type.counter, n) for n in _RECIRC):
            return {}
        pipes = range(self.sw.p4info.obj(P4Type.counter, _RECIRC[0]).size)
        counts = self.sw.counter_cells([(n, pipe) for pipe in pipes for n in _RECIRC])
        out = {}
        for pipe in pipes:
            sent, arrived = (counts.get((n, pipe), 0) for n in _RECIRC)
            if sent or arrived:
                out[pipe] = {"sent": sent, "arrived": arrived, "lost": sent - arrived}
        return out

"""P4Runtime programming of one inagg switch (BMv2 or the software data plane).

``SwitchConnection`` is the session (arbitration, pipeline push/verify, write/read), built on
p4runtime-shell's ``P4RuntimeClient``. The classes after it mirror the P4 controls they program,
with the same names: JobAdmission, ResultReplication, ReplicaRewrite, Forwarding, JobCounters.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import grpc
from p4.v1 import p4runtime_pb2
from p4runtime_sh.p4runtime import P4RuntimeClient, P4RuntimeException, P4RuntimeWriteException

from hostlib.protocol import DROP_REASONS, ENCAP_CODE, GLOBAL_DROP_REASONS, ipv4, mac

from .p4info import BMV2_JSON_PATH, P4INFO_PATH, P4Info, P4Type, encode


class SwitchError(RuntimeError):
    """A switch refused a request or could not be reached; the message says which and why."""


class PipelineMismatch(SwitchError):
    """The switch runs another program (or another build of ours)."""


class SwitchConnection:
    """One P4Runtime session with one device. Several can live in one process."""

    def __init__(self, address: str, device_id: int = 0, election_id: tuple[int, int] = (0, 1),
                 p4info: P4Info | None = None) -> None:
        self.address = address
        self.device_id = device_id
        self.p4info = p4info or P4Info.load()
        try:
            # p4runtime-shell prints a notice for backup (read-only) sessions: keep stdout clean
            with contextlib.redirect_stdout(io.StringIO()):
                self.client = P4RuntimeClient(device_id, address, election_id)
        except SystemExit:  # p4runtime-shell exits when the handshake fails
            raise SwitchError(f"no P4Runtime server answered at {address} (device {device_id})") from None

    def close(self) -> None:
        self.client.tear_down()

    # -- pipeline ----------------------------------------------------------------------------

    def push_pipeline(self, p4info_path: Path = P4INFO_PATH, json_path: Path = BMV2_JSON_PATH) -> None:
        try:
            self.client.set_fwd_pipe_config(str(p4info_path), str(json_path))
        except P4RuntimeException as e:
            raise PipelineMismatch(f"switch {self.address} refused the inagg pipeline: {e}") from None

    def installed_program(self) -> str | None:
        """Name of the program the switch runs, or None when it runs none."""
        try:
            p4info = self.client.get_p4info()
        except P4RuntimeException as e:
            if e.grpc_error.code() == grpc.StatusCode.FAILED_PRECONDITION:  # BMv2: none set yet
                return None
            raise SwitchError(f"switch {self.address}: cannot read its pipeline: {e}") from None
        if not p4info.tables:
            return None
        if p4info != self.p4info.message:
            raise PipelineMismatch(
                f"switch {self.address} runs '{p4info.pkg_info.name or '(unnamed)'}', not this "
                f"build of '{self.p4info.program_name}' (P4Info differs)")
        return p4info.pkg_info.name

    def ensure_pipeline(self, p4info_path: Path = P4INFO_PATH, json_path: Path = BMV2_JSON_PATH) -> bool:
        """Push the pipeline unless ours is already there; True when it was pushed."""
        if self.installed_program() is None:
            self.push_pipeline(p4info_path, json_path)
            return True
        return False

    # -- entities ----------------------------------------------------------------------------

    def write(self, updates: Iterable[p4runtime_pb2.Update]) -> None:
        req = p4runtime_pb2.WriteRequest()
        req.updates.extend(updates)
        if not req.updates:
            return
        try:
            self.client.write(req)
        except (P4RuntimeWriteException, P4RuntimeException) as e:
            raise SwitchError(f"switch {self.address} refused a write: {e}") from None
        except grpc.RpcError as e:
            raise SwitchError(f"switch {self.address} refused a write: "
                              f"{e.code().name}: {e.details()}") from None

    def read(self, entity: p4runtime_pb2.Entity) -> Iterator[p4runtime_pb2.Entity]:
        try:
            for rep in self.client.read_one(entity):
                yield from rep.entities
        except grpc.RpcError as e:
            raise SwitchError(f"switch {self.address} refused a read: {e.details()}") from None

    def table_update(self, kind: int, table: str, key: dict[str, int], action: str | None = None,
                     params: dict[str, int] | None = None) -> p4runtime_pb2.Update:
        t = self.p4info.obj(P4Type.table, table)
        e = p4runtime_pb2.TableEntry(table_id=t.preamble.id)
        fields = {mf.name: mf for mf in t.match_fields}
        for name, value in key.items():
            mf = fields[name]
            m = e.match.add(field_id=mf.id)
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

    def table_entries(self, table: str) -> list[tuple[dict[str, int], str, dict[str, int]]]:
        """(key, action name, params) of every entry of ``table``."""
        q = p4runtime_pb2.Entity()
        q.table_entry.table_id = self.p4info.id(P4Type.table, table)
        return [self.decode_entry(ent.table_entry)[1:] for ent in self.read(q)]

    def decode_entry(self, te: p4runtime_pb2.TableEntry) -> tuple[str, dict[str, int], str, dict[str, int]]:
        """(table, key, action, params) of a TableEntry, with short names."""
        t = self.p4info.by_id(te.table_id)
        names = {mf.id: mf.name for mf in t.match_fields}
        key = {names[m.field_id]: int.from_bytes(m.exact.value, "big") for m in te.match}
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
class SwitchJob:
    """A job admitted to the switch: its grant and its workers."""

    job_id: int
    job_index: int
    epoch: int
    slot_base: int
    slot_count: int
    workers: tuple[WorkerBinding, ...]
    encap: str = "udp"  # how its packets carry the inagg header: "udp" or "roce"

    @property
    def mcast_grp(self) -> int:
        return MCAST_JOB_BASE + self.job_index


# Multicast group ids: the flood group is 1; job groups start above it.
MCAST_FLOOD = 1
MCAST_JOB_BASE = 0x100


class JobAdmission:
    """Programs job_table and worker_table (p4/include/job_admission.p4)."""

    def __init__(self, sw: SwitchConnection) -> None:
        self.sw = sw

    def updates(self, kind: int, job: SwitchJob) -> list[p4runtime_pb2.Update]:
        admit = None if kind == DELETE else "admit"
        params = None if kind == DELETE else {
            "job_index": job.job_index, "slot_base": job.slot_base, "slot_count": job.slot_count,
            "n_workers": len(job.workers), "epoch": job.epoch, "mcast_grp": job.mcast_grp,
            "encap": ENCAP_CODE[job.encap]}
        ups = [self.sw.table_update(kind, "job_table", {"job_id": job.job_id}, admit, params)]
        for w in job.workers:
            ups.append(self.sw.table_update(
                kind, "worker_table", {"job_id": job.job_id, "worker_id": w.rank},
                None if kind == DELETE else "bind_worker",
                None if kind == DELETE else {"port": w.port, "addr": ipv4(w.ip)}))
        return ups


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


class JobCounters:
    """Reads the counters of p4/include/job_counters.p4."""

    def __init__(self, sw: SwitchConnection) -> None:
        self.sw = sw

    def job(self, job_index: int) -> dict:
        c = self.sw.counter
        base = job_index * len(DROP_REASONS)
        drops = {r: c("job_drops", base + i)[base + i] for i, r in enumerate(DROP_REASONS)}
        return {
            "packets": c("job_packets", job_index)[job_index],
            "aggregated": c("job_aggregated", job_index)[job_index],
            "duplicates": c("job_duplicates", job_index)[job_index],
            "results": c("job_results", job_index)[job_index],
            "drops": {r: n for r, n in drops.items() if n},
        }

    def global_drops(self) -> dict[str, int]:
        counts = self.sw.counter("global_drops")
        return {r: counts.get(i, 0) for i, r in enumerate(GLOBAL_DROP_REASONS) if counts.get(i, 0)}

"""The job table's records and the rules a request about a job is checked against.

A job is created with its demand, then each rank joins with its endpoint; once every rank joined
the controller places it (``inagg.controller.fabric``): on one switch, on an aggregation tree of
switches (``Job.tree``, docs/trees.md) or on the host aggregator. Two leases keep it: the job's own
(``Job.last_seen``, renewed by any call about it) and one per rank (``Job.rank_seen``, renewed by
that rank's heartbeat). A job whose own lease runs out is ended; a placed job one of whose ranks
went silent fails, and its failure names the silent ranks (``silence``).

Nothing here locks or talks to a switch: the controller calls these with its lock held.
"""

from __future__ import annotations

import hmac
import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, NamedTuple

import grpc

from inagg.controller.allocator import Demand
from inagg.controller.validation import MAX_NONCE_CHARS, MAX_TOKEN_CHARS, check_address, check_mac
from inagg.hostlib.wire.grant import parse_address

if TYPE_CHECKING:
    from inagg.controller.trees import TreePlace


class Refused(Exception):
    """A request the service refuses, with the gRPC code to answer."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class Member(NamedTuple):
    """A worker that joined: its UDP endpoint "ip:port", MAC, and RoCE QP/rkey (RoCE jobs)."""

    address: str
    mac: str
    qp: int = 0
    rkey: int = 0


@dataclass
class Job:
    job_id: int
    name: str
    token: str
    demand: Demand
    workers: dict[int, Member] = field(default_factory=dict)  # by rank
    transport: str = "udp"            # the switch encapsulation: "udp" or "roce"
    host_only: bool = False           # asked for the host aggregator only (a switch job's host lane)
    nonce: str = ""                   # its launch's nonce (CreateJob): every rank joins with it,
                                      # every grant carries it ("" from a client that predates it)
    place: str | None = None          # switch name (a tree's: its root), or HOST_POOL ("")
                                      # aggregator (a tree's root, or all of it); None before placement
    tree: TreePlace | None = None     # placed on an aggregation tree of switches
    rows: dict[str, int] = field(default_factory=dict)   # its job row (counter index) by switch
    last_seen: float = field(default_factory=time.monotonic)
    rank_seen: dict[int, float] = field(default_factory=dict)  # last heartbeat of each rank
    left: set[int] = field(default_factory=set)                 # ranks that left cleanly
    failure: str = ""                                            # why it failed; "" while it runs
    # ranks that asked to activate (epoch, boundary), not decided yet (Controller.activate)
    activation_asks: dict[tuple[int, int], set[int]] = field(default_factory=dict)
    # ranks that reported a stall in an epoch, with the boundary of their stalled call
    # (Controller.stalled), not decided yet; and the moves a stall made, by boundary
    stall_asks: dict[int, dict[int, int]] = field(default_factory=dict)
    stall_moves: dict[int, int] = field(default_factory=dict)
    stall_reason: str = ""            # why a stall moved it to the host aggregator

    @property
    def job_index(self) -> int | None:
        """Its row on the switch it is placed on (a tree's root); None off switches."""
        return self.rows.get(self.place) if self.place else None


def job_from_row(row: Mapping[str, Any], grace: float = 0.0) -> Job:
    """A job as the store persisted it; every rank's lease starts afresh, ``grace`` seconds
    ahead (a restarted controller cannot know when a rank was last heard, and a rank's beat
    sent while it was down may still be waiting for it)."""
    demand = Demand(**json.loads(row["state"])["demand"])
    job = Job(row["job_id"], row["name"], row["token"], demand,
              {r: Member(*w) for r, *w in row["workers"]}, transport=row["transport"],
              host_only=row["host_only"], place=row["switch"], nonce=row.get("nonce") or "",
              rows={} if row["job_index"] is None else {row["switch"]: row["job_index"]})
    job.rank_seen = dict.fromkeys(job.workers, time.monotonic() + grace)
    stall = json.loads(row.get("stall") or "{}")
    job.stall_moves = {int(b): n for b, n in stall.get("moves", {}).items()}
    job.stall_reason = stall.get("reason", "")
    return job


def stall_record(job: Job) -> str:
    """What a stall did to ``job`` (its moves by boundary, the reason it stays on the host
    aggregator), as the store keeps it: a restarted controller neither forgets that a stall
    moved the job nor gives a stall that came back a fresh epoch again."""
    return json.dumps({"moves": job.stall_moves, "reason": job.stall_reason})


def authenticated(jobs: Mapping[int, Job], job_id: int, token: str) -> Job:
    """The job ``job_id`` if ``token`` is its token; one answer for an unknown job and a wrong
    token, so outsiders cannot probe which job ids exist."""
    job = jobs.get(job_id)
    if job is None or not hmac.compare_digest(job.token.encode(), token.encode()[:MAX_TOKEN_CHARS]):
        raise Refused(grpc.StatusCode.PERMISSION_DENIED, f"job {job_id}: unknown job or wrong token")
    return job


def running(job: Job) -> Job:
    """``job`` if it has not failed; renews its lease."""
    if job.failure:
        raise Refused(grpc.StatusCode.FAILED_PRECONDITION, f"job {job.job_id} failed: {job.failure}")
    job.last_seen = time.monotonic()
    return job


def check_rank(job: Job, rank: int) -> None:
    if not 0 <= rank < job.demand.n_workers:
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"rank {rank} not in 0..{job.demand.n_workers - 1}")


def check_member(job: Job, rank: int, member: Member) -> None:
    """A joining rank's fields, and its address against the job's other ranks (ValueError)."""
    if not 0 <= rank < job.demand.n_workers:
        raise ValueError(f"rank {rank} not in 0..{job.demand.n_workers - 1}")
    check_address(member.address)
    check_mac(member.mac)
    if job.transport == "roce" and not 1 <= member.qp <= 0xFFFFFF:
        raise ValueError(f"job {job.job_id} uses RoCEv2: rank {rank} must give its QP (1..2^24-1), "
                         f"got {member.qp}")
    if job.transport != "roce" and (member.qp or member.rkey):
        raise ValueError(f"job {job.job_id} uses {job.transport}, not RoCEv2: rank {rank} gave a QP/rkey")
    host = parse_address(member.address)[0]
    for other, m in job.workers.items():
        if other != rank and m.address == member.address:
            raise ValueError(f"job {job.job_id}: rank {rank}'s address {member.address} is rank "
                             f"{other}'s already (each rank needs its own UDP port)")
        if other != rank and job.transport == "roce" and parse_address(m.address)[0] == host:
            raise ValueError(f"job {job.job_id} uses RoCEv2: rank {rank} shares IP {host} with rank "
                             f"{other}; the switch tells RoCEv2 ranks apart by IP (their UDP "
                             f"source port is the flow label's), so each needs its own")


def check_nonce(job: Job, rank: int, nonce: str) -> None:
    """Refuse a rank whose launch nonce is not the job's: it read this job's id and token from
    a rendezvous store that another launch shares (its own launch made another nonce, or none),
    so it must never take part in this job's calls."""
    if job.nonce and not hmac.compare_digest(job.nonce.encode(), nonce.encode()[:MAX_NONCE_CHARS]):
        raise Refused(grpc.StatusCode.FAILED_PRECONDITION,
                      f"job {job.job_id}: rank {rank} joins with launch nonce {nonce[:8] or 'none'}..., "
                      f"the job's is {job.nonce[:8]}...: two launches share one rendezvous store; "
                      f"give each job its own (another MASTER_PORT or init_method)")


def silent_ranks(job: Job, now: float, rank_lease_seconds: float) -> list[int]:
    """Ranks of a running, placed job whose lease ran out."""
    if job.failure or job.place is None:
        return []
    return sorted(r for r, seen in job.rank_seen.items()
                  if r not in job.left and now - seen > rank_lease_seconds)


def pause_leases(job: Job, stall: float, now: float) -> None:
    """Stop ``job``'s lease clocks for ``stall`` seconds in which the controller itself was not
    scheduled (stopped, starved of CPU): the beats its ranks sent meanwhile wait in its server's
    queue and are read only after its lease thread looks, so that time is no rank's silence.
    A time already ahead of ``now`` (a restored job's grace) stays; none moves past ``now``."""
    job.last_seen = max(job.last_seen, min(job.last_seen + stall, now))
    for rank, seen in list(job.rank_seen.items()):   # a beat only assigns existing ranks
        job.rank_seen[rank] = max(seen, min(seen + stall, now))


def silence(job: Job, now: float, rank_lease_seconds: float) -> str:
    """Why ``job`` fails for its silent ranks, naming each; "" while every rank is heard."""
    silent = silent_ranks(job, now, rank_lease_seconds)
    if not silent:
        return ""
    names = ", ".join(f"rank {r} ({job.workers[r].address})" for r in silent)
    return f"{names} stopped: no heartbeat for more than {rank_lease_seconds:g}s"

"""What the controller tells about jobs: each job's grants, the host aggregator's job list and
the operator's listing. All read the job table and the fabric; none changes them (callers hold
the controller's lock).

A grant names where a job aggregates (switch or host aggregator), its slot range, K and epoch.
A job has an active grant and, while a change waits for its ranks to activate it, a pending one;
a host grant says why in words the workers log (``host_reason``). A job on an aggregation tree
has one grant per rank: the switch its rank hangs off, with that switch's slots (each switch
numbers its own pool), its ``reason`` the tree in words; asked without a rank (the operator's
listing), the root's (the host aggregator's when it is the root).
"""

from __future__ import annotations

import logging
from typing import Iterable, NamedTuple

from inagg.controller.allocator import HOST, SWITCH, Placement
from inagg.controller.fabric import Fabric
from inagg.controller.jobs import Job
from inagg.controller.switch import JobCounters, SwitchError
from inagg.hostlib.jobservice.proto import inagg_controller_pb2 as pb

log = logging.getLogger("inagg.controller")


def grants(fabric: Fabric, job: Job, rank: int | None = None) -> list[pb.Grant]:
    """The job's active grant, and its pending one if any (empty before placement); a failed
    job's one grant carries only the failure. A tree job's is ``rank``'s (one grant: a tree
    part never changes)."""
    if job.failure:
        return [pb.Grant(job_id=job.job_id, failure=job.failure, nonce=job.nonce)]
    if job.place is None:
        return []
    if job.tree is not None:
        where = job.place if rank is None else next(s for s, r in job.tree.tree.ranks.items() if rank in r)
        return [grant(fabric, job, fabric.allocators[where].jobs[job.job_id].active, False, where)]
    state = fabric.allocators[job.place].jobs[job.job_id]
    out = [grant(fabric, job, state.active, False, job.place)]
    if state.pending:
        out.append(grant(fabric, job, state.pending, True, job.place))
    return out


def grant(fabric: Fabric, job: Job, p: Placement, pending: bool, where: str) -> pb.Grant:
    """Grant ``p`` of ``job`` in allocator ``where`` (a switch, or "": the host aggregator)."""
    if p.mode == SWITCH:
        sw = fabric.switches[where]
        aggregator, k, mac = sw.cfg.aggregator, sw.sw.p4info.values_per_packet, sw.cfg.aggregator_mac
    else:
        aggregator, k, mac = fabric.config.host_aggregator, fabric.config.host_values_per_packet, ""
    reason = job.tree.describe() if job.tree is not None else \
        "" if p.mode == SWITCH else host_reason(fabric, job)
    return pb.Grant(job_id=job.job_id, epoch=p.epoch, mode=p.mode, slot_base=p.slot_base,
                    slot_count=p.slot_count, values_per_packet=k, aggregator=aggregator,
                    pending=pending, transport=job.transport if p.mode == SWITCH else "udp",
                    reason=reason, aggregator_mac=mac, nonce=job.nonce)


def host_reason(fabric: Fabric, job: Job) -> str:
    """Why a job aggregates on the host aggregator, in words its workers log."""
    if job.host_only:
        return "the job asked for the host aggregator (a host lane beside a job on a switch)"
    if job.stall_reason:
        return job.stall_reason
    if atp := fabric.atp_switch(job):
        return (f"sharing atp: its rounds share switch {atp}'s ATP pool; a round whose aggregator "
                f"is taken goes on to the host aggregator (docs/atp.md)")
    if job.place:
        return (f"switch {job.place} has no free slots for it (or an operator drained it); "
                f"it moves to the switch when slots free up")
    return fabric.why_no_switch(job)


def host_jobs(fabric: Fabric, jobs: Iterable[Job]) -> pb.HostJobs:
    """The running jobs whose active grant is on the host aggregator, by job id."""
    out = pb.HostJobs()
    for job in sorted(jobs, key=lambda j: j.job_id):
        if job.place is None or job.failure:
            continue
        p = fabric.allocators[job.place].jobs[job.job_id].active
        if p.mode == HOST:
            atp = fabric.atp_switch(job)
            out.jobs.add(job_id=job.job_id, epoch=p.epoch, slot_base=p.slot_base,
                         slot_count=p.slot_count, workers=host_members(fabric, job),
                         atp_peer=fabric.switches[atp].cfg.aggregator if atp else "")
    return out


def host_members(fabric: Fabric, job: Job) -> list[str]:
    """The host aggregator's members of a job on it, by member id: its ranks, or, as the root
    of its tree, the root's child switches (their aggregator addresses, by child id)."""
    if job.tree is None:
        return [job.workers[r].address for r in sorted(job.workers)]
    ids = job.tree.tree.child_ids(job.tree.tree.root)
    return [fabric.switches[s].cfg.aggregator for s in sorted(ids, key=ids.__getitem__)]


class OnSwitch(NamedTuple):
    """A listed job with counters on switches, as it was when listed: where they are read."""

    entry: int        # its index in the listing's jobs
    job_id: int
    levels: tuple[tuple[str, str, int], ...]   # (switch, key prefix, job row): ``counter_levels``


def list_jobs(fabric: Fabric, jobs: Iterable[Job]) -> tuple[pb.JobList, list[OnSwitch]]:
    """Every job with its grants, and where the jobs on switches are: the caller adds the
    switches' counters to their entries (``add_counters``), after letting its lock go."""
    out = pb.JobList()
    on_switches = []
    for job in sorted(jobs, key=lambda j: j.job_id):
        info = out.jobs.add(job_id=job.job_id, name=job.name, n_workers=job.demand.n_workers,
                            joined=len(job.workers), failure=job.failure,
                            stall_moves=sum(job.stall_moves.values()))
        held = [] if job.failure else grants(fabric, job)
        if held:
            info.active.CopyFrom(held[0])
        if len(held) > 1:
            info.pending.CopyFrom(held[1])
        atp = fabric.atp_switch(job)
        if atp is not None and atp in job.rows:      # its switch's counters, ATP's collisions among them
            on_switches.append(OnSwitch(len(out.jobs) - 1, job.job_id, ((atp, "", job.rows[atp]),)))
        elif held and (job.tree is not None or (held[0].mode == SWITCH and job.job_index is not None)):
            levels = tuple((name, prefix, job.rows[name]) for name, prefix in counter_levels(job))
            on_switches.append(OnSwitch(len(out.jobs) - 1, job.job_id, levels))
    out.switch_slots = sum(a.switch_slots for a in fabric.allocators.values())
    return out, on_switches


def add_recirculation(listing: pb.JobList, fabric: Fabric) -> None:
    """Each switch's recirculation counters per pipe (``JobCounters.recirculation``: its TNA
    program's, none for BMv2's) into the listing, read now; a switch that does not answer is
    left out (logged)."""
    for name, sw in fabric.switches.items():
        try:
            pipes = JobCounters(sw.sw).recirculation()
        except SwitchError as e:  # a switch being restarted: the listing still answers
            log.warning("recirculation counters of switch %s: %s", name, e)
            continue
        for pipe, kinds in sorted(pipes.items()):
            listing.recirculation.add(switch=name, pipe=pipe, **kinds)


def counter_levels(job: Job) -> list[tuple[str, str]]:
    """(switch, key prefix) of each switch whose counters a job's listing shows: its switch's
    unprefixed; on a tree, the root switch's unprefixed and every level's as "<switch>.<name>"."""
    levels = [] if job.tree is not None and job.tree.host_root else [(job.place, "")]
    if job.tree is not None:
        levels += [(name, f"{name}.") for name in job.tree.switches]
    return levels


def add_counters(info: pb.JobInfo, fabric: Fabric, on: OnSwitch) -> None:
    """The switches' counters of the job ``on`` into its listing entry (read now; a switch that
    does not answer leaves its counters out)."""
    for name, prefix, row in on.levels:
        sw = fabric.switches[name]
        try:
            c = JobCounters(sw.sw).job(row)
        except SwitchError as e:  # a switch being restarted: the listing still answers
            log.warning("counters of job %d on switch %s: %s", on.job_id, name, e)
            continue
        info.counters.update({prefix + k: v for k, v in c.items() if k != "drops"})
        info.counters.update({f"{prefix}drop_{k}": v for k, v in c["drops"].items()})
        info.counters[prefix + "switch_restarts"] = sw.restarts

"""What the controller tells about jobs: each job's grants, the host aggregator's job list and
the operator's listing. All read the job table and the fabric; none changes them (callers hold
the controller's lock).

A grant names where a job aggregates (switch or host aggregator), its slot range, K and epoch.
A job has an active grant and, while a change waits for its ranks to activate it, a pending one;
a host grant says why in words the workers log (``host_reason``).
"""

from __future__ import annotations

import logging
from typing import Iterable, NamedTuple

from inagg.control.allocator import HOST, SWITCH, Placement
from inagg.control.fabric import Fabric
from inagg.control.jobs import Job
from inagg.control.switch import JobCounters, SwitchError
from inagg.jobservice.proto import inagg_controller_pb2 as pb

log = logging.getLogger("inagg.controller")


def grants(fabric: Fabric, job: Job) -> list[pb.Grant]:
    """The job's active grant, and its pending one if any (empty before placement); a failed
    job's one grant carries only the failure."""
    if job.failure:
        return [pb.Grant(job_id=job.job_id, failure=job.failure)]
    if job.place is None:
        return []
    state = fabric.allocators[job.place].jobs[job.job_id]
    out = [grant(fabric, job, state.active, False)]
    if state.pending:
        out.append(grant(fabric, job, state.pending, True))
    return out


def grant(fabric: Fabric, job: Job, p: Placement, pending: bool) -> pb.Grant:
    if p.mode == SWITCH:
        sw = fabric.switches[job.place]
        aggregator, k, mac = sw.cfg.aggregator, sw.sw.p4info.values_per_packet, sw.cfg.aggregator_mac
    else:
        aggregator, k, mac = fabric.config.host_aggregator, fabric.config.host_values_per_packet, ""
    return pb.Grant(job_id=job.job_id, epoch=p.epoch, mode=p.mode, slot_base=p.slot_base,
                    slot_count=p.slot_count, values_per_packet=k, aggregator=aggregator,
                    pending=pending, transport=job.transport if p.mode == SWITCH else "udp",
                    reason="" if p.mode == SWITCH else host_reason(fabric, job), aggregator_mac=mac)


def host_reason(fabric: Fabric, job: Job) -> str:
    """Why a job aggregates on the host aggregator, in words its workers log."""
    if job.host_only:
        return "the job asked for the host aggregator (a host lane beside a job on a switch)"
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
            out.jobs.add(job_id=job.job_id, epoch=p.epoch, slot_base=p.slot_base,
                         slot_count=p.slot_count,
                         workers=[job.workers[r].address for r in sorted(job.workers)])
    return out


class OnSwitch(NamedTuple):
    """A listed job whose active grant is on a switch: where its counters are read."""

    entry: int        # its index in the listing's jobs
    job_id: int
    switch: str
    job_index: int


def list_jobs(fabric: Fabric, jobs: Iterable[Job]) -> tuple[pb.JobList, list[OnSwitch]]:
    """Every job with its grants, and where the jobs on a switch are: the caller adds the
    switch's counters to their entries (``add_counters``), after letting its lock go."""
    out = pb.JobList()
    on_switches = []
    for job in sorted(jobs, key=lambda j: j.job_id):
        info = out.jobs.add(job_id=job.job_id, name=job.name, n_workers=job.demand.n_workers,
                            joined=len(job.workers), failure=job.failure)
        held = [] if job.failure else grants(fabric, job)
        if held:
            info.active.CopyFrom(held[0])
        if len(held) > 1:
            info.pending.CopyFrom(held[1])
        if held and held[0].mode == SWITCH and job.job_index is not None:
            on_switches.append(OnSwitch(len(out.jobs) - 1, job.job_id, job.place, job.job_index))
    out.switch_slots = sum(a.switch_slots for a in fabric.allocators.values())
    return out, on_switches


def add_counters(info: pb.JobInfo, fabric: Fabric, on: OnSwitch) -> None:
    """The switch's counters of the job ``on`` into its listing entry (read now; a switch that
    does not answer leaves them out)."""
    sw = fabric.switches[on.switch]
    try:
        c = JobCounters(sw.sw).job(on.job_index)
    except SwitchError as e:  # a switch being restarted: the listing still answers
        log.warning("counters of job %d: %s", on.job_id, e)
        return
    info.counters.update({k: v for k, v in c.items() if k != "drops"})
    info.counters.update({f"drop_{k}": v for k, v in c["drops"].items()})
    info.counters["switch_restarts"] = sw.restarts

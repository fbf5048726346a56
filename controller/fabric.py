"""The switches and their slot pools: where a job aggregates and what each switch must hold.

There is one ``SlotAllocator`` per configured switch (its pool, job rows and K are its program's,
read from its P4Info) and one, HOST_POOL, for jobs on no switch (the host aggregator only); the
host aggregator's slots are split evenly between them. A job goes to the first switch that has
every rank as a host, speaks the job's transport and, on a Tofino, has every rank's port in one
pipe (registers are per pipe: pipe = device port >> 7). A job whose ranks hang off several
linked switches goes on its aggregation tree (docs/trees.md, ``inagg.controller.tree_place``): a
minimum window on every switch of it, taken in one go; with the host aggregator as its root
when only the root switch is full; else, and for any other job, to "" (``Fabric.place``), and
``Fabric.why_no_switch`` says why in words the workers log.

A switch's desired entries are a function of the jobs that hold a switch grant in its
allocator: its own jobs and its parts of trees (``Fabric.switch_jobs``); ``Fabric.program``
pushes them to every switch whose desired entries changed, and
``Fabric.reconnect``/``Fabric.reprogram`` bring back a switch that restarted. The caller (the controller) holds its lock around all of these except ``reconnect``,
which takes it itself around the part that changes shared state.
"""

from __future__ import annotations

import logging
import threading

from inagg.controller.allocator import ATP, HOST_POOL, SWITCH, AllocatorSnapshot, JobState, SlotAllocator
from inagg.controller.config import ControllerConfig
from inagg.controller.jobs import Job
from inagg.controller.program import TOFINO_CHIPS
from inagg.controller.runtime import SwitchCapacity, SwitchRuntime
from inagg.controller.switch import AtpPoolBinding, JobAdmission, SwitchError, SwitchJob
from inagg.hostlib.wire.grant import parse_address
from inagg.controller.tofino.ports import pipe_of
from inagg.controller.tree_place import job_ips, place_tree, tree_refusal
from inagg.controller.trees import l2_routes, tree_switch_job, worker_bindings

log = logging.getLogger("inagg.controller")


def refusal(sw: SwitchRuntime, job: Job) -> str:
    """Why switch ``sw`` cannot aggregate ``job``, in words its workers log; "" when it can."""
    cfg, ips = sw.cfg, job_ips(job)
    strangers = sorted(ips - set(cfg.hosts))
    if strangers:
        return f"worker address(es) {', '.join(strangers)} are not hosts of switch {cfg.name}"
    carried = sw.sw.p4info.encapsulations
    if job.transport not in carried:
        return (f"switch {cfg.name}'s program carries {'/'.join(carried)} only, not the job's "
                f"{job.transport} (docs/tofino.md: Tofino cannot compute RoCE's ICRC)")
    if cfg.program is not None and cfg.program.target in TOFINO_CHIPS:
        pipes = sorted({pipe_of(cfg.device_port(cfg.hosts[ip].port)) for ip in ips})
        if len(pipes) > 1:
            return (f"its workers' ports on switch {cfg.name} are in pipes "
                    f"{', '.join(map(str, pipes))}: a Tofino's registers are per pipe, so one "
                    f"job's ports must share a pipe (docs/tofino.md)")
    return ""


class Fabric:
    """The allocators (by switch name, HOST_POOL for the host aggregator) and the switches'
    runtimes."""

    def __init__(self, config: ControllerConfig) -> None:
        self.config = config
        n = len(config.switches) + 1
        share = config.host_slots // n
        self.allocators: dict[str, SlotAllocator] = {}
        self.switches: dict[str, SwitchRuntime] = {}
        for i, cfg in enumerate(config.switches):
            p4info = cfg.program.p4info
            cap = SwitchCapacity.from_p4info(p4info)
            alloc = SlotAllocator(cap.slots, config.min_window, p4info.values_per_packet, share,
                                  config.host_window, share * i, max_jobs=cap.job_rows,
                                  max_job_workers=cap.job_workers,
                                  worker_entries=cap.worker_entries - 1,   # one holds the job-id mark
                                  sharing=config.sharing)
            self.allocators[cfg.name] = alloc
            self.switches[cfg.name] = SwitchRuntime(cfg, alloc, p4info, l2_routes(config, cfg.name),
                                                    config.host_aggregator)
            if config.sharing == ATP and cap.atp:
                check_atp_k(config, cfg.name, p4info.values_per_packet)
                self.switches[cfg.name].atp_pool = atp_pool(config, cfg.name, cap.slots)
        self.allocators[HOST_POOL] = SlotAllocator(0, config.min_window, config.host_values_per_packet, share,
                                            config.host_window, share * (n - 1))

    # -- allocation --------------------------------------------------------------------------

    def snapshot(self) -> dict[str, AllocatorSnapshot]:
        return {name: alloc.snapshot() for name, alloc in self.allocators.items()}

    def restore(self, saved: dict[str, AllocatorSnapshot]) -> None:
        for name, snapshot in saved.items():
            self.allocators[name].restore(snapshot)

    def place(self, job: Job) -> None:
        """Place a job every rank of which joined: give it a pool and its first grant there;
        a job spanning switches its tree's windows (``tree_place.place_tree``)."""
        if self.config.sharing == ATP:   # every job on the host aggregator, its switch's pool shared
            job.place = HOST_POOL
            self.allocators[HOST_POOL].add_job(job.job_id, job.demand)
            log.info("job %d placed on the host aggregator, sharing switch %s's ATP pool", job.job_id,
                     self.atp_switch(job) or "(none)")
            return
        job.place = HOST_POOL if job.host_only else next(
            (name for name, sw in self.switches.items() if not refusal(sw, job)), HOST_POOL)
        if not job.place and not job.host_only:
            job.tree = place_tree(self.config, self.switches, self.allocators, job)
        if job.tree is not None:
            job.place = HOST_POOL if job.tree.host_root else job.tree.tree.root
            log.info("job %d placed on its %s", job.job_id, job.tree.describe())
            return
        self.allocators[job.place].add_job(job.job_id, job.demand)
        log.info("job %d placed on %s", job.job_id, job.place if job.place != HOST_POOL else "the host aggregator only")

    def why_no_switch(self, job: Job) -> str:
        """Why no switch takes ``job``: the refusal of the switch that has every rank as a host,
        else which addresses no switch has, else that its ranks are on different switches."""
        ips = job_ips(job)
        for sw in self.switches.values():
            if ips <= set(sw.cfg.hosts) and (why := refusal(sw, job)):
                return why
        known = {ip for sw in self.switches.values() for ip in sw.cfg.hosts}
        strangers = sorted(ips - known)
        if strangers:
            return (f"worker address(es) {', '.join(strangers)} are not hosts of any switch in "
                    f"the controller's config")
        return tree_refusal(self.config, self.switches, job)

    def atp_switch(self, job: Job) -> str | None:
        """Under ``sharing = "atp"``: the switch whose ATP pool a placed job's rounds share (the
        first with every rank as a host and an ATP pool); None for any other job."""
        if self.config.sharing != ATP or job.place != HOST_POOL or job.host_only or job.tree is not None:
            return None
        return next((name for name, sw in self.switches.items()
                     if sw.atp_pool is not None and not refusal(sw, job)), None)

    def state(self, job: Job) -> JobState | None:
        """The allocator's state of a placed job; None before placement or after it left."""
        alloc = self.allocators.get(job.place) if job.place is not None else None
        return alloc.jobs.get(job.job_id) if alloc is not None else None

    def remove(self, job: Job) -> None:
        """A job's slots return to every pool holding some (a tree's: several)."""
        for alloc in self.allocators.values():
            if job.job_id in alloc.jobs:
                alloc.remove_job(job.job_id)

    # -- programming -------------------------------------------------------------------------

    def _switch_job(self, job: Job, name: str) -> SwitchJob:
        """Switch ``name``'s entries for ``job``: its ranks, or its part of the job's tree."""
        if job.tree is not None:
            t = job.tree
            places = {n: self.allocators[n].jobs[job.job_id].active for n in t.switches}
            if t.host_root:     # the root's window is the host aggregator's
                places[t.tree.root] = self.allocators[HOST_POOL].jobs[job.job_id].active
            return tree_switch_job(self.config, t.tree, name, job, job.rows[name], places,
                                   host_root=t.host_root)
        atp = self.atp_switch(job) == name
        p = self.allocators[HOST_POOL if atp else name].jobs[job.job_id].active
        bindings = worker_bindings(job, self.switches[name].cfg, sorted(job.workers))
        return SwitchJob(job.job_id, job.rows[name], p.epoch, p.slot_base, p.slot_count,
                         tuple(bindings), job.transport, atp=atp)

    def switch_jobs(self, name: str, jobs: dict[int, Job]) -> list[SwitchJob]:
        """The jobs switch ``name`` should hold now (a switch grant in its allocator), each with
        a job row (counter index): a job off the switch gives its row back, one new on it takes
        the lowest free row."""
        alloc = self.allocators[name]
        on_switch = [j for j in sorted(jobs.values(), key=lambda j: j.job_id)
                     if j.job_id in alloc.jobs and alloc.jobs[j.job_id].active.mode == SWITCH
                     or self.atp_switch(j) == name and not j.failure]
        for job in jobs.values():
            if name in job.rows and job not in on_switch:
                del job.rows[name]
        used = {j.rows[name] for j in on_switch if name in j.rows}
        for job in on_switch:
            if name not in job.rows:
                free = set(range(self.switches[name].capacity.job_rows)) - used
                if not free:  # the allocator admits no more jobs than rows: a bug if reached
                    raise RuntimeError(f"switch {name}: no free job row for job {job.job_id}")
                job.rows[name] = min(free)
                used.add(job.rows[name])
        return [self._switch_job(j, name) for j in on_switch]

    def program(self, jobs: dict[int, Job], *, force: bool = False) -> None:
        """Program every switch whose desired entries changed; raises when one refuses.
        ``force`` (after a rollback): program every switch, logging the ones that fail (the
        keeper retries them)."""
        for name, sw in self.switches.items():
            wanted = self.switch_jobs(name, jobs)
            if wanted == sw.wanted and not force:
                continue           # unchanged; a switch that is down is the keeper's
            try:
                sw.program(wanted)
            except SwitchError as e:
                if not force:
                    raise
                log.warning("switch %s: %s (the keeper retries)", name, e)

    # -- switch keeper -----------------------------------------------------------------------

    def reconnect(self, name: str, lock: threading.RLock) -> None:
        """Take a new session to switch ``name`` when its stream broke (it restarted), or push
        our pipeline again when its pipeline is not ours any more; raises while it is down.
        Connecting happens outside ``lock``, adopting the session under it."""
        sw = self.switches[name]
        if sw.sw.lost.is_set():
            log.warning("switch %s: P4Runtime stream lost; reconnecting", name)
            session = sw.reconnect()
            with lock:
                sw.adopt(session)
        elif sw.sw.restore_pipeline():
            log.warning("switch %s: its pipeline was gone or replaced; pushed ours again", name)
            with lock:
                sw.adopt(None)

    def reprogram(self, name: str, jobs: dict[int, Job], audit_seconds: float) -> bool:
        """Program switch ``name`` where what it holds is not known (it restarted, a failed sync
        left it so, another primary was elected since: it is read back in full), else audit it
        (read back in full, drift repaired) when its last full read is ``audit_seconds`` old;
        True when it was re-programmed. A switch whose primary this session is not is left
        alone (its writes would be refused) until it is again: a new election, so re-programmed."""
        sw = self.switches[name]
        if not sw.sw.primary:
            return False
        if sw.applied is None or not sw.knows():
            sw.program(self.switch_jobs(name, jobs))
            log.warning("switch %s re-programmed (%d job(s))", name, len(sw.applied))
            return True
        if sw.audit_due(audit_seconds):
            sw.reconcile(sw.applied, audit=True)
        return False

    def installed_jobs(self) -> tuple[dict[str, dict[int, int]], int]:
        """What the switches hold now, read over P4Runtime before anything is programmed:
        ({switch: {job id: epoch}} from their ``job_table`` rows, the highest job-id mark kept
        on any of them: ``JobAdmission.mark_update``). A switch that cannot be read is logged
        and counts as holding nothing (the controller cannot know)."""
        out: dict[str, dict[int, int]] = {}
        mark = 0
        for name, sw in self.switches.items():
            try:
                out[name] = {key["job_id"]: params.get("epoch", 0)
                             for key, _, params in sw.sw.table_entries("job_table")}
                for key, _, params in sw.sw.table_entries("worker_table"):
                    mark = max(mark, JobAdmission.mark_of(key, params) or 0)
            except SwitchError as e:
                log.warning("switch %s: cannot read the jobs it holds (%s)", name, e)
                out[name] = {}
        return out, mark

    def keep_id_mark(self, next_job_id: int) -> None:
        """Every switch keeps ``next_job_id`` as its job-id mark from its next reconcile on
        (every placement on a switch reconciles it: the mark is there before any slot of a
        job with a higher id is)."""
        for sw in self.switches.values():
            sw.id_mark = next_job_id

    def close(self) -> None:
        for sw in self.switches.values():
            sw.sw.close()


def atp_pool(config: ControllerConfig, name: str, slots: int) -> AtpPoolBinding:
    """Switch ``name``'s ATP pool under ``sharing = "atp"``: its first ``atp_pool`` slots (0:
    all), for the host aggregator's jobs; its sums leave from its aggregator address (config.load checked that
    every switch has its MAC and that there is a host aggregator)."""
    cfg = next(s for s in config.switches if s.name == name)
    if not 0 <= config.atp_pool <= slots:
        raise ValueError(f"sharing atp: atp_pool = {config.atp_pool}, but switch {name} has {slots} slots "
                         f"(0 gives it all of them)")
    host_ip, host_port = parse_address(config.host_aggregator)
    switch_ip, switch_port = parse_address(cfg.aggregator)
    return AtpPoolBinding(host_ip, host_port, 0, config.atp_pool or slots, cfg.aggregator_mac, switch_ip,
                          switch_port)


def check_atp_k(config: ControllerConfig, name: str, k: int) -> None:
    """An ATP job's packets are the host aggregator's grant's and go through switch ``name``'s
    pool, so both must take the same K; ValueError saying what to set."""
    if config.host_values_per_packet != k:
        raise ValueError(f"sharing atp: switch {name} takes {k} values per packet, the host aggregator "
                         f"{config.host_values_per_packet}: set host_values_per_packet = {k} (and run the "
                         f"host aggregator at it), since an ATP job's packets are summed at either")

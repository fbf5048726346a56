"""Slot allocation across concurrent jobs: pure policy, no I/O.

The switch's slot pool is shared by the jobs the controller admits; a job that finds no room is
granted host aggregation at once instead of waiting. The policy, and why:

* **Minimum window, in aligned chunks.** A job gets at least ``min_window`` switch slots or none:
  fewer slots cannot hide the round-trip time and the job would run slower on the switch than
  on a host. Ranges are whole chunks of ``min_window`` slots on chunk boundaries, so freed space
  never fragments below a minimum window: a job waiting for the switch fits in any free chunk.
* **Demand-proportional shares.** Among the jobs on the switch (earliest arrivals first, as many
  as minimum windows fit), the pool is divided in proportion to demand (bytes per iteration /
  iteration time: the rate its allreduces must sustain), never beyond what a job can use (its
  blocks per iteration). A heavier communicator needs a wider window for the same slowdown.
* **Contiguous ranges, make-before-break.** A job's slots are one range (one table entry).
  Shrinking keeps the base; growing and upgrading take only slots no other job holds, actively
  or in a pending grant. A changed grant is *pending* until the job's workers activate it at an
  allreduce boundary they agree on; the slots it gives up stay held until then. So two jobs
  never aggregate into the same slot, even while grants change under running traffic.
* **Every change is a new epoch**, monotonic per job (job ids are never reused), so a slot's
  owner tag tells a new grant from any earlier one.
* **Sharing: dynamic or static** (``sharing``, per deployment). ``dynamic`` (the default) is
  the policy above. ``static`` gives every job on the switch one fixed, equal share, a minimum
  window, from its placement to its end: never grown into slots nobody uses, never shrunk for
  a newcomer (ATP's static partitioning, the baseline its dynamic sharing is measured against);
  a job that finds no free share runs on the host aggregator and is upgraded to the next share
  that frees up, as under ``dynamic``. ``atp`` gives no job a window: every job holds a
  host-aggregator grant and its switch shares all its slots round by round (ATP's pool,
  docs/atp.md; ``Fabric.atp_switch``), so a switch allocator under it holds no jobs.
* **Upgrades and growth** happen whenever slots free up (a job leaves, its lease expires, or a
  shrink is activated): host jobs move to the switch in arrival order, then switch jobs grow.
* **Tree parts are fixed.** A job aggregating on a tree of switches (docs/trees.md) holds one
  minimum window on each switch of it, taken on all of them at once (``reserve``); the policy
  never resizes, moves or evicts it (every level must keep the same range size and epoch), and
  counts its window, its row and its children against what the other jobs can have.

Invariants (property-tested in tests/test_allocator.py): active switch ranges never overlap,
no slot is held by two jobs, all slots return to the pool when jobs leave, and every job
always has a valid grant.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

SWITCH, HOST = "switch", "host"
DYNAMIC, STATIC, ATP = "dynamic", "static", "atp"
SHARING = (DYNAMIC, STATIC, ATP)   # how the pool is shared among the jobs on the switch (the docstring)
# The host aggregator's pool: the key of its allocator and the place of a job no switch holds (no
# switch can be named "", so it never meets a switch's name).
HOST_POOL = ""
NO_JOB = 0   # job ids start at 1: excluding job 0 excludes none


@dataclass(frozen=True)
class Demand:
    """What a job declared when it registered."""

    n_workers: int
    bytes_per_iteration: int = 0
    iteration_seconds: float = 1.0

    @property
    def rate(self) -> float:
        return self.bytes_per_iteration / max(self.iteration_seconds, 1e-9)


@dataclass(frozen=True)
class Placement:
    """Where a job aggregates (``mode``), its slot range there and the grant's epoch."""

    mode: str
    slot_base: int
    slot_count: int
    epoch: int

    def slots(self) -> range:
        return range(self.slot_base, self.slot_base + self.slot_count)

    def describe(self) -> str:
        """Where, in words: ``switch slots 64-127`` or ``the host aggregator``."""
        if self.mode == SWITCH:
            return f"switch slots {self.slot_base}-{self.slot_base + self.slot_count - 1}"
        return "the host aggregator"

    def same_place(self, other: "Placement") -> bool:
        return (self.mode, self.slot_base, self.slot_count) == (other.mode, other.slot_base, other.slot_count)


@dataclass
class JobState:
    job_id: int
    demand: Demand
    active: Placement
    pending: Placement | None = None
    drained: bool = False  # pinned to host aggregation by the operator
    order: int = 0
    fixed: bool = False    # a part of an aggregation tree: held as placed (``reserve``)
    children: int = 0      # worker entries it takes here when not its ranks (a tree's part)

    @property
    def intended(self) -> Placement:
        return self.pending or self.active

    @property
    def entries(self) -> int:
        """worker_table entries the job takes on this switch."""
        return self.children or self.demand.n_workers


@dataclass(frozen=True)
class AllocatorSnapshot:
    """An allocator's whole state at one moment (``SlotAllocator.snapshot``): its job states and
    its arrival counter, which orders the jobs and so must roll back with them."""

    jobs: dict[int, JobState]
    arrivals: int


@dataclass
class SlotAllocator:
    """Grants for all jobs over one switch pool and one host-aggregator pool."""

    switch_slots: int
    min_window: int = 8
    values_per_packet: int = 64
    host_slots: int = 4096
    host_window: int = 32
    host_base: int = 0  # this allocator's share of a host pool shared with other allocators
    # What the switch can hold besides slots (read from its P4Info by the controller): job rows
    # (job_table, counter rows), ranks of one job (the slot's worker bitmap) and ranks of all
    # its jobs together (worker_table, replica_table). A job that does not fit runs on host.
    max_jobs: int = 1 << 30
    max_job_workers: int = 1 << 30
    worker_entries: int = 1 << 30
    sharing: str = DYNAMIC
    jobs: dict[int, JobState] = field(default_factory=dict)
    _arrivals: int = 0

    def __post_init__(self) -> None:
        if self.sharing not in SHARING:
            raise ValueError(f"sharing {self.sharing!r}: write one of {', '.join(SHARING)}")

    # -- snapshots ---------------------------------------------------------------------------

    def snapshot(self) -> AllocatorSnapshot:
        """A copy of the state that ``restore`` brings back (the controller's rollback of a
        change that failed half way)."""
        return AllocatorSnapshot(copy.deepcopy(self.jobs), self._arrivals)

    def restore(self, snapshot: AllocatorSnapshot) -> None:
        """Put back the state of ``snapshot``, which stays usable (it is copied, not adopted)."""
        self.jobs = copy.deepcopy(snapshot.jobs)
        self._arrivals = snapshot.arrivals

    # -- events ------------------------------------------------------------------------------

    def add_job(self, job_id: int, demand: Demand) -> Placement:
        """Register a job: on the switch if a minimum window is free now, else on host."""
        if job_id in self.jobs:
            raise ValueError(f"job {job_id} exists")
        if demand.n_workers < 1:
            raise ValueError("a job needs at least one worker")
        self._arrivals += 1
        base = self._free_run(SWITCH, self.min_window, job_id)
        if base is not None and self._room_for(demand.n_workers, self._switch_holders(job_id)):
            active = Placement(SWITCH, base, self.min_window, 1)
        else:
            active = self._host_placement(job_id, 1)
        self.jobs[job_id] = JobState(job_id, demand, active, order=self._arrivals)
        self.rebalance()
        return active

    def can_reserve(self, children: int) -> bool:
        """Whether a tree part of ``children`` children fits now: a free minimum window, a
        job row and the worker entries."""
        return (self._free_run(SWITCH, self.min_window, NO_JOB) is not None
                and self._room_for(children, self._switch_holders(NO_JOB)))

    def reserve(self, job_id: int, demand: Demand, mode: str, children: int) -> Placement:
        """Hold a fixed minimum window of ``mode`` (SWITCH: this switch's part of the job's
        aggregation tree; HOST: the host aggregator as the tree's root) for job ``job_id``, as
        its epoch 1, never resized; RuntimeError when none is free (check ``can_reserve``)."""
        if job_id in self.jobs:
            raise ValueError(f"job {job_id} exists")
        base = self._free_run(mode, self.min_window, job_id)
        if base is None or (mode == SWITCH and not self._room_for(children, self._switch_holders(job_id))):
            raise RuntimeError(f"no free {mode} window for job {job_id}'s aggregation tree")
        self._arrivals += 1
        active = Placement(mode, base, self.min_window, 1)
        self.jobs[job_id] = JobState(job_id, demand, active, order=self._arrivals, fixed=True,
                                     children=children)
        return active

    def restore_job(self, state: JobState) -> None:
        """Reinstate a job exactly as persisted (controller restart); no rebalancing."""
        self.jobs[state.job_id] = state
        self._arrivals = max(self._arrivals, state.order)

    def remove_job(self, job_id: int) -> None:
        """A job left or its lease expired: its slots return to the pool."""
        if self.jobs.pop(job_id, None) is not None:
            self.rebalance()

    def drain(self, job_id: int) -> Placement:
        """Operator request: move a job to host aggregation (as a pending grant)."""
        job = self.jobs[job_id]
        job.drained = True
        self.rebalance()
        return job.intended

    def activate(self, job_id: int, epoch: int) -> bool:
        """The job's workers agreed to use pending grant ``epoch``: True when it is active now,
        False when the job has no such pending grant (superseded by a newer one)."""
        job = self.jobs[job_id]
        if job.active.epoch == epoch:
            return True
        if job.pending is None or job.pending.epoch != epoch:
            return False
        p = job.pending
        if p.mode == SWITCH and job.active.mode != SWITCH and not self._room_for(
                job.entries, [j for j in self.jobs.values() if j.job_id != job_id and j.active.mode == SWITCH]):
            return False  # a job leaving the switch has not let go of its row yet: next boundary
        if p.mode == SWITCH:
            for other in self.jobs.values():
                if other.job_id != job_id and other.active.mode == SWITCH and \
                        set(other.active.slots()) & set(p.slots()):
                    raise RuntimeError(f"allocator bug: job {job_id} epoch {epoch} overlaps job {other.job_id}")
        job.active, job.pending = p, None
        self.rebalance()
        return True

    def restart(self, job_id: int, to_host: bool) -> Placement:
        """The job's workers found a slot that makes no progress (its state holds a round no
        resend completes): its active place again under a fresh epoch, which every aggregator
        takes as a new slot owner and so resets each slot on its next packet; with ``to_host``
        (the stall came back on the fresh epoch) the host aggregator instead, where it stays
        (pinned, as a drained job). A pending grant is dropped (its epoch is below the new one);
        the policy proposes again."""
        job = self.jobs[job_id]
        epoch = max(job.active.epoch, job.pending.epoch if job.pending else 0) + 1
        if to_host:
            job.drained = True
            p = self._host_placement(job_id, epoch)
        else:
            p = Placement(job.active.mode, job.active.slot_base, job.active.slot_count, epoch)
        job.active, job.pending = p, None
        self.rebalance()
        return p

    # -- policy ------------------------------------------------------------------------------

    def rebalance(self) -> None:
        """Move every job's pending grant toward the policy's target."""
        on_switch = self._switch_set()
        shares = self._shares(on_switch)
        for job in self._by_arrival():
            if job.job_id not in shares and job.intended.mode == SWITCH and not job.fixed:
                self._propose(job, self._host_placement(job.job_id, 0))        # drained/evicted
        for job in on_switch:                                                  # shrink in place
            cur = job.intended
            if cur.mode == SWITCH and cur.slot_count > shares[job.job_id]:
                self._propose(job, Placement(SWITCH, cur.slot_base, shares[job.job_id], 0))
        for job in on_switch:                                                  # upgrade
            if job.intended.mode == HOST:
                base = self._free_run(SWITCH, self.min_window, job.job_id)
                if base is None:
                    continue
                room = self._run_length(base, job.job_id)
                self._propose(job, Placement(SWITCH, base, min(shares[job.job_id], self._chunks(room)), 0))
        for job in on_switch:                                                  # grow
            cur = job.intended
            if cur.mode == SWITCH and cur.slot_count < shares[job.job_id]:
                end = cur.slot_base + cur.slot_count
                grow = self._chunks(min(self._run_length(end, job.job_id),
                                        shares[job.job_id] - cur.slot_count))
                if grow > 0:
                    self._propose(job, Placement(SWITCH, cur.slot_base, cur.slot_count + grow, 0))

    def useful_window(self, demand: Demand) -> int:
        """Slots beyond the job's blocks per iteration would never be used."""
        if not demand.bytes_per_iteration:
            return self.switch_slots
        blocks = -(-demand.bytes_per_iteration // (4 * self.values_per_packet))
        return max(self.min_window, blocks)

    def _by_arrival(self) -> list[JobState]:
        return sorted(self.jobs.values(), key=lambda j: j.order)

    def _switch_holders(self, exclude: int) -> list[JobState]:
        """Jobs other than ``exclude`` holding switch rows, actively or in a pending grant."""
        return [j for j in self.jobs.values() if j.job_id != exclude and
                (j.active.mode == SWITCH or (j.pending is not None and j.pending.mode == SWITCH))]

    def _room_for(self, entries: int, holders: list[JobState]) -> bool:
        """Whether the switch can hold one more job of ``entries`` worker entries (its ranks,
        or a tree part's children) beside ``holders``."""
        return (len(holders) < min(self.switch_slots // self.min_window, self.max_jobs)
                and entries <= self.max_job_workers
                and sum(j.entries for j in holders) + entries <= self.worker_entries)

    def _fixed(self) -> list[JobState]:
        """The tree parts held on the switch (never moved by the policy)."""
        return [j for j in self.jobs.values() if j.fixed and j.active.mode == SWITCH]

    def _switch_set(self) -> list[JobState]:
        """Jobs the policy puts on the switch beside its tree parts: earliest arrivals, as
        many as minimum windows, job rows and worker entries allow."""
        chosen: list[JobState] = []
        fixed = self._fixed()
        for j in self._by_arrival():
            if not j.drained and not j.fixed and self._room_for(j.entries, fixed + chosen):
                chosen.append(j)
        return chosen

    def _shares(self, jobs: list[JobState]) -> dict[int, int]:
        """Demand-proportional shares in slots: whole chunks, at least one, at most the
        job's useful window (rounded down to chunks); under static sharing one chunk each."""
        chunk = self.min_window
        if self.sharing == STATIC:
            return {j.job_id: chunk for j in jobs}
        useful = {j.job_id: max(1, self.useful_window(j.demand) // chunk) for j in jobs}
        shares = {j.job_id: 1 for j in jobs}
        left = (self.switch_slots - sum(j.active.slot_count for j in self._fixed())) // chunk - len(jobs)
        while left > 0:
            open_jobs = [j for j in jobs if shares[j.job_id] < useful[j.job_id]]
            if not open_jobs:
                break
            total = sum(max(j.demand.rate, 1e-9) for j in open_jobs)
            given = 0
            for j in open_jobs:
                room = useful[j.job_id] - shares[j.job_id]
                add = min(room, int(left * max(j.demand.rate, 1e-9) / total))
                shares[j.job_id] += add
                given += add
            if given == 0:  # rounding remainder: one slot each, earliest first
                for j in open_jobs[:left]:
                    shares[j.job_id] += 1
                    given += 1
            left -= given
        return {job_id: n * chunk for job_id, n in shares.items()}

    def _chunks(self, slots: int) -> int:
        """``slots`` rounded down to whole chunks (ranges never end mid-chunk)."""
        return slots // self.min_window * self.min_window

    def _propose(self, job: JobState, p: Placement) -> None:
        if job.intended.same_place(p):
            return
        epoch = max(job.active.epoch, job.pending.epoch if job.pending else 0) + 1
        if job.active.same_place(p):  # back to where it already is: drop the pending change
            job.pending = None
            return
        job.pending = Placement(p.mode, p.slot_base, p.slot_count, epoch)

    def _held(self, mode: str, exclude: int) -> set[int]:
        """Slots of ``mode`` held by any other job, actively or in a pending grant."""
        held: set[int] = set()
        for j in self.jobs.values():
            if j.job_id == exclude:
                continue
            for p in (j.active, j.pending):
                if p is not None and p.mode == mode:
                    held.update(p.slots())
        return held

    def _free_run(self, mode: str, length: int, job_id: int) -> int | None:
        """First base, on a ``length`` boundary, of ``length`` slots no other job holds."""
        held = self._held(mode, job_id)
        start, size = (0, self.switch_slots) if mode == SWITCH else (self.host_base, self.host_slots)
        for base in range(start, start + size - length + 1, length):
            if held.isdisjoint(range(base, base + length)):
                return base
        return None

    def _run_length(self, base: int, job_id: int) -> int:
        """Free switch slots from ``base`` on, up to the first one another job holds."""
        held = self._held(SWITCH, job_id)
        n = 0
        while base + n < self.switch_slots and base + n not in held:
            n += 1
        return n

    def _host_placement(self, job_id: int, epoch: int) -> Placement:
        job = self.jobs.get(job_id)
        for p in (job.active, job.pending) if job else ():
            if p is not None and p.mode == HOST:
                return Placement(HOST, p.slot_base, p.slot_count, epoch)
        base = self._free_run(HOST, self.host_window, job_id)
        if base is None:
            raise RuntimeError("host aggregator pool exhausted")
        return Placement(HOST, base, self.host_window, epoch)

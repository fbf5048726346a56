"""Placing a job on its aggregation tree (docs/trees.md): whether a tree can carry the job at
all, and taking its windows on every switch of the tree in one go, or degrading.

A job whose ranks hang off several linked switches needs, on every switch of its tree, a
minimum window of slots, a job row and a worker entry per child (its ranks there and its child
switches): the same window size everywhere and one epoch (1: a tree part is fixed,
``SlotAllocator.reserve``). In order:

* every switch of the tree has room: the job aggregates on the whole tree;
* only the root switch is full: the switches below it aggregate and the host aggregator is the
  root (each child switch of the root a member of its host job), where it can be: the root has
  no ranks of its own, the host aggregator takes the switches' K (values per packet) and hangs
  off a switch linked to the tree;
* else: the host aggregator aggregates the whole job (``tree_refusal`` says why).

The caller's transaction (``Controller._change``) makes the reservations all or nothing: a
switch that refuses its entries rolls every allocator back. A job stays where it was placed
until it ends: a tree part is never resized, and a job that fell back to the host aggregator is
not moved onto a tree later.
"""

from __future__ import annotations

import json
from dataclasses import asdict

from inagg.hostlib.wire.grant import parse_address

from inagg.controller.allocator import HOST, HOST_POOL, SWITCH, SlotAllocator
from inagg.controller.config import ControllerConfig
from inagg.controller.jobs import Job
from inagg.controller.runtime import SwitchRuntime
from inagg.controller.store import state_from_dict
from inagg.controller.trees import JobTree, TreePlace, aggregator_of, host_aggregator_at, job_tree, toward


def job_ips(job: Job) -> set[str]:
    """The IPv4 addresses of a job's joined ranks."""
    return {parse_address(m.address)[0] for m in job.workers.values()}


def rank_switches(config: ControllerConfig, job: Job) -> dict[int, str] | None:
    """Each rank's switch (the first that has its address as a host); None when one has none."""
    where: dict[str, str] = {}
    for s in config.switches:
        for ip in s.hosts:
            where.setdefault(ip, s.name)
    ips = {r: parse_address(m.address)[0] for r, m in job.workers.items()}
    if not set(ips.values()) <= set(where):
        return None
    return {r: where[ip] for r, ip in ips.items()}


def carry_refusal(switches: dict[str, SwitchRuntime], job: Job, tree: JobTree) -> str:
    """Why the switches of ``tree`` cannot carry ``job`` whatever their room; "" when they can."""
    if job.transport != "udp":
        return f"aggregation trees carry UDP jobs only, not {job.transport} (docs/trees.md)"
    lacking = [n for n in tree.switches if not switches[n].capacity.trees]
    if lacking:
        return (f"switch(es) {', '.join(lacking)} of its aggregation tree run a program without "
                f"uplink_table (docs/tofino.md)")
    try:
        for n in tree.switches:
            aggregator_of(switches[n].cfg)
    except ValueError as e:
        return str(e)
    ks = {n: switches[n].p4info.values_per_packet for n in tree.switches}
    if len(set(ks.values())) > 1:
        return ("the switches of its aggregation tree carry different values per packet ("
                + ", ".join(f"{n}: {k}" for n, k in ks.items()) + ")")
    return ""


def host_root_refusal(config: ControllerConfig, switches: dict[str, SwitchRuntime],
                      tree: JobTree) -> str:
    """Why the host aggregator cannot stand in for ``tree``'s root switch; "" when it can."""
    root = tree.root
    if tree.ranks[root]:
        return f"ranks {', '.join(map(str, tree.ranks[root]))} hang off its root switch {root}"
    k = switches[root].p4info.values_per_packet
    if config.host_values_per_packet != k:
        return (f"the host aggregator takes {config.host_values_per_packet} values per packet, "
                f"the switches {k}")
    at = host_aggregator_at(config)
    if at is None or (at[0] != root and at[0] not in toward(config, root)):
        return (f"the host aggregator {config.host_aggregator} is a host of no switch linked to "
                f"{root}")
    return ""


def tree_of(config: ControllerConfig, job: Job) -> JobTree | str:
    """The job's tree when its ranks hang off two or more switches, else why it has none."""
    rank_switch = rank_switches(config, job)
    if rank_switch is None:
        return "some of its worker addresses are hosts of no switch"
    if len(set(rank_switch.values())) < 2:
        return "its workers hang off one switch"
    try:
        return job_tree(config, rank_switch)
    except ValueError as e:
        return str(e)


def place_tree(config: ControllerConfig, switches: dict[str, SwitchRuntime],
               allocators: dict[str, SlotAllocator], job: Job) -> TreePlace | None:
    """Reserve ``job``'s windows on its tree (with the host aggregator as its root when only
    the root switch is full); None, reserving nothing, when the job gets no tree."""
    tree = tree_of(config, job)
    if isinstance(tree, str) or carry_refusal(switches, job, tree):
        return None
    full = [n for n in tree.switches if not allocators[n].can_reserve(tree.n_children(n))]
    if full and (full != [tree.root] or host_root_refusal(config, switches, tree)):
        return None
    place = TreePlace(tree, host_root=bool(full))
    for name in place.switches:
        allocators[name].reserve(job.job_id, job.demand, SWITCH, tree.n_children(name))
    if place.host_root:
        allocators[HOST_POOL].reserve(job.job_id, job.demand, HOST, tree.n_children(tree.root))
    return place


def tree_refusal(config: ControllerConfig, switches: dict[str, SwitchRuntime], job: Job) -> str:
    """Why a job spanning switches runs on the host aggregator, in words its workers log."""
    tree = tree_of(config, job)
    if isinstance(tree, str):
        return tree
    if why := carry_refusal(switches, job, tree):
        return why
    names = ", ".join(tree.switches)
    return (f"its aggregation tree ({names}) had no room for it when it was placed: a job "
            f"spanning switches needs a minimum window, a job row and its children's worker "
            f"entries on each (the host aggregator stands in for a full root switch only: "
            f"{host_root_refusal(config, switches, tree) or 'a switch below the root was full'})")


def tree_record(job: Job, allocators: dict[str, SlotAllocator]) -> str | None:
    """What the store keeps of a tree job beside its root's state: its tree, its job rows and
    its other parts' states (JSON); None for a job on no tree."""
    if job.tree is None:
        return None
    states = {name: asdict(a.jobs[job.job_id]) for name, a in allocators.items()
              if name != job.place and job.job_id in a.jobs}
    return json.dumps({"tree": job.tree.as_dict(), "rows": job.rows, "states": states})


def restore_tree(job: Job, record: str, allocators: dict[str, SlotAllocator]) -> None:
    """Bring back what ``tree_record`` kept (controller restart)."""
    d = json.loads(record)
    job.tree = TreePlace.from_dict(d["tree"])
    job.rows = dict(d["rows"])
    for name, state in d["states"].items():
        allocators[name].restore_job(state_from_dict(state))

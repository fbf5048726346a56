"""A job's aggregation tree over the configured switch links (docs/trees.md): pure functions.

The switches and their links (``SwitchConfig.links``) form a forest. A job whose ranks hang off
several switches aggregates on the smallest subtree holding all of them: the union of the paths
between those switches. Its root is the subtree's center (the switch whose farthest switch is
nearest; ties by name), so a leaf-spine job of two ToRs is rooted at the spine. Each switch's
children are its own ranks, known by their job ranks, and its child switches, known by the
smallest ids none of its ranks uses (bits of the parent's bitmap, below ``MAX_WORKERS``).

A placed job's tree (``TreePlace``) may have the host aggregator in its root's place (the root
switch had no room): the root's child switches send up to it, each the member of the host
job at its child id. Frames between switches that no switch aggregates (a job on the host
aggregator, a host root's traffic) are forwarded by MAC along the links (``l2_routes``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from inagg.hostlib.wire.grant import parse_address
from inagg.hostlib.wire.protocol import MAX_WORKERS

from inagg.controller.allocator import Placement
from inagg.controller.config import ControllerConfig, HostPort, SwitchConfig
from inagg.controller.switch import SwitchJob, UplinkBinding, WorkerBinding

if TYPE_CHECKING:
    from inagg.controller.jobs import Job


@dataclass(frozen=True)
class JobTree:
    """Where a job aggregates: ``parent`` of every switch of the tree (None: the root) and the
    job ranks attached to each."""

    root: str
    parent: dict[str, str | None]
    ranks: dict[str, tuple[int, ...]]

    @property
    def switches(self) -> list[str]:
        return sorted(self.parent)

    def child_switches(self, name: str) -> list[str]:
        return sorted(s for s, p in self.parent.items() if p == name)

    def child_ids(self, name: str) -> dict[str, int]:
        """The ids switch ``name`` knows its child switches by: the smallest its ranks leave."""
        free = (i for i in range(MAX_WORKERS) if i not in self.ranks.get(name, ()))
        return {child: next(free) for child in self.child_switches(name)}

    def n_children(self, name: str) -> int:
        """Contributions that complete a round at switch ``name``."""
        return len(self.ranks.get(name, ())) + len(self.child_switches(name))


@dataclass(frozen=True)
class TreePlace:
    """A job placed on its tree; ``host_root``: the host aggregator stands in for the root
    switch, which holds nothing of the job."""

    tree: JobTree
    host_root: bool = False

    @property
    def switches(self) -> list[str]:
        """The switches that aggregate the job."""
        return [s for s in self.tree.switches if not (self.host_root and s == self.tree.root)]

    def describe(self) -> str:
        """The tree in words: each aggregating switch with its ranks, and the root."""
        parts = ", ".join(f"{s} (ranks {', '.join(map(str, self.tree.ranks[s]))})" if self.tree.ranks[s]
                          else s for s in self.switches)
        root = "the host aggregator" if self.host_root else self.tree.root
        return f"aggregation tree over {parts}; root {root}"

    def as_dict(self) -> dict:
        t = self.tree
        return {"root": t.root, "parent": t.parent, "ranks": {k: list(v) for k, v in t.ranks.items()},
                "host_root": self.host_root}

    @classmethod
    def from_dict(cls, d: dict) -> "TreePlace":
        ranks = {k: tuple(v) for k, v in d["ranks"].items()}
        return cls(JobTree(d["root"], dict(d["parent"]), ranks), d["host_root"])


def subtree(config: ControllerConfig, members: set[str]) -> set[str]:
    """The smallest set of linked switches connecting ``members``: their component of the link
    forest with every leaf that is not a member pruned, again and again. ValueError when they
    are not all linked."""
    links = {s.name: set(s.links) for s in config.switches}
    start = min(members)
    component, stack = {start}, [start]
    while stack:
        for other in links[stack.pop()] - component:
            component.add(other)
            stack.append(other)
    if not members <= component:
        raise ValueError(f"switches {', '.join(sorted(members - component))} are not linked to "
                         f"{start}: no aggregation tree holds every rank")
    nodes = set(component)
    while leaves := {n for n in nodes - members if len(links[n] & nodes) <= 1}:
        nodes -= leaves
    return nodes


def center(config: ControllerConfig, nodes: set[str]) -> str:
    """The node of tree ``nodes`` whose farthest node is nearest (ties: the first name)."""
    links = {s.name: set(s.links) & nodes for s in config.switches if s.name in nodes}

    def height(root: str) -> int:
        depth, frontier, seen = 0, {root}, {root}
        while frontier := {o for n in frontier for o in links[n]} - seen:
            seen |= frontier
            depth += 1
        return depth

    return min(sorted(nodes), key=height)


def job_tree(config: ControllerConfig, rank_switch: dict[int, str]) -> JobTree:
    """The job's tree: ``rank_switch`` gives each rank's switch. ValueError (naming why) when
    the ranks' switches are not linked."""
    nodes = subtree(config, set(rank_switch.values()))
    root = center(config, nodes)
    links = {s.name: set(s.links) & nodes for s in config.switches if s.name in nodes}
    parent: dict[str, str | None] = {root: None}
    frontier = [root]
    while frontier:
        name = frontier.pop()
        for other in sorted(links[name] - set(parent)):
            parent[other] = name
            frontier.append(other)
    ranks = {name: tuple(sorted(r for r, s in rank_switch.items() if s == name)) for name in nodes}
    return JobTree(root, parent, ranks)


def toward(config: ControllerConfig, name: str) -> dict[str, int]:
    """Every switch linked to switch ``name``, directly or through others: ``name``'s
    front-panel port on the way to it (links form a forest: one way)."""
    links = {s.name: s.links for s in config.switches}
    out: dict[str, int] = {}
    frontier = list(links[name].items())
    while frontier:
        other, port = frontier.pop()
        if other != name and other not in out:
            out[other] = port
            frontier += [(n, port) for n in links[other]]
    return out


def l2_routes(config: ControllerConfig, name: str) -> dict[str, int]:
    """MAC -> front-panel port on switch ``name`` for the hosts and aggregator addresses of
    every switch linked to it (its own hosts are its own business)."""
    cfgs = {s.name: s for s in config.switches}
    routes = {}
    for other, port in toward(config, name).items():
        macs = [h.mac for h in cfgs[other].hosts.values()] + [cfgs[other].aggregator_mac]
        routes.update((m, port) for m in macs if m)
    return routes


def host_aggregator_at(config: ControllerConfig) -> tuple[str, HostPort] | None:
    """The switch the host aggregator hangs off and its port there (the switch that has its
    address as a host); None when none has."""
    ip = parse_address(config.host_aggregator)[0]
    return next(((s.name, s.hosts[ip]) for s in config.switches if ip in s.hosts), None)


def worker_bindings(job: Job, cfg: SwitchConfig, ranks: Iterable[int]) -> list[WorkerBinding]:
    """How switch ``cfg`` knows ``ranks`` of ``job``: the port of each rank's host, its IPv4,
    MAC (the configured one, else the one it joined with), UDP port and RoCE QP/rkey."""
    out = []
    for rank in ranks:
        m = job.workers[rank]
        ip, udp_port = parse_address(m.address)
        host = cfg.hosts[ip]
        out.append(WorkerBinding(rank, cfg.device_port(host.port), ip, host.mac or m.mac, udp_port,
                                 m.qp, m.rkey))
    return out


def aggregator_of(cfg: SwitchConfig) -> tuple[str, int, str]:
    """(IPv4, UDP port, MAC) of a tree switch's aggregator address; ValueError without a MAC
    (the frames between switches are addressed by it)."""
    if not cfg.aggregator_mac:
        raise ValueError(f"switch {cfg.name} has no aggregator_mac: the switches of an "
                         f"aggregation tree address each other by it (config)")
    ip, port = parse_address(cfg.aggregator)
    return ip, port, cfg.aggregator_mac


def uplink(config: ControllerConfig, tree: JobTree, name: str, parent_slot_base: int, *,
           host_root: bool = False) -> UplinkBinding:
    """Where switch ``name`` (not the root) sends its partial sums: its parent's aggregator
    address through the link to it, or, when ``host_root`` and its parent is the root, the
    host aggregator's (its MAC the one its switch lists, the port the one toward it)."""
    cfgs = {s.name: s for s in config.switches}
    cfg, parent = cfgs[name], tree.parent[name]
    ip, port, mac = aggregator_of(cfg)
    rank = tree.child_ids(parent)[name]
    if host_root and parent == tree.root:
        at = host_aggregator_at(config)
        if at is None:
            raise ValueError(f"the host aggregator {config.host_aggregator} is a host of no "
                             f"switch: switch {name} has no way up to it (config)")
        out = at[1].port if at[0] == name else toward(config, name)[at[0]]
        up_ip, up_port = parse_address(config.host_aggregator)
        return UplinkBinding(cfg.device_port(out), rank, parent_slot_base, at[1].mac, up_ip,
                             up_port, mac, ip, port)
    up_ip, up_port, up_mac = aggregator_of(cfgs[parent])
    return UplinkBinding(cfg.device_port(cfg.links[parent]), rank, parent_slot_base, up_mac,
                         up_ip, up_port, mac, ip, port)


def tree_switch_job(config: ControllerConfig, tree: JobTree, name: str, job: Job, job_index: int,
                    places: dict[str, Placement], *, host_root: bool = False) -> SwitchJob:
    """What switch ``name`` of ``job``'s tree holds (``places``: the job's grant on each
    switch; with ``host_root``, the root's is the host aggregator's): its own ranks and its
    child switches as children, a child switch bound by its aggregator address on the link's
    port, and below the root its uplink (docs/trees.md)."""
    cfgs = {s.name: s for s in config.switches}
    cfg, p = cfgs[name], places[name]
    children = worker_bindings(job, cfg, tree.ranks[name])
    for child, child_id in tree.child_ids(name).items():
        ip, port, mac = aggregator_of(cfgs[child])
        children.append(WorkerBinding(child_id, cfg.device_port(cfg.links[child]), ip, mac, port))
    up = None
    if (parent := tree.parent[name]) is not None:
        up = uplink(config, tree, name, places[parent].slot_base, host_root=host_root)
    return SwitchJob(job.job_id, job_index, p.epoch, p.slot_base, p.slot_count,
                     tuple(sorted(children, key=lambda w: w.rank)), job.transport, up)

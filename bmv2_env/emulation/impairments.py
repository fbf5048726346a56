"""How a run applies its topology's link impairments, decided before the network is built, and
what it reports of them: never an impairment that was not applied.

Mininet's TCLink applies a link's ``delay``/``jitter``/``loss``/``max_queue_size`` with the
kernel's netem qdisc. Where the kernel has none (this machine: no sch_netem, no iptables/nft):

* **loss** on the software data plane is applied by the switch's own ports
  (``inagg-soft-switch --loss``, ``softswitch/impair.py``): on a host's link, the switch port
  drops that share of the frames it receives from the host and of those it sends to it (netem
  on both ends drops each direction once); on a switch-to-switch link, each end drops that share
  of what it sends. Seeded, counted per port direction and reported (``port_stats``).
* **loss** on BMv2 has no such mechanism (simple_switch has no per-port drop): the run is
  refused before anything is built, naming the alternative (``DATAPLANE=soft``).
* **delay, jitter, max_queue_size** are not applied on either data plane: the run goes on,
  and the summary names them as not applied.

Where netem works, Mininet applies everything as asked (``by == "netem"``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from inagg.bmv2_env.emulation.topology import Topology, TopologyError
from inagg.bmv2_env.emulation.topology_schema import NETEM_OPTIONS


@dataclass
class Impairments:
    """What this run applies: ``by`` netem, the soft switch's ports, or nothing; whether the
    links' loss is applied; the options asked and not applied; the switches' loss counts
    (switch -> [{port, direction, seen, dropped, loss_pct}], read after the jobs)."""

    by: str = "none"
    loss: bool = False
    not_applied: tuple[str, ...] = ()
    port_stats: dict[str, list[dict]] = field(default_factory=dict)


def asked_options(topo: Topology) -> tuple[str, ...]:
    """The netem options some link of the topology asks for, in NETEM_OPTIONS' order."""
    return tuple(k for k in NETEM_OPTIONS if any(k in link.params for link in topo.links))


def plan(topo: Topology, dataplane: str, netem: bool) -> Impairments:
    """How the run applies what the topology asks (see the module's docstring); TopologyError
    when loss is asked on BMv2 without netem."""
    asked = asked_options(topo)
    if not asked:
        return Impairments()
    if netem:
        return Impairments("netem", "loss" in asked)
    if "loss" in asked and dataplane != "soft":
        raise TopologyError("link loss: this kernel has no netem qdisc and BMv2 has no per-port drop, so the loss "
                            "cannot be applied on the BMv2 data plane; run it on the software data plane "
                            "(make run DATAPLANE=soft, --dataplane soft), which drops at its ports, or remove "
                            "\"loss\" from the links")
    return Impairments("soft switch ports" if "loss" in asked else "none", "loss" in asked,
                       tuple(k for k in asked if k != "loss"))


def switch_losses(topo: Topology) -> dict[str, list[tuple[int, str, float]]]:
    """Each switch's ``--loss`` settings, (port, "in"|"out", percent), from its links' loss:
    both directions at a host's port, egress at each end of a switch-to-switch link."""
    out: dict[str, list[tuple[int, str, float]]] = {}
    for link in topo.links:
        pct = link.params.get("loss", 0)
        if not pct:
            continue
        switch_link = link.a.port is not None and link.b.port is not None
        for end in (link.a, link.b):
            if end.port is not None:
                directions = ("out",) if switch_link else ("in", "out")
                out.setdefault(end.node, []).extend((end.port, d, pct) for d in directions)
    return out


def loss_flags(losses: list[tuple[int, str, float]], seed: int) -> list[str]:
    """The soft switch's options for ``losses`` (``switch_losses``' entry of one switch)."""
    if not losses:
        return []
    return [*(f for port, d, pct in losses for f in ("--loss", f"{port}:{d}:{pct}")), "--loss-seed", str(seed)]


def stats_path(logs: Path, switch: str) -> Path:
    """Where switch ``switch`` keeps its loss counts (``--impair-stats``)."""
    return logs / f"{switch}-port-loss.json"


def read_port_stats(logs: Path, switches: list[str]) -> dict[str, list[dict]]:
    """The loss counts the switches saved (those that have a file)."""
    out = {}
    for name in switches:
        try:
            out[name] = json.loads(stats_path(logs, name).read_text())
        except (OSError, ValueError):
            continue
    return out


def measured_loss_pct(topo: Topology, hosts: list[str], port_stats: dict[str, list[dict]]) -> float | None:
    """The share of frames the switch ports of ``hosts``' links dropped (both directions), in
    percent; None when those ports counted nothing."""
    seen = dropped = 0
    for host in hosts:
        at = topo.attachment(host)
        for entry in port_stats.get(at.node, []):
            if entry["port"] == at.port:
                seen, dropped = seen + entry["seen"], dropped + entry["dropped"]
    return 100 * dropped / seen if seen else None


def port_lines(port_stats: dict[str, list[dict]]) -> list[str]:
    """The summary's lines of the ports' loss: per switch a heading, then per port each
    direction's frames dropped of those seen, the share and the loss asked."""
    lines = []
    for name, entries in port_stats.items():
        if entries:
            lines.append(f"switch {name} port loss (applied by its ports; dropped/seen, % of % asked):")
        by_port: dict[int, list[str]] = {}
        for e in entries:
            share = 100 * e["dropped"] / e["seen"] if e["seen"] else 0
            by_port.setdefault(e["port"], []).append(
                f"{e['direction']} {e['dropped']}/{e['seen']} ({share:.2f} % of {e['loss_pct']:g} %)")
        lines += [f"  p{port} {', '.join(parts)}" for port, parts in by_port.items()]
    return lines

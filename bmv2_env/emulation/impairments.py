"""How a run applies its topology's link impairments, decided before the network is built, and
what it reports of them: never an impairment that was not applied.

Mininet's TCLink applies a link's ``delay``/``jitter``/``loss``/``max_queue_size`` with the
kernel's netem qdisc. Where the kernel has none (this machine: no sch_netem, no iptables/nft):

* **loss and delay** on the software data plane are applied by the switch's own ports
  (``inagg-soft-switch --loss/--delay``, ``softswitch/impair.py``): on a host's link, the switch
  port drops that share of the frames it receives from the host and of those it sends to it,
  and holds the rest that long back (netem on both ends impairs each direction once); on a
  switch-to-switch link, each end impairs what it sends. Seeded, counted per port direction and
  reported (``port_stats``). The delay is constant (no jitter), so nothing is reordered.
* **loss and delay** on BMv2 have no such mechanism (simple_switch has no per-port drop or
  delay): the run is refused before anything is built, naming the alternative (``DATAPLANE=soft``).
* **jitter, max_queue_size** are not applied on either data plane: the run goes on, and the
  summary names them as not applied.

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
    delay: bool = False
    not_applied: tuple[str, ...] = ()
    port_stats: dict[str, list[dict]] = field(default_factory=dict)


def asked_options(topo: Topology) -> tuple[str, ...]:
    """The netem options some link of the topology asks for, in NETEM_OPTIONS' order."""
    return tuple(k for k in NETEM_OPTIONS if any(k in link.params for link in topo.links))


PORT_APPLIED = ("loss", "delay")   # what the software data plane's ports apply without netem
_TC_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def plan(topo: Topology, dataplane: str, netem: bool) -> Impairments:
    """How the run applies what the topology asks (see the module's docstring); TopologyError
    when loss or delay is asked on BMv2 without netem."""
    asked = asked_options(topo)
    if not asked:
        return Impairments()
    if netem:
        return Impairments("netem", "loss" in asked, "delay" in asked)
    on_ports = tuple(k for k in asked if k in PORT_APPLIED)
    if on_ports and dataplane != "soft":
        raise TopologyError(f"link {' and '.join(on_ports)}: this kernel has no netem qdisc and BMv2 has no per-port "
                            f"drop or delay, so they cannot be applied on the BMv2 data plane; run it on the software "
                            f"data plane (make run DATAPLANE=soft, --dataplane soft), which applies them at its ports, "
                            f"or remove them from the links")
    return Impairments("soft switch ports" if on_ports else "none", "loss" in asked, "delay" in asked,
                       tuple(k for k in asked if k not in PORT_APPLIED))


def delay_ms(text: str) -> float:
    """A tc time ("5ms", "500us", "0.1s"; topology_schema checked it) in milliseconds."""
    unit = next(u for u in ("us", "ms", "s") if text.endswith(u))
    return float(text[:-len(unit)]) * _TC_UNITS[unit]


def switch_impairments(topo: Topology) -> dict[str, list[tuple[int, str, float, float]]]:
    """Each switch's port settings, (port, "in"|"out", loss percent, delay ms), from its links'
    loss and delay: both directions at a host's port, egress at each end of a switch link."""
    out: dict[str, list[tuple[int, str, float, float]]] = {}
    for link in topo.links:
        pct, ms = link.params.get("loss", 0), delay_ms(link.params.get("delay", "0ms"))
        if not pct and not ms:
            continue
        switch_link = link.a.port is not None and link.b.port is not None
        for end in (link.a, link.b):
            if end.port is not None:
                directions = ("out",) if switch_link else ("in", "out")
                out.setdefault(end.node, []).extend((end.port, d, pct, ms) for d in directions)
    return out


def impairment_flags(settings: list[tuple[int, str, float, float]], seed: int) -> list[str]:
    """The soft switch's options for ``settings`` (``switch_impairments``' entry of a switch)."""
    if not settings:
        return []
    loss = [f for port, d, pct, _ in settings if pct for f in ("--loss", f"{port}:{d}:{pct:g}")]
    delay = [f for port, d, _, ms in settings if ms for f in ("--delay", f"{port}:{d}:{ms:g}")]
    return [*loss, *delay, "--loss-seed", str(seed)]


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


def asked_delay_ms(topo: Topology, hosts: list[str]) -> float:
    """The largest delay the topology asks on the links of ``hosts``, in milliseconds."""
    return max((delay_ms(link.params.get("delay", "0ms")) for link in topo.links
                if link.a.node in hosts or link.b.node in hosts), default=0.0)


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
    """The summary's lines of the ports' impairments: per switch a heading, then per port each
    direction's frames dropped of those seen (the share, the loss asked) and those delayed."""
    lines = []
    for name, entries in port_stats.items():
        if entries:
            lines.append(f"switch {name} port impairments (applied by its ports; dropped/seen, % of % asked; "
                         "delayed frames):")
        by_port: dict[int, list[str]] = {}
        for e in entries:
            share = 100 * e["dropped"] / e["seen"] if e["seen"] else 0
            delay = f", {e['delayed']} delayed {e['delay_ms']:g} ms" if e.get("delay_ms") else ""
            by_port.setdefault(e["port"], []).append(
                f"{e['direction']} {e['dropped']}/{e['seen']} ({share:.2f} % of {e['loss_pct']:g} %){delay}")
        lines += [f"  p{port} {', '.join(parts)}" for port, parts in by_port.items()]
    return lines

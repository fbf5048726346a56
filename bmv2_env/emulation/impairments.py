"""How a run applies its topology's link impairments, decided before the network is built, and
what it reports of them: never an impairment that was not applied.

Mininet's TCLink applies a link's ``delay``/``jitter``/``loss``/``max_queue_size`` with the
kernel's netem qdisc (it passes netem no ``duplicate`` or ``reorder``). Where the kernel has no
netem (this machine: no sch_netem, no iptables/nft), or a link asks for duplicate or reorder:

* **loss, delay, jitter, duplicate, reorder** on the software data plane are applied by the
  switch's own ports (``inagg-soft-switch --loss/--delay/--jitter/--duplicate/--reorder``,
  ``softswitch/impair.py``, netem's meanings): on a host's link the switch port impairs the
  frames it receives from the host and those it sends to it (netem on both ends impairs each
  direction once); on a switch-to-switch link, each end impairs what it sends. Seeded, counted
  per port direction as they happen (dropped, delayed, duplicated, and reordered: frames that
  left behind a later one) and reported (``port_stats``).
* **the same on BMv2** have no such mechanism (simple_switch has no per-port drop, delay or
  copy): the run is refused before anything is built, naming the alternative (``DATAPLANE=soft``).
* **max_queue_size** is not applied without netem: the run goes on, and the summary names it as
  not applied.

Where netem works and no link asks for duplicate or reorder, Mininet applies everything as asked
(``by == "netem"``). Rates (``bw``, ``bw_schedule``) are tc's htb/tbf, not netem: they apply on
every kernel and both data planes (shaping.py); the table in bmv2_env/README.md says who applies what.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from inagg.bmv2_env.emulation.topology import Topology, TopologyError
from inagg.bmv2_env.emulation.topology_schema import IMPAIRMENTS, NETEM_OPTIONS


@dataclass
class Impairments:
    """What this run applies: ``by`` netem, the soft switch's ports, or nothing; the options it
    applies and those asked and not applied; the switches' counts (switch -> [{port, direction,
    seen, dropped, delayed, duplicated, reordered, ...}], read after the jobs); the bandwidth
    changes applied (shaping.BandwidthSchedule.applied)."""

    by: str = "none"
    applied: tuple[str, ...] = ()
    not_applied: tuple[str, ...] = ()
    port_stats: dict[str, list[dict]] = field(default_factory=dict)
    bw_changes: list[dict] = field(default_factory=list)


def asked_options(topo: Topology) -> tuple[str, ...]:
    """The impairments some link of the topology asks for, in IMPAIRMENTS' order."""
    return tuple(k for k in IMPAIRMENTS if any(k in link.params for link in topo.links))


PORT_APPLIED = ("delay", "jitter", "loss", "duplicate", "reorder")   # what the soft switch's ports apply
PORT_SETTINGS = ("loss", "delay", "jitter", "duplicate", "reorder")  # their options, in flag order
_TC_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def plan(topo: Topology, dataplane: str, netem: bool) -> Impairments:
    """How the run applies what the topology asks (see the module's docstring); TopologyError
    when the ports' impairments are asked on BMv2 and netem cannot apply them."""
    asked = asked_options(topo)
    if not asked:
        return Impairments()
    if netem and set(asked) <= set(NETEM_OPTIONS):
        return Impairments("netem", asked)
    on_ports = tuple(k for k in asked if k in PORT_APPLIED)
    if on_ports and dataplane != "soft":
        why = ("this kernel has no netem qdisc" if not netem else
               "Mininet's TCLink passes netem no duplicate or reorder")
        raise TopologyError(f"link {' and '.join(on_ports)}: {why} and BMv2 has no per-port drop, delay or copy, "
                            f"so they cannot be applied on the BMv2 data plane; run it on the software data plane "
                            f"(make run DATAPLANE=soft, --dataplane soft), which applies them at its ports, or "
                            f"remove them from the links")
    return Impairments("soft switch ports" if on_ports else "none", on_ports,
                       tuple(k for k in asked if k not in PORT_APPLIED))


def tclink_options(params: dict, by: str) -> dict:
    """The link options Mininet's TCLink gets: its netem ones only when netem applies them
    (never duplicate/reorder, which it does not know), a ``bw_schedule`` as its first rate on
    tbf (shaping.py re-rates it)."""
    opts = {k: v for k, v in params.items()
            if k not in ("duplicate", "reorder", "bw_schedule") and (by == "netem" or k not in NETEM_OPTIONS)}
    if "bw_schedule" in params:
        opts.update(bw=params["bw_schedule"][0][1], use_tbf=True)
    return opts


def delay_ms(text: str) -> float:
    """A tc time ("5ms", "500us", "0.1s"; topology_schema checked it) in milliseconds."""
    unit = next(u for u in ("us", "ms", "s") if text.endswith(u))
    return float(text[:-len(unit)]) * _TC_UNITS[unit]


def port_settings(params: dict) -> dict[str, float]:
    """A link's settings for the ports (``PORT_SETTINGS``: percentages and milliseconds), those
    it asks only."""
    return {k: delay_ms(params[k]) if k in ("delay", "jitter") else params[k]
            for k in PORT_SETTINGS if params.get(k)}


def switch_impairments(topo: Topology) -> dict[str, list[tuple[int, str, dict[str, float]]]]:
    """Each switch's port settings, (port, "in"|"out", ``port_settings``), from its links:
    both directions at a host's port, egress at each end of a switch link."""
    out: dict[str, list[tuple[int, str, dict[str, float]]]] = {}
    for link in topo.links:
        settings = port_settings(link.params)
        if not settings:
            continue
        switch_link = link.a.port is not None and link.b.port is not None
        for end in (link.a, link.b):
            if end.port is not None:
                directions = ("out",) if switch_link else ("in", "out")
                out.setdefault(end.node, []).extend((end.port, d, settings) for d in directions)
    return out


def impairment_flags(entries: list[tuple[int, str, dict[str, float]]], seed: int) -> list[str]:
    """The soft switch's options for ``entries`` (``switch_impairments``' entry of a switch)."""
    if not entries:
        return []
    flags = [f for k in PORT_SETTINGS for port, d, s in entries if k in s for f in (f"--{k}", f"{port}:{d}:{s[k]:g}")]
    return [*flags, "--loss-seed", str(seed)]


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


def asked_ms(topo: Topology, hosts: list[str], key: str = "delay") -> float:
    """The largest ``key`` (delay, jitter) the topology asks on the links of ``hosts``, in
    milliseconds."""
    return max((delay_ms(link.params.get(key, "0ms")) for link in topo.links
                if link.a.node in hosts or link.b.node in hosts), default=0.0)


def measured_pct(topo: Topology, hosts: list[str], port_stats: dict[str, list[dict]], count: str) -> float | None:
    """The share of frames the switch ports of ``hosts``' links ``count``ed ("dropped",
    "duplicated", "reordered"; both directions), in percent of those they saw; None when those
    ports counted nothing."""
    seen = counted = 0
    for host in hosts:
        at = topo.attachment(host)
        for entry in port_stats.get(at.node, []):
            if entry["port"] == at.port:
                seen, counted = seen + entry["seen"], counted + entry.get(count, 0)
    return 100 * counted / seen if seen else None


def _direction_text(e: dict) -> str:
    """One port direction's counts: dropped/seen (the share, of the loss asked), then what it
    delayed, duplicated and reordered where it was asked to (or, reordering, where it happened)."""
    share = 100 * e["dropped"] / e["seen"] if e["seen"] else 0
    text = f"{e['direction']} {e['dropped']}/{e['seen']} ({share:.2f} % of {e['loss_pct']:g} %)"
    if e.get("delay_ms"):
        jitter = f" +- {e['jitter_ms']:g}" if e.get("jitter_ms") else ""
        text += f", {e['delayed']} delayed {e['delay_ms']:g}{jitter} ms"
    if e.get("duplicate_pct"):
        text += f", {e['duplicated']} duplicated (of {e['duplicate_pct']:g} %)"
    if e.get("reorder_pct") or e.get("jitter_ms") or e.get("reordered"):
        text += f", {e['reordered']} reordered"
    return text


def port_lines(port_stats: dict[str, list[dict]]) -> list[str]:
    """The summary's lines of the ports' impairments: per switch a heading, then per port each
    direction's counts (``_direction_text``)."""
    lines = []
    for name, entries in port_stats.items():
        if entries:
            lines.append(f"switch {name} port impairments (applied by its ports; dropped/seen, % of % asked; "
                         "delayed, duplicated and reordered frames, as counted):")
        by_port: dict[int, list[str]] = {}
        for e in entries:
            by_port.setdefault(e["port"], []).append(_direction_text(e))
        lines += [f"  p{port} {', '.join(parts)}" for port, parts in by_port.items()]
    return lines


def bw_lines(changes: list[dict]) -> list[str]:
    """The summary's lines of the bandwidth changes applied: when (after time zero), which
    link, the rate asked and each end's rate as tc showed it afterwards."""
    if not changes:
        return []
    lines = ["bandwidth schedule (tc tbf on both ends; the rate tc shows after each change):"]
    for c in changes:
        at = "n/a" if c["at_s"] is None else f"{c['at_s']:+.1f} s"
        ends = "/".join("none" if r is None else f"{r:g}" for r in c["mbit_applied"])
        refused = f" (tc refused: {c['error']})" if c.get("error") else ""
        lines.append(f"  {at} link {c['link']}: {c['mbit']:g} Mbit/s asked, {ends} Mbit/s applied{refused}")
    return lines

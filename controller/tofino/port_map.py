"""From what bf_switchd says about its ports to the config's ``device_ports``, and which pipe
each host lands in.

Two inputs are read, both as connector (ucli's ``1/0``) -> device port:

- the bring-up script's output (controller/tofino/bfrt_port_script.py): its ``inagg-port-map {JSON}``
  line, anywhere in a bfshell log, or that JSON alone;
- the text of ucli's ``pm show``: the table whose header names ``PORT`` and ``D_P`` (open-p4studio
  ``pkgsrc/bf-drivers/src/bf_pm/bf_pm_ucli.c``), each added port a row.

A front-panel port's connector is its ``ports`` entry's, else ``<port>/0``. Every port a host or
link uses must be in the map, and no device port may be there twice. Registers are per pipe
(pipe = device port >> 7): a job whose hosts are in two pipes runs on the host aggregator
(controller/fabric.py: refusal), so the report groups the hosts by pipe and warns when a
switch's (or a planned job's) hosts span pipes.
"""

from __future__ import annotations

import json
import re

from inagg.controller.tofino.bfrt_port_script import MAP_MARK
from inagg.controller.tofino.ports import PortedSwitch, parse_connector, pipe_of

_PM_SHOW_PORT = re.compile(r"^\d+/\d+$")


def _add(found: dict[str, int], connector: str, dev_port: int, where: str) -> None:
    """Record connector -> dev_port, refusing a device port under two connectors."""
    parse_connector(connector, where)
    if found.get(connector, dev_port) != dev_port:
        raise ValueError(f"{where}: connector {connector} has device ports {found[connector]} "
                         f"and {dev_port}: the map mixes two runs; take one run's output")
    other = next((c for c, d in found.items() if d == dev_port and c != connector), None)
    if other is not None:
        raise ValueError(f"{where}: device port {dev_port} is both {other} and {connector}: a "
                         f"device port is one connector's; take the map of one switch, one run")
    found[connector] = dev_port


def _script_map(document: dict, where: str) -> tuple[str, dict[str, int]]:
    """(switch name, connector -> device port) of the script's JSON."""
    try:
        found: dict[str, int] = {}
        for entry in document["ports"].values():
            _add(found, entry["connector"], int(entry["dev_port"]), where)
        return str(document["switch"]), found
    except (KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{where}: not the bring-up script's map (missing {e}): give the "
                         f"script's output or pm show's text") from None


def _pm_show_map(text: str, where: str) -> dict[str, int]:
    """connector -> device port of pm show's table(s); {} when the text has none."""
    found: dict[str, int] = {}
    columns: tuple[int, int] | None = None
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("|")]
        if "PORT" in cells and "D_P" in cells:
            columns = cells.index("PORT"), cells.index("D_P")
        elif columns and len(cells) > max(columns) and _PM_SHOW_PORT.match(cells[columns[0]]):
            _add(found, cells[columns[0]], int(cells[columns[1]]), where)
    return found


def read_port_map(text: str, where: str) -> tuple[str | None, dict[str, int]]:
    """(switch name or None for pm show, connector -> device port) of the script's output or
    pm show's text; ValueError naming what is wrong with it."""
    marked = [line.split(MAP_MARK, 1)[1] for line in text.splitlines() if MAP_MARK + " " in line]
    candidates = marked[-1:] or [text]
    try:
        document = json.loads(candidates[0])
    except ValueError:
        document = None
    if isinstance(document, dict):
        return _script_map(document, where)
    if marked:
        raise ValueError(f"{where}: the {MAP_MARK} line is not JSON: rerun the script")
    found = _pm_show_map(text, where)
    if not found:
        raise ValueError(f"{where}: neither the bring-up script's output (an {MAP_MARK} line) "
                         f"nor pm show's table (a header with PORT and D_P, a row per port)")
    return None, found


def connector_of(sw: PortedSwitch, front_panel: int) -> str:
    """The SDE connector of a front-panel port: its ``ports`` entry's, else ``<port>/0``."""
    setup = sw.port_setup.get(front_panel)
    return setup.connector if setup else f"{front_panel}/0"


def device_ports_from(sw: PortedSwitch, connectors: dict[str, int]) -> dict[int, int]:
    """The switch's ``device_ports``: every front-panel port its hosts, links and ``ports``
    section name -> its device port in ``connectors``."""
    users = sw.port_users()
    wanted = sorted(set(users) | set(sw.port_setup))
    missing = [p for p in wanted if connector_of(sw, p) not in connectors]
    if missing:
        raise ValueError(
            f"switch {sw.name}: no device port in the map for "
            + ", ".join(f"front-panel port {p} ({users.get(p, 'ports section')}, connector "
                        f"{connector_of(sw, p)})" for p in missing)
            + ": bring it up (the script adds every port of the ports section; pm show lists "
              "added ports only) or fix its connector")
    return {p: connectors[connector_of(sw, p)] for p in wanted}


def pipe_report(sw: PortedSwitch, device_ports: dict[int, int],
                jobs: list[list[str]]) -> tuple[list[str], list[str]]:
    """(lines: each pipe's hosts and links, warnings: hosts or a planned job across pipes)."""
    users = sw.port_users()
    by_pipe: dict[int, list[str]] = {}
    for port, who in sorted(users.items()):
        by_pipe.setdefault(pipe_of(device_ports[port]), []).append(
            f"{who} (port {port}, device port {device_ports[port]})")
    lines = [f"pipe {pipe}: " + ", ".join(whos) for pipe, whos in sorted(by_pipe.items())]
    reason = ("a Tofino's registers are per pipe, so the controller runs a job whose hosts are "
              "in two pipes on the host aggregator")
    warnings = []
    host_pipes = sorted({pipe_of(device_ports[h.port]) for h in sw.hosts.values()})
    if len(host_pipes) > 1:
        warnings.append(f"switch {sw.name}'s hosts are in pipes {', '.join(map(str, host_pipes))}: "
                        f"{reason}; keep each job's hosts in one pipe")
    for job in jobs:
        strangers = [ip for ip in job if ip not in sw.hosts]
        if strangers:
            raise ValueError(f"--job {','.join(job)}: {', '.join(strangers)} is not a host of "
                             f"switch {sw.name}")
        pipes = sorted({pipe_of(device_ports[sw.hosts[ip].port]) for ip in job})
        if len(pipes) > 1:
            warnings.append(f"job {','.join(job)} spans pipes {', '.join(map(str, pipes))}: "
                            f"{reason}; move its hosts to one pipe")
    return lines, warnings

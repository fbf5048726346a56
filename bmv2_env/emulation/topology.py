"""The emulation's topology file, read and checked before anything is started.

A topology lists hosts (ip, mac), switches (the inagg address they answer on), links, the host
aggregator's host, the jobs, and optionally ``mtu``, every link's MTU (1500 by default; 9000 for
jumbo frames), from which the software data plane's K follows. A link joins two endpoints: a
host (``"h1"``) or a switch port (``"s1-p3"``); an optional third element holds link options
(delay, jitter, loss, duplicate, reorder, bw, bw_schedule: bmv2_env/README.md says who applies
each). Switch-to-switch links go to the controller as its switches' ``links``: they must form a
forest (one link between two switches, no cycle). A job whose workers hang off several switches aggregates on the tree of
the switches between them (docs/trees.md), so its workers' switches and the host aggregator's
must be linked, directly or through others; a topology that asks for more is refused with a
message naming the job and the switches.

A job lists its ``workers`` (hosts, rank order: a host named several times runs several
ranks), ``epochs``, optionally ``host_reduce`` (true: the ranks of a host reduce in shared
memory first and one leader per host is the switch's worker, ``INAGG_HOST_REDUCE=auto``),
``hook``, ``transport`` and ``start_delay``: every job's workers start at once, but one with a
``start_delay`` joins the controller that many seconds after every job before it holds a grant,
and all jobs train once all hold grants (so the two-job demo's first job has the switch and
overlaps the second whatever the machine's speed). A job may also name what it trains and for
how long, and when it arrives: ``model`` (the zoo's) or a synthetic ``profile``, ``iterations``
or ``duration`` instead of ``epochs``, and ``start``, its arrival in seconds after time zero
(bmv2_env/README.md, "Workloads"; checked in topology_schema.check_workload).

Everything is checked before a network is built, and a mistake is refused with the file, the
entry and what to write instead: the keys and values of every entry, addresses, duplicates and
contradictions in topology_schema.py; links, attachments and trees here. A JSON key repeated in
one object is refused too (json would keep the last silently).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from inagg.bmv2_env.emulation.run_dir import MAX_IFNAME, RUN_ID_LEN
from inagg.bmv2_env.emulation.topology_schema import (TopologyError, check_addresses, check_controller, check_jobs,
                                                       check_link_options, check_schema, did_you_mean)
from inagg.controller.config import unique_keys
from inagg.hostlib.wire.grant import ETHERNET_MTU, MAX_IPV4_DATAGRAM

__all__ = ["Endpoint", "Link", "Topology", "TopologyError", "host_ip", "load_topology", "parse_topology"]

_SWITCH_PORT = re.compile(r"^(?P<switch>[A-Za-z][A-Za-z0-9]*)-p(?P<port>[0-9]+)$")
# Mininet names a node's shell and interfaces after it: keep names short and plain
_NODE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9]{0,7}$")
MIN_MTU = 576    # every IPv4 host takes datagrams this large


@dataclass(frozen=True)
class Endpoint:
    node: str
    port: int | None = None    # switch endpoints only

    def __str__(self) -> str:
        return self.node if self.port is None else f"{self.node}-p{self.port}"


@dataclass(frozen=True)
class Link:
    a: Endpoint
    b: Endpoint
    params: dict = field(default_factory=dict)


@dataclass
class Topology:
    hosts: dict[str, dict]
    switches: dict[str, dict]
    links: list[Link]
    aggregator: str
    jobs: list[dict]
    controller: dict
    mtu: int = ETHERNET_MTU

    def attachment(self, host: str) -> Endpoint:
        """The switch port a host is wired to."""
        for link in self.links:
            for mine, other in ((link.a, link.b), (link.b, link.a)):
                if mine.node == host and other.port is not None:
                    return other
        raise TopologyError(f"host {host} is linked to no switch")

    def host_ports(self, switch: str) -> dict[str, dict]:
        """The controller's ``hosts`` map of one switch: IPv4 -> port and MAC, its own hosts only."""
        out = {}
        for name, h in self.hosts.items():
            at = self.attachment(name)
            if at.node == switch:
                out[host_ip(h)] = {"port": at.port, "mac": h["mac"]}
        return out

    def switch_links(self, switch: str) -> dict[str, int]:
        """The controller's ``links`` of one switch: neighbour switch -> its port to it."""
        out = {}
        for link in self.links:
            for mine, other in ((link.a, link.b), (link.b, link.a)):
                if mine.node == switch and mine.port is not None and other.port is not None:
                    out[other.node] = mine.port
        return out

    def link_loss(self, host: str) -> float:
        for link in self.links:
            if host in (link.a.node, link.b.node):
                return link.params.get("loss", 0)
        return 0


def host_ip(host: dict) -> str:
    return host["ip"].split("/")[0]


def _endpoint(text, hosts: dict, switches: dict, where: str) -> Endpoint:
    if not isinstance(text, str):
        raise TopologyError(f"{where}: endpoint {text!r} is not a string")
    if text in hosts:
        return Endpoint(text)
    m = _SWITCH_PORT.match(text)
    if m and m["switch"] in switches:
        port = int(m["port"])
        if not 1 <= port <= 510:
            raise TopologyError(f"{where}: port {port} of {m['switch']} not in 1..510")
        # the port's interface in the root namespace is <run id><switch>-eth<port> (RunDir.interface_name)
        room = MAX_IFNAME - RUN_ID_LEN - len("-eth")
        if len(m["switch"]) + len(str(port)) > room:
            raise TopologyError(f"{where}: switch {m['switch']!r} with port {port} names an interface over Linux's "
                                f"{MAX_IFNAME} characters; keep the switch name and port number within {room} "
                                f"characters together (e.g. switch 's1')")
        return Endpoint(m["switch"], port)
    raise TopologyError(f"{where}: {text!r} is neither a host nor a switch port "
                        f"(hosts: {', '.join(hosts)}; switch ports are written like 's1-p3')")


def parse_links(raw: list, hosts: dict, switches: dict, file: str = "topology") -> list[Link]:
    """The links of file ``file``: two endpoints each (hosts or switch ports), a host or a port
    in one link at most."""
    links, used = [], set()
    for i, entry in enumerate(raw):
        where = f"{file}: links[{i}]"
        if not isinstance(entry, list) or len(entry) not in (2, 3):
            raise TopologyError(f"{where}: expected [a, b] or [a, b, {{options}}], got {entry!r}")
        params = entry[2] if len(entry) == 3 else {}
        if not isinstance(params, dict):
            raise TopologyError(f"{where}: link options must be an object, got {params!r}")
        check_link_options(params, where)
        a, b = (_endpoint(e, hosts, switches, where) for e in entry[:2])
        if a.port is None and b.port is None:
            raise TopologyError(f"{where}: host-to-host link {a}-{b}: hosts attach to switch ports")
        for end in (a, b):
            if end in used or (end.port is None and any(u.node == end.node for u in used)):
                raise TopologyError(f"{where}: {end} is already linked (one link per host and per port)")
            used.add(end)
        links.append(Link(a, b, params))
    return links


def switch_forest(topo: Topology) -> dict[str, str]:
    """Each switch's component of the switch links (a representative switch); TopologyError
    when two switches are linked twice or the links close a cycle (a tree needs one way up)."""
    part = {name: name for name in topo.switches}

    def find(name: str) -> str:
        while part[name] != name:
            name = part[name]
        return name

    for link in topo.links:
        if link.a.port is None or link.b.port is None:
            continue
        a, b = find(link.a.node), find(link.b.node)
        if a == b:
            raise TopologyError(f"link {link.a}-{link.b} closes a cycle of switch links: aggregation trees "
                                "need a forest (one way between two switches); remove one link of the cycle")
        part[a] = b
    return {name: find(name) for name in topo.switches}


def check_trees(topo: Topology, file: str = "topology") -> None:
    """Every job's workers and the host aggregator hang off switches the links join."""
    try:
        forest = switch_forest(topo)
    except TopologyError as e:
        raise TopologyError(f"{file}: {e}") from None
    agg_switch = topo.attachment(topo.aggregator).node
    for job in topo.jobs:
        where = {w: topo.attachment(w).node for w in job["workers"]}
        switches = sorted(set(where.values()) | {agg_switch})
        if len({forest[s] for s in switches}) > 1:
            placed = ", ".join(f"{w} on {s}" for w, s in where.items())
            raise TopologyError(
                f"{file}: job {job['name']}: its workers ({placed}) and the host aggregator "
                f"({topo.aggregator} on {agg_switch}) hang off switches {', '.join(switches)}, "
                "which no switch links join: link them (switch port to switch port) so that the "
                "job aggregates on their tree and reaches the host aggregator")


def parse_topology(data: dict, where: str = "topology") -> Topology:
    """The topology in ``data`` (from file ``where``), refused with a TopologyError naming the
    file, the entry and what to write instead unless the emulation can build it: the schema
    and every value first (topology_schema), then links, attachments and trees."""
    check_schema(data, where)
    hosts, switches = data["hosts"], data["switches"]
    for name in list(hosts) + list(switches):
        if not _NODE_NAME.match(name):
            raise TopologyError(f"{where}: node name {name!r}: use a letter then up to 7 letters/digits")
    if set(hosts) & set(switches):
        raise TopologyError(f"{where}: {sorted(set(hosts) & set(switches))} named both host and switch; "
                            "rename one of each pair")
    check_addresses(hosts, switches, where)
    mtu = data.get("mtu", ETHERNET_MTU)
    if not isinstance(mtu, int) or not MIN_MTU <= mtu <= MAX_IPV4_DATAGRAM:
        raise TopologyError(f"{where}: mtu must be an integer in {MIN_MTU}..{MAX_IPV4_DATAGRAM}, got {mtu!r}; "
                            "write e.g. 1500 (the default) or 9000 (jumbo frames)")
    controller = data.get("controller", {})
    check_controller(controller, where)
    if data["aggregator"] not in hosts:
        raise TopologyError(f"{where}: aggregator {data['aggregator']!r} is not a host"
                            f"{did_you_mean(str(data['aggregator']), hosts)}; name the host that runs the "
                            f"host aggregator (hosts: {', '.join(hosts)})")
    check_jobs(data["jobs"], hosts, where)
    topo = Topology(hosts, switches, parse_links(data["links"], hosts, switches, where), data["aggregator"],
                    data["jobs"], controller, mtu)
    for name in hosts:
        if not any(name in (link.a.node, link.b.node) for link in topo.links):
            raise TopologyError(f"{where}: host {name} is linked to no switch; add a link like [\"{name}\", \"s1-p9\"]")
    check_trees(topo, where)
    return topo


def load_topology(path: Path) -> Topology:
    """Read topology file ``path`` (JSON, no repeated keys) and check it (``parse_topology``)."""
    try:
        data = json.loads(Path(path).read_text(), object_pairs_hook=unique_keys)
    except (OSError, ValueError) as e:
        raise TopologyError(f"cannot read topology {path}: {e}") from None
    return parse_topology(data, str(path))

"""The controller's configuration file (TOML or JSON): switches, host aggregator, pool policy,
service. examples/controller.toml is a commented example.

Example in JSON (bmv2_env/emulation/topologies/ ships real ones)::

    {
      "listen": "10.0.0.100:50051", "tls_cert": "ctl.pem", "tls_key": "ctl.key",
      "admin_token_file": "admin.token",
      "database": "controller.sqlite",
      "lease_seconds": 30, "rank_lease_seconds": 8,
      "min_window": 8, "sharing": "dynamic",
      "host_aggregator": "10.0.0.100:42666",
      "host_slots": 4096, "host_window": 32, "host_values_per_packet": 4096,
      "metrics_listen": "127.0.0.1:9464",
      "switches": [{
        "name": "s1", "grpc": "127.0.0.1:9559", "device_id": 0,
        "target": "bmv2",
        "aggregator": "10.0.0.254:42602", "aggregator_mac": "00:00:00:00:00:fe",
        "hosts": {"10.0.0.1": {"port": 1, "mac": "00:00:00:00:00:01"}}
      }]
    }

Each switch names its ``target`` (bmv2, soft, tofino, tofino2; default bmv2) and may name its program's
artifacts (``p4info`` and, by target, ``bmv2_json`` or ``binary`` + ``context`` + ``bfrt``); the
shipped builds in p4/ are the defaults (controller/artifacts.py finds them in a checkout or a
wheel). A Tofino switch names the P4Runtime server it runs (``p4runtime_server``: ``bf_switchd``,
the default, or ``stratum``: the device config's packing, controller/tofino/config.py) and
maps the front-panel ports its hosts and links use to device ports (``"device_ports": {"1": 128,
...}``, docs/tofino.md), every used port mapped; its ``ports`` section says how each of them comes
up (SDE connector, speed, FEC, autoneg: controller/tofino/ports.py), from which
``inagg-tofino-ports`` writes the bring-up script and fills ``device_ports``. It may name
front-panel ports it put in loopback (``"loopback_ports": [57, 58]``, mapped like the others):
each pipe's results recirculate through its recirculation port and its loopback ports, each
slot through one of them (controller/switch.py: ``recirculation_rows``).
Switches wired to each other name the link on both ends: ``"links": {"spine": 5}`` on a ToR
(its front-panel port 5 goes to switch "spine") and ``"links": {"tor1": 1}`` on the spine. The
links must form a forest (no cycles); a job whose ranks hang off several linked switches
aggregates on a tree of them (docs/trees.md, controller/trees.py).
Relative paths are relative to the config file (to the working directory for a config given as
a dict).
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass, field, replace
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:   # Python 3.10: the same parser from PyPI (inagg[control])
    import tomli as tomllib

from inagg.hostlib.wire.grant import HOST_VALUES_PER_PACKET, HOST_WINDOW, parse_address

from inagg.controller.allocator import ATP, DYNAMIC, SHARING
from inagg.controller.artifacts import artifact
from inagg.hostlib.jobservice.credentials import load_token
from inagg.controller.program import DEVICE_FILES, TARGETS, TOFINO_CHIPS, Program
from inagg.controller.tofino.ports import PortSetup, parse_ports
from inagg.controller.validation import check_mac

# The programs this repository builds, by target (a config may name others), relative to p4/:
# one folder per target under p4/out/ (make build, make tofino).
DEFAULT_ARTIFACTS: dict[str, dict[str, str]] = {
    "bmv2": {"p4info": "out/bmv2/inagg.p4info.txtpb", "bmv2_json": "out/bmv2/inagg.json"},
    # the BMv2 program at the software target's own K (tools/soft_p4info.py, make build)
    "soft": {"p4info": "out/soft/inagg.p4info.txtpb", "bmv2_json": "out/bmv2/inagg.json"},
    **{chip: {"p4info": f"out/{chip}/inagg.p4info.txtpb",
              "binary": f"out/{chip}/{chip}.bin.gz",
              "context": f"out/{chip}/context.json.gz",
              "bfrt": f"out/{chip}/bfrt.json.gz"} for chip in TOFINO_CHIPS},
}


# Seconds SetForwardingPipelineConfig may take (every other P4Runtime call: 10 s): a Tofino
# device config is 7-8 MB (tofino.bin, context.json and bfrt.json), and bf_switchd verifies it,
# resets the pipes and writes every register of the program before it answers (tens of seconds
# on a real switch, more on tofino-model). A switch's ``push_timeout`` overrides it.
DEFAULT_PUSH_TIMEOUT = 120.0


@dataclass(frozen=True)
class HostPort:
    port: int
    mac: str


@dataclass(frozen=True)
class SwitchConfig:
    name: str
    grpc: str
    device_id: int
    aggregator: str               # "ip:port" workers send contributions to in switch mode
    hosts: dict[str, HostPort]    # IPv4 -> where that host is attached (front-panel port)
    program: Program | None = None   # None: the default program of bmv2
    device_ports: dict[int, int] = field(default_factory=dict)  # front panel -> device port
    aggregator_mac: str = ""      # the MAC workers must map ``aggregator``'s IP to ("" = not said)
    links: dict[str, int] = field(default_factory=dict)   # neighbour switch -> front-panel port
    port_setup: dict[int, PortSetup] = field(default_factory=dict)  # the ``ports`` section
    push_timeout: float = DEFAULT_PUSH_TIMEOUT   # seconds the pipeline push may take
    loopback_ports: tuple[int, ...] = ()   # front-panel ports in loopback (recirculation)

    def port_users(self) -> dict[int, str]:
        """Each front-panel port a host or link uses -> who uses it (for messages)."""
        users = {port: f"link to {name}" for name, port in self.links.items()}
        users.update({h.port: f"host {ip}" for ip, h in self.hosts.items()})
        users.update({port: "loopback" for port in self.loopback_ports})
        return users

    @property
    def loopback_device_ports(self) -> list[int]:
        """The device ports of the front-panel ports in loopback."""
        return sorted(self.device_port(p) for p in self.loopback_ports)

    @property
    def ports(self) -> list[int]:
        """The device ports the hosts are attached to."""
        return sorted({self.device_port(h.port) for h in self.hosts.values()})

    def device_port(self, front_panel: int) -> int:
        """The device port of a front-panel port (the same number where no map is given)."""
        return self.device_ports.get(front_panel, front_panel) if self.device_ports else front_panel


@dataclass(frozen=True)
class ControllerConfig:
    switches: tuple[SwitchConfig, ...]
    host_aggregator: str
    listen: str = "127.0.0.1:50051"
    admin_token: str = ""             # or admin_token_file, or $INAGG_ADMIN_TOKEN
    admin_token_file: str = ""
    tls_cert: str = ""                # PEM certificate and key of the job service (TCP)
    tls_key: str = ""
    insecure: bool = False            # serve TCP in plaintext (tokens readable on the wire)
    database: str = "controller.sqlite"
    lease_seconds: float = 30.0       # a job no rank renews for this long ends
    rank_lease_seconds: float = 8.0   # a placed job one of whose ranks is silent this long fails
    switch_check_seconds: float = 1.0 # how often each switch is checked for a restart
    switch_audit_seconds: float = 30.0   # how often each switch is read back in full, drift repaired
    max_jobs: int = 4096              # jobs the controller holds at once (CreateJob is open)
    min_window: int = 8
    sharing: str = DYNAMIC            # the switch pool among its jobs: dynamic, static or atp (allocator.py)
    atp_pool: int = 0                 # sharing atp: each switch's pool, in slots from 0 (0: all its slots)
    host_slots: int = 4096
    host_window: int = HOST_WINDOW
    host_values_per_packet: int = HOST_VALUES_PER_PACKET
    metrics_listen: str = ""              # "ip:port" of the Prometheus endpoint; "" = none
    extra: dict = field(default_factory=dict)


def _need(d: dict, key: str, where: str):
    if key not in d:
        raise ValueError(f"{where}: missing key {key!r}")
    return d[key]


_SWITCH_KEYS = {"name", "grpc", "device_id", "target", "aggregator", "aggregator_mac", "hosts",
                "device_ports", "p4info", "p4runtime_server", "links", "ports", "push_timeout",
                "loopback_ports"} | {k for keys in DEVICE_FILES.values() for k in keys}


def parse_program(s: dict, where: str, base: Path | None) -> Program:
    """The switch's program: its target and artifacts (config paths over the defaults)."""
    target = s.get("target", "bmv2")
    if target not in TARGETS:
        raise ValueError(f"{where}: target must be one of {', '.join(TARGETS)}, got {target!r}")
    paths = {}
    for key, default in DEFAULT_ARTIFACTS[target].items():
        given = s.get(key)
        paths[key] = (base or Path()) / given if given is not None else artifact(default)
    stray = set(k for keys in DEVICE_FILES.values() for k in keys) - set(DEVICE_FILES[target])
    if target not in TOFINO_CHIPS:
        stray.add("p4runtime_server")
    if stray & set(s):
        raise ValueError(f"{where}: {sorted(stray & set(s))} do not belong to a {target} program")
    try:
        return Program(target, paths.pop("p4info"), paths, s.get("p4runtime_server", "bf_switchd"))
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def default_program(target: str) -> Program:
    """The program this repository builds for ``target`` (p4/, see DEFAULT_ARTIFACTS); raises
    FileNotFoundError naming the missing folder when neither a checkout's nor a wheel's is there."""
    return parse_program({"target": target}, target, None)


def parse_device_ports(s: dict, where: str, users: dict[int, str]) -> dict[int, int]:
    """Front-panel -> device port map; every port a host or link uses (``users``: port -> who)
    must be in it when given, and no device port may be in it twice."""
    given = s.get("device_ports", {})
    mapping = {int(k): int(v) for k, v in given.items()}
    missing = sorted(set(users) - set(mapping))
    if mapping and missing:
        raise ValueError(f"{where}.device_ports: no device port for front-panel port(s) {missing} "
                         f"({', '.join(users[p] for p in missing)}): map each "
                         f"(inagg-tofino-ports map fills the map, docs/tofino.md)")
    first: dict[int, int] = {}
    for front_panel, dev_port in mapping.items():
        if dev_port in first:
            raise ValueError(f"{where}.device_ports: front-panel ports {first[dev_port]} and "
                             f"{front_panel} both map to device port {dev_port}: each front-panel "
                             f"port has a device port of its own (pm show's D_P)")
        first[dev_port] = front_panel
    return mapping


def parse_port_setup_section(s: dict, where: str, users: dict[int, str]) -> dict[int, PortSetup]:
    """The ``ports`` section of a Tofino switch (controller/tofino/ports.py); {} when absent."""
    if "ports" not in s:
        return {}
    if s.get("target") not in TOFINO_CHIPS:
        raise ValueError(f"{where}.ports: port bring-up settings belong to a Tofino switch, "
                         f"not a {s.get('target', 'bmv2')} one: remove the section")
    return parse_ports(s["ports"], f"{where}.ports", users)


def parse_mac(s: dict, key: str, where: str) -> str:
    """An optional MAC entry, checked; "" when absent."""
    try:
        return check_mac(str(s.get(key, "")))
    except ValueError as e:
        raise ValueError(f"{where}.{key}: {e}") from None


def parse_links(s: dict, where: str, host_ports: set[int]) -> dict[str, int]:
    """A switch's links: neighbour switch name -> front-panel port (not a host's port)."""
    links = {}
    for name, port in s.get("links", {}).items():
        if not isinstance(port, int) or port < 0:
            raise ValueError(f"{where}.links[{name!r}]: a port number, got {port!r}")
        if port in host_ports:
            raise ValueError(f"{where}.links[{name!r}]: port {port} is a host's port")
        links[str(name)] = port
    return links


def check_links(switches: list[SwitchConfig]) -> None:
    """Links name known switches, both ends declare them, and they form a forest (each link
    on a cycle would give a job two ways up)."""
    by_name = {s.name: s for s in switches}
    for s in switches:
        for other in s.links:
            if other == s.name or other not in by_name:
                raise ValueError(f"switch {s.name}: links to {other!r}, which is not another "
                                 f"configured switch")
            if s.name not in by_name[other].links:
                raise ValueError(f"switch {s.name} links to {other}, but {other} names no link "
                                 f"to {s.name}: declare the link on both ends")
    seen: set[str] = set()
    for start in by_name:
        if start in seen:
            continue
        stack, parent = [start], {start: ""}
        while stack:
            name = stack.pop()
            seen.add(name)
            for other in by_name[name].links:
                if other == parent[name]:
                    continue
                if other in parent:
                    raise ValueError(f"switch links form a cycle through {name} and {other}: "
                                     f"aggregation trees need a forest of links")
                parent[other] = name
                stack.append(other)


def parse_switch(s: dict, i: int, base: Path | None) -> SwitchConfig:
    """One ``switches`` entry, checked, naming the first bad key."""
    where = f"switches[{i}]"
    unknown_keys = set(s) - _SWITCH_KEYS
    if unknown_keys:
        raise ValueError(f"{where}: unknown key(s) {sorted(unknown_keys)}")
    hosts = {}
    for ip, h in _need(s, "hosts", where).items():
        ipaddress.IPv4Address(ip)
        hosts[ip] = HostPort(int(_need(h, "port", f"{where}.hosts[{ip}]")),
                             str(_need(h, "mac", f"{where}.hosts[{ip}]")))
    parse_address(_need(s, "aggregator", where))
    sw = SwitchConfig(
        str(s.get("name", f"s{i + 1}")), str(_need(s, "grpc", where)), int(s.get("device_id", 0)),
        s["aggregator"], hosts, parse_program(s, where, base),
        aggregator_mac=parse_mac(s, "aggregator_mac", where),
        links=parse_links(s, where, {h.port for h in hosts.values()}),
        push_timeout=parse_push_timeout(s, where),
        loopback_ports=parse_loopback_ports(s, where, hosts))
    users = sw.port_users()
    return replace(sw, device_ports=parse_device_ports(s, where, users),
                   port_setup=parse_port_setup_section(s, where, users))


def parse_loopback_ports(s: dict, where: str, hosts: dict[str, HostPort]) -> tuple[int, ...]:
    """A Tofino switch's front-panel ports in loopback (``loopback_ports``); () when absent.
    A port in loopback carries only recirculated passes, so no host or link may be on it."""
    if "loopback_ports" not in s:
        return ()
    if s.get("target") not in TOFINO_CHIPS:
        raise ValueError(f"{where}.loopback_ports: recirculation through loopback ports belongs to "
                         f"a Tofino switch, not a {s.get('target', 'bmv2')} one: remove the key")
    given = s["loopback_ports"]
    if not isinstance(given, list) or not all(isinstance(p, int) and not isinstance(p, bool) for p in given):
        raise ValueError(f"{where}.loopback_ports: a list of front-panel port numbers, "
                         f"e.g. [57, 58], not {given!r}")
    used = {h.port: f"host {ip}" for ip, h in hosts.items()}
    used.update({int(port): f"link to {name}" for name, port in s.get("links", {}).items()})
    taken = [f"{p} ({used[p]})" for p in given if p in used]
    if taken or len(set(given)) != len(given):
        raise ValueError(f"{where}.loopback_ports: each port once, and none a host or link is on: "
                         f"{', '.join(taken) or sorted(given)}")
    return tuple(given)


def parse_push_timeout(s: dict, where: str) -> float:
    """The switch's ``push_timeout``: seconds SetForwardingPipelineConfig may take (default
    DEFAULT_PUSH_TIMEOUT: a Tofino config is 7-8 MB that bf_switchd writes into the chip)."""
    value = s.get("push_timeout", DEFAULT_PUSH_TIMEOUT)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{where}.push_timeout: a number of seconds above 0, got {value!r}")
    return float(value)


def parse_config(data: dict, base: Path | None = None) -> ControllerConfig:
    """Validate a config dict, naming the first bad entry."""
    switches = [parse_switch(s, i, base) for i, s in enumerate(data.get("switches", []))]
    check_links(switches)
    host_aggregator = _need(data, "host_aggregator", "config")
    parse_address(host_aggregator)
    known = {f for f in ControllerConfig.__dataclass_fields__} - {"switches", "host_aggregator", "extra"}
    unknown = set(data) - known - {"switches", "host_aggregator"}
    if unknown:
        raise ValueError(f"config: unknown key(s) {sorted(unknown)}")
    kwargs = {k: data[k] for k in known if k in data}
    for key in ("database", "admin_token_file", "tls_cert", "tls_key"):
        if kwargs.get(key) and base is not None and not Path(kwargs[key]).is_absolute():
            kwargs[key] = str(base / kwargs[key])
    if kwargs.get("sharing", DYNAMIC) not in SHARING:
        raise ValueError(f"config: sharing {kwargs['sharing']!r}: write one of {', '.join(SHARING)} "
                         f"(how the switch's slots are shared among its jobs; default {DYNAMIC})")
    if kwargs.get("sharing") == ATP:
        check_atp(switches, host_aggregator)
    for key in ("switch_check_seconds", "switch_audit_seconds"):
        value = kwargs.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"config: {key} {value!r}: write a number of seconds above 0 "
                             f"(how often the keeper looks at each switch)")
    if bool(kwargs.get("tls_cert")) != bool(kwargs.get("tls_key")):
        raise ValueError("config: tls_cert and tls_key go together")
    if not kwargs.get("admin_token"):
        kwargs["admin_token"] = load_token(kwargs.get("admin_token_file"))
    return ControllerConfig(switches=tuple(switches), host_aggregator=host_aggregator, **kwargs)


def unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object whose keys are all different (json keeps the last of a repeated key
    silently; TOML refuses one itself)."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} appears twice in one object: keep one (rename the other)")
        out[key] = value
    return out


def read_config_data(path: Path | str) -> dict:
    """A config file's raw dict: TOML when it ends in ``.toml`` (comments allowed; the
    commented example is examples/controller.toml), else JSON. Same keys either way."""
    path = Path(path)
    try:
        text = path.read_text()
        if path.suffix == ".toml":
            return tomllib.loads(text)
        return json.loads(text, object_pairs_hook=unique_keys)
    except (OSError, ValueError, tomllib.TOMLDecodeError) as e:
        raise ValueError(f"cannot read controller config {path}: {e}") from None


def load_config(path: Path | str) -> ControllerConfig:
    """Read and check a config file (read_config_data, parse_config)."""
    return parse_config(read_config_data(path), Path(path).parent)


def check_atp(switches: list[SwitchConfig], host_aggregator: str) -> None:
    """``sharing = "atp"`` (docs/atp.md) needs each switch's aggregator MAC (the source of the
    sums it sends the host aggregator) and the host aggregator's IPv4 address (the switch
    takes frames to and from its port); ValueError naming what is missing."""
    missing = [s.name for s in switches if not s.aggregator_mac]
    if missing:
        raise ValueError(f"config: sharing atp: switch(es) {', '.join(missing)} need aggregator_mac "
                         f"(the source MAC of the sums a switch sends the host aggregator)")
    host, _ = parse_address(host_aggregator)
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        raise ValueError(f"config: sharing atp: host_aggregator {host_aggregator!r} must be an IPv4 "
                         f"address and port (the switch matches its frames by address)") from None

"""A Tofino switch's ports as its config entry describes them: which SDE port (connector and
channel, ucli's ``1/0``) each front-panel port the hosts and links name is, and at what speed,
FEC and autonegotiation it comes up.

The config's ``ports`` section, keyed by front-panel port (the numbers ``hosts`` and ``links``
use), in TOML::

    [switches.ports]
    1 = { connector = "1/0", speed = "100G", fec = "rs" }
    2 = { speed = "100G" }            # connector "2/0", fec "none", autoneg "default"

The values are translated to the strings BF Runtime's ``$PORT`` table takes (its ``$SPEED``,
``$FEC`` and ``$AUTO_NEGOTIATION`` choices in open-p4studio's
``pkgsrc/bf-drivers/src/bf_rt/bf_rt_port/bf_rt_port_tf1.json``, the same in tf2/tf3), and a
speed's FEC is checked against what the port manager accepts for it
(``bf_port_fec_type_validate`` in ``pkgsrc/bf-drivers/src/port_mgr/bf_port_if.c``), so a bad
entry is refused when the config is read, not by bf_switchd halfway through a bring-up.
controller/tofino/bfrt_port_script.py writes the bring-up script from these entries;
controller/tofino/port_map.py turns its output into the config's ``device_ports``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

PIPE_SHIFT = 7   # a Tofino device port's pipe is dev_port >> 7 (128 device ports per pipe)

SPEEDS: dict[str, str] = {s: f"BF_SPEED_{s}" for s in
                          ("1G", "10G", "25G", "40G", "50G", "100G", "200G", "400G")}
FECS: dict[str, str] = {"none": "BF_FEC_TYP_NONE", "fc": "BF_FEC_TYP_FIRECODE",
                        "rs": "BF_FEC_TYP_REED_SOLOMON"}
AUTONEG: dict[str, str] = {"default": "PM_AN_DEFAULT", "on": "PM_AN_FORCE_ENABLE",
                           "off": "PM_AN_FORCE_DISABLE"}
# The FEC the port manager accepts at each speed (bf_port_fec_type_validate).
FEC_AT_SPEED: dict[str, tuple[str, ...]] = {
    "1G": ("none",), "10G": ("none", "fc"), "25G": ("none", "fc", "rs"),
    "40G": ("none", "fc"), "50G": ("none", "fc", "rs"), "100G": ("none", "rs"),
    "200G": ("rs",), "400G": ("rs",),
}
_ENTRY_KEYS = ("connector", "speed", "fec", "autoneg")
_CONNECTOR = re.compile(r"^(\d{1,3})/(\d)$")


class PortedSwitch(Protocol):
    """What the Tofino port tools read of a switch's config entry (the controller's
    ``SwitchConfig`` is one): declared here so that tofino/ stays below the controller's config."""

    name: str
    hosts: dict
    port_setup: dict[int, "PortSetup"]
    loopback_ports: tuple[int, ...]

    def port_users(self) -> dict[int, str]: ...


def pipe_of(dev_port: int) -> int:
    """The pipe a device port belongs to (its registers are that pipe's)."""
    return dev_port >> PIPE_SHIFT


@dataclass(frozen=True)
class PortSetup:
    """One front-panel port: its SDE connector and channel and how it comes up (config words:
    speed as in SPEEDS, fec and autoneg as in FECS and AUTONEG)."""

    front_panel: int
    conn: int
    chnl: int
    speed: str
    fec: str = "none"
    autoneg: str = "default"

    @property
    def connector(self) -> str:
        """``conn/chnl``, as ucli and ``$PORT_NAME`` write it."""
        return f"{self.conn}/{self.chnl}"

    def sde_values(self) -> tuple[str, str, str]:
        """$SPEED, $FEC and $AUTO_NEGOTIATION as BF Runtime's $PORT table takes them."""
        return SPEEDS[self.speed], FECS[self.fec], AUTONEG[self.autoneg]


def parse_connector(text: object, where: str) -> tuple[int, int]:
    """``"1/0"`` -> (1, 0); a clear error for anything else."""
    m = _CONNECTOR.match(text) if isinstance(text, str) else None
    if not m:
        raise ValueError(f"{where}: connector {text!r} is not conn/chnl as ucli writes it "
                         f"(e.g. \"1/0\": connector 1, channel 0)")
    return int(m[1]), int(m[2])


def _choice(entry: dict, key: str, choices: dict[str, str], default: str | None,
            where: str) -> str:
    """A config word out of ``choices`` (case-insensitive), or the default when absent."""
    given = entry.get(key, default)
    if given is None:
        raise ValueError(f"{where}: missing {key!r}: one of {', '.join(choices)}")
    word = next((c for c in choices if c.lower() == str(given).lower()), None)
    if word is None:
        raise ValueError(f"{where}: unknown {key} {given!r}: use one of {', '.join(choices)}")
    return word


def parse_port_setup(front_panel: int, entry: object, where: str) -> PortSetup:
    """One ``ports`` entry, checked: connector (default ``<front_panel>/0``), speed, a FEC the
    port manager takes at that speed, autoneg."""
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: expected a table like {{speed = \"100G\", fec = \"rs\"}}, "
                         f"got {entry!r}")
    unknown = sorted(set(entry) - set(_ENTRY_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}: a port takes {', '.join(_ENTRY_KEYS)}")
    conn, chnl = parse_connector(entry.get("connector", f"{front_panel}/0"), where)
    speed = _choice(entry, "speed", SPEEDS, None, where)
    fec = _choice(entry, "fec", FECS, "none", where)
    if fec not in FEC_AT_SPEED[speed]:
        raise ValueError(f"{where}: fec {fec!r} is not available at {speed} (the port manager "
                         f"takes {', '.join(FEC_AT_SPEED[speed])} there): change fec or speed")
    return PortSetup(front_panel, conn, chnl, speed, fec, _choice(entry, "autoneg", AUTONEG,
                                                                  "default", where))


def front_panel_number(key: object, where: str) -> int:
    """A ``ports`` key: the front-panel port number hosts and links use."""
    try:
        number = int(str(key))
    except ValueError:
        number = -1
    if number < 0:
        raise ValueError(f"{where}: key {key!r} is not a front-panel port number (the numbers "
                         f"hosts' \"port\" and links use; the SDE's \"1/0\" goes in connector)")
    return number


def parse_ports(section: object, where: str, used: dict[int, str]) -> dict[int, PortSetup]:
    """A switch's ``ports`` section: front-panel port -> PortSetup. ``used`` names who uses
    each port a host or link needs ("host 10.0.0.1"): each must have an entry. No port may
    be listed twice, nor two ports name one connector."""
    if not isinstance(section, dict):
        raise ValueError(f"{where}: expected a table of front-panel port -> port settings")
    ports: dict[int, PortSetup] = {}
    by_connector: dict[str, int] = {}
    for key, entry in section.items():
        number = front_panel_number(key, where)
        if number in ports:
            raise ValueError(f"{where}: front-panel port {number} is listed twice ({key!r}): "
                             f"keep one entry")
        port = parse_port_setup(number, entry, f"{where}[{key!r}]")
        if port.connector in by_connector:
            raise ValueError(f"{where}: front-panel ports {by_connector[port.connector]} and "
                             f"{number} both name connector {port.connector}: give each its own")
        ports[number], by_connector[port.connector] = port, number
    missing = {p: who for p, who in used.items() if p not in ports}
    if missing:
        raise ValueError(f"{where}: no entry for front-panel port(s) "
                         + ", ".join(f"{p} ({who})" for p, who in sorted(missing.items()))
                         + ": add one each, e.g. 1 = { speed = \"100G\" }")
    return ports

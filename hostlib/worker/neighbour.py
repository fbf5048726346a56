"""The worker host's neighbour entry for a switch's aggregator address.

Neither switch program (BMv2's, Tofino's) answers ARP for the aggregator address workers send
contributions to, so every worker host needs a static neighbour entry for it (the Mininet
emulation adds one per host). When the controller's config names a switch's
``aggregator_mac``, that switch's grants carry it (``Grant.aggregator_mac``), and each rank,
when it starts using such a grant, compares it with the kernel's IPv4 neighbour table
(/proc/net/arp): a missing entry, or one with another MAC, is logged as a warning with the
command that sets it (as root). The library changes no system state itself.
"""

from __future__ import annotations

from pathlib import Path

from inagg.hostlib.wire.transport import interface_of

ARP_TABLE = Path("/proc/net/arp")
_ATF_COM = 0x2   # linux/if_arp.h: the entry is complete (has a MAC)


def kernel_neighbour(ip: str, table: Path = ARP_TABLE) -> str | None:
    """The MAC of the kernel's complete neighbour entry for ``ip`` (lower case); None if none.
    The table's rows: IP address, HW type, flags (hex), HW address, mask, device."""
    for line in table.read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 6 and fields[0] == ip and int(fields[2], 16) & _ATF_COM:
            return fields[3].lower()
    return None


def neighbour_problem(ip: str, mac: str, table: Path = ARP_TABLE) -> str:
    """"" when the kernel maps ``ip`` to ``mac`` (or has no readable table: not Linux); else
    what is wrong and the command that fixes it."""
    if not table.is_file():
        return ""
    have = kernel_neighbour(ip, table)
    if have == mac.lower():
        return ""
    dev = interface_of(ip)
    fix = f"ip neigh replace {ip} lladdr {mac} nud permanent" + (f" dev {dev}" if dev else "")
    now = f"this host maps it to {have}" if have else "this host has no neighbour entry for it"
    return (f"the switch's aggregator address {ip} is at {mac} and the switch answers no ARP, but "
            f"{now}: contributions cannot leave; as root: {fix}")

"""What each in-network aggregation format costs on the wire, and from how many workers it beats
ring allreduce on the same links: arithmetic, not a measurement.

Per packet of K int32 values: the Ethernet frame (header to last value, padded to Ethernet's
60-byte minimum), plus FCS (4), preamble and start delimiter (8) and the inter-frame gap (12)
on the wire. Goodput is the values' share of the line. inagg's K are read from the committed
P4Infos (BMv2, Tofino) and the host path's MTU rule (the software switch and host aggregator
at MTU 1500); SwitchML's and ATP's formats are those shared/reference/anchors.md records
(SwitchML: 10 header bytes after UDP, its 8-byte header and two exponents; ATP: 18 header
bytes after UDP, and 32 values as its public P4 program carries them, beside the paper's 62
values over two passes in a 308-byte frame).

INA versus ring, per worker link in each direction: INA sends the tensor once and receives the
result once (S bytes of values each way); ring allreduce moves 2(N-1)/N S each way, at its own
framing (TCP/IPv4 with timestamps: 52 header bytes per MTU-sized segment). INA is faster once
2(N-1)/N / g_ring > 1 / g_ina; a format whose goodput is under half of ring's never is (the
bound 2(N-1)/N < 2). Latency, packet rates and loss are not counted: the table is the wire's
bound, which software data planes (BMv2, the software switch) do not reach at 100 GbE.

Prints the Markdown table docs/tofino.md carries and writes benchmarks/results/wire_efficiency.csv.
"""

from __future__ import annotations

import argparse
import csv
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from inagg.controller.config import default_program  # noqa: E402
from inagg.hostlib.wire.grant import ETHERNET_MTU, JUMBO_MTU, values_for_mtu  # noqa: E402
from inagg.hostlib.wire.protocol import ENCAP_BYTES, HEADER_BYTES  # noqa: E402

LINE_GBPS = 100.0
ON_WIRE_EXTRA = 4 + 8 + 12   # FCS, preamble + SFD, inter-frame gap
MIN_FRAME = 60               # Ethernet's minimum frame without FCS
TCP_IP_HEADERS = 20 + 32     # IPv4 + TCP with timestamps
RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Format:
    system: str
    target: str
    values: int          # K, int32 values per packet
    frame: int           # Ethernet frame bytes without FCS

    @property
    def wire(self) -> int:
        return max(self.frame, MIN_FRAME) + ON_WIRE_EXTRA

    @property
    def goodput(self) -> float:
        """The values' share of the line."""
        return 4 * self.values / self.wire


def udp_format(system: str, target: str, values: int, header: int) -> Format:
    """A format carried in Ethernet/IPv4/UDP with ``header`` bytes before the values."""
    return Format(system, target, values, ENCAP_BYTES + header + 4 * values)


def formats() -> list[Format]:
    """inagg's targets (K from their programs) beside SwitchML and ATP."""
    k = {t: default_program(t).p4info.values_per_packet for t in ("bmv2", "tofino")}
    return [
        udp_format("inagg", "BMv2", k["bmv2"], HEADER_BYTES),
        udp_format("inagg", "Tofino 1", k["tofino"], HEADER_BYTES),
        udp_format("inagg", f"soft switch / host aggregator, MTU {ETHERNET_MTU}",
                   values_for_mtu(ETHERNET_MTU), HEADER_BYTES),
        udp_format("SwitchML", "Tofino 1", 64, 10),
        udp_format("SwitchML", "Tofino 1, folded pipes", 256, 10),
        udp_format("ATP", "Tofino 1, public P4", 32, 18),
        Format("ATP", "Tofino 1, paper (two passes)", 62, 308),
    ]


def ring_goodput(mtu: int) -> float:
    """Ring allreduce's share of the line over TCP/IPv4 in ``mtu``-sized packets."""
    return (mtu - TCP_IP_HEADERS) / (mtu + 14 + ON_WIRE_EXTRA)


def ina_beats_ring_from(g_ina: float, g_ring: float, limit: int = 1 << 20) -> int | None:
    """The smallest N >= 2 at which INA's wire time is below ring's; None if none is."""
    if g_ring / g_ina >= 2:
        return None
    return next(n for n in range(2, limit) if 2 * (n - 1) / n / g_ring > 1 / g_ina)


def rows() -> list[dict]:
    out = []
    for f in formats():
        row = {"system": f.system, "target": f.target, "K": f.values, "frame_bytes": f.frame,
               "wire_bytes": f.wire, "wire_bytes_per_value": round(f.wire / f.values, 2),
               "goodput_gbps": round(LINE_GBPS * f.goodput, 1)}
        for mtu in (JUMBO_MTU, ETHERNET_MTU):
            row[f"beats_ring_mtu{mtu}"] = ina_beats_ring_from(f.goodput, ring_goodput(mtu))
        # as N grows ring's share tends to 2 S / g_ring: INA's time over ring's then
        row["time_vs_ring_large_n"] = round(ring_goodput(JUMBO_MTU) / (2 * f.goodput), 2)
        out.append(row)
    return out


def _from(n: int | None) -> str:
    return "never" if n is None else f"N ≥ {n}"


def markdown(table: list[dict]) -> str:
    lines = [f"| system | target | K | frame / on the wire (B) | wire B per value | goodput at "
             f"{LINE_GBPS:.0f} GbE | beats ring (TCP, MTU {JUMBO_MTU}: {100 * ring_goodput(JUMBO_MTU):.1f} %) "
             f"| beats ring (TCP, MTU {ETHERNET_MTU}: {100 * ring_goodput(ETHERNET_MTU):.1f} %) "
             f"| time / ring's, large N (MTU {JUMBO_MTU}) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in table:
        lines.append(f"| {r['system']} | {r['target']} | {r['K']} | {r['frame_bytes']} / {r['wire_bytes']} "
                     f"| {r['wire_bytes_per_value']:.2f} | {r['goodput_gbps']:.1f} Gb/s "
                     f"({r['goodput_gbps'] / LINE_GBPS:.0%}) | {_from(r[f'beats_ring_mtu{JUMBO_MTU}'])} "
                     f"| {_from(r[f'beats_ring_mtu{ETHERNET_MTU}'])} | {r['time_vs_ring_large_n']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--no-csv", action="store_true", help="print the table only")
    args = p.parse_args(argv)
    table = rows()
    print(markdown(table))
    if not args.no_csv:
        RESULTS.mkdir(exist_ok=True)
        with open(RESULTS / "wire_efficiency.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(table[0]))
            writer.writeheader()
            writer.writerows(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

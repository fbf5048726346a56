"""A job's grant: where its workers send contributions and which aggregator slots they may use.

Issued by the controller (or, before the controller exists in a deployment, written in a config
file). All workers of a job hold the same grant; a new grant always carries a new epoch."""

from __future__ import annotations

from dataclasses import dataclass

from inagg.hostlib.wire.protocol import ENCAPSULATIONS, HEADER_BYTES, MAX_SLOT, ROCE_HEADER_BYTES, ROCE_ICRC_BYTES

# The host path never relies on IP fragmentation: a datagram (IPv4 + UDP + inagg header + K
# values) fits the MTU of the interface it leaves by, so K follows from that MTU.
IPV4_UDP_BYTES = 20 + 8
ETHERNET_MTU, JUMBO_MTU = 1500, 9000
MAX_IPV4_DATAGRAM = 65535  # loopback's MTU (65536) allows more than IPv4 can say


def values_for_mtu(mtu: int) -> int:
    """The most int32 values a datagram (host path, or switch path over UDP) carries
    unfragmented on a link of ``mtu`` bytes: 364 at 1500, 2239 at 9000, 16372 on loopback."""
    return (min(mtu, MAX_IPV4_DATAGRAM) - IPV4_UDP_BYTES - HEADER_BYTES) // 4


def switch_values_for_mtu(mtu: int) -> int:
    """The most int32 values a switch-path packet carries unfragmented on a link of ``mtu``
    bytes in either framing, RoCE's (the larger) included: 355 at 1500, 2230 at 9000, 16363
    on loopback. A software switch refuses a program whose K its ports cannot carry over UDP
    (``values_for_mtu``); RoCE jobs need this K."""
    return (min(mtu, MAX_IPV4_DATAGRAM) - IPV4_UDP_BYTES - ROCE_HEADER_BYTES - ROCE_ICRC_BYTES
            - HEADER_BYTES) // 4


# Host aggregation K where the MTU allows it (loopback, 16 KiB of values per datagram): larger
# K costs aggregator memory (slots x 2 sets x K x 4 bytes) for little gain. Aggregators and the
# controller use min(this, values_for_mtu(interface MTU)).
HOST_VALUES_PER_PACKET = 4096
# The host aggregator's default UDP port (its address is configured; decoders bind this port).
HOST_AGGREGATOR_PORT = 42666
# Slots per job on a host aggregator: W * K * 4 bytes (512 KiB) in flight per worker.
HOST_WINDOW = 32


@dataclass(frozen=True)
class Grant:
    job_id: int
    epoch: int
    slot_base: int
    slot_count: int
    values_per_packet: int
    aggregator: tuple[str, int]
    mode: str = "host"  # "switch": aggregated in the data plane; "host": by a host aggregator
    transport: str = "udp"  # how contributions are carried: "udp", or "roce" (RoCEv2)
    reason: str = ""        # host mode: why the controller did not put the job on a switch
    aggregator_mac: str = ""  # switch mode, when configured: the MAC of the aggregator address

    def __post_init__(self) -> None:
        if not 1 <= self.job_id <= 0xFFFF:
            raise ValueError(f"grant: job_id {self.job_id} not in 1..65535")
        if not 0 <= self.epoch <= 0xFFFF:
            raise ValueError(f"grant: epoch {self.epoch} not in 0..65535")
        if self.slot_count < 1 or self.slot_base < 0 or self.slot_base + self.slot_count > MAX_SLOT + 1:
            raise ValueError(f"grant: slots [{self.slot_base}, +{self.slot_count}) out of range")
        if not 1 <= self.values_per_packet <= 0xFFFF:
            raise ValueError(f"grant: values_per_packet {self.values_per_packet} not in 1..65535")
        if self.mode not in ("switch", "host"):
            raise ValueError(f"grant: mode must be 'switch' or 'host', got {self.mode!r}")
        if self.transport not in ENCAPSULATIONS:
            raise ValueError(f"grant: transport must be one of {ENCAPSULATIONS}, got {self.transport!r}")


def parse_address(text: str) -> tuple[str, int]:
    """``"host:port"`` -> ``(host, port)`` with a clear error."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"bad address {text!r}: expected HOST:PORT")
    return host, int(port)

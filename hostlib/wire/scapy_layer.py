"""scapy layers for inagg, generated from the header twins (``protocol.HEADER_FIELDS``,
``roce.RETH_FIELDS``/``IMMDT_FIELDS``) so they cannot drift.

``import inagg.hostlib.wire.scapy_layer`` binds the inagg header to its UDP ports, both directions: the
switch's (``UDP_PORT``) and the host aggregator's (``HOST_AGGREGATOR_PORT``), and to RoCEv2: scapy's
BTH (UDP 4791) -> RETH -> ImmDt for UC RDMA WRITE ONLY WITH IMMEDIATE, then inagg when the
immediate is "INAG"; scapy's BTH keeps the trailing ICRC in its ``icrc`` field. ``bind_port(p)``
adds a deployment's own port. A host-aggregator datagram larger than its links' MTU (16 KB
ones, the loopback default, on 1500-byte links) travels IP-fragmented: ``read_pcap``
reassembles fragments before decoding, where ``rdpcap`` alone shows them, and reads an empty
capture (BMv2 leaves a port's pcap empty, without even the file header, until its first frame) as
no packets.
"""

from __future__ import annotations

from pathlib import Path
import struct

from scapy.contrib.roce import BTH
from scapy.fields import BitField, Field, SignedByteField
from scapy.layers.inet import UDP, defragment
from scapy.packet import Packet, bind_layers
from scapy.plist import PacketList
from scapy.utils import rdpcap

from inagg.hostlib.wire.grant import HOST_AGGREGATOR_PORT
from inagg.hostlib.wire.protocol import (HEADER_FIELDS, MSG_CONTRIBUTION, ROCE_INAGG_IMMEDIATE,
                       ROCE_OPCODE_UC_WRITE_ONLY_IMM, UDP_PORT, VERSION)
from inagg.hostlib.wire.roce import IMMDT_FIELDS, RETH_FIELDS


def _field(name: str, width: int, signed: bool):
    if signed:
        if width != 8:
            raise NotImplementedError(f"signed field {name} of width {width}")
        return SignedByteField(name, 0)
    return BitField(name, 0, width)


class ValuesField(Field):
    """The int32 values after the header: every whole 4-byte word of the payload, decoded and
    encoded with one ``struct`` call (scapy's ``FieldListField`` builds a field object per value:
    a millisecond a packet, most of a large capture's read time). Trailing bytes short of a word
    stay as the layer's payload."""

    def __init__(self, name: str) -> None:
        super().__init__(name, [])

    def getfield(self, pkt: Packet, s: bytes) -> tuple[bytes, list[int]]:
        n = len(s) // 4
        return s[4 * n:], list(struct.unpack(f"!{n}i", s[:4 * n]))

    def addfield(self, pkt: Packet, s: bytes, val: list[int] | None) -> bytes:
        val = list(val or [])
        return s + struct.pack(f"!{len(val)}i", *val)

    def i2len(self, pkt: Packet, x: list[int] | None) -> int:
        return 4 * len(x or [])


class Inagg(Packet):
    name = "inagg"
    fields_desc = [_field(*f) for f in HEADER_FIELDS] + [
        ValuesField("values"),
    ]

    def mysummary(self) -> str:
        kind = "contrib" if self.msg_type == MSG_CONTRIBUTION else "result"
        return self.sprintf(
            f"inagg {kind} job=%job_id% w=%worker_id% slot=%slot%/%slot_set% off=%offset% n=%count%"
        )


# Sensible defaults for a hand-built packet.
Inagg.fields_desc[0].default = VERSION
Inagg.fields_desc[1].default = MSG_CONTRIBUTION


class RETH(Packet):
    """RDMA Extended Transport Header (virtual address, rkey, DMA length)."""
    name = "RETH"
    fields_desc = [_field(*f) for f in RETH_FIELDS]


class ImmDt(Packet):
    """Immediate data: inagg's "INAG" marks an inagg header after it."""
    name = "ImmDt"
    fields_desc = [_field(*f) for f in IMMDT_FIELDS]


def bind_port(port: int) -> None:
    bind_layers(UDP, Inagg, dport=port)
    bind_layers(UDP, Inagg, sport=port)


def read_pcap(path: Path | str, count: int = -1) -> PacketList:
    """A pcap's packets (the first ``count`` frames; -1: all) with IP fragments reassembled
    (host-aggregator datagrams), decoded; an empty file (not one frame yet) has none."""
    if Path(path).stat().st_size == 0:
        return PacketList([], name=Path(path).name)
    return defragment(rdpcap(str(path), count=count))


bind_port(UDP_PORT)
bind_port(HOST_AGGREGATOR_PORT)
bind_layers(BTH, RETH, opcode=ROCE_OPCODE_UC_WRITE_ONLY_IMM)
bind_layers(RETH, ImmDt)
bind_layers(ImmDt, Inagg, imm=ROCE_INAGG_IMMEDIATE)

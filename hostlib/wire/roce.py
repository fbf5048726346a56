"""The inagg protocol carried as RoCEv2, so that a switch (or a software data plane) can
aggregate RoCE traffic and an RDMA NIC can one day send and receive it.

Wire format (IPv4 only)::

    Ethernet | IPv4 | UDP (dst 4791) | BTH (12 B) | RETH (16 B) | ImmDt (4 B)
             | inagg header (16 B) + payload, exactly as in UDP mode | ICRC (4 B)

Design decisions, and why:

* **Opcode: UC RDMA WRITE ONLY WITH IMMEDIATE (0x2B).** UC, as SwitchML's RDMA mode: the
  switch consumes contributions and emits results of its own, so RC's ACK/NAK and retransmission
  state machine would have nothing sensible to acknowledge; inagg retransmits by itself.
  "ONLY": one inagg packet is one complete message (it fits one MTU). WITH IMMEDIATE: a receiving
  NIC raises a completion per packet, so the host learns which results arrived.
* **The inagg header and payload are the WRITE's payload** (RETH DMA length = their length). The
  aggregation logic stays byte-for-byte the one of UDP mode: a data plane parses the inagg header
  at a fixed distance (BTH + RETH + ImmDt = 32 B) after UDP and runs the same code.
* **ImmDt = the fixed magic 0x494E4147 ("INAG").** It lets a parser tell inagg traffic from any
  other RDMA WRITE with one 32-bit compare, without knowing QP numbers (assigned by connection
  setup, per host); and a receiving NIC hands the immediate to software in the completion, so a
  QP shared with other traffic still recognises inagg writes without reading memory. Carrying a
  field instead (job, slot) would duplicate the inagg header, which is in the packet anyway.
* **BTH:** P_Key 0xFFFF (default partition), destination QP configurable (default 1), PSN a
  per-sender 24-bit counter, SE/M/pad/TVer 0, FECN/BECN 0, AckReq 0 (UC never acknowledges).
* **RETH:** virtual address = inagg element offset * 4, the byte offset of the block in the
  tensor: with a zero-based memory region (``IBV_ACCESS_ZERO_BASED``) a receiver's NIC writes
  each block to its own place. Caveat: the DMA payload starts with the 16-byte inagg header, so
  the values land at VA + 16 and a block's tail overlaps the next block's header; a flat tensor
  receiver needs a region laid out per block (or a header-stripping switch, a different format).
  The rkey is configurable.
* **IPv4/UDP:** DF set with IP ID 0 (the kernel keeps a zero ID on DF packets, and the ICRC
  covers the ID), UDP checksum 0 (allowed for RoCEv2 over IPv4; the ICRC protects the payload).
  The UDP source port carries flow entropy: ``0xC000 | (qp & 0x3FFF)`` as Linux's
  ``rdma_flow_label_to_udp_sport``, stable per QP so ECMP keeps a sender's packets in order.
* **ICRC** (InfiniBand spec, annex A17, RoCEv2): CRC-32 (the Ethernet polynomial, ``zlib.crc32``)
  over 8 bytes of 0xFF standing in for the LRH, then the IPv4 header with TOS, TTL and header
  checksum set to all-ones, the UDP header with its checksum set to 0xFFFF, the BTH with its
  "resv8a" byte (FECN, BECN, 6 reserved bits) set to 0xFF, and the rest of the packet (RETH,
  ImmDt, inagg bytes); appended little-endian. Masked fields are those a router may rewrite.
  This is exactly ``scapy.contrib.roce.BTH.compute_icrc``, which the tests compare against.

:class:`RoceRawTransport` speaks this over Linux raw IP sockets, so it works without an RDMA NIC
(it needs root). Where a real NIC would plug in is a pyverbs UC-QP sender posting
``IBV_WR_RDMA_WRITE_WITH_IMM`` work requests with the inagg bytes as the SGE and the magic as
immediate; it is not implemented, for want of hardware to test it (see :func:`verbs_available`).
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct
import time
import zlib
from typing import NamedTuple

from inagg.hostlib.wire.protocol import (
    ENCAP_BYTES,
    ROCE_HEADER_BYTES,
    ROCE_ICRC_BYTES,
    ROCE_INAGG_IMMEDIATE as INAGG_IMMEDIATE,
    ROCE_OPCODE_UC_WRITE_ONLY_IMM as OPCODE_UC_RDMA_WRITE_ONLY_IMM,
    ROCE_UDP_PORT,
    ipv4_checksum,
    mac,
    unpack_header,
)
from inagg.hostlib.wire.transport import enlarge_buffers

# (name, width in bits, signed) in wire order: the twins of bth_h, reth_h and immdt_h in
# p4/include/headers.p4 (tests/test_protocol_twin.py compares them).
BTH_FIELDS: tuple[tuple[str, int, bool], ...] = (
    ("opcode", 8, False), ("solicited", 1, False), ("mig_req", 1, False),
    ("pad_count", 2, False), ("transport_version", 4, False), ("pkey", 16, False),
    ("fecn", 1, False), ("becn", 1, False), ("resv6", 6, False), ("dst_qp", 24, False),
    ("ack_req", 1, False), ("resv7", 7, False), ("psn", 24, False),
)
RETH_FIELDS: tuple[tuple[str, int, bool], ...] = (
    ("va", 64, False), ("rkey", 32, False), ("dma_len", 32, False),
)
IMMDT_FIELDS: tuple[tuple[str, int, bool], ...] = (("imm", 32, False),)


def byte_offset(fields: tuple[tuple[str, int, bool], ...], name: str) -> int:
    """Byte offset of field ``name`` (byte-aligned) in a header described by ``fields``."""
    bits = 0
    for field, width, _ in fields:
        if field == name:
            assert bits % 8 == 0, f"{name} is not byte-aligned"
            return bits // 8
        bits += width
    raise KeyError(name)

DEFAULT_PKEY = 0xFFFF
DEFAULT_QP = 0x000001
DEFAULT_RKEY = 0
PSN_MASK = QP_MASK = 0xFFFFFF

IPV4_BYTES = 20
UDP_BYTES = 8
BTH_BYTES = 12
RETH_BYTES = 16
IMM_BYTES = 4
# What a RoCEv2 frame adds beyond the inagg packet compared to plain Ethernet/IPv4/UDP framing.
ROCE_OVERHEAD = BTH_BYTES + RETH_BYTES + IMM_BYTES + ROCE_ICRC_BYTES

_IP_DF = 0x4000
# IPv4 | UDP | BTH | RETH | ImmDt, the fixed 60 bytes before the inagg bytes.
_HEADERS = struct.Struct("!BBHHHBBH4s4s" "HHHH" "BBHII" "QII" "I")
assert _HEADERS.size == IPV4_BYTES + UDP_BYTES + BTH_BYTES + RETH_BYTES + IMM_BYTES
_BTH_RETH_IMM = struct.Struct("!BBHII" "QII" "I")
assert _BTH_RETH_IMM.size == BTH_BYTES + RETH_BYTES + IMM_BYTES == ROCE_HEADER_BYTES
_LRH_CRC = zlib.crc32(b"\xff" * 8)  # the masked LRH stand-in, folded once


class RoceMeta(NamedTuple):
    """The RoCE fields of a decapsulated packet that the inagg bytes do not carry."""

    src_ip: str
    dst_ip: str
    src_port: int
    dst_qp: int
    psn: int
    va: int
    rkey: int


def icrc(packet: bytes | bytearray | memoryview) -> bytes:
    """The 4-byte ICRC of a RoCEv2 IPv4 ``packet``: it starts at the IPv4 header and ends with
    the ICRC's 4 bytes, which are ignored. The slot is part of the argument because the IPv4 total
    length and UDP length that the CRC covers count it: a builder passes its packet with a
    placeholder there, a receiver the packet as received. Only the headers up to BTH are copied."""
    view = memoryview(packet)
    ihl = (view[0] & 0x0F) * 4
    bth = ihl + UDP_BYTES
    masked = bytearray(view[:bth + BTH_BYTES])
    masked[1] = 0xFF  # TOS (DSCP/ECN)
    masked[8] = 0xFF  # TTL
    masked[10:12] = b"\xff\xff"  # IPv4 header checksum
    masked[ihl + 6:ihl + 8] = b"\xff\xff"  # UDP checksum
    masked[bth + 4] = 0xFF  # BTH resv8a: FECN, BECN, 6 reserved bits
    crc = zlib.crc32(view[bth + BTH_BYTES:-ROCE_ICRC_BYTES], zlib.crc32(masked, _LRH_CRC))
    return crc.to_bytes(ROCE_ICRC_BYTES, "little")


def encapsulate(
    inagg: bytes, *, src_ip: str, dst_ip: str, src_port: int, dst_qp: int = DEFAULT_QP,
    psn: int, rkey: int = DEFAULT_RKEY, tos: int = 0, ttl: int = 64,
) -> bytes:
    """The IPv4 packet (IPv4 header on) carrying the inagg packet ``inagg`` as a UC RDMA WRITE
    ONLY WITH IMMEDIATE; the RETH virtual address is taken from the inagg header's offset."""
    if not (0 <= dst_qp <= QP_MASK and 0 <= psn <= PSN_MASK):
        raise ValueError(f"destination QP {dst_qp:#x} / PSN {psn:#x} do not fit in 24 bits")
    va = unpack_header(inagg).offset * 4
    n = len(inagg)
    udp_len = UDP_BYTES + ROCE_OVERHEAD + n
    pkt = bytearray(_HEADERS.size + n + ROCE_ICRC_BYTES)
    _HEADERS.pack_into(
        pkt, 0,
        0x45, tos, IPV4_BYTES + udp_len, 0, _IP_DF, ttl, socket.IPPROTO_UDP, 0,
        socket.inet_aton(src_ip), socket.inet_aton(dst_ip),
        src_port, ROCE_UDP_PORT, udp_len, 0,
        OPCODE_UC_RDMA_WRITE_ONLY_IMM, 0, DEFAULT_PKEY, dst_qp, psn,
        va, rkey, n,
        INAGG_IMMEDIATE,
    )
    struct.pack_into("!H", pkt, 10, ipv4_checksum(pkt[:IPV4_BYTES]))
    pkt[_HEADERS.size:-ROCE_ICRC_BYTES] = inagg
    pkt[-ROCE_ICRC_BYTES:] = icrc(pkt)
    return bytes(pkt)


def frame(inagg: bytes, *, dst_mac: str | int, src_mac: str | int, **fields) -> bytes:
    """:func:`encapsulate` behind an Ethernet header; ``fields`` are encapsulate's keywords."""
    return (mac(dst_mac).to_bytes(6, "big") + mac(src_mac).to_bytes(6, "big") + b"\x08\x00"
            + encapsulate(inagg, **fields))


def decapsulate(packet: bytes | bytearray | memoryview,
                verify_icrc: bool = True) -> tuple[bytes | bytearray | memoryview, RoceMeta]:
    """The inagg bytes (a slice of ``packet``, so a memoryview in gives a memoryview out, with no
    copy) and the RoCE fields of a RoCEv2 IPv4 packet; ``ValueError`` says what is wrong
    otherwise. Bytes past the IPv4 total length (Ethernet padding) are ignored."""
    if len(packet) < IPV4_BYTES or packet[0] >> 4 != 4:
        raise ValueError("not an IPv4 packet")
    ihl = (packet[0] & 0x0F) * 4
    total, = struct.unpack_from("!H", packet, 2)
    if len(packet) < total:
        raise ValueError(f"truncated IPv4 packet: {len(packet)} of {total} bytes")
    if packet[9] != socket.IPPROTO_UDP:
        raise ValueError(f"not UDP: IP protocol {packet[9]}")
    inagg_at = ihl + UDP_BYTES + _BTH_RETH_IMM.size
    if total < inagg_at + ROCE_ICRC_BYTES:
        raise ValueError(f"too short for RoCEv2: {total} bytes, need {inagg_at + ROCE_ICRC_BYTES}")
    src_port, dst_port, udp_len = struct.unpack_from("!HHH", packet, ihl)
    if dst_port != ROCE_UDP_PORT:
        raise ValueError(f"not RoCEv2: UDP destination port {dst_port}, not {ROCE_UDP_PORT}")
    if udp_len != total - ihl:
        raise ValueError(f"UDP length {udp_len} disagrees with IPv4 total length {total}")
    opcode, _, _, qp, psn, va, rkey, dma_len, imm = _BTH_RETH_IMM.unpack_from(
        packet, ihl + UDP_BYTES)
    if opcode != OPCODE_UC_RDMA_WRITE_ONLY_IMM:
        raise ValueError(f"BTH opcode {opcode:#04x} is not UC RDMA WRITE ONLY WITH IMMEDIATE "
                         f"({OPCODE_UC_RDMA_WRITE_ONLY_IMM:#04x})")
    if imm != INAGG_IMMEDIATE:
        raise ValueError(f"immediate data {imm:#010x} is not the inagg magic "
                         f"{INAGG_IMMEDIATE:#010x}")
    inagg_end = total - ROCE_ICRC_BYTES
    if dma_len != inagg_end - inagg_at:
        raise ValueError(f"RETH DMA length {dma_len} disagrees with the "
                         f"{inagg_end - inagg_at} payload bytes")
    if verify_icrc:
        want = icrc(packet[:total])
        got = bytes(packet[inagg_end:total])
        if got != want:
            raise ValueError(f"ICRC mismatch: packet carries {got.hex()}, computed {want.hex()}")
    meta = RoceMeta(socket.inet_ntoa(packet[12:16]), socket.inet_ntoa(packet[16:20]), src_port,
                    qp & QP_MASK, psn & PSN_MASK, va, rkey)
    return packet[inagg_at:inagg_end], meta


def _attach_port_qp_filter(sock: socket.socket, qp: int) -> None:
    """Keep only UDP packets to port 4791 whose BTH destination QP is ``qp``, in the kernel: a
    raw IPPROTO_UDP socket otherwise queues a copy of every UDP datagram the host receives (plain
    inagg traffic at line rate included), which would overflow the queue and cost Python time."""
    prog = (
        (0xB1, 0, 0, 0),                       # ldxb 4*([0]&0xf): X = IPv4 header length
        (0x48, 0, 0, 2),                       # ldh [x+2]: UDP destination port
        (0x15, 0, 3, ROCE_UDP_PORT),           # jeq 4791, else reject
        (0x40, 0, 0, UDP_BYTES + 4),           # ld [x+12]: BTH resv8a | destination QP
        (0x54, 0, 0, QP_MASK),                 # and 0xffffff
        (0x15, 1, 0, qp),                      # jeq qp: accept, else reject
        (0x06, 0, 0, 0),                       # ret 0: reject
        (0x06, 0, 0, 0xFFFFFFFF),              # ret all: accept
    )
    insns = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *i) for i in prog))
    fprog = struct.pack("HL", len(prog), ctypes.addressof(insns))  # struct sock_fprog
    sock.setsockopt(socket.SOL_SOCKET, 26, fprog)  # SO_ATTACH_FILTER; the kernel copies it


class RoceRawTransport:
    """A transport like :class:`~inagg.hostlib.wire.transport.UdpTransport` that frames each inagg packet
    as RoCEv2 (UC RDMA WRITE ONLY WITH IMMEDIATE) over Linux raw IP sockets, with no RDMA NIC.

    Addresses are ``(ipv4, qp)``: ``peer`` is where packets go (the aggregator's IP and QP),
    ``bind`` the local IP (0.0.0.0: the route's source towards the peer) and the QP this
    transport receives on. Sending uses an IPPROTO_RAW socket (IP_HDRINCL: we write the whole
    IPv4 header, as the ICRC covers it); receiving an IPPROTO_UDP raw socket, which sees every
    incoming UDP packet with its IPv4 header, filtered in the kernel on port 4791 and our QP. The
    kernel's UDP stack also sees the packets and may answer ICMP port-unreachable (rate-limited,
    harmless). Packets on our QP that fail :func:`decapsulate` (bad ICRC...) are counted in
    ``dropped``. Needs root (CAP_NET_RAW)."""

    overhead = ENCAP_BYTES + ROCE_OVERHEAD

    def __init__(self, peer: tuple[str, int], bind: tuple[str, int] = ("0.0.0.0", DEFAULT_QP),
                 *, rkey: int = DEFAULT_RKEY) -> None:
        try:
            self._rx = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)
            self._tx = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
        except PermissionError as e:
            raise PermissionError("RoceRawTransport needs root (CAP_NET_RAW): it sends and "
                                  "receives whole IPv4 packets on raw sockets") from e
        self._bind_ip, self.qp = bind
        self._rx.bind((self._bind_ip, 0))
        _attach_port_qp_filter(self._rx, self.qp)
        enlarge_buffers(self._rx)
        enlarge_buffers(self._tx)
        self.src_port = 0xC000 | (self.qp & 0x3FFF)
        self.rkey = rkey
        self.dropped = 0
        self._psn = 0
        self._rbuf = bytearray(1 << 16)
        self._rview = memoryview(self._rbuf)
        self.retarget(peer)

    @property
    def address(self) -> tuple[str, int]:
        return self._src_ip, self.qp

    def retarget(self, peer: tuple[str, int]) -> None:
        """Send to another aggregator (IP, QP) from now on (a new grant)."""
        self.peer = peer
        self._src_ip = self._bind_ip
        if self._src_ip == "0.0.0.0":  # the ICRC covers the source address: learn it now
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect((peer[0], ROCE_UDP_PORT))
                self._src_ip = probe.getsockname()[0]

    def send(self, data: bytes) -> None:
        pkt = encapsulate(data, src_ip=self._src_ip, dst_ip=self.peer[0], src_port=self.src_port,
                          dst_qp=self.peer[1], psn=self._psn, rkey=self.rkey)
        self._psn = (self._psn + 1) & PSN_MASK
        self._tx.sendto(pkt, (self.peer[0], 0))

    def recv_into(self, buf: bytearray, timeout: float) -> int:
        """Receive one inagg packet into ``buf`` (truncated to its size, as a datagram socket
        does); 0 when none came within ``timeout`` seconds."""
        return self.recv_from(buf, timeout)[0]

    @staticmethod
    def source_of(aggregator: tuple[str, int]) -> str:
        """Results come from the switch's IP (their UDP source port is RoCE's entropy)."""
        return socket.gethostbyname(aggregator[0])

    def recv_from(self, buf: bytearray, timeout: float) -> tuple[int, str | None]:
        """Receive one inagg packet into ``buf``: (length, source IP), or (0, None) when none
        came within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            self._rx.settimeout(left)
            try:
                got = self._rx.recv_into(self._rbuf)
            except TimeoutError:
                return 0, None
            try:
                inagg, meta = decapsulate(self._rview[:got])
            except ValueError:
                self.dropped += 1
                continue
            if meta.dst_qp != self.qp:  # queued before the filter was attached
                continue
            n = min(len(inagg), len(buf))
            buf[:n] = inagg[:n]
            return n, meta.src_ip
        return 0, None

    def close(self) -> None:
        self._rx.close()
        self._tx.close()


def verbs_available() -> str | None:
    """None when a real RDMA device is present and ``pyverbs`` imports (where a pyverbs UC-QP
    sender would plug in), else why not."""
    sysfs = "/sys/class/infiniband"
    if not (os.path.isdir(sysfs) and os.listdir(sysfs)):
        return f"no RDMA device ({sysfs} is missing or empty)"
    try:
        import pyverbs  # noqa: F401
    except ImportError as e:
        return f"pyverbs is not importable ({e})"
    return None

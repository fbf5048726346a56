"""RoCEv2 framing of inagg packets (hostlib/wire/roce.py): round trips, the ICRC against scapy's
independent implementation, decapsulation errors, and the raw-socket transport end to end in a
network namespace of its own (root only)."""

from __future__ import annotations

import os
import socket
import struct
import subprocess

import numpy as np
import pytest
from scapy.compat import raw
from scapy.contrib.roce import BTH
from scapy.layers.inet import IP, UDP
from scapy.packet import Raw

from inagg.bmv2_env.emulation.testbed import have_netns, in_netns, sh
from inagg.hostlib.wire.protocol import ENCAP_BYTES, build_contribution, unpack_header
from inagg.hostlib.wire.roce import (
    INAGG_IMMEDIATE,
    IPV4_BYTES,
    OPCODE_UC_RDMA_WRITE_ONLY_IMM,
    ROCE_OVERHEAD,
    ROCE_UDP_PORT,
    UDP_BYTES,
    RoceRawTransport,
    decapsulate,
    encapsulate,
    frame,
    icrc,
    verbs_available,
)

ADDR = dict(src_ip="10.0.0.1", dst_ip="10.0.0.2", src_port=0xC005, dst_qp=0x00ABCD, psn=0xFFFFFE,
            rkey=0x1234_5678, tos=0x02, ttl=17)
BTH_AT = IPV4_BYTES + UDP_BYTES


def contribution(n_values: int, offset: int = 4096) -> bytes:
    values = np.arange(n_values, dtype=np.int32) - 7 if n_values else None
    return build_contribution(7, 3, 2, 40, 1, offset, values, max(n_values, 1))


SIZES = [0, 64, 4096]


@pytest.mark.parametrize("n_values", SIZES)
def test_round_trip(n_values):
    inagg = contribution(n_values)
    pkt = encapsulate(inagg, **ADDR)
    assert len(pkt) == IPV4_BYTES + UDP_BYTES + ROCE_OVERHEAD + len(inagg)
    got, meta = decapsulate(pkt)
    assert got == inagg
    assert meta == (ADDR["src_ip"], ADDR["dst_ip"], ADDR["src_port"], ADDR["dst_qp"], ADDR["psn"],
                    unpack_header(inagg).offset * 4, ADDR["rkey"])
    # A memoryview in gives the inagg bytes without a copy; Ethernet padding is ignored.
    view_got, _ = decapsulate(memoryview(pkt + bytes(6)))
    assert isinstance(view_got, memoryview) and view_got == inagg
    eth = frame(inagg, dst_mac="00:00:00:00:00:02", src_mac=1, **ADDR)
    assert eth == bytes.fromhex("000000000002" "000000000001" "0800") + pkt


def scapy_packet(inagg: bytes, *, src_ip, dst_ip, src_port, dst_qp, psn, rkey, tos, ttl,
                 fecn: int = 0) -> bytes:
    """The same packet built by scapy's layers, its ICRC computed by scapy (BTH.compute_icrc);
    scapy has no RETH/ImmDt layers, so they are raw bytes after the BTH."""
    reth_imm = struct.pack("!QIII", unpack_header(inagg).offset * 4, rkey, len(inagg),
                           INAGG_IMMEDIATE)
    return raw(IP(src=src_ip, dst=dst_ip, tos=tos, ttl=ttl, id=0, flags="DF")
               / UDP(sport=src_port, dport=ROCE_UDP_PORT, chksum=0)
               / BTH(opcode=OPCODE_UC_RDMA_WRITE_ONLY_IMM, pkey=0xFFFF, fecn=fecn, dqpn=dst_qp,
                     psn=psn)
               / Raw(reth_imm + inagg))


@pytest.mark.parametrize("n_values", SIZES)
def test_packet_and_icrc_match_scapy(n_values):
    inagg = contribution(n_values)
    ours = encapsulate(inagg, **ADDR)
    theirs = scapy_packet(inagg, **ADDR)
    assert icrc(ours) == theirs[-4:]
    assert ours == theirs  # every header byte too, IPv4 checksum and lengths included


def test_icrc_masks_exactly_the_fields_the_spec_says():
    pkt = bytearray(encapsulate(contribution(64), **ADDR))
    base = icrc(pkt)

    def changed(at: int, xor: int) -> bool:
        mutated = bytearray(pkt)
        mutated[at] ^= xor
        return icrc(mutated) != base

    masked = {"TOS": 1, "TTL": 8, "IPv4 checksum": 10, "IPv4 checksum lo": 11,
              "UDP checksum": IPV4_BYTES + 6, "UDP checksum lo": IPV4_BYTES + 7,
              "BTH FECN": BTH_AT + 4}
    covered = {"IPv4 ID": 5, "IPv4 source": 12, "UDP source port": IPV4_BYTES + 1,
               "BTH P_Key": BTH_AT + 3, "BTH dest QP": BTH_AT + 7, "BTH PSN": BTH_AT + 11,
               "RETH VA": BTH_AT + 19, "ImmDt": BTH_AT + 31, "payload": len(pkt) - 5}
    assert not [name for name, at in masked.items() if changed(at, 0x80)]
    assert not [name for name, at in covered.items() if not changed(at, 0x01)]
    assert not changed(len(pkt) - 1, 0xFF)  # the ICRC slot itself is not covered
    # scapy agrees that what a router rewrites (TTL, TOS, FECN) leaves the ICRC alone.
    rewritten = dict(ADDR, ttl=1, tos=0xB8)
    assert scapy_packet(contribution(64), **rewritten, fecn=1)[-4:] == base


def mutated(at: int, value: bytes, n_values: int = 64) -> bytes:
    pkt = bytearray(encapsulate(contribution(n_values), **ADDR))
    pkt[at:at + len(value)] = value
    return bytes(pkt)


@pytest.mark.parametrize("packet, message", [
    (b"\x60" + bytes(59), "not an IPv4 packet"),
    (encapsulate(contribution(0), **ADDR)[:-1], "truncated IPv4 packet"),
    (mutated(9, b"\x06"), "not UDP: IP protocol 6"),
    (mutated(IPV4_BYTES + 2, b"\xa6\x6a"), "not RoCEv2: UDP destination port 42602"),
    (mutated(IPV4_BYTES + 4, b"\x00\x20"), "UDP length 32 disagrees"),
    (mutated(BTH_AT, b"\x0b"),
     r"BTH opcode 0x0b is not UC RDMA WRITE ONLY WITH IMMEDIATE \(0x2b\)"),
    (mutated(BTH_AT + 28, b"RoCE"), "immediate data 0x526f4345 is not the inagg magic 0x494e4147"),
    (mutated(BTH_AT + 24, struct.pack("!I", 16)), "RETH DMA length 16 disagrees with the 272"),
    (mutated(-10, b"\xff"), "ICRC mismatch: packet carries"),
])
def test_decapsulate_errors(packet, message):
    with pytest.raises(ValueError, match=message):
        decapsulate(packet)


def test_decapsulate_can_skip_icrc():
    got, _ = decapsulate(mutated(-1, b"\x00"), verify_icrc=False)
    assert got == contribution(64)


def test_overhead_and_verbs_probe():
    assert ROCE_OVERHEAD == 36 and RoceRawTransport.overhead == ENCAP_BYTES + 36
    reason = verbs_available()
    assert reason is None or "RDMA device" in reason or "pyverbs" in reason


def test_transport_without_root_says_why(monkeypatch):
    """Without CAP_NET_RAW the raw socket is refused; the error must name the cause."""
    def refuse(*args):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(socket, "socket", refuse)
    with pytest.raises(PermissionError, match=r"needs root \(CAP_NET_RAW\)"):
        RoceRawTransport(("127.0.0.1", 1))


@pytest.fixture
def netns():
    """A fresh network namespace with only its loopback up: nothing sent there leaves it."""
    reason = have_netns()
    if reason:
        pytest.skip(f"RoceRawTransport end to end {reason}")
    name = f"inaggroce{os.getpid()}"
    sh("ip", "netns", "add", name)
    try:
        sh("ip", "-n", name, "link", "set", "lo", "up")
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def test_raw_transport_end_to_end(netns):
    buf = bytearray(1 << 16)
    with in_netns(netns):
        worker = RoceRawTransport(("127.0.0.1", 0x22), bind=("0.0.0.0", 0x11))
        switch = RoceRawTransport(("127.0.0.1", 0x11), bind=("127.0.0.1", 0x22))
        plain = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        assert worker.address == ("127.0.0.1", 0x11)  # the route's source towards the peer
        for n_values in SIZES:
            sent = contribution(n_values)
            worker.send(sent)
            got = switch.recv_into(buf, 2.0)
            assert bytes(buf[:got]) == sent
        assert worker.recv_into(buf, 0.05) == 0  # not for its QP
        # Plain UDP to port 4791 (not RoCE) is filtered out; a reply reaches the worker.
        plain.sendto(b"not roce", ("127.0.0.1", ROCE_UDP_PORT))
        assert switch.recv_into(buf, 0.05) == 0
        switch.send(contribution(64, offset=0))
        assert bytes(buf[:worker.recv_into(buf, 2.0)]) == contribution(64, offset=0)
        assert worker.dropped == switch.dropped == 0
    finally:
        for sock in (worker, switch, plain):
            sock.close()

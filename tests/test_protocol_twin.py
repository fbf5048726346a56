"""The P4 include files and inagg.hostlib.wire.protocol must describe the same wire format."""

import re
from pathlib import Path

import numpy as np
import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.utils import rdpcap, wrpcap

from inagg.hostlib.wire import protocol, roce
from inagg.hostlib.wire.scapy_layer import Inagg

P4_INCLUDE = Path(__file__).resolve().parents[1] / "p4" / "include"


def p4_header_fields(text: str, header: str) -> list[tuple[str, int, bool]]:
    body = re.search(r"header\s+%s\s*\{(.*?)\}" % header, text, re.S)
    assert body, f"header {header} not found"
    fields = []
    for m in re.finditer(r"(bit|int)<(\d+)>\s+(\w+)\s*;", body.group(1)):
        fields.append((m.group(3), int(m.group(2)), m.group(1) == "int"))
    return fields


def p4_constants(text: str) -> dict[str, int]:
    consts = {}
    for m in re.finditer(r"const\s+(bit|int)<(\d+)>\s+(\w+)\s*=\s*(-?(?:0x[0-9a-fA-F]+|\d+))\s*;", text):
        consts[m.group(3)] = int(m.group(4), 0)
    return consts


def test_header_fields_match_p4():
    text = (P4_INCLUDE / "headers.p4").read_text()
    assert p4_header_fields(text, "inagg_h") == list(protocol.HEADER_FIELDS)


@pytest.mark.parametrize("header, fields, nbytes", [
    ("bth_h", roce.BTH_FIELDS, roce.BTH_BYTES),
    ("reth_h", roce.RETH_FIELDS, roce.RETH_BYTES),
    ("immdt_h", roce.IMMDT_FIELDS, roce.IMM_BYTES),
])
def test_roce_headers_match_p4(header, fields, nbytes):
    """The RoCEv2 headers the P4 parser extracts are the ones inagg.hostlib.wire.roce writes."""
    text = (P4_INCLUDE / "headers.p4").read_text()
    assert p4_header_fields(text, header) == list(fields)
    assert sum(w for _, w, _ in fields) == 8 * nbytes


def test_header_size_matches():
    total_bits = sum(w for _, w, _ in protocol.HEADER_FIELDS)
    assert total_bits == 8 * protocol.HEADER_BYTES
    assert protocol.HEADER_STRUCT.size == protocol.HEADER_BYTES


def p4_sizes(text: str) -> dict[str, int]:
    """The defaults of size.p4's overridable sizes (#ifndef X / #define X n / #endif)."""
    return {m.group(1): int(m.group(2), 0)
            for m in re.finditer(r"#ifndef (\w+)\n#define \1 (\w+)\n#endif", text)}


def test_constants_match_p4():
    """The wire constants, and K (a size of the program: size.p4's default)."""
    consts = p4_constants((P4_INCLUDE / "constants.p4").read_text())
    consts["SWITCH_VALUES_PER_PACKET"] = p4_sizes((P4_INCLUDE / "size.p4").read_text())["SWITCH_VALUES_PER_PACKET"]
    assert consts == protocol.P4_CONSTANTS


def test_field_positions_round_trip():
    """Each field lands at the bit offset the P4 declaration gives it."""
    bit = 0
    for name, width, signed in protocol.HEADER_FIELDS:
        value = -(1 << (width - 1)) if signed else (1 << width) - 1
        fields = {n: 0 for n, _, _ in protocol.HEADER_FIELDS}
        fields["version"] = protocol.VERSION if name != "version" else value
        fields[name] = value
        raw = int.from_bytes(protocol.Header(**fields).pack(), "big")
        got = (raw >> (128 - bit - width)) & ((1 << width) - 1)
        assert got == value & ((1 << width) - 1), name
        assert protocol.unpack_header(protocol.Header(**fields).pack())._asdict()[name] == value
        bit += width


def test_truncated_header_is_an_error():
    with pytest.raises(protocol.ProtocolError, match="truncated"):
        protocol.unpack_header(b"\x11" * 15)


def test_scapy_layer_decodes_pcap(tmp_path):
    payload = protocol.build_contribution(7, 2, 3, 40, 1, 4096, np.array([5, -6, 7]), 4, exp=-3,
                                          flags=protocol.FLAG_RETRANSMIT)
    pkt = (Ether() / IP(src="10.0.0.1", dst="10.0.0.9")
           / UDP(sport=40000, dport=protocol.UDP_PORT) / payload)
    wrpcap(str(tmp_path / "x.pcap"), [pkt])
    got = rdpcap(str(tmp_path / "x.pcap"))[0]
    layer = got[Inagg]
    assert (layer.job_id, layer.worker_id, layer.epoch, layer.slot, layer.slot_set) == (7, 2, 3, 40, 1)
    assert (layer.exp, layer.count, layer.offset, layer.flags) == (-3, 3, 4096, protocol.FLAG_RETRANSMIT)
    assert layer.values == [5, -6, 7, 0]
    assert bytes(layer) == payload


@pytest.mark.parametrize("outcome", list(protocol.Outcome), ids=lambda o: o.label)
def test_outcome_has_its_twins(outcome):
    """One row per outcome: the same code in the C++ engine, and in the P4 program either the
    same SLOT_* code (a row of SlotState's table) or a drop reason of the same name."""
    from inagg.hostlib.native_build import _native

    assert _native.OUTCOMES[outcome.label] == outcome.value
    consts = p4_constants((P4_INCLUDE / "constants.p4").read_text())
    if outcome in protocol.SLOT_OUTCOMES:
        assert consts[f"SLOT_{outcome.name}"] == outcome.value
    reasons = protocol.DROP_REASONS if outcome.label in protocol.DROP_REASONS else \
        protocol.GLOBAL_DROP_REASONS
    if outcome.is_drop and outcome.label != "unknown_job":  # unknown jobs: forwarded by P4
        assert _native.p4_drop_code(outcome) == reasons.index(outcome.label)
    else:
        assert _native.p4_drop_code(outcome) == -1


def test_native_has_no_other_outcomes():
    from inagg.hostlib.native_build import _native

    assert _native.OUTCOMES == {o.label: o.value for o in protocol.Outcome}

"""Packet decoding: the scapy layer and the Wireshark dissector (tools/wireshark/inagg.lua, run by
tshark) on pcaps the project makes: the software switch's own capture of a contribution (by the
C++ packet loop and by the Python loop's scapy writer), a 16 KB host-aggregator result datagram
(loopback/jumbo-frame size) fragmented for a 1500-byte link, and a RoCEv2 frame from
inagg.hostlib.wire.roce. tshark tests skip when tshark is absent (``make setup-emulation`` installs it)."""

import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from scapy.contrib.roce import BTH
from scapy.layers.inet import IP, UDP, fragment
from scapy.layers.l2 import Ether
from scapy.utils import wrpcap

from inagg.bmv2_env.emulation.loopback import free_udp_port, random_loopback_net
from inagg.controller.config import default_program
from inagg.bmv2_env.emulation.testbed import stop_processes
from inagg.hostlib.wire import protocol, roce
from inagg.hostlib.wire.grant import HOST_AGGREGATOR_PORT
from inagg.hostlib.wire.scapy_layer import ImmDt, Inagg, RETH, read_pcap

ROOT = Path(__file__).resolve().parents[1]
DISSECTOR = ROOT / "tools" / "wireshark" / "inagg.lua"
SWITCH_VALUES = np.arange(64, dtype=np.int64) * 3 - 100
HOST_VALUES = np.arange(4096, dtype=np.int64) - 2048


def host_result_fragments() -> list:
    """A host aggregator's 4096-value result as a 1500-byte link carries it: IP fragments."""
    payload = protocol.build_contribution(5, 0, 2, 17, 0, 8192, HOST_VALUES, 4096)
    payload = bytes([(protocol.VERSION << 4) | protocol.MSG_RESULT]) + payload[1:]
    datagram = (Ether(src="08:00:00:00:00:64", dst="08:00:00:00:00:01")
                / IP(src="10.0.0.100", dst="10.0.0.1", id=77)
                / UDP(sport=HOST_AGGREGATOR_PORT, dport=47001) / payload)
    return fragment(datagram, fragsize=1480)


def roce_frame() -> bytes:
    payload = protocol.build_contribution(9, 3, 4, 21, 1, 1024, SWITCH_VALUES, 64, exp=-7,
                                          flags=protocol.round_fields(13)[1])   # set 1, tag 6
    return roce.frame(payload, dst_mac="00:00:00:00:00:fe", src_mac="08:00:00:00:00:04",
                      src_ip="10.0.0.4", dst_ip="10.0.0.254", src_port=49152, psn=11, dst_qp=0x42)


@pytest.fixture(scope="module", params=["native", "python"])
def switch_capture(request, tmp_path_factory) -> Path:
    """The software switch's own pcap of one contribution entering port 1 (loopback UDP ports),
    written by either engine's packet loop (started with the program: the C++ loop captures
    only while a pipeline is set)."""
    out = tmp_path_factory.mktemp("pcap")
    net = random_loopback_net()
    to_switch = (f"{net}.254", free_udp_port(f"{net}.254"))
    proc = subprocess.Popen([sys.executable, "-m", "inagg.bmv2_env.softswitch.switch", "--engine", request.param,
                             "-i", f"1@udp:{net}.1",
                             "--udp-bind", "%s:%d" % to_switch, "--pcap", str(out), str(default_program("soft").files["bmv2_json"]), "--",
                             "--grpc-server-addr", f"unix:{out}/p4rt.sock"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert "inagg-soft-switch" in proc.stdout.readline()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((f"{net}.1", 0))
            s.sendto(protocol.build_contribution(3, 1, 2, 7, 0, 448, SWITCH_VALUES, 64, exp=-5),
                     to_switch)
        pcap = out / f"udp_{net}.1_in.pcap"
        deadline = time.time() + 30
        while not (pcap.exists() and pcap.stat().st_size > 24):   # the pcap header is 24 bytes
            assert proc.poll() is None and time.time() < deadline, "the switch wrote no capture"
            time.sleep(0.05)
    finally:
        stop_processes([proc])
    return pcap


def test_scapy_decodes_the_switch_capture(switch_capture):
    (pkt,) = read_pcap(switch_capture)
    layer = pkt[Inagg]
    assert (layer.job_id, layer.worker_id, layer.epoch, layer.slot, layer.offset, layer.exp) == (3, 1, 2, 7, 448, -5)
    assert layer.values == SWITCH_VALUES.tolist()        # 64 values, not Raw


def test_scapy_reassembles_host_aggregator_datagrams(tmp_path):
    frags = host_result_fragments()
    assert len(frags) == 12                              # 16 KB on a 1500-byte link
    wrpcap(str(tmp_path / "host.pcap"), frags)
    (pkt,) = read_pcap(tmp_path / "host.pcap")
    layer = pkt[Inagg]
    assert layer.msg_type == protocol.MSG_RESULT and layer.job_id == 5 and layer.offset == 8192
    assert layer.values == HOST_VALUES.tolist()         # 4096 values, not Raw


def test_scapy_decodes_roce(tmp_path):
    wrpcap(str(tmp_path / "roce.pcap"), [Ether(roce_frame())])
    (pkt,) = read_pcap(tmp_path / "roce.pcap")
    assert pkt[BTH].opcode == protocol.ROCE_OPCODE_UC_WRITE_ONLY_IMM and pkt[BTH].dqpn == 0x42
    assert pkt[RETH].va == 1024 * 4 and pkt[RETH].dma_len == protocol.HEADER_BYTES + 64 * 4
    assert pkt[ImmDt].imm == protocol.ROCE_INAGG_IMMEDIATE
    assert (pkt[Inagg].job_id, pkt[Inagg].worker_id, pkt[Inagg].exp) == (9, 3, -7)
    assert pkt[Inagg].values == SWITCH_VALUES.tolist()
    assert pkt[BTH].icrc == int.from_bytes(roce.icrc(roce_frame()[14:]), "big")   # ICRC kept apart


def tshark_fields(pcap: Path, *fields: str) -> list[list[str]]:
    """tshark with the dissector: one row per inagg packet, the given fields."""
    if shutil.which("tshark") is None:
        pytest.skip("tshark not installed (make setup-emulation installs it)")
    cmd = ["tshark", "-r", str(pcap), "-X", f"lua_script:{DISSECTOR}", "-Y", "inagg", "-T", "fields",
           "-E", "occurrence=a", "-E", "aggregator=;"]
    for f in fields:
        cmd += ["-e", f]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "Lua: Error" not in proc.stderr, proc.stderr
    return [line.split("\t") for line in proc.stdout.splitlines()]


def test_tshark_decodes_the_switch_capture(switch_capture):
    rows = tshark_fields(switch_capture, "inagg.msg_type", "inagg.job_id", "inagg.worker_id", "inagg.epoch",
                         "inagg.slot", "inagg.offset", "inagg.exp", "inagg.n_values", "inagg.value")
    assert len(rows) == 1
    *header, values = rows[0]
    assert header == ["1", "3", "1", "2", "7", "448", "-5", "64"]
    assert [int(v) for v in values.split(";")] == SWITCH_VALUES.tolist()


def test_tshark_reassembles_host_aggregator_datagrams(tmp_path):
    wrpcap(str(tmp_path / "host.pcap"), host_result_fragments())
    rows = tshark_fields(tmp_path / "host.pcap", "inagg.msg_type", "inagg.job_id", "inagg.offset",
                         "inagg.n_values", "inagg.value")
    assert len(rows) == 1
    *header, values = rows[0]
    assert header == ["2", "5", "8192", "4096"]
    assert [int(v) for v in values.split(";")] == HOST_VALUES.tolist()


def test_tshark_decodes_roce(tmp_path):
    wrpcap(str(tmp_path / "roce.pcap"), [Ether(roce_frame())])
    rows = tshark_fields(tmp_path / "roce.pcap", "infiniband.bth.opcode", "inagg.job_id", "inagg.worker_id",
                         "inagg.slot", "inagg.slot_set", "inagg.round_tag", "inagg.exp", "inagg.n_values",
                         "inagg.value")
    assert len(rows) == 1
    *header, values = rows[0]
    assert header == [str(protocol.ROCE_OPCODE_UC_WRITE_ONLY_IMM), "9", "3", "21", "1", "6", "-7", "64"]
    assert [int(v) for v in values.split(";")] == SWITCH_VALUES.tolist()   # the ICRC is not a value


def test_dissector_header_fields_follow_the_protocol_twin():
    """The Lua dissector's header fields, in order, are protocol.HEADER_FIELDS (the values
    after them are its own); tshark tests above check the offsets on real packets."""
    names = re.findall(r'ProtoField\.\w+\("inagg\.(\w+)"', DISSECTOR.read_text())
    assert names[:len(protocol.HEADER_FIELDS)] == [f[0] for f in protocol.HEADER_FIELDS]


def test_dissector_flag_names_follow_the_protocol_twin():
    """Every FLAG_<NAME> of protocol.py is named in the dissector's flag text, as its lower-case
    name, and no other bit is (a flag the twin gains shows here until the dissector has it); a
    bit with two names (0x02: FROM_HOST on a result, MINE on a contribution) has both."""
    text = DISSECTOR.read_text()
    named = {(int(bit, 16), name) for table in ("FLAG_NAMES", "CONTRIBUTION_FLAG_NAMES")
             for bit, name in re.findall(r'\[(0x[0-9A-Fa-f]+)\] = "(\w+)"',
                                         re.search(rf"local {table} = \{{(.*?)\}}", text, re.S).group(1))}
    flags = {(value, name[len("FLAG_"):].lower()) for name, value in vars(protocol).items()
             if name.startswith("FLAG_") and isinstance(value, int)}
    assert named == flags


def test_tshark_names_a_switch_partial_sum_flag(tmp_path):
    """A tree's partial sum (FLAG_FROM_SWITCH, 0x80) is named in the flags' text, not "none"."""
    payload = bytearray(protocol.build_contribution(9, 3, 4, 21, 1, 1024, SWITCH_VALUES, 64))
    payload[1] = protocol.FLAG_FROM_SWITCH
    frame = (Ether() / IP(src="10.0.0.1", dst="10.0.0.254") / UDP(sport=47001, dport=protocol.UDP_PORT)
             / bytes(payload))
    wrpcap(str(tmp_path / "tree.pcap"), [frame])
    if shutil.which("tshark") is None:
        pytest.skip("tshark not installed (make setup-emulation installs it)")
    proc = subprocess.run(["tshark", "-r", str(tmp_path / "tree.pcap"), "-X", f"lua_script:{DISSECTOR}", "-V"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "Flags: 0x80 (from_switch)" in proc.stdout, proc.stdout[-3000:] + proc.stderr


def test_read_pcap_reads_an_empty_capture_as_no_packets(tmp_path):
    """BMv2 leaves a port's pcap file empty (no header yet) until its first frame; an empty
    capture with its header has no frames either."""
    (tmp_path / "empty.pcap").write_bytes(b"")
    wrpcap(str(tmp_path / "header_only.pcap"), [], linktype=1)
    assert len(read_pcap(tmp_path / "empty.pcap")) == 0
    assert len(read_pcap(tmp_path / "header_only.pcap")) == 0

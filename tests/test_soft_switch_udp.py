"""The software switch process attached over UDP on loopback (what ``make demo`` runs), on both
engines: the native packet loop (recvmmsg/sendmmsg batches) and the Python reference loop.

Real processes and sockets: the switch is programmed over P4Runtime, workers are UDP sockets at
their own loopback addresses. A burst of whole windows must come back complete (no drop on a
clean path), a datagram from an address that is no port's host is ignored, every frame in and
out is in the ports' pcaps, and the switch stops cleanly on SIGTERM. The native loop's pcaps are
written by scapy's writer from its capture queue: they decode with their frames' times, and what
a full queue leaves out is counted."""

import re
import socket
import struct
import subprocess
import sys
import time
from contextlib import contextmanager

import numpy as np
import pytest

from inagg.bmv2_env.emulation.loopback import ROOT, free_udp_port, random_loopback_net
from inagg.bmv2_env.softswitch.switch import udp_host_mac
from inagg.controller.config import default_program
from inagg.controller.program import Program
from inagg.controller.switch import (
    INSERT, PipelineMismatch, JobAdmission, JobCounters, ReplicaRewrite, ResultReplication, SwitchConnection,
    SwitchJob, WorkerBinding,
)
from inagg.hostlib.wire.grant import values_for_mtu
from inagg.hostlib.wire.protocol import MSG_CONTRIBUTION, MSG_RESULT, SWITCH_VALUES_PER_PACKET as K, build_contribution, unpack_header
from inagg.hostlib.wire.scapy_layer import Inagg, read_pcap
from inagg.hostlib.wire.transport import enlarge_buffers
from tools.soft_p4info import soft_p4info_text

SLOTS = 512


@contextmanager
def soft_switch(tmp_path, *options: str):
    """(switch process, P4Runtime connection, loopback /24 prefix, the switch's UDP address) with
    2 UDP-attached hosts."""
    net = random_loopback_net()
    to_switch = (f"{net}.254", free_udp_port(f"{net}.254"))
    sock = tmp_path / "p4rt.sock"
    proc = subprocess.Popen(
        [sys.executable, "-m", "inagg.bmv2_env.softswitch.switch", *options,
         "-i", f"1@udp:{net}.1", "-i", f"2@udp:{net}.2", "--udp-bind", "%s:%d" % to_switch, "--no-p4",
         "--pcap", str(tmp_path), "--", "--grpc-server-addr", f"unix:{sock}"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sw = None
    try:
        assert "inagg-soft-switch" in proc.stdout.readline()
        sw = SwitchConnection(f"unix:{sock}")
        sw.push_pipeline()
        yield proc, sw, net, to_switch
    finally:
        if sw is not None:
            sw.close()
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@pytest.fixture(params=["native", "python"])
def switch(request, tmp_path):
    with soft_switch(tmp_path, "--engine", request.param) as (proc, sw, net, to_switch):
        yield proc, sw, net, to_switch, tmp_path


def admit(sw, net: str, workers: list[socket.socket], slots: int) -> None:
    """One job of the given worker sockets (ranks in order) over ``slots`` slots."""
    job = SwitchJob(1, 0, 1, 0, slots, tuple(
        WorkerBinding(r, r + 1, f"{net}.{r + 1}", udp_host_mac(f"{net}.{r + 1}"), w.getsockname()[1])
        for r, w in enumerate(workers)))
    sw.write(JobAdmission(sw).updates(INSERT, job) + ReplicaRewrite(sw).updates(INSERT, job)
             + [ResultReplication(sw).job_update(INSERT, job)])


def udp_socket(ip: str) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((ip, 0))
    enlarge_buffers(s)
    s.settimeout(5)
    return s


def pcap_frames(path) -> list[bytes]:
    data = path.read_bytes()
    assert struct.unpack_from("<IHHiIII", data) == (0xA1B2C3D4, 2, 4, 0, 0, 65535, 1)
    frames, at = [], 24
    while at < len(data):
        _, _, length, _ = struct.unpack_from("<IIII", data, at)
        frames.append(data[at + 16: at + 16 + length])
        at += 16 + length
    return frames


def test_windows_come_back_complete_and_strangers_are_ignored(switch):
    proc, sw, net, to_switch, pcap_dir = switch
    workers = [udp_socket(f"{net}.{r + 1}") for r in range(2)]
    stranger = udp_socket(f"{net}.3")
    try:
        admit(sw, net, workers, SLOTS)
        stranger.sendto(build_contribution(1, 0, 1, 0, 0, 0, np.full(K, 1000, np.int32), K), to_switch)
        for rnd in range(2):
            for slot in range(SLOTS):
                for rank, w in enumerate(workers):
                    values = np.full(K, rank + 1 + slot, np.int32)
                    w.sendto(build_contribution(1, rank, 1, slot, rnd % 2, K * slot, values, K),
                             to_switch)
            for w in workers:
                got = {}
                for _ in range(SLOTS):
                    h = unpack_header(data := w.recv(65535))
                    assert h.msg_type == MSG_RESULT and (h.count, h.slot_set) == (K, rnd % 2)
                    got[h.slot] = np.frombuffer(data, ">i4", K, 16)
                assert sorted(got) == list(range(SLOTS))
                assert all((got[s] == 3 + 2 * s).all() for s in got)
        c = JobCounters(sw).job(0)
        assert (c["packets"], c["aggregated"], c["results"]) == (4 * SLOTS, 4 * SLOTS, 2 * SLOTS)
    finally:
        for s in (*workers, stranger):
            s.close()
    proc.terminate()
    assert proc.wait(10) == 0
    for rank in range(2):
        name = f"udp_{net}.{rank + 1}"
        sent, got = (pcap_frames(pcap_dir / f"{name}_{d}.pcap") for d in ("in", "out"))
        assert len(sent) == len(got) == 2 * SLOTS
        assert {unpack_header(f[42:]).msg_type for f in got} == {MSG_RESULT}


@pytest.mark.parametrize("engine", ["native", "python"])
def test_values_per_packet_is_the_software_targets(tmp_path, engine):
    """The software target's P4Info (DEFAULT_ARTIFACTS["soft"]) carries its own K: pushed, the
    switch aggregates packets of that K and refuses the P4 program's K (bad_length) as it would
    any other; a P4Info whose K no port carries is refused."""
    soft = default_program("soft")
    k = soft.p4info.values_per_packet
    assert k > K
    with soft_switch(tmp_path, "--engine", engine) as (proc, sw, net, to_switch):
        sw.push_pipeline(soft)
        workers = [udp_socket(f"{net}.{r + 1}") for r in range(2)]
        try:
            admit(sw, net, workers, 4)
            for rank, w in enumerate(workers):
                w.sendto(build_contribution(1, rank, 1, 0, 0, 0, np.arange(k, dtype=np.int32) * (rank + 1), k),
                         to_switch)
            for w in workers:
                data = w.recv(65535)
                assert unpack_header(data).count == k
                assert (np.frombuffer(data, ">i4", k, 16) == 3 * np.arange(k)).all()
            workers[0].sendto(build_contribution(1, 0, 1, 1, 0, 0, np.ones(K, np.int32), K), to_switch)
            for w in workers:
                w.settimeout(0.3)
                with pytest.raises(TimeoutError):
                    w.recv(65535)
            assert JobCounters(sw).job(0)["drops"] == {"bad_length": 1}
        finally:
            for w in workers:
                w.close()
        too_large = tmp_path / "too_large.p4info.txtpb"
        too_large.write_text(soft_p4info_text(soft.p4info_path.read_text(), values_for_mtu(65535) + 1))
        with pytest.raises(PipelineMismatch, match=r"@inagg_values_per_packet\(16373\): this data plane's "
                                                   r"ports carry 1\.\.16372 values per packet"):
            sw.push_pipeline(Program("soft", too_large, soft.files))


def exchange_rounds(sw, net: str, to_switch: tuple[str, int], slots: int) -> None:
    """Two workers each contribute to ``slots`` slots and get every result back."""
    workers = [udp_socket(f"{net}.{r + 1}") for r in range(2)]
    try:
        admit(sw, net, workers, slots)
        for slot in range(slots):
            for rank, w in enumerate(workers):
                w.sendto(build_contribution(1, rank, 1, slot, 0, K * slot, np.full(K, rank + slot, np.int32), K),
                         to_switch)
        for w in workers:
            for _ in range(slots):
                assert unpack_header(w.recv(65535)).msg_type == MSG_RESULT
    finally:
        for w in workers:
            w.close()


def stop_switch(proc) -> str:
    """SIGTERM; the switch's output after its first line."""
    proc.terminate()
    assert proc.wait(10) == 0
    return proc.stdout.read()


def test_native_captures_decode_with_the_times_the_loop_saw(tmp_path):
    """Every contribution in and every result out of each port decodes from its pcap (scapy's
    writer, fed by the native loop's capture queue), stamped between the first send and the last
    receive, in time order."""
    slots = 64
    with soft_switch(tmp_path, "--engine", "native") as (proc, sw, net, to_switch):
        start = time.time()
        exchange_rounds(sw, net, to_switch, slots)
        end = time.time()
        stop_switch(proc)
    for rank in range(2):
        for direction, msg_type in (("in", MSG_CONTRIBUTION), ("out", MSG_RESULT)):
            pkts = read_pcap(tmp_path / f"udp_{net}.{rank + 1}_{direction}.pcap")
            assert [p[Inagg].msg_type for p in pkts] == [msg_type] * slots
            assert sorted(p[Inagg].slot for p in pkts) == list(range(slots))
            times = [float(p.time) for p in pkts]
            assert times == sorted(times)
            assert start - 0.001 <= times[0] and times[-1] <= end + 0.001


def test_a_full_capture_queue_counts_what_it_leaves_out(tmp_path):
    """A 1 KiB capture queue (--pcap-buffer 1) holds three frames per drain: the rest of a burst
    is left out of the pcaps, the data path does not wait for the writer (every result comes
    back), and the warning at stop counts exactly the frames missing."""
    slots = 256
    with soft_switch(tmp_path, "--engine", "native", "--pcap-buffer", "1") as (proc, sw, net, to_switch):
        exchange_rounds(sw, net, to_switch, slots)
        output = stop_switch(proc)
    captured = sum(len(pcap_frames(tmp_path / f"udp_{net}.{r + 1}_{d}.pcap")) for r in range(2) for d in ("in", "out"))
    dropped = re.search(r"pcap: (\d+) captured frames left out", output)
    assert dropped, output
    assert int(dropped[1]) > 0 and captured + int(dropped[1]) == 4 * slots


def test_the_capture_buffer_must_be_positive(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "inagg.bmv2_env.softswitch.switch", "--pcap", str(tmp_path),
                           "--pcap-buffer", "0", "--no-p4"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2
    assert "--pcap-buffer: expected a positive integer, got '0'" in proc.stderr

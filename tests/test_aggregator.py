"""The inagg-aggregator server and the client's error paths, over real sockets."""

import json
import socket
import subprocess
import sys
import threading

import numpy as np
import pytest

from inagg.hostlib.aggregator.server import HostAggregator, default_values_per_packet, main as aggregator_main
from inagg.hostlib.aggregator.engine_reference import AggregationEngine, JobConfig
from inagg.hostlib.wire.grant import Grant, values_for_mtu
from inagg.hostlib.wire.protocol import FLAG_FROM_SWITCH, MSG_RESULT, build_contribution, round_fields, unpack_header
from inagg.hostlib.worker.stream import NativeSlotStream
from inagg.hostlib.worker.call_protocol import CallRefused
from inagg.hostlib.worker.rounds import CongestionWindow, WindowControl
from inagg.hostlib.worker.stream_base import AllreduceError
from inagg.hostlib.worker.stream_reference import SlotStream
from inagg.hostlib.wire.transport import UdpTransport

K = 64


@pytest.fixture
def served():
    """An aggregator on loopback with job 1 (2 workers) and job 2 (2 workers)."""
    workers = [UdpTransport(("127.0.0.1", 0), bind=("127.0.0.1", 0)) for _ in range(4)]
    eng = AggregationEngine(32, K)
    eng.set_job(JobConfig(1, 1, 0, 8, tuple(w.address for w in workers[:2])))
    eng.set_job(JobConfig(2, 1, 8, 8, tuple(w.address for w in workers[2:])))
    agg = HostAggregator(("127.0.0.1", 0), eng)
    thread = threading.Thread(target=agg.serve, daemon=True)
    thread.start()
    for w in workers:
        w.retarget(agg.address)
    yield agg, workers
    agg.stop()
    thread.join(5)
    for w in workers:
        w.close()


def run_ranks(streams, arrays):
    errors = [None] * len(streams)

    def go(i):
        try:
            streams[i].allreduce(arrays[i])
        except Exception as e:  # noqa: BLE001 - reported to the test
            errors[i] = e

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(streams))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return errors


def test_bad_packets_do_not_disturb_a_running_job(served):
    agg, w = served
    g = Grant(2, 1, 8, 8, K, agg.address)
    streams = [SlotStream(g, r, 2, w[2 + r]) for r in range(2)]
    xs = [np.arange(1000, dtype=np.float32) * (r + 1) for r in range(2)]
    bad = [b"", b"\x00" * 3, b"\x21" + b"\x00" * 40,
           build_contribution(1, 0, 1, 9, 0, 0, np.ones(K, np.int32), K),   # job 1, job 2's slot
           build_contribution(2, 0, 1, 9, 0, 0, np.ones(K, np.int32), K),   # forged rank 0 of job 2
           build_contribution(2, 1, 1, 9, 0, 0, np.ones(3, np.int32), 3),   # wrong payload size
           build_contribution(77, 0, 1, 0, 0, 0, None, K)]
    for pkt in bad:
        w[0].send(pkt)
    assert run_ranks(streams, xs) == [None, None]
    assert np.array_equal(xs[0], np.arange(1000, dtype=np.float32) * 3)
    report = agg.report()
    assert report["drops"] == {"truncated": 2, "bad_version": 1, "unknown_job": 1}
    assert report["jobs"][1]["drops"] == {"bad_slot": 1}
    assert report["jobs"][2]["drops"] == {"bad_worker": 2}


def test_ranks_use_the_smallest_window_goal_and_adapt_it(served):
    """The control round makes every rank use the smallest goal (the slot mapping must agree);
    after a call each rank sets its own goal from what it measured."""
    agg, w = served
    g = Grant(1, 1, 0, 8, K, agg.address)
    streams = [SlotStream(g, r, 2, w[r]) for r in range(2)]
    streams[0].window_control.goal, streams[1].window_control.goal = 8, 3
    xs = [np.arange(2000, dtype=np.float32) * (r + 1) for r in range(2)]   # 32 blocks
    assert run_ranks(streams, xs) == [None, None]
    assert np.array_equal(xs[1], np.arange(2000, dtype=np.float32) * 3)
    assert [s.window for s in streams] == [3, 3]
    assert all(1 <= s.window_control.goal <= 8 for s in streams)


def test_ranks_with_different_congestion_windows_finish_the_call(served):
    """Each rank sends its blocks in order, as far as its own window allows from its oldest one
    without a result: a rank far ahead waits on one whose window is a single block, and neither
    waits for ever (the Python stream and the native one in one job)."""
    agg, w = served
    g = Grant(1, 1, 0, 8, K, agg.address)
    streams = [SlotStream(g, 0, 2, w[0]), NativeSlotStream(g, 1, 2, w[1])]
    streams[0].window_control.congestion = CongestionWindow(size=1, slow_start=False, maximum=1)
    xs = [np.arange(20_000, dtype=np.float32) * (r + 1) for r in range(2)]   # 313 blocks
    assert run_ranks(streams, xs) == [None, None]
    assert all(np.array_equal(x, np.arange(20_000, dtype=np.float32) * 3) for x in xs)
    assert streams[0].window_control.congestion.size == 1 and streams[1].window_control.congestion.size == 8


@pytest.mark.parametrize("size, peak, window, timeouts, goal", [
    (16, 16, 32, 1, 16),   # a timeout halves the window (and ends slow start): 8; the slots twice that
    (40, 40, 20, 1, 20),   # ... halved from the slots the call used, where its window was larger
    (20, 30, 40, 0, 60),   # twice the largest window of the call (30), not its last
    (1, 1, 6, 3, 4),       # never below the minimum
    (40, 40, 80, 0, 64),   # never above the slots granted
])
def test_window_control(size, peak, window, timeouts, goal):
    wc = WindowControl(minimum=4, maximum=64, congestion=CongestionWindow(size=size))
    wc.congestion.peak = peak     # what the call's results made it
    wc.update(window, timeouts)
    assert (wc.goal, wc.congestion.slow_start) == (goal, not timeouts)


def test_non_finite_input_raises_on_every_rank(served):
    agg, w = served
    g = Grant(1, 1, 0, 8, K, agg.address)
    streams = [SlotStream(g, r, 2, w[r]) for r in range(2)]
    xs = [np.ones(500, np.float32), np.ones(500, np.float32)]
    xs[1][300] = np.nan
    errors = run_ranks(streams, xs)
    assert all(isinstance(e, FloatingPointError) for e in errors), errors
    assert "element 256" in str(errors[0])
    assert np.all(xs[0][:256] == 2) and np.all(xs[0][320:] == 2)
    # the stream stays usable afterwards
    ys = [np.ones(100, np.float32), np.ones(100, np.float32)]
    assert run_ranks(streams, ys) == [None, None] and np.all(ys[0] == 2)


def test_unreachable_aggregator_is_a_clear_error():
    t = UdpTransport(("127.0.0.1", 9), bind=("127.0.0.1", 0))
    s = SlotStream(Grant(1, 1, 0, 4, K, ("127.0.0.1", 9)), 0, 2, t, stall_timeout=0.3)
    with pytest.raises(AllreduceError, match="no result for 0.3s from host aggregator 127.0.0.1:9"):
        s.allreduce(np.ones(10, np.float32))


def test_wrong_dtype_and_shape_fail_the_call_on_every_rank(served):
    """A rank that cannot run its part still takes part in the control round: every rank fails
    that call with the same error naming the rank, and the next call is exact."""
    agg, w = served
    g = Grant(1, 1, 0, 8, K, agg.address)
    streams = [SlotStream(g, r, 2, w[r]) for r in range(2)]
    for bad, reason in ((np.ones(10), "rank 0 passed a float64 tensor"),
                        (np.ones((2, 5), np.float32), "rank 0 passed a tensor that is not contiguous")):
        errors = run_ranks(streams, [bad, np.ones(10, np.float32)])
        assert [type(e) for e in errors] == [CallRefused, CallRefused], errors
        assert str(errors[0]) == str(errors[1]) and reason in str(errors[0])
        xs = [np.full(10, r + 1, np.float32) for r in range(2)]
        assert run_ranks(streams, xs) == [None, None] and np.all(xs[0] == 3) and np.all(xs[1] == 3)


@pytest.mark.parametrize("job, message", [
    ({"job_id": 1, "slot_base": 0, "slot_count": 4}, "missing key 'workers'"),
    ({"job_id": 1, "slot_base": 0, "slot_count": 99, "workers": ["127.0.0.1:1"]}, "outside the pool"),
    ({"job_id": 1, "slot_base": 0, "slot_count": 4, "workers": ["nohost"]}, "expected HOST:PORT"),
])
def test_bad_job_config_is_refused_with_a_clear_error(job, message, capsys):
    assert aggregator_main(["--slots", "16", "--bind", "127.0.0.1:0", "--job", json.dumps(job)]) == 2
    assert message in capsys.readouterr().err


def test_cli_reports_counters_on_sigterm():
    proc = subprocess.Popen([sys.executable, "-m", "inagg.hostlib.aggregator.server", "--bind", "127.0.0.1:0"],
                            stdout=subprocess.PIPE, text=True)
    assert "listening on" in proc.stdout.readline()
    proc.terminate()
    out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0 and json.loads(out)["jobs"] == {}


def test_results_go_only_to_the_members_addresses(served):
    """A stranger claiming rank 0 is dropped and never answered; the real members get the
    result from the native loop at their own addresses only."""
    agg, w = served
    stranger = UdpTransport(agg.address, bind=("127.0.0.1", 0))
    try:
        forged = build_contribution(1, 0, 1, 2, 0, 0, np.ones(K, np.int32), K)
        stranger.send(forged)
        w[0].send(forged)
        w[1].send(build_contribution(1, 1, 1, 2, 0, 0, np.full(K, 2, np.int32), K))
        buf = bytearray(65536)
        for member in w[:2]:
            n = member.recv_into(buf, 5.0)
            assert n == 16 + 4 * K and np.all(np.frombuffer(buf, ">i4", K, 16) == 3)
        assert stranger.recv_into(buf, 0.2) == 0
        assert agg.report()["jobs"][1]["drops"] == {"bad_worker": 1}
    finally:
        stranger.close()


def test_values_per_packet_fit_the_interface_mtu(capsys):
    """Datagrams are never fragmented: K follows from the MTU (loopback: the IPv4 limit)."""
    assert (values_for_mtu(1500), values_for_mtu(9000), values_for_mtu(65536)) == (364, 2239, 16372)
    assert default_values_per_packet("127.0.0.1") == 4096
    assert aggregator_main(["--bind", "127.0.0.1:0", "--values-per-packet", "16373"]) == 2
    assert "at most 16372" in capsys.readouterr().err


def test_an_oversized_datagram_is_refused_not_fragmented():
    t = UdpTransport(("127.0.0.1", 9), bind=("127.0.0.1", 0))
    try:
        with pytest.raises(ValueError, match="never fragmented"):
            t.send(bytes(65508))
    finally:
        t.close()


def test_capped_socket_buffers_are_noticed():
    """A clean path must not drop: the aggregator asks for large buffers and says when the
    kernel granted less (net.core.rmem_max without root)."""
    agg = HostAggregator(("127.0.0.1", 0), AggregationEngine(4, K))
    try:
        assert not agg.buffers_too_small
        agg.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
        assert agg.buffers_too_small
    finally:
        agg.sock.close()


@pytest.mark.parametrize("engine", ["python", "native"])
def test_a_bad_host_job_in_the_controller_feed_never_keeps_the_others_from_being_served(engine):
    """The feed applies every job it can: a job with two ranks at one address or slots outside
    the pool is left out and reported, the good ones are served; a later snapshot that fixes or
    drops the bad job is applied too."""
    from inagg.hostlib.jobservice.proto import inagg_controller_pb2 as pb
    from inagg.hostlib.aggregator.server import apply_snapshot, host_engine

    eng = AggregationEngine(32, K) if engine == "python" else host_engine(32, K)
    good = pb.HostJob(job_id=1, epoch=1, slot_base=0, slot_count=8, workers=["127.0.0.1:5000", "127.0.0.1:5001"])
    twin = pb.HostJob(job_id=2, epoch=1, slot_base=8, slot_count=8, workers=["127.0.0.1:6000", "127.0.0.1:6000"])
    wide = pb.HostJob(job_id=3, epoch=1, slot_base=24, slot_count=16, workers=["127.0.0.1:7000"])
    refused = apply_snapshot(eng, [good, twin, wide])
    assert set(eng.jobs) == {1}
    assert "duplicate worker addresses" in refused[2] and "outside the pool of 32" in refused[3]
    moved = pb.HostJob(job_id=1, epoch=2, slot_base=8, slot_count=8, workers=list(good.workers))
    fixed = pb.HostJob(job_id=2, epoch=2, slot_base=0, slot_count=8, workers=["127.0.0.1:6000", "127.0.0.1:6001"])
    assert apply_snapshot(eng, [moved, fixed]) == {}          # two jobs swap slots in one snapshot
    assert {j: (c.epoch, c.slot_base) for j, c in eng.jobs.items()} == {1: (2, 8), 2: (2, 0)}


def test_an_atp_jobs_release_goes_to_its_switch_alone():
    """An ATP job (docs/atp.md) on the native loop: the switch's sum of a round goes to every
    member; a stale packet's release (a header-only result of its round) goes to the switch's
    address only, never to a worker, whose checks an old round's result could pass."""
    workers = [UdpTransport(("127.0.0.1", 0), bind=("127.0.0.1", 0)) for _ in range(2)]
    switch = UdpTransport(("127.0.0.1", 0), bind=("127.0.0.1", 0))
    eng = AggregationEngine(8, K)
    eng.set_job(JobConfig(3, 1, 0, 4, tuple(w.address for w in workers), atp_peer=switch.address))
    agg = HostAggregator(("127.0.0.1", 0), eng)
    thread = threading.Thread(target=agg.serve, daemon=True)
    thread.start()
    buf = bytearray(65536)
    try:
        for t in (*workers, switch):
            t.retarget(agg.address)
        switch.send(build_contribution(3, 1, 1, 2, 0, 0, np.full(K, 5, np.int32), K, flags=FLAG_FROM_SWITCH))
        for w in workers:
            assert w.recv_into(buf, 5.0) == 16 + 4 * K and np.all(np.frombuffer(buf, ">i4", K, 16) == 5)
        _, late = round_fields(14)                     # an older round's tag on the same set
        workers[0].send(build_contribution(3, 0, 1, 2, 0, 0, np.ones(K, np.int32), K, flags=late))
        assert switch.recv_into(buf, 5.0) == 16
        h = unpack_header(bytes(buf[:16]))
        assert (h.msg_type, h.job_id, h.slot, h.count) == (MSG_RESULT, 3, 2, 0)
        assert all(w.recv_into(buf, 0.2) == 0 for w in workers)
        assert agg.report()["jobs"][3]["drops"] == {"stale_round": 1}
    finally:
        agg.stop()
        thread.join(5)
        for t in (*workers, switch):
            t.close()

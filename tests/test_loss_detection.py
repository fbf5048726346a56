"""Loss detection of the worker's stream (inagg.hostlib.worker.rounds.LossDetector, RttEstimator, is_burst):
its decisions on scripted sequences of sends and results, and over a real socket scripted
aggregators, in both streams (the native one, native/stream.cpp, is the twin of the Python
specification): one that loses one contribution (the stream resends exactly that round, early)
and one that drains a deep window slower than the RTO (nothing is resent)."""

import threading
import time

import numpy as np
import pytest

from inagg.hostlib.wire.grant import Grant
from inagg.hostlib.worker.stream import NativeSlotStream
from inagg.hostlib.wire.protocol import FLAG_RETRANSMIT
from inagg.hostlib.worker.rounds import (
    LOSS_MEMORY, MAX_BACKOFF, RTO_OVER_MIN_RTT, TICKS_PER_RTO_MIN, Loss, LossDetector, Round, RttEstimator,
    is_burst,
)
from inagg.hostlib.worker.stream_reference import SlotStream
from inagg.hostlib.wire.transport import UdpTransport
from scripted_udp import as_result, bound_socket, datagrams

STREAMS = {"python": SlotStream, "native": NativeSlotStream}


def sent(at: float, rto: float = 1.0) -> Round:
    return Round(chunk=0, priming=False, round_no=0, offset=0, count=0, packet=b"",
                 sent_at=at, deadline=at + rto, rto=rto)


def detector(rtt: float = 0.01, rto_min: float = 0.004) -> LossDetector:
    est = RttEstimator(rto_min, 1.0)
    est.sample(rtt)
    return LossDetector(est)


def test_a_later_answered_round_marks_an_overdue_earlier_one_lost():
    d = detector(rtt=0.01)               # reorder window: srtt / 4 = 2.5 ms
    a, b, c = sent(0.0), sent(0.001), sent(0.002)
    d.delivered(c, 0.012, [a, b])        # c answered after 10 ms
    assert d.verdict(a, 0.012) is Loss.NONE      # within c's RTT + the reorder window
    assert d.verdict(a, 0.0126) is Loss.FAST     # 0 + 10 ms + 2.5 ms
    assert d.verdict(b, 0.0126) is Loss.NONE     # b is 1 ms younger
    assert d.verdict(b, 0.0136) is Loss.FAST


def test_no_fast_retransmit_without_a_later_answered_round():
    d = detector()
    a, b = sent(0.002), sent(0.003)
    d.delivered(sent(0.001), 0.011, [])  # only an older round answered
    assert d.verdict(a, 0.5) is Loss.NONE and d.verdict(b, 0.5) is Loss.NONE
    assert d.verdict(a, 1.002) is Loss.TIMEOUT   # its own deadline still holds


def test_answers_to_retransmitted_rounds_do_not_move_the_reference_karn():
    d = detector()
    a, late = sent(0.0), sent(0.005)
    late.retransmitted = True            # which copy was answered is unknown
    d.delivered(late, 0.02, [a])
    assert d.verdict(a, 0.5) is Loss.NONE


def test_a_resent_round_is_judged_from_its_latest_transmission():
    d = detector(rtt=0.01)
    a = sent(0.0)
    d.delivered(sent(0.001), 0.011, [])
    assert d.verdict(a, 0.014) is Loss.FAST
    a.last_sent = 0.014                  # resent: no round sent after that was answered yet
    assert d.verdict(a, 0.1) is Loss.NONE
    d.delivered(sent(0.015), 0.025, [])
    assert d.verdict(a, 0.0265) is Loss.FAST


def test_backoff_only_on_a_silent_path_and_bounded():
    d = detector(rtt=0.01, rto_min=0.004)
    rto = d.rtt.rto
    a = sent(0.0, rto=rto)
    assert d.silent(a)                   # nothing answered since a was sent
    assert d.next_rto(a, backoff=True, now=0.1) == pytest.approx(2 * rto)
    a.rto = 100.0
    assert d.next_rto(a, backoff=True, now=0.1) == pytest.approx(min(MAX_BACKOFF * rto, 1.0))
    d.delivered(sent(0.001), 0.011, [])
    assert not d.silent(a)               # results keep coming: random loss, no backoff
    assert d.next_rto(a, backoff=False, now=0.1) == rto


def test_a_round_queued_behind_answered_ones_waits_an_rto_from_their_answers():
    d = detector(rtt=0.01)
    rto = d.rtt.rto
    head, back = sent(0.0, rto), sent(0.0, rto)   # one burst: back waits for head's answer
    d.delivered(head, 0.8 * rto, [back])
    assert d.verdict(back, 1.5 * rto) is Loss.NONE   # past its own deadline, within head's + RTO
    assert d.verdict(back, 1.8 * rto) is Loss.TIMEOUT
    assert not d.silent(back)


def test_only_answers_to_rounds_sent_no_later_restart_a_timer():
    d = detector(rtt=0.01)
    rto = d.rtt.rto
    x = sent(0.0, rto)
    x.last_sent, x.deadline, x.retransmitted = 0.01, 0.01 + rto, True
    y = sent(0.0, rto)                   # resent after x: its answer may be that resend's
    y.last_sent, y.retransmitted = 0.02, True
    d.delivered(y, 0.025, [x])
    assert x.deadline == 0.01 + rto
    d.delivered(sent(0.005, rto), 0.026, [x])   # sent before x's resend: x waits anew
    assert x.deadline == pytest.approx(0.026 + rto)


def test_a_resend_answered_at_once_leaves_the_rto_alone():
    """No Eifel floor: in a job the answer that follows a resend at once is most often another
    rank's resend completing the round, no sign that this rank's RTO was too short."""
    d = detector(rtt=0.01)
    rto = d.rtt.rto
    a = sent(0.0, rto)
    a.last_sent, a.retransmitted = rto, True
    d.delivered(a, rto + 1e-6, [])
    assert d.rtt.rto == rto and d.rtt.reorder_window(lossy=False) == 0.01 / 4


def test_a_fast_retransmission_marks_the_path_lossy_for_a_while():
    d = detector(rtt=0.002, rto_min=0.02)          # RTO: rto_min; reorder window: rto_min / 4
    assert d.timeout(0.0) == 0.02 and not d.lossy(0.0)
    d.saw_loss(1.0)
    assert d.lossy(1.0) and d.lossy(1.0 + LOSS_MEMORY / 2)
    assert d.timeout(1.0) == pytest.approx(0.004)   # two SRTTs: RACK-TLP's probe timeout
    assert d.rtt.reorder_window(lossy=True) == pytest.approx(0.0005)
    assert d.rtt.reorder_window(lossy=False) == pytest.approx(0.005)
    a = sent(1.0, 0.004)
    d.delivered(sent(1.0005, 0.004), 1.0025, [a])   # a later-sent round answered
    assert d.verdict(a, 1.0024) is Loss.NONE
    assert d.verdict(a, 1.0026) is Loss.FAST        # 1.0 + its 2 ms RTT + 0.5 ms (loss-free: 5 ms)
    assert not d.lossy(1.0 + LOSS_MEMORY) and d.timeout(1.0 + LOSS_MEMORY) == 0.02
    a.rto = 1.0
    assert d.next_rto(a, backoff=True, now=1.1) == pytest.approx(MAX_BACKOFF * 0.004)


def test_the_lossy_timeout_is_at_least_a_scan_tick_and_at_most_the_rto():
    est = RttEstimator(0.02, 1.0)
    assert est.lossy_timeout() == est.rto             # no sample yet
    est.sample(0.00001)
    assert est.lossy_timeout() == est.scan_tick() == 0.02 / TICKS_PER_RTO_MIN
    est.sample(0.5)
    assert est.lossy_timeout() == est.rto


def test_rto_follows_the_minimum_rtt_not_the_waits_for_other_ranks():
    est = RttEstimator(0.001, 1.0)
    est.sample(0.002)
    for _ in range(20):                  # rounds that waited for another rank's recovery
        est.sample(0.2)
    assert est.rto == pytest.approx(RTO_OVER_MIN_RTT * 0.002)
    low = RttEstimator(0.005, 1.0)
    low.sample(0.0001)
    assert low.rto == 0.005              # never below rto_min


@pytest.mark.parametrize("backoffs,window,burst", [(0, 64, False), (1, 64, False), (31, 64, False),
                                                   (32, 64, True), (1, 1, False), (2, 3, True)])
def test_a_burst_is_half_the_window_timing_out_at_once(backoffs, window, burst):
    assert is_burst(backoffs, window) is burst


class ScriptedAggregator:
    """A one-rank job's aggregator on a real socket: ``answer`` decides, datagram by datagram,
    whether to echo it as its result (a one-rank sum is the contribution itself)."""

    def __init__(self) -> None:
        self.sock = bound_socket()

    def answer(self, data: bytes) -> bool:
        raise NotImplementedError

    def serve(self) -> None:
        for data, sender in datagrams(self.sock):
            if not self.answer(data):
                continue
            try:
                self.sock.sendto(as_result(data), sender)
            except OSError:   # the test is over and closed the socket
                return


class LoseOneContribution(ScriptedAggregator):
    """Loses the first transmission of one block's contribution, answers every other datagram
    at once."""

    def __init__(self, lost_offset: int) -> None:
        super().__init__()
        self.lost_offset = lost_offset
        self.lost = False
        self.resent_offsets: list[int] = []

    def answer(self, data: bytes) -> bool:
        offset = int.from_bytes(data[12:16], "big")
        if data[1] & FLAG_RETRANSMIT:
            self.resent_offsets.append(offset)
        if offset == self.lost_offset and not self.lost:
            self.lost = True
            return False
        return True


@pytest.mark.parametrize("kind", STREAMS)
def test_a_lost_contribution_is_resent_once_by_fast_retransmit(kind):
    k, window = 4, 8
    agg = LoseOneContribution(lost_offset=2 * k)    # block 2; blocks 3.. are answered after it
    thread = threading.Thread(target=agg.serve, daemon=True)
    thread.start()
    transport = UdpTransport(agg.sock.getsockname(), bind=("127.0.0.1", 0))
    try:
        # an RTO of 2 s: only the fast path can resend before it
        stream = STREAMS[kind](Grant(3, 2, 0, window, k, agg.sock.getsockname()), 0, 1, transport,
                               rto_min=2.0, rto_max=2.0, stall_timeout=10.0)
        x = np.arange(40, dtype=np.int32)
        stream.allreduce(x)
        assert x.tolist() == list(range(40))
        s = stream.stats
        assert agg.resent_offsets == [2 * k]
        assert s.retransmissions == s.fast_retransmissions == 1
        assert s.backoffs == 0 and s.timeouts() == 0
    finally:
        agg.sock.close()
        transport.close()


class SlowFifoAggregator(ScriptedAggregator):
    """Answers every datagram in arrival order, one each ``service`` seconds: a window of W
    rounds takes W services to drain, far longer than the RTO, while answers keep coming far
    more often than the RTO."""

    def __init__(self, service: float) -> None:
        super().__init__()
        self.service = service
        self.resent = 0

    def answer(self, data: bytes) -> bool:
        self.resent += bool(data[1] & FLAG_RETRANSMIT)
        time.sleep(self.service)
        return True


@pytest.mark.parametrize("kind", STREAMS)
def test_a_deep_window_drained_slower_than_the_rto_is_not_resent(kind):
    rto, window = 0.2, 16
    # the window drains in 4.8 RTOs; a service is longer than the streams' scan tick (rto / 4),
    # so they look for lost rounds between answers
    agg = SlowFifoAggregator(service=0.3 * rto)
    thread = threading.Thread(target=agg.serve, daemon=True)
    thread.start()
    transport = UdpTransport(agg.sock.getsockname(), bind=("127.0.0.1", 0))
    try:
        stream = STREAMS[kind](Grant(3, 2, 0, window, 4, agg.sock.getsockname()), 0, 1, transport,
                               rto_min=rto, rto_max=rto, stall_timeout=10.0)
        stream.window_control.goal = window
        x = np.arange(4 * window, dtype=np.int32)
        stream.allreduce(x)
        assert x.tolist() == list(range(4 * window))
        assert stream.window == window
        assert stream.stats.retransmissions == 0 and agg.resent == 0
    finally:
        agg.sock.close()
        transport.close()
        thread.join(5)


def test_probes_of_a_silent_path_double_and_end_with_an_answer():
    d = detector(rtt=0.001, rto_min=0.02)         # RTO: rto_min
    assert d.may_probe(0.0)
    assert d.probe(0.0) == pytest.approx(0.04)
    assert not d.may_probe(0.039) and d.may_probe(0.04)
    assert d.probe(0.04) == pytest.approx(0.08)
    for _ in range(5):
        last = d.probe(1.0)
    assert last == pytest.approx(MAX_BACKOFF * 0.02)
    d.delivered(sent(0.5), 1.01, [])              # an answer ends the episode
    assert d.may_probe(1.01) and d.probe(1.01) == pytest.approx(0.04)


class StallOnce(ScriptedAggregator):
    """Answers every datagram at once but, at the first data round, stops for ``stall``
    seconds (a descheduled aggregator): the window waits in its socket, then is answered, each
    answer ``gap`` seconds after the one before (a loaded machine's aggregator catching up)."""

    def __init__(self, stall: float, gap: float = 0.0) -> None:
        super().__init__()
        self.stall, self.gap = stall, gap
        self.seen = 0

    def answer(self, data: bytes) -> bool:
        self.seen += 1
        if self.seen == 2:                        # 1: the control round
            time.sleep(self.stall)
        elif self.seen > 2:
            time.sleep(self.gap)
        return True


@pytest.mark.parametrize("gap", [0.0, 0.01])
@pytest.mark.parametrize("kind", STREAMS)
def test_a_stalled_aggregator_costs_a_probe_per_timeout_not_a_window(kind, gap):
    rto, window = 0.05, 16
    agg = StallOnce(stall=6 * rto, gap=gap)       # probes after 1 and 3 RTOs; answers from 6 on
    thread = threading.Thread(target=agg.serve, daemon=True)
    thread.start()
    transport = UdpTransport(agg.sock.getsockname(), bind=("127.0.0.1", 0))
    try:
        stream = STREAMS[kind](Grant(3, 2, 0, window, 4, agg.sock.getsockname()), 0, 1, transport,
                               rto_min=rto, rto_max=1.0, stall_timeout=10.0)
        stream.window_control.goal = window
        x = np.arange(4 * window, dtype=np.int32)
        stream.allreduce(x)
        assert x.tolist() == list(range(4 * window)) and stream.window == window
        s = stream.stats
        assert 1 <= s.retransmissions <= 3 and s.fast_retransmissions == 0
    finally:
        agg.sock.close()
        transport.close()
        thread.join(5)

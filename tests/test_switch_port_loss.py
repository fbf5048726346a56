"""Loss and delay on the software switch's ports (``--loss``, ``--delay``:
native/port_impairment.cpp and its Python twin bmv2_env/softswitch/impair.py), for links where
the kernel has no netem.

The twin decides every frame as the C++ does and releases held frames in the same order
(hypothesis, on the real extension), and a real switch process of either engine, driven over
loopback UDP, drops exactly the frames the twin predicts from the seed, on the way in and on
the way out, delays the others by at least the port's delay without reordering them, and
counts them in --impair-stats."""

import json
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inagg.bmv2_env.softswitch.impair import DelayLine, PortImpairments, loss_hash, parse_delay, parse_loss
from inagg.hostlib.native_build import _native
from inagg.hostlib.wire.protocol import MSG_RESULT, SWITCH_VALUES_PER_PACKET as K, build_contribution, unpack_header
from tests.test_soft_switch_udp import admit, soft_switch, udp_socket

U64 = st.integers(0, 2**64 - 1)


@settings(max_examples=200, deadline=None)
@given(seed=U64, port=st.integers(0, 511), egress=st.booleans(), n=U64)
def test_the_twin_hashes_as_the_cpp(seed, port, egress, n):
    assert loss_hash(seed, port, egress, n) == _native.loss_hash(seed, port, egress, n)


@settings(max_examples=100, deadline=None)
@given(seed=U64, fraction=st.one_of(st.sampled_from([0.0, 1.0, 0.5]), st.floats(0, 1)),
       delay=st.integers(0, 10**6), frames=st.lists(st.tuples(st.integers(1, 4), st.booleans()), max_size=300))
def test_the_twin_decides_each_frame_as_the_cpp(seed, fraction, delay, frames):
    """Ports 1-3 lossy both ways, port 3 delayed too (port 4 not impaired): the same fates,
    the same counts."""
    native, twin = _native.PortImpairments(seed), PortImpairments(seed)
    for imp in (native, twin):
        for port in (1, 2, 3):
            for egress in (False, True):
                imp.set_loss(port, egress, fraction)
        imp.set_delay(3, True, delay)
    assert [native.next(p, e) for p, e in frames] == [twin.next(p, e) for p, e in frames]
    assert sorted(native.stats()) == twin.stats()
    if fraction in (0.0, 1.0):
        assert all(dropped == (seen if fraction else 0) for _, _, seen, dropped, *_ in twin.stats())


@settings(max_examples=100, deadline=None)
@given(holds=st.lists(st.tuples(st.integers(0, 50), st.integers(1, 4), st.booleans(), st.binary(max_size=8)),
                      max_size=60),
       nows=st.lists(st.integers(0, 60), max_size=6))
def test_held_frames_leave_in_the_same_order_from_both(holds, nows):
    native, twin = _native.DelayLine(), DelayLine()
    for release, port, egress, frame in holds:
        native.hold(release, port, egress, frame)
        twin.hold(release, port, egress, frame)
    for now in sorted(nows) + [60]:
        assert native.take_due(now) == twin.take_due(now)


def test_a_fraction_outside_0_to_1_is_refused():
    with pytest.raises(ValueError, match="0..1"):
        _native.PortImpairments(0).set_loss(1, False, 1.5)
    with pytest.raises(ValueError, match="0..1"):
        PortImpairments(0).set_loss(1, False, -0.1)
    with pytest.raises(ValueError, match="PORT:in|out:PERCENT"):
        parse_loss("1:sideways:3")
    with pytest.raises(ValueError, match="0..100"):
        parse_loss("1:in:101")
    assert parse_delay("2:out:5") == (2, True, 5000) and parse_loss("2:in:1.5") == (2, False, 0.015)


@pytest.mark.parametrize("engine", ["native", "python"])
def test_the_switch_drops_what_the_twin_predicts(tmp_path, engine):
    """Port 1 drops 30 % of what it receives (rank 0's contributions), port 2 20 % of what it
    sends (results to rank 1): a slot completes unless rank 0's contribution was dropped; rank
    0 gets every completed slot's result, rank 1 those its port did not drop; the counts saved
    are the twin's."""
    slots, seed = 200, 7
    stats = tmp_path / "loss.json"
    options = ("--engine", engine, "--loss", "1:in:30", "--loss", "2:out:20", "--loss-seed", str(seed),
               "--impair-stats", str(stats))
    twin = PortImpairments(seed)
    twin.set_loss(1, False, 0.3)
    twin.set_loss(2, True, 0.2)
    completed = [s for s in range(slots) if not twin.next(1, False)[0]]
    to_rank1 = [s for s in completed if not twin.next(2, True)[0]]
    with soft_switch(tmp_path, *options) as (proc, sw, net, to_switch):
        workers = [udp_socket(f"{net}.{r + 1}") for r in range(2)]
        try:
            admit(sw, net, workers, slots)
            for slot in range(slots):
                for rank, w in enumerate(workers):
                    w.sendto(build_contribution(1, rank, 1, slot, 0, K * slot, np.full(K, slot, np.int32), K),
                             to_switch)
            for w, expected in zip(workers, (completed, to_rank1)):
                got = [unpack_header(w.recv(65535)) for _ in expected]
                assert [h.slot for h in got] == expected and {h.msg_type for h in got} == {MSG_RESULT}
                w.settimeout(0.3)
                with pytest.raises(TimeoutError):
                    w.recv(65535)
        finally:
            for w in workers:
                w.close()
        proc.terminate()
        assert proc.wait(10) == 0
    saved = json.loads(stats.read_text())
    assert saved == [{"port": p, "direction": "out" if e else "in", "seen": seen, "dropped": dropped,
                      "loss_pct": 100 * f, "delay_ms": 0, "delayed": 0} for p, e, seen, dropped, f, _, _ in twin.stats()]
    assert [(e["seen"], e["dropped"]) for e in saved] == [(slots, slots - len(completed)),
                                                          (len(completed), len(completed) - len(to_rank1))]


def test_loss_on_a_port_no_interface_attaches_is_refused(tmp_path, capfd):
    from inagg.bmv2_env.softswitch.switch import parse_args

    with pytest.raises(SystemExit):
        parse_args(["-i", "1@veth0", "--loss", "2:in:1", "--no-p4"])
    assert "--loss/--delay on port(s) [2], which no -i attaches" in capfd.readouterr().err


@pytest.mark.parametrize("engine", ["native", "python"])
def test_the_switch_delays_without_reordering(tmp_path, engine):
    """Port 1 holds what it receives 150 ms, port 2 what it sends 100 ms: every result comes
    back, in slot order, no sooner than its path's delay (a lower bound: a loaded machine only
    makes it later); the counts say every frame of those directions was delayed."""
    slots = 20
    stats = tmp_path / "delay.json"
    options = ("--engine", engine, "--delay", "1:in:150", "--delay", "2:out:100", "--impair-stats", str(stats))
    with soft_switch(tmp_path, *options) as (proc, sw, net, to_switch):
        workers = [udp_socket(f"{net}.{r + 1}") for r in range(2)]
        try:
            admit(sw, net, workers, slots)
            sent = time.monotonic()
            for slot in range(slots):
                for rank, w in enumerate(workers):
                    w.sendto(build_contribution(1, rank, 1, slot, 0, K * slot, np.full(K, slot, np.int32), K),
                             to_switch)
            for w, least in zip(workers, (0.15, 0.25)):
                got = [unpack_header(w.recv(65535)).slot for _ in range(slots)]
                assert got == list(range(slots)) and time.monotonic() - sent >= least
        finally:
            for w in workers:
                w.close()
        proc.terminate()
        assert proc.wait(10) == 0
    saved = {(e["port"], e["direction"]): (e["delay_ms"], e["seen"], e["delayed"]) for e in json.loads(stats.read_text())}
    assert saved == {(1, "in"): (150, slots, slots), (2, "out"): (100, slots, slots)}

"""Impairments on the software switch's ports (``--loss``, ``--delay``, ``--jitter``,
``--duplicate``, ``--reorder``: native/port_impairment.cpp and its Python twin
bmv2_env/softswitch/impair.py), for links where the kernel has no netem.

The twin decides every frame as the C++ does, counts reordering alike and releases held frames
in the same order (hypothesis, on the real extension), and a real switch process of either
engine, driven over loopback UDP, drops exactly the frames the twin predicts from the seed, on
the way in and on the way out, delays the others by at least the port's delay without
reordering them, sends twice exactly the frames the twin says, reorders under jitter and
reorder as many frames as its --impair-stats count (the receiver sees the same order)."""

import json
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inagg.bmv2_env.softswitch.impair import DelayLine, PortImpairments, impair_hash, parse_impairment, stats_json
from inagg.hostlib.native_build import _native
from inagg.hostlib.wire.protocol import MSG_RESULT, SWITCH_VALUES_PER_PACKET as K, build_contribution, unpack_header
from tests.test_soft_switch_udp import admit, soft_switch, udp_socket

U64 = st.integers(0, 2**64 - 1)


@settings(max_examples=200, deadline=None)
@given(seed=U64, port=st.integers(0, 511), egress=st.booleans(), n=U64, salt=st.integers(0, 4))
def test_the_twin_hashes_as_the_cpp(seed, port, egress, n, salt):
    assert impair_hash(seed, port, egress, n, salt) == _native.impair_hash(seed, port, egress, n, salt)


FRACTIONS = st.one_of(st.sampled_from([0.0, 1.0, 0.5]), st.floats(0, 1))


@settings(max_examples=100, deadline=None)
@given(seed=U64, loss=FRACTIONS, duplicate=FRACTIONS, reorder=FRACTIONS, delay=st.integers(0, 10**6),
       jitter=st.integers(0, 10**6),
       frames=st.lists(st.tuples(st.integers(1, 4), st.booleans(), st.integers(0, 3)), max_size=300))
def test_the_twin_decides_each_frame_as_the_cpp(seed, loss, duplicate, reorder, delay, jitter, frames):
    """Ports 1-3 lossy both ways, port 3 delayed with jitter, duplicating and reordering too
    (port 4 not impaired): the same fates, the same counts; frames leave in an order of their
    own (each may leave after up to 3 later ones), counted reordered alike."""
    native, twin = _native.PortImpairments(seed), PortImpairments(seed)
    for imp in (native, twin):
        for port in (1, 2, 3):
            for egress in (False, True):
                imp.set_loss(port, egress, loss)
        imp.set_delay(3, True, delay)
        imp.set_jitter(3, True, jitter)
        imp.set_duplicate(3, True, duplicate)
        imp.set_reorder(3, True, reorder)
    fates = [native.next(p, e) for p, e, _ in frames]
    assert fates == [twin.next(p, e) for p, e, _ in frames]
    leaving = sorted((i + late, p, e, fate[-1])
                     for i, ((p, e, late), fate) in enumerate(zip(frames, fates)) if not fate[0])
    for _, p, e, n in leaving:
        native.left(p, e, n)
        twin.left(p, e, n)
    assert sorted(native.stats(), key=lambda d: (d["port"], d["egress"])) == twin.stats()
    for s in twin.stats():
        if loss in (0.0, 1.0):
            assert s["dropped"] == (s["seen"] if loss else 0)
        assert s["duplicated"] <= s["seen"] - s["dropped"] and s["delayed"] <= s["seen"] - s["dropped"]
    for dropped, delay_us, duplicated, copy_us, _ in fates:
        assert not dropped or (delay_us, duplicated) == (0, False)
        assert 0 <= delay_us <= delay + jitter and (duplicated or copy_us == 0)


@settings(max_examples=100, deadline=None)
@given(holds=st.lists(st.tuples(st.integers(0, 50), st.integers(1, 4), st.booleans(), st.integers(0, 9),
                                st.binary(max_size=8)), max_size=60),
       nows=st.lists(st.integers(0, 60), max_size=6))
def test_held_frames_leave_in_the_same_order_from_both(holds, nows):
    native, twin = _native.DelayLine(), DelayLine()
    for release, port, egress, n, frame in holds:
        native.hold(release, port, egress, n, frame)
        twin.hold(release, port, egress, n, frame)
    for now in sorted(nows) + [60]:
        assert native.take_due(now) == twin.take_due(now)


def test_a_fraction_outside_0_to_1_is_refused():
    for name in ("loss", "duplicate", "reorder"):
        with pytest.raises(ValueError, match=f"port {name}: the fraction must be in 0..1"):
            getattr(_native.PortImpairments(0), f"set_{name}")(1, False, 1.5)
        with pytest.raises(ValueError, match=f"port {name}: the fraction must be in 0..1"):
            getattr(PortImpairments(0), f"set_{name}")(1, False, -0.1)
    with pytest.raises(ValueError, match="PORT:in|out:PERCENT"):
        parse_impairment("loss", "1:sideways:3")
    with pytest.raises(ValueError, match="0..100"):
        parse_impairment("duplicate", "1:in:101")
    assert parse_impairment("delay", "2:out:5") == (2, True, 5000) and parse_impairment("jitter", "2:out:0.5") == (2, True, 500)
    assert parse_impairment("loss", "2:in:1.5") == (2, False, 0.015) and parse_impairment("reorder", "1:in:25")[2] == 0.25


def send_slots(workers: list, to_switch: tuple, slots: int) -> None:
    """Every worker's contribution to each of ``slots`` slots (slot s: K values of s), in slot order."""
    for slot in range(slots):
        for rank, w in enumerate(workers):
            w.sendto(build_contribution(1, rank, 1, slot, 0, K * slot, np.full(K, slot, np.int32), K), to_switch)


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
            send_slots(workers, to_switch, slots)
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
    assert saved == stats_json(twin.stats())
    assert [(e["seen"], e["dropped"]) for e in saved] == [(slots, slots - len(completed)),
                                                          (len(completed), len(completed) - len(to_rank1))]


def test_loss_on_a_port_no_interface_attaches_is_refused(tmp_path, capfd):
    from inagg.bmv2_env.softswitch.switch import parse_args

    with pytest.raises(SystemExit):
        parse_args(["-i", "1@veth0", "--loss", "2:in:1", "--no-p4"])
    assert "--loss/--delay/--jitter/--duplicate/--reorder on port(s) [2], which no -i attaches" in capfd.readouterr().err


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
            send_slots(workers, to_switch, slots)
            for w, least in zip(workers, (0.15, 0.25)):
                got = [unpack_header(w.recv(65535)).slot for _ in range(slots)]
                assert got == list(range(slots)) and time.monotonic() - sent >= least
        finally:
            for w in workers:
                w.close()
        proc.terminate()
        assert proc.wait(10) == 0
    saved = {(e["port"], e["direction"]): (e["delay_ms"], e["seen"], e["delayed"], e["reordered"])
             for e in json.loads(stats.read_text())}
    assert saved == {(1, "in"): (150, slots, slots, 0), (2, "out"): (100, slots, slots, 0)}


def overtaken(sequence: list[int]) -> int:
    """How many entries of ``sequence`` come after a larger one (``left``'s count)."""
    latest, count = -1, 0
    for n in sequence:
        count += n < latest
        latest = max(latest, n)
    return count


@pytest.mark.parametrize("engine", ["native", "python"])
def test_the_switch_duplicates_and_reorders_what_it_counts(tmp_path, engine):
    """Port 2 sends its results 30 ms +- 25 ms late, 25 % of them twice and 20 % at once: rank 1
    gets every slot's result, twice exactly those the twin says, in an order whose overtaken
    results are the port's reordered count (loopback keeps the switch's sending order)."""
    slots, seed = 200, 11
    stats = tmp_path / "impair.json"
    options = ("--engine", engine, "--delay", "2:out:30", "--jitter", "2:out:25", "--duplicate", "2:out:25",
               "--reorder", "2:out:20", "--loss-seed", str(seed), "--impair-stats", str(stats))
    twin = PortImpairments(seed)
    twin.set_delay(2, True, 30000)
    twin.set_jitter(2, True, 25000)
    twin.set_duplicate(2, True, 0.25)
    twin.set_reorder(2, True, 0.2)
    twice = {s for s in range(slots) if twin.next(2, True)[2]}
    with soft_switch(tmp_path, *options) as (proc, sw, net, to_switch):
        workers = [udp_socket(f"{net}.{r + 1}") for r in range(2)]
        try:
            admit(sw, net, workers, slots)
            send_slots(workers, to_switch, slots)
            got = [unpack_header(workers[1].recv(65535)).slot for _ in range(slots + len(twice))]
            workers[1].settimeout(0.3)
            with pytest.raises(TimeoutError):
                workers[1].recv(65535)
        finally:
            for w in workers:
                w.close()
        proc.terminate()
        assert proc.wait(10) == 0
    assert sorted(got) == sorted([*range(slots), *twice])
    [saved] = json.loads(stats.read_text())
    assert (saved["seen"], saved["duplicated"], saved["dropped"]) == (slots, len(twice), 0)
    assert saved["reordered"] == overtaken(got) > 0 and saved["jitter_ms"] == 25 and saved["reorder_pct"] == 20

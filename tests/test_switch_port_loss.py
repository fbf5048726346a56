"""Loss on the software switch's ports (``--loss``: native/port_impairment.cpp and its Python
twin bmv2_env/softswitch/impair.py), for links where the kernel has no netem.

The twin decides every frame as the C++ does (hypothesis, on the real extension), and a real
switch process of either engine, driven over loopback UDP, drops exactly the frames the twin
predicts from the seed, on the way in and on the way out, and counts them in --impair-stats."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inagg.bmv2_env.softswitch.impair import PortImpairments, loss_hash, parse_loss
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
       frames=st.lists(st.tuples(st.integers(1, 4), st.booleans()), max_size=300))
def test_the_twin_drops_the_frames_the_cpp_drops(seed, fraction, frames):
    """Ports 1-3 impaired in both directions (port 4 not): the same frames dropped, the same counts."""
    native, twin = _native.PortImpairments(seed), PortImpairments(seed)
    for port in (1, 2, 3):
        for egress in (False, True):
            native.set_loss(port, egress, fraction)
            twin.set_loss(port, egress, fraction)
    assert [native.drop(p, e) for p, e in frames] == [twin.drop(p, e) for p, e in frames]
    assert sorted(native.stats()) == twin.stats()
    if fraction in (0.0, 1.0):
        assert all(dropped == (seen if fraction else 0) for _, _, seen, dropped, _ in twin.stats())


def test_a_fraction_outside_0_to_1_is_refused():
    with pytest.raises(ValueError, match="0..1"):
        _native.PortImpairments(0).set_loss(1, False, 1.5)
    with pytest.raises(ValueError, match="0..1"):
        PortImpairments(0).set_loss(1, False, -0.1)
    with pytest.raises(ValueError, match="PORT:in|out:PERCENT"):
        parse_loss("1:sideways:3")


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
    completed = [s for s in range(slots) if not twin.drop(1, False)]
    to_rank1 = [s for s in completed if not twin.drop(2, True)]
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
                      "loss_pct": 100 * f} for p, e, seen, dropped, f in twin.stats()]
    assert [(e["seen"], e["dropped"]) for e in saved] == [(slots, slots - len(completed)),
                                                          (len(completed), len(completed) - len(to_rank1))]


def test_loss_on_a_port_no_interface_attaches_is_refused(tmp_path, capfd):
    from inagg.bmv2_env.softswitch.switch import parse_args

    with pytest.raises(SystemExit):
        parse_args(["-i", "1@veth0", "--loss", "2:in:1", "--no-p4"])
    assert "--loss on port(s) [2], which no -i attaches" in capfd.readouterr().err

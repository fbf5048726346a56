"""Link rates by tc tbf (bmv2_env/emulation/shaping.py), on a real veth pair in this namespace
(root; skipped without): ``shape`` sets and re-rates an end in place, ``applied_rate`` reads
back what tc shows, and a ``BandwidthSchedule`` applies its first rate at bring-up and the later
ones from its thread after time zero, recording each change as tc then shows it."""

import os
import subprocess
import time
from types import SimpleNamespace

import pytest

from inagg.bmv2_env.emulation.shaping import BandwidthSchedule, applied_rate, rate_bits, shape


@pytest.fixture
def veth_pair():
    """Two ends of a fresh veth pair, as Mininet's interfaces in the root namespace show them
    to shaping.py (a name and a node)."""
    if os.geteuid() != 0:
        pytest.skip("tc needs root")
    a, b = f"shp{os.getpid()}a"[:15], f"shp{os.getpid()}b"[:15]
    subprocess.run(["ip", "link", "add", a, "type", "veth", "peer", "name", b], check=True, capture_output=True)
    root = SimpleNamespace(name="root", pid=os.getpid(), inNamespace=False)
    try:
        yield [SimpleNamespace(name=a, node=root), SimpleNamespace(name=b, node=root)]
    finally:
        subprocess.run(["ip", "link", "del", a], capture_output=True)


def test_shape_sets_and_rerates_in_place(veth_pair):
    end = veth_pair[0]
    assert applied_rate(end) is None
    shape(end, "100mbit")
    assert applied_rate(end) == 100
    shape(end, "1500kbit")
    assert applied_rate(end) == 1.5 and rate_bits("1500kbit") == 1.5e6
    shape(end, None)
    assert applied_rate(end) is None
    with pytest.raises(RuntimeError, match="tc qdisc del"):
        shape(end, None)   # nothing left to remove: tc's own message


def test_a_schedule_applies_each_rate_after_time_zero_and_records_it(veth_pair):
    schedule = BandwidthSchedule([("h1-s1-p1", veth_pair, [[0, 50], [0.3, 5], [0.6, 20]])])
    schedule.bring_up()
    assert [applied_rate(e) for e in veth_pair] == [50, 50]
    zero = time.time()
    schedule.start(zero)
    deadline = time.monotonic() + 30
    while len(schedule.changes) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    schedule.stop()
    changes = schedule.applied(zero)
    assert [(c["mbit"], c["mbit_applied"]) for c in changes] == [(50, [50, 50]), (5, [5, 5]), (20, [20, 20])]
    assert changes[0]["at_s"] <= 0 and changes[1]["at_s"] >= 0.3 and changes[2]["at_s"] >= 0.6
    assert [applied_rate(e) for e in veth_pair] == [20, 20]


def test_a_stopped_schedule_applies_nothing_more(veth_pair):
    schedule = BandwidthSchedule([("l", veth_pair, [[0, 50], [60, 5]])])
    schedule.bring_up()
    schedule.start(time.time())
    schedule.stop()
    assert [c["mbit"] for c in schedule.applied(None)] == [50] and schedule.applied(None)[0]["at_s"] is None


def test_a_change_tc_refuses_is_reported_and_the_later_ones_still_come(veth_pair):
    schedule = BandwidthSchedule([("l", veth_pair, [[0, 50], [0.2, 5], [0.4, 20]])])
    schedule.bring_up()
    subprocess.run(["ip", "link", "del", veth_pair[0].name], check=True, capture_output=True)   # both ends gone
    schedule.start(time.time())
    deadline = time.monotonic() + 30
    while len(schedule.changes) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    schedule.stop()
    later = schedule.applied(None)[1:]
    assert [c["mbit"] for c in later] == [5, 20], later
    assert all(c["mbit_applied"] == [None, None] and "tc qdisc replace" in c["error"] for c in later), later

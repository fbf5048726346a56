"""The backend's calibration plan (``inagg.hostlib.pytorch.path.calibration``): the ladder on fast
links; on any link, every call past the first size within ``calibration_seconds`` on its path's
true alpha-beta cost, a bounded number of rounds, and the payload each rank sends, counted.
``calibrate`` runs a plan as ``AllreduceDispatch.calibrate`` does, each call's time given by a
cost function; the chooser after it: tests/test_backend.py."""

from __future__ import annotations

import threading
from typing import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inagg.hostlib.pytorch.path.calibration import LADDER, CalibrationPlan
from inagg.hostlib.pytorch.path.choice import PathChooser
from inagg.hostlib.pytorch.path.links import LinkShape
from inagg.hostlib.pytorch.path.options import PathChoiceOptions
from inagg.hostlib.wire.grant import Grant

PATHS = ("inagg", "host", "gloo")
MIB = 1 << 20
CAP = PathChoiceOptions().calibration_seconds   # 0.25 s
SWITCH_GRANT = Grant(1, 1, 0, 32, 364, ("10.0.0.254", 42666), mode="switch")


def calibrate(c: PathChooser, took: Callable[[str, int], float]) -> CalibrationPlan:
    """``c`` calibrated as the backend does (``AllreduceDispatch.calibrate``), a call of ``n``
    bytes on ``path`` taking ``took(path, n)``: the plan that ran."""
    plan = CalibrationPlan(c, LADDER)
    while sizes := plan.next_round():
        for path, n in sizes.items():
            for _ in range(plan.timed):
                c.observe(path, n, took(path, n))
        c.agree()
        plan.ran(sizes)
    assert plan.rounds <= plan.max_rounds
    return plan


def shaped(world: int, bytes_per_s: float, rtt: float = 1e-3) -> Callable[[str, int], float]:
    """Each path's alpha-beta time on links of ``bytes_per_s`` for a job of ``world`` ranks: a
    round trip of ``rtt`` per call (gloo's ring: N-1 of them), then its bytes on the busiest
    link (``LinkShape.of_job``)."""
    shape = LinkShape.of_job(8 * bytes_per_s, world, SWITCH_GRANT, SWITCH_GRANT, 1500)
    trips = {"inagg": 1, "host": 1, "gloo": world - 1}
    return lambda path, n: trips[path] * rtt + shape.floor(path, n)


def test_on_fast_links_every_path_climbs_the_ladder_in_three_rounds():
    """1 GB/s links at 4 ranks, 0.1 ms round trips: every ladder size is cheap, so the plan is
    the ladder itself (what the backend timed before plans), 3 + 1 calls per path and size."""
    plan = calibrate(PathChooser(lambda v: v, PATHS), shaped(4, 1e9, 1e-4))
    assert plan.sizes == dict.fromkeys(PATHS, list(LADDER))
    assert plan.rounds == 3 and plan.record()["calls"] == 3 * 3 * 4
    assert plan.payload_bytes() == 3 * 4 * sum(LADDER)


def test_where_64_bytes_take_a_ms_sizes_between_keep_each_call_within_the_bound():
    """1 GB/s links at 8 ranks, 1 ms round trips (gloo's ring: 7 ms): 16 KiB bounded from 64 B
    (256 times its figure) could take over ``calibration_seconds``, so each path is timed at a
    size between first, as large as the bound allows (inagg and the host lane 4 KiB, gloo
    1 KiB); gloo's 1 MiB, 64 times its 16 KiB figure, needs 256 KiB before it."""
    plan = calibrate(PathChooser(lambda v: v, PATHS), shaped(8, 1e9))
    assert plan.sizes == {"inagg": [64, 4096, 16384, MIB], "host": [64, 4096, 16384, MIB],
                          "gloo": [64, 1024, 16384, 256 << 10, MIB]}
    assert plan.rounds == 5


def test_on_10_mbit_links_at_8_workers_no_call_takes_a_mib_and_the_payload_is_an_eighth():
    """Issue 36's slow start: 8 workers on 10 Mbit/s links, where a 1 MiB call takes 0.9 s on
    the switch, 1.5 s on gloo's ring and 7 s on the host lane (the ladder's calibration: 39 s
    of calls). No path is timed at 1 MiB; each climbs as far as a call stays within
    ``calibration_seconds``, the calibration's calls take 2.1 s, and each rank's payload is an
    eighth of the ladder's (counts that do not depend on the machine)."""
    took = shaped(8, 10e6 / 8)
    assert took("inagg", MIB) > 0.8 and took("gloo", MIB) > 1.4 and took("host", MIB) > 6.9
    plan = calibrate(PathChooser(lambda v: v, PATHS), took)
    assert plan.sizes == {"inagg": [64, 4096, 16384, 256 << 10], "host": [64, 4096, 16384],
                          "gloo": [64, 1024, 16384, 64 << 10]}
    assert all(took(p, n) <= CAP for p, sizes in plan.sizes.items() for n in sizes)
    assert all(took(p, 4 * sizes[-1]) > CAP for p, sizes in plan.sizes.items())
    ladder_s = sum(4 * took(p, n) for p in PATHS for n in LADDER)
    planned_s = sum(4 * took(p, n) for p, sizes in plan.sizes.items() for n in sizes)
    assert ladder_s > 38 and planned_s < 2.2
    assert plan.payload_bytes() == 1_544_960 < 3 * 4 * sum(LADDER) / 8


@settings(max_examples=200, deadline=None)
@given(alphas=st.lists(st.floats(1e-5, 2e-2), min_size=3, max_size=3),
       rates=st.lists(st.floats(1e4, 1e10), min_size=3, max_size=3),
       cap=st.sampled_from([0.05, 0.25, 1.0]))
def test_whatever_the_links_each_call_past_64_bytes_stays_within_the_bound(alphas, rates, cap):
    """Paths of any alpha-beta cost (a round trip of 10 us to 20 ms, 10 KB/s to 10 GB/s): every
    size past the first is one whose call takes at most ``calibration_seconds``, a path stops only
    at the ladder's top or where the bound of 4x its last size (4x that size's time) is over
    it, and the rounds stay within ``max_rounds``."""
    cost = {p: (a, 1 / r) for p, a, r in zip(PATHS, alphas, rates)}

    def took(path: str, n: int) -> float:
        return cost[path][0] + cost[path][1] * n

    plan = calibrate(PathChooser(lambda v: v, PATHS, calibration_seconds=cap), took)
    assert plan.max_rounds == 8
    for p, sizes in plan.sizes.items():
        assert sizes[0] == LADDER[0] and all(b >= 4 * a for a, b in zip(sizes, sizes[1:]))
        assert all(took(p, n) <= cap * (1 + 1e-6) for n in sizes[1:])
        assert sizes[-1] == LADDER[-1] or 4 * took(p, sizes[-1]) > cap * (1 - 1e-6)   # 4x its size's bound


def test_a_path_with_no_agreed_time_is_not_climbed_and_a_bad_ladder_is_refused():
    """A path whose first calls no rank timed has no figure to bound its next call: it stays at
    the first size. A ladder that is not rising powers of 4 is refused, naming what to write,
    and so is a bound that is not a positive number of seconds."""
    c = PathChooser(lambda v: v, ("inagg", "gloo"))
    plan = CalibrationPlan(c)
    first = plan.next_round()
    for _ in range(3):
        c.observe("gloo", 64, 1e-4)
    c.agree()
    plan.ran(first)
    assert plan.next_round() == {"gloo": 16 << 10}
    for ladder in [(64, 1000), (16 << 10, 64), (), (2, 8)]:
        with pytest.raises(ValueError, match="rising powers of 4"):
            CalibrationPlan(c, ladder)
    with pytest.raises(ValueError, match="calibration_seconds must be a positive number of seconds"):
        PathChoiceOptions(calibration_seconds=0)


class MinOfRanks:
    """The agreement of ``n`` ranks on threads, as ``StoreMin`` is over a job's store: each
    rank's vector in, their elementwise minimum out. A rank waiting for an agreement the others
    never make fails after ``timeout`` seconds (a job would hang there), as every rank does
    once one has failed (``end``)."""

    def __init__(self, n: int, timeout: float = 120.0) -> None:
        self.barrier, self.vectors = threading.Barrier(n, timeout=timeout), [np.empty(0)] * n

    def of(self, rank: int) -> Callable[[np.ndarray], np.ndarray]:
        def agree(v: np.ndarray) -> np.ndarray:
            self.vectors[rank] = v
            self.barrier.wait()
            out = np.minimum.reduce(self.vectors)
            self.barrier.wait()
            return out
        return agree

    def end(self) -> None:
        self.barrier.abort()


def test_ranks_whose_links_differ_plan_the_same_calls():
    """Each rank reads its own links' rate (its interface's speed, or ``INAGG_LINK_RATE``): one
    here reports 10 Mbit/s, the other none. Calls cost the same on both (fast links), so only
    the floors differ; the ranks still plan the same calls, from the links they agree on (the
    slowest rate any rank reports), not each its own: a plan of its own would leave one rank
    waiting in a call the other never makes."""
    ranks, took = MinOfRanks(2), shaped(2, 1e9, 1e-4)
    slow = LinkShape.of_job(10e6, 2, SWITCH_GRANT, SWITCH_GRANT, 1500)
    plans: dict[int, dict] = {}

    def run(rank: int, links: LinkShape | None) -> None:
        try:
            plans[rank] = calibrate(PathChooser(ranks.of(rank), PATHS, links=links), took).sizes
        except BaseException:
            ranks.end()
            raise

    threads = [threading.Thread(target=run, args=a) for a in ((0, slow), (1, None))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert plans.keys() == {0, 1} and plans[0] == plans[1]
    assert all(slow.floor(p, sizes[-1]) <= CAP for p, sizes in plans[0].items())   # the slow one's floors

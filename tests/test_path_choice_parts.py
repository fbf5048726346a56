"""The path chooser's parts on their own (``inagg.hostlib.pytorch.path.timings``, ``path_cost``,
``path_options``, ``path_schedule``, ``path_explore``, ``path_confirm``, ``path_links``): what each records,
predicts and decides, without the chooser around it. The chooser as a whole:
tests/test_backend.py."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from inagg.hostlib.pytorch.path.choice import PathChooser
from inagg.hostlib.pytorch.path.confirm import Confirmations, Pending
from inagg.hostlib.pytorch.path.cost import PRIOR, PathModel
from inagg.hostlib.pytorch.path.explore import ExplorationBudget, Probes
from inagg.hostlib.pytorch.path.links import LINK_RATE_ENV, GrantMove, LinkShape, link_rate, parse_rate
from inagg.hostlib.pytorch.path.options import FIRST_AGREEMENT, PathChoiceOptions
from inagg.hostlib.pytorch.path.schedule import AgreementSchedule, Sampler
from inagg.hostlib.pytorch.path.timings import SIZE_CLASSES, PathTimings, size_class
from inagg.hostlib.wire.grant import Grant


def model_of(*timings: PathTimings, shared_clock: bool = False) -> PathModel:
    """The model the ranks of ``timings`` (one per rank) agree on: their elementwise minimum."""
    return PathModel(np.minimum.reduce([t.summary() for t in timings]), PRIOR, shared_clock)


def timed(calls: dict[int, list[float]], per_class: int = 5) -> PathTimings:
    """A rank's timings with ``calls`` (payload bytes -> the calls' seconds) recorded."""
    t = PathTimings(per_class)
    for nbytes, seconds in calls.items():
        for s in seconds:
            t.observe(nbytes, s, 0.0)
    return t


# -- timings -------------------------------------------------------------------------------------

def test_size_classes_are_powers_of_four_and_the_last_takes_anything_larger():
    assert [size_class(n) for n in (0, 1, 3, 4, 15, 16, 1 << 20)] == [0, 0, 0, 1, 1, 2, 10]
    assert size_class(1 << 200) == SIZE_CLASSES - 1


def test_a_ring_keeps_the_last_calls_of_each_class_and_forgets_all_or_all_but_the_newest():
    t = timed({64: [1.0, 2.0, 3.0, 4.0]}, per_class=3)
    c = size_class(64)
    assert t.measured(c) == 4 and not t.filling(c)
    assert sorted(model_of(t).ring[c]) == [2.0, 3.0, 4.0]        # the oldest went
    t.forget(c, keep_newest=True)
    assert t.measured(c) == 1 and t.filling(c)
    assert model_of(t).ring[c].tolist() == [4.0, np.inf, np.inf]
    t.forget(c)
    assert t.measured(c) == 0 and not model_of(t).seen[c]


def test_on_a_shared_clock_a_call_runs_from_the_last_start_to_the_last_end():
    ranks = [PathTimings(5, shared_clock=True) for _ in range(2)]
    ranks[0].observe(64, 0.3, 10.0)    # 10.0 .. 10.3
    ranks[1].observe(64, 0.4, 10.5)    # 10.5 .. 10.9
    assert model_of(*ranks, shared_clock=True).seconds[size_class(64)] == pytest.approx(0.4)
    apart = [PathTimings(5) for _ in range(2)]
    apart[0].observe(64, 0.3, 0.0)
    apart[1].observe(64, 0.4, 0.0)
    assert model_of(*apart).seconds[size_class(64)] == pytest.approx(0.3)   # the ranks' minimum


# -- cost model ----------------------------------------------------------------------------------

def test_a_class_figure_is_its_median_and_predicts_its_sizes_along_the_line():
    m = model_of(timed({64: [1e-3, 9e-3, 2e-3], 1 << 20: [3e-3, 3e-3, 3e-3]}))
    assert m.seconds[size_class(64)] == pytest.approx(2e-3)      # a preempted call is an outlier
    assert m.predict(64) == pytest.approx(2e-3)
    assert m.predict(1 << 20) == pytest.approx(3e-3)
    assert m.predict(96) == pytest.approx(2e-3 * m.line(96) / m.line(64))
    assert m.predict(1 << 14) == pytest.approx(m.line(1 << 14))   # unmeasured class: the line


def test_an_unseen_model_predicts_the_prior_and_a_refit_keeps_what_did_not_change():
    t = timed({})
    unseen = PathModel.unseen(len(t.summary()))
    assert unseen.predict(1000) == pytest.approx(PRIOR[0] + PRIOR[1] * 1000)
    assert unseen.refit(unseen.summary.copy(), False) is unseen
    t.observe(64, 1e-3, 0.0)
    assert unseen.refit(t.summary(), False) is not unseen


def test_newest_lags_is_how_much_slower_the_newest_call_was_than_the_others():
    m = model_of(timed({64: [1e-3, 1e-3, 1e-3, 6e-3], 4096: [2e-3]}))
    lags = m.newest_lags()
    assert lags[size_class(64)] == pytest.approx(5e-3)
    assert lags[size_class(4096)] == 0.0            # a single call has nothing to lag behind


# -- options -------------------------------------------------------------------------------------

def test_options_are_frozen_checked_and_overridable_through_the_chooser():
    o = PathChoiceOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.margin = 0.5   # type: ignore[misc]
    assert o.trusted == 3 and PathChoiceOptions(per_class=2).trusted == 2
    for bad in (dict(agree_every=FIRST_AGREEMENT - 1), dict(explore_budget=1.0), dict(agree_budget=0.0),
                dict(margin=1.0), dict(probes=-1), dict(probe_ratio=0.5), dict(sample_every=0),
                dict(sample_seconds=-1.0), dict(measure_every_seconds=float("inf")), dict(link_margin=0.3),
                dict(link_bound=0.9)):
        with pytest.raises(ValueError):
            PathChoiceOptions(**bad)
    c = PathChooser(lambda v: v, ("inagg", "gloo"), PathChoiceOptions(margin=0.1), agree_every=64)
    assert (c.options.margin, c.options.agree_every) == (0.1, 64)
    assert PathChooser(lambda v: v, ("inagg", "host"), prefer="gloo").prefer is None   # not among its paths
    with pytest.raises(ValueError):
        PathChooser(lambda v: v, ("inagg", "gloo"), forced="host")


# -- schedule and samples ------------------------------------------------------------------------

def test_scheduled_agreements_come_at_16_32_64_then_every_agree_every_while_time_allows():
    s = AgreementSchedule(agree_every=128, agree_budget=0.5)
    held = []
    for call in range(1, 600):
        s.count(1.0)   # calls far dearer than an agreement: time never holds one back
        agreement, scheduled = s.check(call)
        if agreement:
            held.append(call)
            s.agreed(call, scheduled, agreement_s=0.1)
    assert held == [16, 32, 64, 128, 256, 384, 512]


def test_at_dear_calls_a_scheduled_agreement_comes_by_agree_seconds_of_them():
    s = AgreementSchedule(agree_every=128, agree_budget=0.01, agree_seconds=2.0)
    for call in range(1, 17):
        s.count(0.5)
    assert s.check(16) == (True, True)
    s.agreed(16, True, agreement_s=1e-3)      # by the count, the next would be at call 32
    s.reprice(16, 0.5)                        # calls of 0.5 s: 2 s of them by call 20
    assert s.next_agreement == 20
    s.reprice(16, 1e-3)                       # cheap calls never put it later than that
    assert s.next_agreement == 20
    s.count(0.5, 4)
    assert s.check(20) == (True, True)


def test_a_scheduled_agreement_waits_for_its_time_and_comes_sooner_at_dearer_calls():
    s = AgreementSchedule(agree_every=128, agree_budget=0.01)
    for call in range(1, 17):
        s.count(1e-4)
    assert s.check(16) == (True, True)
    s.agreed(16, True, agreement_s=1e-3)      # the next one waits for 0.1 s of calls
    for call in range(17, 33):
        s.count(1e-4)
    assert s.check(32) == (False, False)      # 1.6 ms of calls: put off ...
    assert 32 + 984 <= s.next_agreement <= 32 + 985   # ... by 98.4 ms more at 0.1 ms a call
    s.reprice(33, 10e-3)                      # calls of 10 ms now: 10 of them earn it
    assert s.next_agreement == 33 + 10
    s.agree_at_next_call(33)                  # an unscheduled one comes first
    assert s.next_agreement == 34 and s.check(34) == (True, False)


def test_samples_ahead_names_the_calls_the_sampler_times():
    ms = 2.0 ** -10                           # ~1 ms, exact in binary: sums stay exact
    s = Sampler(PathChoiceOptions(sample_every=8, sample_seconds=10 * ms))
    c = size_class(4096)
    first, period = s.samples_ahead(0, c, ms)
    assert (first, period) == (10, 10)        # 10 calls' time comes after 8 calls
    picked = []
    for call in range(1, 41):
        s.count(c, ms)
        if s.timed(call, c, ms, filling=False):
            picked.append(call)
    assert picked == [first, first + period, first + 2 * period, first + 3 * period]


def test_calls_from_measure_from_seconds_up_are_timed_by_their_class_time():
    call_s = 2.0 ** -5                        # ~31 ms, exact in binary
    s = Sampler(PathChoiceOptions(measure_from_seconds=10e-3, measure_every_seconds=4 * call_s))
    c = size_class(4 << 20)
    picked = []
    for call in range(1, 21):
        s.count(c, call_s)
        picked.append(s.timed(call, c, call_s, filling=False))
    assert [i + 1 for i, p in enumerate(picked) if p] == [4, 8, 12, 16, 20]   # one per 4 calls' time


# -- probes and explorations ---------------------------------------------------------------------

def test_a_cheap_new_size_probes_prefer_and_close_paths_a_dear_one_only_faster_paths():
    o = PathChoiceOptions()
    t = timed({})
    models = {p: PathModel.unseen(len(t.summary())) for p in ("inagg", "host", "gloo")}
    probes = Probes(("inagg", "host", "gloo"), o)
    assert probes.plan(models, "gloo", 4, best_seconds=1e-4)       # cheap: every path's prior line is close
    taken = [probes.take(models, 4, last_path="gloo") for _ in range(11)]
    # the calls' own path first (no warm-up), then one path's run after another, each after an
    # untimed warm-up (the call before was another path's)
    assert taken == [("gloo", False)] * 3 + [("inagg", True)] + [("inagg", False)] * 3 + [("host", True)] \
        + [("host", False)] * 3
    assert not probes.pending(size_class(4)) and probes.take(models, 4, "gloo") == (None, False)
    two = {p: models[p] for p in ("inagg", "gloo")}
    dear = Probes(("inagg", "gloo"), o)
    big = 1 << 24
    assert not dear.plan(two, "gloo", big, best_seconds=two["inagg"].line(big))   # not faster by the margin
    assert dear.plan(two, "gloo", big, best_seconds=1.0)                         # far faster by its line


def test_explorations_take_turns_and_wait_for_their_class_budget():
    b = ExplorationBudget(("inagg", "host", "gloo"), fraction=0.1)
    c = size_class(4096)
    assert b.next_turn("gloo") == "inagg"
    b.spend(c, 0.0, "inagg", call=5)
    assert b.next_turn("gloo") == "host"
    b.spend(c, 0.0, "host", call=6)
    assert b.next_turn("gloo") == "inagg"                            # least recently explored
    b.earn(c, 1e-3, calls=100)
    assert b.affordable(c, 1e-3, agreement_s=2e-3) == pytest.approx(1e-3 + 1e-4 + 1e-2 - 2e-3)
    assert b.credit[size_class(64)] == 0.0                           # each class earns its own


# -- confirmations -------------------------------------------------------------------------------

def test_a_class_that_leaves_prefer_waits_for_its_ring_then_rechecks_prefer():
    models = {"host": model_of(timed({4096: [1e-3] * 3})), "gloo": model_of(timed({4096: [2e-3] * 5}))}
    k = Confirmations("gloo", per_class=5, probe_ratio=2.0)
    c = size_class(4096)
    k.track(c, "host", models)
    assert k.waiting[c] == Pending("host", 2, True)                  # its ring holds 3 of 5
    assert k.count(c, "gloo") is None and k.count(c, "host") is None
    assert k.count(c, "host") == Pending("host", 1, True) and c not in k.waiting
    assert k.start_recheck(c) and not k.start_recheck(c)
    k.track(c, "host", models, link_bound=True)                     # both on their links' floors:
    assert c not in k.waiting                                        # no noise to recheck
    k.track(c, "host", models)                                       # stays on host, gloo close
    assert k.waiting[c] == Pending("host", 5 << 2, True)


def test_a_class_whose_newest_call_was_much_slower_waits_for_a_full_ring():
    models = {"gloo": model_of(timed({4096: [1e-3] * 4 + [50e-3]}))}
    k = Confirmations("gloo", per_class=5, probe_ratio=2.0)
    assert k.slowed(models, threshold=10e-3) == [("gloo", size_class(4096))]
    assert k.waiting[size_class(4096)] == Pending("gloo", 5, False)
    assert k.slowed(models, threshold=10e-3) == []                   # already waiting


# -- links ---------------------------------------------------------------------------------------

MIB = 1 << 20
SWITCH_GRANT = Grant(1, 1, 0, 32, 364, ("10.0.0.254", 42666), mode="switch")


def links_of(world: int, rate: float = 100e6) -> LinkShape:
    """A job of ``world`` ranks on 1500-byte links of ``rate`` at the switch's K (364)."""
    return LinkShape.of_job(rate, world, SWITCH_GRANT, None, 1500)


def test_inaggs_bytes_on_a_link_are_flat_in_n_and_the_rings_grow_as_2_n_minus_1_over_n():
    frame = (14 + 20 + 8 + 16 + 4 * 364) / (4 * 364)
    segment = 1514 / 1448
    for n in (2, 4, 8, 16):
        shape = links_of(n)
        assert shape.bytes_per_byte["inagg"] == pytest.approx(frame)
        assert shape.bytes_per_byte["gloo"] == pytest.approx(2 * (n - 1) / n * segment)
    assert links_of(4).floor("inagg", 4 * MIB) == pytest.approx(4 * MIB * frame * 8 / 100e6)   # 0.349 s
    lane = LinkShape.of_job(100e6, 4, SWITCH_GRANT, SWITCH_GRANT, 1500)
    assert lane.bytes_per_byte["host"] == pytest.approx(4 * frame)   # the host aggregator's link
    on_host = LinkShape.of_job(100e6, 4, dataclasses.replace(SWITCH_GRANT, mode="host"), None, 1500)
    assert on_host.bytes_per_byte["inagg"] == pytest.approx(4 * frame)   # a grant there: the same
    with pytest.raises(ValueError, match="positive"):
        LinkShape(0.0, {})


def moving_chooser(grant: dict) -> PathChooser:
    """A chooser of a 4-rank job on 100 Mbit/s links whose inagg grant is ``grant``'s: its
    ``epoch`` in use, ``offered`` the epoch offered next (None: none); epoch 1 is on the host
    aggregator, later ones on the switch. Its 4 MiB calls measured: inagg on the host
    aggregator 4x its switch time, gloo between: gloo takes them."""
    def links() -> LinkShape:
        on = SWITCH_GRANT if (grant["offered"] or grant["epoch"]) > 1 else dataclasses.replace(SWITCH_GRANT, mode="host")
        return LinkShape.of_job(100e6, 4, on, None, 1500)

    move = GrantMove(lambda: grant["epoch"], lambda: grant["offered"] or grant["epoch"], links)
    c = PathChooser(lambda v: v, ("inagg", "gloo"), links=links(), move=move)
    for path, s in (("inagg", 4 * SWITCH_S), ("gloo", GLOO_S)):
        for _ in range(5):
            c.observe(path, 4 * MIB, s)
    c.agree()
    assert c.best(4 * MIB) == "gloo"
    return c


SWITCH_S, GLOO_S = 0.36, 0.64


def calls_of(c: PathChooser, grant: dict, n: int) -> list[tuple[str, bool]]:
    """``n`` 4 MiB calls: an inagg call ends by taking the grant offered."""
    taken = []
    for _ in range(n):
        path, measure = c.choose(4 * MIB)
        taken.append((path, measure))
        if path == "inagg" and grant["offered"]:
            grant["epoch"], grant["offered"] = grant["offered"], None
        if measure:
            c.observe(path, 4 * MIB, GLOO_S if path == "gloo" else SWITCH_S if grant["epoch"] > 1 else 4 * SWITCH_S)
    return taken


def test_a_grant_offered_on_the_switch_is_probed_though_every_call_is_on_gloo():
    """Once every rank has seen the switch's grant offered, the next agreement drops inagg's
    figures and links of the old grant, and the next calls probe inagg (an untimed warm-up,
    at whose end the ranks take the new grant, then timed calls); measured at its switch time
    there, it takes the calls. (Agreements come every ``agree_seconds`` of such calls.)"""
    grant = {"epoch": 1, "offered": None}
    c = moving_chooser(grant)
    grant["offered"] = 2
    c.agree()
    assert c.links.bytes_per_byte["inagg"] == pytest.approx(links_of(4).bytes_per_byte["inagg"])
    assert not c.models["inagg"].seen.any()
    taken = calls_of(c, grant, 40)
    assert taken[:2] == [("inagg", False), ("inagg", True)]   # the probe's warm-up, untimed, then timed
    assert c.best(4 * MIB) == "inagg"     # gloo only rechecked (the class left it) and explored
    assert sum(path == "inagg" for path, _ in taken) >= 30
    c.agree()
    assert c.models["inagg"].seen.any()   # the grant taken is the one offered: its figures stay


def test_a_grant_taken_before_an_agreement_saw_it_offered_is_probed_too():
    """The ranks took the switch's grant at an inagg call (an exploration) before any agreement
    saw it offered: the next agreement sees the newer epoch in use and drops the old figures."""
    grant = {"epoch": 1, "offered": None}
    c = moving_chooser(grant)
    grant["epoch"] = 2
    c.agree()
    assert not c.models["inagg"].seen.any()
    calls_of(c, grant, 40)
    assert c.best(4 * MIB) == "inagg"


def test_a_link_rate_is_written_as_tc_does_and_loopback_reports_none(monkeypatch):
    assert parse_rate("100mbit") == 100e6 and parse_rate("1gbit") == 1e9 and parse_rate("2500") == 2500.0
    for bad in ("fast", "0mbit", "10 mbps"):
        with pytest.raises(ValueError, match="as tc does"):
            parse_rate(bad)
    monkeypatch.delenv(LINK_RATE_ENV, raising=False)
    assert link_rate("127.0.0.1") is None and link_rate("0.0.0.0") is None
    monkeypatch.setenv(LINK_RATE_ENV, "25gbit")
    assert link_rate("127.0.0.1") == 25e9


def chosen_at(links: LinkShape | None, seconds: dict[str, float], nbytes: int = 4 * MIB) -> str:
    """The path a chooser with ``links`` takes for ``nbytes`` once each path's ring there holds
    calls of ``seconds``."""
    c = PathChooser(lambda v: v, ("inagg", "gloo"), links=links)
    for path, s in seconds.items():
        for _ in range(5):
            c.observe(path, nbytes, s)
    c.agree()
    return c.best(nbytes)


@pytest.mark.parametrize("n, inagg_over_floor, gloo_over_floor", [(2, 1.0, 1.1), (4, 1.2, 1.05), (8, 1.1, 1.0)])
def test_where_both_paths_are_link_bound_the_faster_takes_the_calls_by_the_link_margin(n, inagg_over_floor,
                                                                                       gloo_over_floor):
    """4 MiB at 100 Mbit/s: inagg 0.91x, 0.77x and 0.63x gloo's time at 2, 4 and 8 ranks, both
    within ``link_bound`` of their floors: inagg takes the calls. Without the links' rate
    (loopback) the same figures need ``margin`` (25 %): gloo keeps the first two."""
    links = links_of(n)
    seconds = {p: f * links.floor(p, 4 * MIB) for p, f in (("inagg", inagg_over_floor), ("gloo", gloo_over_floor))}
    assert chosen_at(links, seconds) == "inagg"
    assert chosen_at(None, seconds) == ("inagg" if seconds["inagg"] < 0.75 * seconds["gloo"] else "gloo")


def test_paths_far_from_their_floors_need_the_full_margin_and_none_is_predicted_under_it():
    """inagg 0.85x gloo, both at 2.5x their floors or more (their time the machine's, not the
    links'): gloo keeps the calls. A line from small calls cannot predict a large call under its
    floor."""
    links = links_of(4, rate=1e9)
    gloo = 2.5 * links.floor("gloo", 4 * MIB)
    assert chosen_at(links, {"inagg": 0.85 * gloo, "gloo": gloo}) == "gloo"
    c = PathChooser(lambda v: v, ("inagg", "gloo"), links=links)
    for _ in range(5):
        c.observe("inagg", 1024, 1e-4)
    c.agree()
    assert c.predict("inagg", 64 * MIB) == pytest.approx(links.floor("inagg", 64 * MIB))


def test_a_dear_new_size_probes_a_path_whose_floor_is_faster_though_its_line_is_not():
    """4 MiB at 4 ranks on 100 Mbit/s: inagg's line from a job's first calls (a window still
    opening) says 1.4 s, gloo's figure 0.76 s; inagg's floor is 0.35 s, so it is probed there
    (and gloo beside it). Without the links' rate the line decides: left to exploration."""
    links = links_of(4)
    slow_start = {p: PathModel(timed({MIB: [0.36] * 3}).summary()) for p in ("inagg", "gloo")}
    floors = {p: links.floor(p, 4 * MIB) for p in ("inagg", "gloo")}
    assert slow_start["inagg"].line(4 * MIB) > 0.76
    assert Probes(("inagg", "gloo"), PathChoiceOptions()).plan(slow_start, "gloo", 4 * MIB, 0.76, floors=floors)
    assert not Probes(("inagg", "gloo"), PathChoiceOptions()).plan(slow_start, "gloo", 4 * MIB, 0.76)

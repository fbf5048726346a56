"""The alpha-beta cost model, the link estimator and the collective chooser (pure, fast).

Crossovers are derived here from the equations of docs/artopk.md, independently of the
module's code, and the chooser is checked on both sides of each."""

import numpy as np
import pytest

from inagg.hostlib.worker.cost_model import (
    OPTIONS,
    SWITCH_HEADER_OVERHEAD,
    CollectiveChooser,
    CostModel,
    LinkEstimator,
    header_overhead,
)

ALPHA = 5e-6                   # one-way latency, s
BETA = 8 / 100e9               # 100 Gb/s
N = 8
M = 4 * 25_000_000             # a 25 M-parameter float32 gradient
H = SWITCH_HEADER_OVERHEAD
EPS = 1e-6                     # relative step to either side of a crossover


def estimator_at(alpha, beta, window=8):
    """An estimator whose window holds exact samples of (alpha, beta): a float32 allreduce
    (4 latencies) of several sizes and a tiny int32 probe (2 latencies)."""
    est = LinkEstimator(1.0, 1.0, window=window)
    feed(est, alpha, beta, window)
    return est


def feed(est, alpha, beta, count):
    for i in range(count):
        nbytes, lat = (4.0, 2) if i % 4 == 0 else (1e5 * (i + 1), 4)
        est.observe(nbytes, lat * alpha + beta * nbytes, latencies=lat)


def test_header_overhead_is_header_plus_encapsulation_per_payload_byte():
    assert SWITCH_HEADER_OVERHEAD == pytest.approx(58 / 256)
    assert header_overhead(4096) == pytest.approx(58 / 16384)


def test_equations():
    h = 0.01
    star = CostModel(ALPHA, BETA, N, h)
    var = CostModel(ALPHA, BETA, N, h, selection="var")
    c = 0.01
    w = (1 + h) * BETA
    assert star.predict("dense_ina", M, c) == pytest.approx(4 * ALPHA + w * M)
    assert star.predict("dense_host", M, c) == pytest.approx(4 * ALPHA + w * N * M)
    assert star.predict("artopk_ina", M, c) == pytest.approx(8 * ALPHA + 2 * w * c * M)
    assert star.predict("artopk_host", M, c) == pytest.approx(8 * ALPHA + 2 * w * N * c * M)
    assert var.predict("artopk_ina", M, c) == pytest.approx(12 * ALPHA + w * (2 * c * M + 4 * N))
    assert star.predict("allgather_topk_ina", M, c) == pytest.approx(8 * ALPHA + 2 * w * N * c * M)
    assert star.predict("allgather_topk_host", M, c) == pytest.approx(
        8 * ALPHA + 2 * w * N * N * c * M)
    assert set(star.predict_all(M, c)) == set(OPTIONS)


def test_model_rejects_bad_arguments():
    with pytest.raises(ValueError, match="alpha, beta"):
        CostModel(-1.0, BETA, N)
    with pytest.raises(ValueError, match="n_workers"):
        CostModel(ALPHA, BETA, 0)
    with pytest.raises(ValueError, match="unknown collective 'ring'"):
        CostModel(ALPHA, BETA, N).predict("ring", M, 0.1)
    with pytest.raises(ValueError, match="CR c in"):
        CostModel(ALPHA, BETA, N).predict("dense_ina", M, 0.0)


def side(c_star):
    return c_star * (1 - EPS), c_star * (1 + EPS)


def test_chooser_flips_at_the_cr_crossover_on_the_switch():
    # dense_ina = artopk_ina:  4a + (1+h)bM = 8a + 2(1+h)b c M
    c_star = 0.5 - 2 * ALPHA / ((1 + H) * BETA * M)
    below, above = side(c_star)
    chooser = CollectiveChooser(estimator_at(ALPHA, BETA), N)
    assert chooser.choose(M, below) == "artopk_ina"
    assert chooser.choose(M, above) == "dense_ina"
    times = chooser.predicted
    assert times["dense_ina"] == pytest.approx(times["artopk_ina"], rel=1e-5)


def test_chooser_flips_at_the_cr_crossover_on_a_host_aggregator():
    # dense_host = artopk_host:  4a + N(1+h)bM = 8a + 2N(1+h)b c M
    c_star = 0.5 - 2 * ALPHA / (N * (1 + H) * BETA * M)
    chooser = CollectiveChooser(estimator_at(ALPHA, BETA), N, options=("dense_host", "artopk_host"))
    below, above = side(c_star)
    assert chooser.choose(M, below) == "artopk_host"
    assert chooser.choose(M, above) == "dense_host"


def test_var_selection_moves_the_crossover_by_its_extra_allreduce():
    # dense_ina = artopk_ina (VAR):  4a + (1+h)bM = 12a + (1+h)b(2cM + 4N)
    m = 4 * 1_000_000
    c_star = ((1 + H) * BETA * (m - 4 * N) - 8 * ALPHA) / (2 * (1 + H) * BETA * m)
    chooser = CollectiveChooser(estimator_at(ALPHA, BETA), N, selection="var")
    below, above = side(c_star)
    assert chooser.choose(m, below) == "artopk_ina"
    assert chooser.choose(m, above) == "dense_ina"
    star_c = 0.5 - 2 * ALPHA / ((1 + H) * BETA * m)
    assert c_star < star_c  # VAR needs a lower CR to pay off


def test_chooser_flips_at_the_gradient_size_crossover():
    # for fixed c: artopk_ina wins once (1+h) b M (1 - 2c) > 4a
    c = 0.01
    m_star = 4 * ALPHA / ((1 + H) * BETA * (1 - 2 * c))
    chooser = CollectiveChooser(estimator_at(ALPHA, BETA), N)
    small, large = side(m_star)
    assert chooser.choose(small, c) == "dense_ina"
    assert chooser.choose(large, c) == "artopk_ina"


def test_allgather_and_host_paths_are_dominated_when_the_switch_is_available():
    # 8a + 2(1+h)bNcM >= 8a + 2(1+h)bcM, and fan-in N >= 1: the switch path always wins
    chooser = CollectiveChooser(estimator_at(ALPHA, BETA), N)
    for m in (4e3, 4e6, 4e9):
        for c in (0.001, 0.1, 0.49, 1.0):
            assert chooser.choose(m, c) in ("dense_ina", "artopk_ina")


def test_hysteresis_re_decides_only_when_beta_moves_past_the_threshold():
    c, m = 0.1, 4 * 1_000
    beta_star = 4 * ALPHA / ((1 + H) * m * (1 - 2 * c))  # artopk wins for beta > beta*
    est = estimator_at(ALPHA, 0.97 * beta_star)
    chooser = CollectiveChooser(est, N, threshold=0.1)
    assert chooser.choose(m, c) == "dense_ina" and chooser.decisions == 1

    feed(est, ALPHA, 1.03 * beta_star, 8)          # crossed, but moved only ~6 %
    assert est.beta == pytest.approx(1.03 * beta_star)
    assert CostModel(est.alpha, est.beta, N).predict("artopk_ina", m, c) < \
        CostModel(est.alpha, est.beta, N).predict("dense_ina", m, c)
    assert chooser.choose(m, c) == "dense_ina" and chooser.decisions == 1

    feed(est, ALPHA, 1.08 * beta_star, 8)          # ~11 % from the decision's 0.97
    assert chooser.choose(m, c) == "artopk_ina" and chooser.decisions == 2
    assert chooser.choose(m, c) == "artopk_ina" and chooser.decisions == 2

    chooser.choose(m, 0.05)                        # new inputs always re-decide
    assert chooser.decisions == 3


def test_chooser_rejects_unknown_options():
    with pytest.raises(ValueError, match="non-empty subset"):
        CollectiveChooser(LinkEstimator(ALPHA, BETA), N, options=("ring",))


def test_estimator_recovers_alpha_and_beta_from_exact_samples():
    est = estimator_at(3e-6, 1e-10, window=16)
    assert est.alpha == pytest.approx(3e-6, rel=1e-9)
    assert est.beta == pytest.approx(1e-10, rel=1e-9)


def test_estimator_plain_fit_is_t_equals_alpha_plus_beta_bytes_under_noise():
    rng = np.random.default_rng(0)
    est = LinkEstimator(0.0, 0.0, window=400)
    for _ in range(400):
        b = rng.uniform(0, 1e6)
        est.observe(b, 1e-4 + 2e-9 * b + rng.normal(0, 1e-6))
    assert est.alpha == pytest.approx(1e-4, rel=0.02)
    assert est.beta == pytest.approx(2e-9, rel=0.01)


def test_estimator_uses_priors_until_two_sizes_are_seen():
    est = LinkEstimator(1e-5, 1e-9, window=4)
    est.observe(1000, 1.0)
    est.observe(1000, 1.2)                         # same size: alpha and beta not separable
    assert (est.alpha, est.beta) == (1e-5, 1e-9)
    est.observe(1, 0.2)                            # a tiny probe separates them
    assert est.alpha > 0 and est.beta > 0 and est.beta != 1e-9


def test_estimator_clamps_to_non_negative_by_refitting_on_the_boundary():
    est = LinkEstimator(1.0, 1.0)
    for b, t in ((100, 0.0), (200, 1.0), (300, 2.0)):   # unconstrained: alpha = -1, beta = 0.01
        est.observe(b, t)
    assert est.alpha == 0.0
    # least squares through the origin: sum(b t) / sum(b^2)
    assert est.beta == pytest.approx((200 * 1 + 300 * 2) / (100**2 + 200**2 + 300**2))
    est2 = LinkEstimator(1.0, 1.0)
    for b, t in ((100, 3.0), (200, 2.0), (300, 1.0)):   # negative slope: beta = 0, alpha = mean
        est2.observe(b, t)
    assert est2.beta == 0.0 and est2.alpha == pytest.approx(2.0)


def test_estimator_window_forgets_old_samples():
    est = estimator_at(1e-5, 1e-9, window=8)
    feed(est, 2e-5, 4e-9, 8)
    assert est.alpha == pytest.approx(2e-5) and est.beta == pytest.approx(4e-9)


def test_changed_is_relative_to_the_last_mark():
    est = estimator_at(1e-5, 1e-9)
    assert est.changed(0.1)                        # nothing marked yet
    est.mark()
    assert not est.changed(0.1)
    feed(est, 1.05e-5, 1e-9, 8)
    assert not est.changed(0.1) and est.changed(0.04)
    feed(est, 1.15e-5, 1e-9, 8)
    assert est.changed(0.1)


def test_estimator_rejects_bad_samples():
    with pytest.raises(ValueError, match="bad transfer sample"):
        LinkEstimator(0, 0).observe(10, -1.0)
    with pytest.raises(ValueError, match="window >= 2"):
        LinkEstimator(0, 0, window=1)

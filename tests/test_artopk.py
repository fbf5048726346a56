"""AR-Topk and the allgather baseline over the real allreduce path: N worker threads, each with
its own SlotStream over UDP, and a HostAggregator on loopback.

References are float64. Sums through the aggregator are checked against the codec's proven
per-block bound (hostlib/wire/codec.py), as the end-to-end allreduce tests do."""

import threading

import numpy as np
import pytest

from inagg.hostlib.wire import codec
from inagg.hostlib.aggregator.server import HostAggregator
from inagg.hostlib.worker.artopk import (
    DEFAULT_CANDIDATES,
    ARTopk,
    CompressionSchedule,
    allgather_topk,
    candidate_gains,
    k_for,
    pareto_knee,
    topk_indices,
)
from inagg.hostlib.aggregator.engine_reference import AggregationEngine, JobConfig
from inagg.hostlib.wire.grant import Grant
from inagg.hostlib.worker.stream_reference import SlotStream
from inagg.hostlib.wire.transport import UdpTransport

K = 256        # values per packet
W = 8          # slots of the job
NUMEL = 20_011
CR = 0.05      # k = 1001: four packets of values, four of indices


@pytest.fixture
def cluster():
    """``cluster(n)`` -> a ``run(fn)`` that calls ``fn(rank, allreduce)`` on n threads, each
    with its own SlotStream, against one aggregator, and returns (results, errors). The
    aggregator and the streams are ``run.aggregator`` and ``run.streams``."""
    servers = []

    def make(n, drop_rate=0.0):
        transports = [UdpTransport(("127.0.0.1", 0), bind=("127.0.0.1", 0)) for _ in range(n)]
        engine = AggregationEngine(W, K)
        engine.set_job(JobConfig(1, 1, 0, W, tuple(t.address for t in transports)))
        agg = HostAggregator(("127.0.0.1", 0), engine, drop_rate=drop_rate, seed=3)
        thread = threading.Thread(target=agg.serve, daemon=True)
        thread.start()
        servers.append((agg, thread, transports))
        grant = Grant(1, 1, 0, W, K, agg.address)
        for t in transports:
            t.retarget(agg.address)
        streams = [SlotStream(grant, r, n, t, stall_timeout=5.0) for r, t in enumerate(transports)]

        def run(fn):
            results, errors = [None] * n, [None] * n

            def go(rank):
                try:
                    results[rank] = fn(rank, streams[rank].allreduce)
                except Exception as e:  # noqa: BLE001 - reported to the test
                    errors[rank] = e

            threads = [threading.Thread(target=go, args=(r,)) for r in range(n)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            return results, errors

        run.aggregator, run.streams = agg, streams
        return run

    yield make
    for agg, thread, transports in servers:
        agg.stop()
        thread.join(5)
        for t in transports:
            t.close()


def ok(outcome):
    results, errors = outcome
    for e in errors:
        if e is not None:
            raise e
    return results


def gradient(rank, step, numel=NUMEL, scale=1.0):
    """Heavy-tailed like real gradients: normal * exp(uniform(-4, 4))."""
    rng = np.random.default_rng([rank, step, numel])
    x = rng.standard_normal(numel) * np.exp(rng.uniform(-4, 4, numel)) * scale
    return x.astype(np.float32)


def sum_bound(contributions):
    """Per-element bound on |allreduce(sum) - float64 sum| for these per-rank contributions
    (the codec's bound per block, plus the float64 reference's own rounding)."""
    xs = np.stack(contributions)
    n = len(contributions)
    ref = xs.astype(np.float64).sum(axis=0)
    exps = np.max(np.stack([codec.block_exponents(x, K)[0] for x in xs]), axis=0)
    bound = np.empty_like(ref)
    for c, e in enumerate(exps.tolist()):
        sl = slice(c * K, (c + 1) * K)
        bound[sl] = codec.error_bound(ref[sl], e, n)
    return bound + 2.0**-52 * np.abs(xs.astype(np.float64)).sum(axis=0)


def average_tolerance(ref_sum, bound, n):
    """y = float32(s / N) with |s - ref_sum| <= bound: |y - ref_sum/N| <= bound/N plus one
    float32 rounding of the quotient."""
    return bound / n + 2.0**-23 * (np.abs(ref_sum) + bound) / n + 2.0**-149


def run_artopk(run, n, steps, selection, grads=gradient, cr=CR):
    """Each rank runs ``steps`` AR-Topk steps and records, per step, its G (computed here as
    grad + residual in float32, exactly as ARTopk does), the update, the indices, the root,
    the new residual and the gain."""

    def worker(rank, allreduce):
        art = ARTopk(rank, n, allreduce, selection=selection, cr=cr)
        log = []
        for s in range(steps):
            grad = grads(rank, s)
            g = grad + (art.residual if art.residual is not None else np.float32(0))
            update = art.step(grad)
            log.append(dict(grad=grad, g=g, update=update, idx=art.last_indices.copy(),
                            root=art.last_root, residual=art.residual.copy(), gain=art.last_gain))
        return art, log

    return ok(run(worker))


@pytest.mark.parametrize("selection", ["star", "var"])
def test_artopk_over_the_aggregator(cluster, selection):
    n, steps = 4, 5
    k = k_for(CR, NUMEL)
    run = cluster(n)
    out = run_artopk(run, n, steps, selection)
    # it really went through the aggregator: 2 allreduces per step (+1 for VAR's selection)
    calls = steps * (3 if selection == "var" else 2)
    assert [s.stats.allreduces for s in run.streams] == [calls] * n
    job = run.aggregator.report()["jobs"][1]
    assert job["drops"] == {} and job["results"] > 0
    arts, logs = [a for a, _ in out], [lg for _, lg in out]
    for s in range(steps):
        recs = [lg[s] for lg in logs]
        idx = recs[0]["idx"]
        root = recs[0]["root"]
        # one index set and one root on every worker, and it is the root's own top-k of G
        assert idx.dtype == np.int32 and idx.size == k
        for r in recs:
            assert r["root"] == root and np.array_equal(r["idx"], idx)
        true_top = np.argsort(-np.abs(recs[root]["g"]), kind="stable")[:k]
        assert np.array_equal(np.sort(idx), np.sort(true_top))
        if selection == "star":
            assert root == s % n
        else:
            norms = [np.linalg.norm(np.sort(np.abs(r["g"].astype(np.float64)))[-k:]) for r in recs]
            assert root == int(np.argmax(norms))
        # the update: the average of every worker's own G at the root's indices
        contrib = [r["g"][idx] for r in recs]
        ref = np.stack(contrib).astype(np.float64).sum(axis=0)
        tol = average_tolerance(ref, sum_bound(contrib), n)
        for r in recs:
            assert np.array_equal(r["update"], recs[0]["update"])  # bit-identical on all ranks
            assert r["update"].dtype == np.float32 and r["update"].size == NUMEL
            assert np.all(np.abs(r["update"][idx] - ref / n) <= tol)
            rest = np.ones(NUMEL, bool)
            rest[idx] = False
            assert not np.any(r["update"][rest])
        # error feedback, exactly: sent + new residual == G bit for bit
        for r in recs:
            sent = np.zeros(NUMEL, np.float32)
            sent[idx] = r["g"][idx]
            assert np.array_equal(sent + r["residual"], r["g"])
            assert not np.any(r["residual"][idx])
            g64 = r["g"].astype(np.float64)
            assert r["gain"] == pytest.approx(np.sum(g64[idx] ** 2) / np.sum(g64**2), rel=1e-12)
    # over all steps: sum(sent) + residual == sum(grads) up to the float32 rounding of each
    # G = grad + residual, i.e. |err| <= sum_t 2**-24 |G_t|
    for art, lg in zip(arts, logs):
        sent_total = np.zeros(NUMEL)
        for rec in lg:
            sent_total[rec["idx"]] += rec["g"][rec["idx"]]
        lhs = sent_total + art.residual
        rhs = np.sum([rec["grad"].astype(np.float64) for rec in lg], axis=0)
        slack = 2.0**-24 * np.sum([np.abs(rec["g"].astype(np.float64)) for rec in lg], axis=0)
        assert np.all(np.abs(lhs - rhs) <= slack)
        assert art.steps == steps
        per_step = 8 * k + (4 * n if selection == "var" else 0)
        assert art.bytes_sent == steps * per_step


def test_packet_loss_changes_nothing(cluster):
    """Retransmissions through a lossy aggregator give bit-identical updates and residuals."""
    n, steps = 3, 3
    clean = run_artopk(cluster(n), n, steps, "var")
    lossy_run = cluster(n, drop_rate=0.05)
    lossy = run_artopk(lossy_run, n, steps, "var")
    assert lossy_run.aggregator.injected_drops > 0
    for (_, a), (_, b) in zip(clean, lossy):
        for x, y in zip(a, b):
            assert np.array_equal(x["update"], y["update"])
            assert np.array_equal(x["residual"], y["residual"])


def test_var_picks_the_worker_with_the_largest_topk_norm(cluster):
    n, steps = 4, 4
    big = [2, 0, 3, 1]  # the designed winner per step

    def grads(rank, step):
        # 1000**(step+1) dwarfs every other rank's G, residuals of earlier winners included
        return gradient(rank, step, scale=1000.0 ** (step + 1) if rank == big[step] else 1.0)

    out = run_artopk(cluster(n), n, steps, "var", grads=grads)
    assert [rec["root"] for rec in out[0][1]] == big


def test_var_ties_go_to_the_lowest_rank(cluster):
    n = 3
    out = run_artopk(cluster(n), n, 2, "var", grads=lambda rank, step: gradient(0, step))
    assert [rec["root"] for rec in out[2][1]] == [0, 0]


def test_allgather_baseline_equals_the_dense_average_of_sparsified_gradients(cluster):
    n, k = 4, k_for(CR, NUMEL)

    def worker(rank, allreduce):
        return allgather_topk(gradient(rank, 0), k, rank, n, allreduce)

    results = ok(cluster(n)(worker))
    grads = [gradient(r, 0) for r in range(n)]
    tops = [topk_indices(g, k) for g in grads]
    ref = np.zeros(NUMEL)
    for g, t in zip(grads, tops):
        ref[t] += g[t]
    # the values travel as one N*k vector of segments; each dense element gathers the errors
    # of the segment entries that land on it
    segments = []
    for r, (g, t) in enumerate(zip(grads, tops)):
        v = np.zeros(n * k, np.float32)
        v[r * k:(r + 1) * k] = g[t]
        segments.append(v)
    all_idx = np.concatenate(tops)
    bound = np.bincount(all_idx, weights=sum_bound(segments), minlength=NUMEL)
    tol = average_tolerance(ref, bound, n)
    for y in results:
        assert y.dtype == np.float32 and np.array_equal(y, results[0])
        assert np.all(np.abs(y - ref / n) <= tol)
        assert not np.any(y[np.setdiff1d(np.arange(NUMEL), all_idx)])


def test_schedule_decisions_agree_across_ranks_over_the_aggregator(cluster):
    """Warm-up, then knees from per-rank estimates that differ (each rank's G and its own
    predict()): the averaged estimates make every rank choose the same CR."""
    n, steps, warmup = 3, 6, 3
    numel = 5_000

    def worker(rank, allreduce):
        sched = CompressionSchedule(lambda c: 0.01 + (rank + 1) * c, warmup_steps=warmup,
                                    interval=2)
        art = ARTopk(rank, n, allreduce, selection="star", cr=sched)
        crs = []
        for s in range(steps):
            art.step(gradient(rank, s, numel))
            crs.append(art.last_cr)
            assert art.last_indices.size == k_for(art.last_cr, numel)
        return crs, art.bytes_sent

    results = ok(cluster(n)(worker))
    crs = [c for c, _ in results]
    assert crs[0][:warmup] == pytest.approx([1.0, 0.55, 0.1])
    assert all(c == crs[0] for c in crs)
    assert all(c in DEFAULT_CANDIDATES for c in crs[0][warmup:])
    assert crs[0][warmup + 1] == crs[0][warmup]  # interval 2: kept between decisions
    decisions = 2  # at steps 3 and 5, each an allreduce of 2 floats per candidate
    payload = [4 * numel if c == 1.0 else 8 * k_for(c, numel) for c in crs[0]]  # CR 1: dense
    expected = sum(payload) + decisions * 8 * len(DEFAULT_CANDIDATES)
    assert all(b == expected for _, b in results)


@pytest.mark.parametrize("selection", ["star", "var"])
def test_a_dense_step_is_one_allreduce_of_g_and_empties_the_residual(cluster, selection):
    """CR 1.0 (warm-up's first step, or an override when dense is cheaper): no selection, no
    index broadcast; the update is the average of G and every residual becomes zero."""
    n = 3
    run = cluster(n)

    def worker(rank, allreduce):
        art = ARTopk(rank, n, allreduce, selection=selection, cr=CR)
        art.step(gradient(rank, 0))
        g = gradient(rank, 1) + art.residual
        before = art.bytes_sent
        update = art.step(gradient(rank, 1), cr=1.0)
        assert art.last_root is None and art.last_cr == 1.0 and art.steps == 2
        assert not np.any(art.residual) and art.bytes_sent - before == 4 * NUMEL
        art.step(gradient(rank, 2))  # back to the configured CR
        assert art.last_indices.size == k_for(CR, NUMEL)
        return g, update

    results = ok(run(worker))
    gs = [g for g, _ in results]
    ref = np.stack(gs).astype(np.float64).sum(axis=0)
    tol = average_tolerance(ref, sum_bound(gs), n)
    for _, update in results:
        assert np.all(np.abs(update - ref / n) <= tol)
    calls = 3 * (3 if selection == "var" else 2) - (2 if selection == "var" else 1)
    assert [s.stats.allreduces for s in run.streams] == [calls] * n


@pytest.mark.parametrize("selection", ["star", "var"])
def test_non_finite_gradient_raises_on_every_rank_and_keeps_state(cluster, selection):
    """Rank 1 puts inf where rank 0's G is always 0: under STAR at step 2 (root 0) the inf is
    not among the broadcast indices, so only the poisoned contribution can reveal it. Every
    rank raises, nobody's state moves, and the next step works."""
    n, bad_at = 2, 7

    def grads(rank, step):
        g = gradient(rank, step)
        if rank == 0:
            g[bad_at] = 0.0
        return g

    def worker(rank, allreduce):
        art = ARTopk(rank, n, allreduce, selection=selection, cr=CR)
        for s in range(2):
            art.step(grads(rank, s))
        before = art.residual.copy()
        bad = grads(rank, 2)
        if rank == 1:
            bad[bad_at] = np.inf
        with pytest.raises(FloatingPointError, match=r"residual holds inf/NaN on some rank"):
            art.step(bad)
        assert art.steps == 2 and np.array_equal(art.residual, before)
        art.step(grads(rank, 2))
        return art.steps

    assert ok(cluster(n)(worker)) == [3, 3]


def test_length_change_is_refused(cluster):
    def worker(rank, allreduce):
        art = ARTopk(rank, 1, allreduce, cr=0.1)
        art.step(np.ones(100, np.float32))
        with pytest.raises(ValueError, match="has 99 elements, earlier steps had 100"):
            art.step(np.ones(99, np.float32))

    ok(cluster(1)(worker))


def no_allreduce(x):
    raise AssertionError("validation must fail before any communication")


@pytest.mark.parametrize("grad, message", [
    (np.ones(10), "float32 numpy array, got float64"),
    ([1.0, 2.0], "float32 numpy array, got list"),
    (np.ones((2, 5), np.float32), r"flat \(1-D\), got shape \(2, 5\)"),
    (np.ones(0, np.float32), "needs 1..2147483647 elements"),
    (np.broadcast_to(np.float32(0), (2**31,)), "got 2147483648"),
])
def test_bad_gradients_are_refused_before_communicating(grad, message):
    with pytest.raises(ValueError, match=message):
        ARTopk(0, 2, no_allreduce, cr=0.1).step(grad)
    with pytest.raises(ValueError, match=message):
        allgather_topk(grad, 1, 0, 2, no_allreduce)


@pytest.mark.parametrize("kwargs, message", [
    (dict(rank=2, world_size=2, cr=0.1), "rank 2 not in 0..1"),
    (dict(rank=0, world_size=2, cr=0.0), r"cr must be in \(0, 1\]"),
    (dict(rank=0, world_size=2, cr=1.5), r"cr must be in \(0, 1\]"),
    (dict(rank=0, world_size=2, cr=0.1, selection="ring"), "selection must be one of"),
])
def test_bad_configuration_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ARTopk(allreduce=no_allreduce, **kwargs)


def test_bad_cr_override_is_refused():
    with pytest.raises(ValueError, match=r"cr must be in \(0, 1\], got 2.0"):
        ARTopk(0, 2, no_allreduce, cr=0.1).step(np.ones(10, np.float32), cr=2.0)


def test_allgather_refuses_k_out_of_range():
    with pytest.raises(ValueError, match="k must be in 1..10, got 11"):
        allgather_topk(np.ones(10, np.float32), 11, 0, 2, no_allreduce)


def test_schedule_rejects_bad_settings():
    with pytest.raises(ValueError, match="candidate CR"):
        CompressionSchedule(lambda c: c, warmup_steps=1, candidates=(0.1, 2.0))
    with pytest.raises(ValueError, match="interval >= 1"):
        CompressionSchedule(lambda c: c, warmup_steps=1, interval=0)
    with pytest.raises(ValueError, match="finite times"):
        CompressionSchedule(lambda c: -1.0, warmup_steps=0).local_estimates(np.ones(10, np.float32))


# -- pure parts -------------------------------------------------------------------------------

def test_k_and_topk():
    assert k_for(0.001, 100) == 1 and k_for(0.1, 1005) == 100 and k_for(1.0, 7) == 7
    x = np.array([0.5, -3.0, 2.0, 0.0, -1.0], np.float32)
    assert sorted(topk_indices(x, 2).tolist()) == [1, 2]
    assert sorted(topk_indices(x, 5).tolist()) == [0, 1, 2, 3, 4]


def test_warmup_falls_linearly_then_decisions_come_every_interval():
    sched = CompressionSchedule(lambda c: c, warmup_steps=5, target=0.2, interval=3)
    assert [sched.cr_at(s) for s in range(5)] == pytest.approx(np.linspace(1.0, 0.2, 5))
    assert sched.cr_at(5) is None
    sched.decide(np.array([1.0, 0.9, 0.8, 0.7, 0.6, 1.0, 0.5, 0.2, 0.1, 0.05]))
    assert [sched.cr_at(s) for s in (6, 7)] == [sched.cr, sched.cr]
    assert sched.cr_at(8) is None
    assert CompressionSchedule(lambda c: c, warmup_steps=1, target=0.3).cr_at(0) == 1.0


def test_candidate_gains_match_a_full_sort():
    g = gradient(0, 0, 3_001)
    crs = DEFAULT_CANDIDATES
    energy = np.sort(g.astype(np.float64) ** 2)[::-1]
    expected = [energy[:k_for(c, g.size)].sum() / energy.sum() for c in crs]
    assert candidate_gains(g, crs) == pytest.approx(expected, rel=1e-12)
    assert candidate_gains(np.zeros(10, np.float32), crs).tolist() == [1.0] * len(crs)


def knee_by_definition(a, b):
    """Independent statement of the rule: Pareto front, min-max normalization, largest
    perpendicular distance from the line through the two extremes, on the origin's side."""
    pts = list(zip(a, b))
    front = [i for i, p in enumerate(pts)
             if not any(q[0] <= p[0] and q[1] <= p[1] and q != p for q in pts)]
    if len(front) == 1:
        return front[0]
    fa, fb = [a[i] for i in front], [b[i] for i in front]
    na = [(v - min(fa)) / (max(fa) - min(fa)) for v in fa]
    nb = [(v - min(fb)) / (max(fb) - min(fb)) for v in fb]
    p1 = (na[int(np.argmin(na))], nb[int(np.argmin(na))])
    p2 = (na[int(np.argmin(nb))], nb[int(np.argmin(nb))])
    dx, dy = p2[0] - p1[0], p2[1] - p1[1]
    dist = [((x - p1[0]) * dy - (y - p1[1]) * dx) / np.hypot(dx, dy) for x, y in zip(na, nb)]
    return front[int(np.argmax(dist))]


def test_knee_on_a_synthetic_front():
    # time rises with CR, 1/gain falls: candidates 0.1 .. 0.001 with a clear elbow at 0.011
    times = np.array([10.0, 4.0, 2.0, 1.6, 1.5])
    inv_gain = np.array([1.0, 1.05, 1.2, 2.5, 6.0])
    assert pareto_knee(times, inv_gain) == 2 == knee_by_definition(times, inv_gain)
    # a dominated candidate (slower and worse than 0.011) is never the knee
    times_d, inv_d = times.copy(), inv_gain.copy()
    times_d[3], inv_d[3] = 2.1, 1.3
    assert pareto_knee(times_d, inv_d) == 2
    # nor does a dominated one stretch the normalization (with it, 0.033 would look best)
    assert pareto_knee(np.append(times, 100.0), np.append(inv_gain, 7.0)) == 2
    # one candidate dominating all others wins; a two-point front ties to the larger CR
    assert pareto_knee([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]) == 0
    assert pareto_knee([2.0, 1.0], [1.0, 2.0]) == 0


@pytest.mark.parametrize("seed", range(30))
def test_knee_matches_the_definition_on_random_points(seed):
    rng = np.random.default_rng(seed)
    times, inv_gain = rng.uniform(1, 10, 6), rng.uniform(1, 10, 6)
    if seed % 2:  # every point on the front
        times, inv_gain = np.sort(times)[::-1], np.sort(inv_gain)
    assert pareto_knee(times, inv_gain) == knee_by_definition(times, inv_gain)


def test_schedule_decides_the_knee_of_gain_and_predicted_time():
    """A G whose energy is concentrated in a few entries: the knee from the schedule's own
    estimates equals the knee computed here from first principles."""
    rng = np.random.default_rng(5)
    g = (rng.standard_normal(100_000) * np.exp(-np.arange(100_000) / 800.0)).astype(np.float32)
    predict = lambda c: 0.002 + 0.05 * c  # noqa: E731
    sched = CompressionSchedule(predict, warmup_steps=0)
    est = sched.local_estimates(g)
    cr = sched.decide(est)
    energy = np.sort(g.astype(np.float64) ** 2)[::-1]
    gains = [energy[:k_for(c, g.size)].sum() / energy.sum() for c in sched.candidates]
    times = [predict(c) for c in sched.candidates]
    assert sched.last_gains == pytest.approx(gains, rel=1e-6)  # float32 estimates
    assert cr == sched.candidates[knee_by_definition(times, [1 / x for x in gains])]
    assert cr not in (sched.candidates[0], sched.candidates[-1])  # a real elbow, not an end

"""End to end: worker processes, UDP on loopback, the inagg-aggregator CLI."""

import numpy as np
import pytest

from inagg.bmv2_env.demos.allreduce_demo import TensorSpec, run_local_job

SPECS = [
    TensorSpec(100_003, dynamic_range=12.0, seed=11),   # not a multiple of K
    TensorSpec(5, seed=12),                             # fewer values than one packet
    TensorSpec(40_000, dtype="int32", seed=13),
]


@pytest.mark.parametrize("n_workers", [2, 4, 8])
def test_allreduce_matches_float64_reference(n_workers):
    run = run_local_job(n_workers, SPECS, window=16, values_per_packet=256)
    for r in run.workers:
        assert r.max_err_over_bound <= 1.0, (r.rank, r.max_err_over_bound)
        assert r.stats["allreduces"] == len(SPECS)
    job = run.aggregator["jobs"]["1"]
    assert job["drops"] == {}
    assert job["results"] * n_workers == job["aggregated"]


def test_results_under_loss_are_bit_identical():
    specs = SPECS[:1] + SPECS[2:]
    clean = run_local_job(4, specs, window=16, values_per_packet=256, keep_results=True)
    for rate in (0.01, 0.05):
        lossy = run_local_job(4, specs, window=16, values_per_packet=256, drop_rate=rate,
                              seed=7, keep_results=True)
        assert lossy.aggregator["injected_drops"] > 0
        assert sum(r.stats["retransmissions"] for r in lossy.workers) > 0
        for a, b in zip(clean.workers, lossy.workers):
            for x, y in zip(a.results, b.results):
                assert np.array_equal(x, y)
        assert all(np.array_equal(clean.workers[0].results[i], w.results[i])
                   for w in lossy.workers for i in range(len(specs)))

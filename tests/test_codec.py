"""The block floating-point codec: error bound, special values, no int32 overflow."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hostlib import codec
from hostlib.protocol import EXP_NONE

K = 64


def aggregate(xs: list[np.ndarray], k: int = K) -> tuple[np.ndarray, np.ndarray]:
    """What the protocol computes: shared exponent per block, int32 sum, dequantize.
    Returns (result, per-element bound)."""
    n = len(xs)
    s = codec.shift_for(n)
    exps = np.max(np.stack([codec.block_exponents(x, k)[0] for x in xs]), axis=0)
    size = xs[0].size
    y = np.empty(size, np.float32)
    bound = np.empty(size)
    for c, e in enumerate(exps.tolist()):
        sl = slice(c * k, (c + 1) * k)
        total = np.zeros(len(range(size)[sl]), np.int64)
        for x in xs:
            q = codec.quantize(x[sl], e, s)
            assert q.dtype == np.int32
            total += q
        assert np.all(np.abs(total) < 2**31), "int32 sum would overflow"
        codec.dequantize(total.astype(np.int32), e, s, out=y[sl])
        exact = np.sum(np.stack([x[sl] for x in xs]).astype(np.float64), axis=0)
        # float64 reference itself is exact up to 2**-52 of the sum of magnitudes
        bound[sl] = codec.error_bound(exact, e, n) + 2.0**-52 * np.sum(
            np.abs(np.stack([x[sl] for x in xs]).astype(np.float64)), axis=0)
    return y, bound


def exact_sum(xs):
    return np.sum(np.stack(xs).astype(np.float64), axis=0)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 32), size=st.integers(1, 300), seed=st.integers(0, 2**32 - 1),
       spread=st.floats(0, 80))
def test_error_within_bound_wide_dynamic_range(n, size, seed, spread):
    rng = np.random.default_rng(seed)
    xs = [(rng.standard_normal(size) * np.exp2(rng.uniform(-spread, spread, size))).astype(np.float32)
          for _ in range(n)]
    y, bound = aggregate(xs)
    assert np.all(np.abs(y - exact_sum(xs)) <= bound)


def test_zeros_denormals_and_extremes():
    tiny = np.float32(1.4e-45)  # smallest denormal
    x0 = np.array([0, 0, 0, 0, tiny, -tiny, 1e-39, 0], np.float32)
    x1 = np.array([0, 0, 0, 0, tiny, 0, -3e-39, 1e38], np.float32)
    y, bound = aggregate([x0, x1], k=4)
    assert np.all(y[:4] == 0)
    assert np.all(np.abs(y - exact_sum([x0, x1])) <= bound)
    exps, bad = codec.block_exponents(x0, 4)
    assert exps.tolist() == [EXP_NONE, codec.EXP_MIN] and not bad.any()


def test_denormal_only_blocks_are_exact():
    x = (np.arange(1, 65, dtype=np.float32) * np.float32(1.4e-45))
    y, _ = aggregate([x, x, x])
    assert np.array_equal(y, exact_sum([x, x, x]).astype(np.float32))


@pytest.mark.parametrize("bad_value", [np.inf, -np.inf, np.nan, np.float32(2.0**127)])
def test_unrepresentable_values_are_flagged(bad_value):
    x = np.ones(3 * K, np.float32)
    x[K + 5] = bad_value
    exps, bad = codec.block_exponents(x, K)
    assert bad.tolist() == [False, True, False]
    assert exps[1] == EXP_NONE


def test_no_overflow_at_the_limit_with_32_workers():
    n = 32
    s = codec.shift_for(n)
    x = np.full(K, np.nextafter(np.float32(2.0), np.float32(0)), np.float32)  # just below 2**1
    e = int(codec.block_exponents(x, K)[0][0])
    q = codec.quantize(x, e, s).astype(np.int64)
    assert np.all(np.abs(q * n) <= 2**30)
    y, bound = aggregate([x] * n)
    assert np.all(np.abs(y - exact_sum([x] * n)) <= bound)


def test_shift_rejects_no_workers():
    with pytest.raises(ValueError, match="n_workers"):
        codec.shift_for(0)

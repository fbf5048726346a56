"""The block floating-point codec: error bound, special values, no int32 overflow."""

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inagg.hostlib.wire import codec
from inagg.hostlib.wire.protocol import EXP_NONE

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


# -- exact fixed point (the small calls that ride in the control round) ---------------------------

F32_MAX = np.finfo(np.float32).max


def nearest_float32(q: Fraction) -> np.float32:
    """The float32 nearest to ``q`` (ties to even, inf past float32's range), found among the
    neighbours of float64's rounding by exact comparison: independent of the codec's rounding."""
    if q >= Fraction(2**128) - Fraction(2**103):      # half an ulp above the largest float32
        return np.float32(np.inf)
    if q <= -(Fraction(2**128) - Fraction(2**103)):
        return np.float32(-np.inf)
    with np.errstate(over="ignore"):
        c = np.float32(float(q))
    c = np.clip(c, -F32_MAX, F32_MAX)
    with np.errstate(over="ignore"):
        candidates = [c, np.nextafter(c, np.float32(np.inf)), np.nextafter(c, np.float32(-np.inf))]
    finite = [f for f in candidates if np.isfinite(f)]
    return min(finite, key=lambda f: (abs(Fraction(float(f)) - q), int(f.view(np.uint32)) & 1))


def fixed_sum(xs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """What the one-round path computes: every rank's limbs, the switch's int32 lane-wise sum,
    the decode. Returns (result, lane sums as int64) and checks every rank's values encoded."""
    n = len(xs)
    lanes = np.zeros(xs[0].size * codec.fixed_limbs(n), np.int64)
    for x in xs:
        limbs = np.zeros(lanes.size, np.int32)
        assert codec.fixed_encode(x, n, limbs)
        lanes += limbs
    y = np.empty(xs[0].size, np.float32)
    codec.fixed_decode(lanes.astype(np.int32), n, y)
    return y, lanes


def exact_reference(xs: list[np.ndarray]) -> np.ndarray:
    sums = [sum((Fraction(float(x[i])) for x in xs), Fraction(0)) for i in range(xs[0].size)]
    return np.array([nearest_float32(q) for q in sums], np.float32)


def representable(n: int, size: int, seed: int, spread: int) -> list[np.ndarray]:
    """n ranks' float32 values across the codec's whole range (subnormals to just below 2**127)."""
    rng = np.random.default_rng(seed)
    exps = rng.integers(max(-150, 126 - spread), 127, (n, size))
    with np.errstate(over="ignore"):
        xs = (rng.uniform(-1, 1, (n, size)) * np.exp2(exps.astype(np.float64))).astype(np.float32)
    return [np.clip(x, -np.nextafter(np.float32(2.0**127), 0), np.nextafter(np.float32(2.0**127), 0)) for x in xs]


@settings(max_examples=80, deadline=None)
@given(n=st.integers(1, 64), size=st.integers(1, 40), seed=st.integers(0, 2**32 - 1),
       spread=st.integers(1, 280))
def test_fixed_point_sum_is_the_exact_sum_rounded_once(n, size, seed, spread):
    xs = representable(n, size, seed, spread)
    y, lanes = fixed_sum(xs)
    assert np.all(np.abs(lanes) < 2**31), "int32 lane sum would overflow"
    assert np.array_equal(y.view(np.uint32), exact_reference(xs).view(np.uint32))


@pytest.mark.parametrize("xs, expected", [
    ([[1e30, 1.0], [1.0, 2.0**-149], [-1e30, -1.0]], [1.0, 2.0**-149]),       # cancellation
    ([[1.4e-45, -1.4e-45, 3e-45]] * 4, [5.6e-45, -5.6e-45, 1.12e-44]),      # subnormals, exact
    ([[2.0**-126 - 2.0**-149], [2.0**-149]], [2.0**-126]),                   # subnormal -> normal
    ([[1.0], [2.0**-24]], [1.0]),                       # a tie: to even (1.0)
    ([[1.0 + 2.0**-23], [2.0**-24]], [1.0 + 2.0**-22]), # a tie: to even (up)
    ([[1.0], [2.0**-24], [2.0**-149]], [1.0 + 2.0**-23]),  # just past the tie: up
    ([[2.0**127 - 2.0**103]] * 2, [F32_MAX]),           # the largest float32, exactly
    ([[2.0**127 - 2.0**103]] * 3, [np.inf]),            # past float32's range: inf, as any float sum
    ([[-(2.0**127 - 2.0**103)]] * 3, [-np.inf]),
    ([[-0.0], [0.0]], [0.0]),
])
def test_fixed_point_extremes(xs, expected):
    arrays = [np.array(x, np.float32) for x in xs]
    y, _ = fixed_sum(arrays)
    assert np.array_equal(y, np.array(expected, np.float32))
    assert np.array_equal(y, exact_reference(arrays))


@pytest.mark.parametrize("bad_value", [np.inf, -np.inf, np.nan, np.float32(2.0**127), np.float32(-F32_MAX)])
def test_fixed_point_refuses_what_the_block_codec_refuses(bad_value):
    x = np.array([1.0, bad_value, 2.0], np.float32)
    limbs = np.full(3 * codec.fixed_limbs(4), 7, np.int32)
    assert not codec.fixed_encode(x, 4, limbs)
    assert not limbs[codec.fixed_limbs(4): 2 * codec.fixed_limbs(4)].any()   # the bad value sends zeros
    assert bool(codec.block_exponents(x, 3)[1][0])                             # a bad block too


def test_limbs_of_32_ranks_at_the_limit_do_not_overflow():
    n = 32
    x = np.full(4, -np.nextafter(np.float32(2.0**127), 0), np.float32)
    y, lanes = fixed_sum([x] * n)
    assert np.all(np.abs(lanes) < 2**31) and np.all(y == -np.inf)
    assert codec.limb_bits(n) == 26 and codec.fixed_limbs(n) == 11

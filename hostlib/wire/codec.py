"""Block floating-point codec: float32 blocks <-> int32 values that a switch can sum.

Every block of K values (one packet) is scaled by a power of two shared by all workers of the
job: ``E`` = the largest of the workers' block exponents, where a worker's exponent ``e`` is the
smallest integer with ``max|x| < 2**e`` (``frexp``). A value is sent as
``q = rint(x * 2**(S - E))`` with ``S = 30 - ceil(log2 N)`` for N workers, so ``|q| <= 2**S`` and
the sum of N such values is at most ``2**30`` in magnitude: the int32 sum cannot overflow for any
N (32 included). The receiver returns ``y = float32(sum * 2**(E - S))``.

Error bound, per element of a block with shared exponent E (proved in tests/test_codec.py)::

    |y - sum_w x_w| <= N * 2**(E - S - 1) * (1 + 2**-24) + 2**-24 * |sum_w x_w| + 2**-150

(N rounding errors of half a quantum each, then one float32 rounding of the result; the last
term covers float32 subnormal outputs.) With N = 4 the quantum is 2**-28 of the block's range,
below float32's own precision.

Float formats (``FLOAT_DTYPES``): float32, float16 and bfloat16 (``BFLOAT16``: numpy has none,
so its bits, as a dtype of their own). A 16-bit value widens exactly to float32, so exponents and
quantization see the float32 values; a result is the float32 result (divided by the worker count
for an average) rounded once to the tensor's format, to nearest, ties to even: the same bits
as the float32 codec's result converted with torch's ``.to(dtype)``.

Not representable, and reported rather than summed: inf, NaN and ``|x| >= 2**127`` (the block
exponent travels as int8). Blocks whose values are all below ``2**-127`` use exponent -127;
all-zero blocks send ``EXP_NONE``.
"""

from __future__ import annotations

import math

import numpy as np

from inagg.hostlib.wire.protocol import EXP_NONE

EXP_MIN = -127  # smallest block exponent sent; smaller blocks are clamped to it
EXP_MAX = 127   # largest representable block exponent (values below 2**127)


def shift_for(n_workers: int) -> int:
    """The scale exponent S for a job of ``n_workers``: N values of magnitude <= 2**S sum to
    at most 2**30 < 2**31."""
    if n_workers < 1:
        raise ValueError(f"n_workers must be >= 1, got {n_workers}")
    return 30 - math.ceil(math.log2(n_workers))


# numpy has no bfloat16: a bfloat16 array is its uint16 bits under a dtype of its own (so no
# plain uint16 array is taken for one); ``native_values`` hands the C++ codec its uint16 view
BFLOAT16 = np.dtype([("bfloat16", np.uint16)])
FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float16), BFLOAT16)   # native Format's order


def is_float(dtype: np.dtype) -> bool:
    """Whether arrays of ``dtype`` are float values the block codec carries."""
    return dtype in FLOAT_DTYPES


def native_values(x: np.ndarray) -> np.ndarray:
    """``x`` as the C++ codec takes it: float32 and float16 as they are, bfloat16 as its bits."""
    return x.view(np.uint16) if x.dtype == BFLOAT16 else x


def widen(x: np.ndarray) -> np.ndarray:
    """The float32 values of ``x`` (any of FLOAT_DTYPES; exact)."""
    if x.dtype == BFLOAT16:
        return (x.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return x.astype(np.float32, copy=False)


def widen_into(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``widen(x)`` written into the float32 array ``out`` (no temporary)."""
    if x.dtype == BFLOAT16:
        np.left_shift(x.view(np.uint16), 16, out=out.view(np.uint32), dtype=np.uint32)
    else:
        np.copyto(out, x)
    return out


def narrow(y: np.ndarray, out: np.ndarray) -> np.ndarray:
    """float32 ``y`` rounded to ``out``'s format (to nearest, ties to even), written into ``out``."""
    if out.dtype == BFLOAT16:
        u = y.astype(np.float32, copy=False).view(np.uint32)
        out.view(np.uint16)[:] = (u + 0x7FFF + ((u >> 16) & 1)) >> 16   # results are never NaN
    else:
        with np.errstate(over="ignore"):   # beyond float16's range: inf, as the rounding says
            out[:] = y
    return out


def block_exponents(x: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-block exponents of a flat array of one of FLOAT_DTYPES.

    Returns ``(exps, bad)``: ``exps`` int8 (EXP_NONE for all-zero blocks), ``bad`` a bool mask
    of blocks holding inf/NaN or values too large for the codec (their exponent is EXP_NONE).
    """
    x = widen(x)
    n = x.size
    n_blocks = -(-n // block)
    full = n // block
    maxabs = np.empty(n_blocks, dtype=np.float32)
    if full:
        np.max(np.abs(x[: full * block].reshape(full, block)), axis=1, out=maxabs[:full])
    if full < n_blocks:
        maxabs[full] = np.max(np.abs(x[full * block:]))
    with np.errstate(invalid="ignore"):
        _, e = np.frexp(maxabs)
    bad = ~np.isfinite(maxabs) | (e > EXP_MAX)
    exps = np.where(maxabs == 0, EXP_NONE, np.maximum(e, EXP_MIN))
    exps[bad] = EXP_NONE
    return exps.astype(np.int8), bad


def quantize(block: np.ndarray, exp: int, shift: int, out: np.ndarray | None = None) -> np.ndarray:
    """A block of one of FLOAT_DTYPES -> int32 with shared exponent ``exp`` (``EXP_NONE``: every
    value is 0)."""
    if exp == EXP_NONE:
        return _zeros(block.size, np.int32, out)
    scaled = np.ldexp(widen(block), shift - exp, dtype=np.float64)
    np.rint(scaled, out=scaled)
    return _as(scaled, np.int32, out)


def dequantize(q: np.ndarray, exp: int, shift: int, out: np.ndarray | None = None, divisor: int = 1) -> np.ndarray:
    """int32 sum with shared exponent ``exp`` -> float32 (one rounding, in float64 first), divided
    by ``divisor`` (an average), written into ``out`` in its format when given."""
    if exp == EXP_NONE:
        y = np.zeros(q.size, np.float32)
    else:
        y = np.ldexp(q, exp - shift, dtype=np.float64).astype(np.float32)
    if divisor != 1:
        np.divide(y, np.float32(divisor), out=y)
    return y if out is None else narrow(y, out)


def quantize_blocks(x: np.ndarray, block: int, exps: np.ndarray, shift: int) -> np.ndarray:
    """``quantize`` of every block of ``x`` under its agreed exponent ``exps[b]``, native-endian
    int32 (a call's fixed point on another transport than the wire's)."""
    e = _per_value(exps, block, x.size)
    with np.errstate(invalid="ignore", over="ignore"):   # bad blocks' values: EXP_NONE, zeroed
        q = np.rint(np.ldexp(widen(x), shift - e, dtype=np.float64))
    q[e == EXP_NONE] = 0
    return q.astype(np.int32)


def dequantize_blocks(q: np.ndarray, block: int, exps: np.ndarray, shift: int, divisor: int,
                      out: np.ndarray) -> np.ndarray:
    """``dequantize`` of every block's int32 sums under its agreed exponent into ``out``."""
    e = _per_value(exps, block, out.size)
    y = np.ldexp(q[:out.size], e - shift, dtype=np.float64).astype(np.float32)
    y[e == EXP_NONE] = 0
    if divisor != 1:
        np.divide(y, np.float32(divisor), out=y)
    return narrow(y, out)


def _per_value(exps: np.ndarray, block: int, size: int) -> np.ndarray:
    """Each value's block exponent (int64)."""
    return np.repeat(exps.astype(np.int64), block)[:size]


def _zeros(size: int, dtype: type, out: np.ndarray | None) -> np.ndarray:
    """``size`` zeros of ``dtype``: a new array, or ``out`` zeroed when given."""
    zeros = np.zeros(size, dtype=dtype) if out is None else out
    zeros[:] = 0
    return zeros


def _as(values: np.ndarray, dtype: type, out: np.ndarray | None) -> np.ndarray:
    """``values`` converted to ``dtype``: a new array, or written into ``out`` when given."""
    if out is None:
        return values.astype(dtype)
    out[:] = values
    return out


def error_bound(exact_sum: np.ndarray, exp: int, n_workers: int) -> np.ndarray:
    """The codec's per-element error bound for a block (see module docstring)."""
    if exp == EXP_NONE:
        return np.zeros_like(exact_sum, dtype=np.float64)
    s = shift_for(n_workers)
    quantum_err = n_workers * math.ldexp(1.0, exp - s - 1) * (1 + 2.0**-24)
    return quantum_err + 2.0**-24 * np.abs(exact_sum.astype(np.float64)) + 2.0**-150


# -- exact fixed point: the small calls that ride in the control round ----------------------------
#
# A float32 is an integer multiple of 2**-149 (the smallest subnormal), and the codec's values are
# below 2**EXP_MAX, so ``x * 2**149`` is an integer below 2**FIXED_BITS. Split into signed limbs of
# ``limb_bits(N)`` bits (one per int32 lane, least significant first), N ranks' limbs sum without
# int32 overflow, and the lane-wise sums, carried, are the EXACT sum of the ranks' floats. It is
# rounded once to float32 (to nearest, ties to even; inf beyond float32's range), so the result
# is the correctly rounded sum, the same bits on every rank. No exponent needs agreeing first:
# one round trip. inf, NaN and |x| >= 2**EXP_MAX are not representable, as in the block codec.

FIXED_FRACTION_BITS = 149                      # float32 values are multiples of 2**-149
FIXED_BITS = EXP_MAX + FIXED_FRACTION_BITS     # |x| < 2**EXP_MAX: |x| * 2**149 < 2**276
_MAX_BIASED_EXP = EXP_MAX + 126                # float32 biased exponents above: |x| >= 2**EXP_MAX, inf, NaN
_SIGNIFICAND_BITS = 24


def limb_bits(n_workers: int) -> int:
    """Bits per limb for a job of ``n_workers``: N limbs of magnitude < 2**b sum to less than
    2**31 in magnitude (b = 31 - ceil(log2 N), one more than the block codec's shift)."""
    return shift_for(n_workers) + 1


def fixed_limbs(n_workers: int) -> int:
    """int32 lanes per float32 value in the exact fixed-point encoding."""
    return -(-FIXED_BITS // limb_bits(n_workers))


def fixed_encode(x: np.ndarray, n_workers: int, out: np.ndarray) -> bool:
    """float32 values -> their exact signed limbs in ``out`` (int32, ``fixed_limbs`` per value,
    least significant first). False when some value is inf, NaN or |x| >= 2**EXP_MAX: its limbs
    are zero (the caller flags the call, FLAG_OVERFLOW)."""
    b, n_limbs = limb_bits(n_workers), fixed_limbs(n_workers)
    bits = x.view(np.uint32).astype(np.int64)
    biased = (bits >> 23) & 0xFF
    good = biased <= _MAX_BIASED_EXP
    significand = ((bits & 0x7FFFFF) | (biased > 0).astype(np.int64) << 23) * good
    shift = np.maximum(biased - 1, 0)          # |x| = significand * 2**(shift - 149)
    # position of the significand's bit 0 within each limb
    at = shift[:, None] - b * np.arange(n_limbs)[None, :]
    up = significand[:, None] << np.clip(at, 0, b)
    down = significand[:, None] >> np.clip(-at, 0, _SIGNIFICAND_BITS)
    limbs = np.where(at >= 0, up, down) & ((1 << b) - 1)
    limbs *= 1 - 2 * (bits >> 31)[:, None]
    out[:x.size * n_limbs] = limbs.reshape(-1)
    return bool(good.all())


def fixed_decode(sums: np.ndarray, n_workers: int, out: np.ndarray) -> np.ndarray:
    """Lane-wise int32 sums of ``fixed_encode`` limbs -> the exact sums, each rounded once to
    float32, in ``out``."""
    b, n_limbs = limb_bits(n_workers), fixed_limbs(n_workers)
    rows = sums[:out.size * n_limbs].reshape(out.size, n_limbs).tolist()
    out[:] = [round_to_float32(_exact_total(row, b)) for row in rows]
    return out


def _exact_total(limbs: list[int], b: int) -> int:
    """sum(limbs[i] << (b * i)): Python's ints are exact, so the carries resolve themselves."""
    total = 0
    for limb in reversed(limbs):
        total = (total << b) + limb
    return total


def round_to_float32(value: int) -> float:
    """``value * 2**-149`` rounded to the nearest float32 (ties to even; inf when too large), as
    the float64 that holds it exactly."""
    magnitude = abs(value)
    drop = max(0, magnitude.bit_length() - _SIGNIFICAND_BITS)
    kept = magnitude >> drop
    if drop:
        rest, half = magnitude & ((1 << drop) - 1), 1 << (drop - 1)
        kept += rest > half or (rest == half and kept & 1)
    exact = math.ldexp(kept, drop - FIXED_FRACTION_BITS)   # 24 significant bits: exact in float64
    y = math.inf if exact >= 2.0**128 else exact
    return -y if value < 0 else y

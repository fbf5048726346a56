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

Not representable, and reported rather than summed: inf, NaN and ``|x| >= 2**127`` (the block
exponent travels as int8). Blocks whose values are all below ``2**-127`` use exponent -127;
all-zero blocks send ``EXP_NONE``.
"""

from __future__ import annotations

import math

import numpy as np

from .protocol import EXP_NONE

EXP_MIN = -127  # smallest block exponent sent; smaller blocks are clamped to it
EXP_MAX = 127   # largest representable block exponent (values below 2**127)


def shift_for(n_workers: int) -> int:
    """The scale exponent S for a job of ``n_workers``: N values of magnitude <= 2**S sum to
    at most 2**30 < 2**31."""
    if n_workers < 1:
        raise ValueError(f"n_workers must be >= 1, got {n_workers}")
    return 30 - math.ceil(math.log2(n_workers))


def block_exponents(x: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-block exponents of a flat float32 array.

    Returns ``(exps, bad)``: ``exps`` int8 (EXP_NONE for all-zero blocks), ``bad`` a bool mask
    of blocks holding inf/NaN or values too large for the codec (their exponent is EXP_NONE).
    """
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
    """float32 block -> int32 with shared exponent ``exp`` (``EXP_NONE``: every value is 0)."""
    if exp == EXP_NONE:
        q = np.zeros(block.size, dtype=np.int32) if out is None else out
        q[:] = 0
        return q
    scaled = np.ldexp(block, shift - exp, dtype=np.float64)
    np.rint(scaled, out=scaled)
    if out is None:
        return scaled.astype(np.int32)
    out[:] = scaled
    return out


def dequantize(q: np.ndarray, exp: int, shift: int, out: np.ndarray | None = None) -> np.ndarray:
    """int32 sum with shared exponent ``exp`` -> float32 (one rounding, in float64 first)."""
    if exp == EXP_NONE:
        y = np.zeros(q.size, dtype=np.float32) if out is None else out
        y[:] = 0
        return y
    y64 = np.ldexp(q, exp - shift, dtype=np.float64)
    if out is None:
        return y64.astype(np.float32)
    out[:] = y64
    return out


def error_bound(exact_sum: np.ndarray, exp: int, n_workers: int) -> np.ndarray:
    """The codec's per-element error bound for a block (see module docstring)."""
    if exp == EXP_NONE:
        return np.zeros_like(exact_sum, dtype=np.float64)
    s = shift_for(n_workers)
    quantum_err = n_workers * math.ldexp(1.0, exp - s - 1) * (1 + 2.0**-24)
    return quantum_err + 2.0**-24 * np.abs(exact_sum.astype(np.float64)) + 2.0**-150

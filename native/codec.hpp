// Block floating-point codec, the C++ twin of hostlib/codec.py (which documents the format and
// proves the error bound). Results must be bit-identical to the numpy version: the worker's
// native stream and the Python one may serve ranks of the same job.
#pragma once

#include <cstddef>
#include <cstdint>

namespace inagg {

constexpr int8_t EXP_NONE = -128;
constexpr int EXP_MIN = -127;
constexpr int EXP_MAX = 127;

// The scale exponent S for a job of n workers: n values of magnitude <= 2**S sum below 2**31.
int shift_for(int n_workers);

// Per-block exponents of x (blocks of `block` values): exps[b] = the smallest e with
// max|x| < 2**e (at least EXP_MIN), EXP_NONE for an all-zero block; bad[b] = 1 (and EXP_NONE)
// for a block holding inf/NaN or |x| >= 2**127.
void block_exponents(const float* x, size_t n, size_t block, int8_t* exps, uint8_t* bad);

// q[i] = rint(x[i] * 2**(shift - exp)) (all zero for EXP_NONE), written big-endian for the wire.
void quantize_be(const float* x, size_t n, int exp, int shift, uint32_t* q_be);

// y[i] = float32(q[i] * 2**(exp - shift)) from big-endian int32 sums (zero for EXP_NONE).
void dequantize_be(const uint32_t* q_be, size_t n, int exp, int shift, float* y);

}  // namespace inagg

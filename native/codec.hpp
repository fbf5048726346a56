// Block floating-point codec and the exact fixed-point codec of small calls, the C++ twins of
// hostlib/wire/codec.py (which documents both formats and proves the block codec's error bound).
// Results must be bit-identical to the numpy version: the worker's native stream and the Python one
// may serve ranks of the same job.
#pragma once

#include <cstddef>
#include <cstdint>

#include "protocol.hpp"

namespace inagg {

constexpr int kExpMin = -127;  // smallest block exponent sent; smaller blocks are clamped to it
constexpr int kExpMax = 127;   // largest representable block exponent (values below 2**127)

// The scale exponent S for a job of n workers: n values of magnitude <= 2**S sum below 2**31.
int shift_for(int n_workers);

// The element formats of float tensors (hostlib/wire/codec.py FLOAT_DTYPES, in the same order).
// A 16-bit value widens exactly to float32, so every step below computes on the float32 value
// of an element, and a result is the float32 result rounded once to the element's format
// (to nearest, ties to even): the same bits as the float32 codec's result converted after.
enum class Format : uint8_t { Float32 = 0, Float16 = 1, BFloat16 = 2 };
size_t format_bytes(Format f);
// The address of element i of a tensor in format f.
inline const void* element_at(const void* x, Format f, size_t i) {
    return static_cast<const uint8_t*>(x) + i * format_bytes(f);
}
inline void* element_at(void* x, Format f, size_t i) {
    return static_cast<uint8_t*>(x) + i * format_bytes(f);
}

// Per-block exponents of x (blocks of `block` values): exps[b] = the smallest e with
// max|x| < 2**e (at least kExpMin), kExpNone for an all-zero block; bad[b] = 1 (and kExpNone)
// for a block holding inf/NaN or |x| >= 2**127.
void block_exponents(const void* x, Format f, size_t n, size_t block, int8_t* exps, uint8_t* bad);

// q[i] = rint(x[i] * 2**(shift - exp)) (all zero for kExpNone), written big-endian for the wire.
void quantize_be(const void* x, Format f, size_t n, int exp, int shift, uint32_t* q_be);

// y[i] = float32(q[i] * 2**(exp - shift)) / divisor, rounded to format f, from big-endian int32
// sums (zero for kExpNone). divisor: 1 for a sum, the worker count for an average.
void dequantize_be(const uint32_t* q_be, size_t n, int exp, int shift, float divisor, Format f,
                   void* y);

// The same steps over every block of a tensor with native-endian int32 (the fixed point of a
// call that runs on another transport, e.g. gloo, under agreed exponents exps[n / block]).
void quantize_blocks(const void* x, Format f, size_t n, size_t block, const int8_t* exps, int shift,
                     int32_t* q);
void dequantize_blocks(const int32_t* q, size_t n, size_t block, const int8_t* exps, int shift,
                       float divisor, Format f, void* y);

// acc[i] += rint(x[i] * 2**(shift - exp)) (nothing for kExpNone), wrapping as the switch's int32
// sum: the host-local reduce adds its ranks' quantized values as the switch would.
void quantize_add(const float* x, size_t n, int exp, int shift, int32_t* acc);

// y[i] = float32(q[i] * 2**(exp - shift)) / divisor (a float32 division; divisor 1: none), zero
// for kExpNone; native-endian int32 sums (the host-local reduce's).
void dequantize_div(const int32_t* q, size_t n, int exp, int shift, float divisor, float* y);

// Exact fixed point (hostlib/wire/codec.py documents it): a float32 is x * 2**149, an integer below
// 2**(kExpMax + 149), split into signed limbs of limb_bits(N) bits, one per int32 lane.
int limb_bits(int n_workers);
int fixed_limbs(int n_workers);

// The limbs of x[0..n) into limbs[0 .. n * fixed_limbs); false when some value is inf, NaN or
// |x| >= 2**kExpMax (its limbs are zero).
bool fixed_encode(const float* x, size_t n, int n_workers, int32_t* limbs);

// Lane-wise sums of N ranks' limbs -> the exact sums rounded once to float32 (ties to even).
void fixed_decode(const int32_t* sums, size_t n, int n_workers, float* y);

}  // namespace inagg

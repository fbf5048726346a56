// Block floating-point codec (see codec.hpp). Every step matches numpy's: frexp for exponents,
// float64 ldexp then round-half-to-even to quantize, float64 ldexp then one rounding to float32
// to dequantize.
//
// Why the loops look as they do: they run over every value of every call (64 MiB per worker per
// call on the host-path benchmark), and a libm call per value (ldexp, nearbyint) cost more CPU
// than the rest of a worker's call. Here each loop is branch-free arithmetic the compiler
// vectorizes (value_loops.hpp), and still bit-identical:
// - ldexp(v, s) is v * 2**s computed exactly in float64: a float32 (or an int32) times a power
//   of two within [2**-157, 2**157] neither overflows nor loses a bit in float64;
// - rint for |v| < 2**51 is adding and reading back 1.5 * 2**52: the addition rounds to an
//   integer (half to even, the default rounding mode) and the low 32 bits of the sum's mantissa
//   are that integer in two's complement (quantized values stay below 2**30);
// - max|x| and "all finite" are one unsigned max over the values' bits with the sign cleared:
//   such bits order as the magnitudes do, and inf/NaN are the ones at or above 0x7f800000.
#include "codec.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "value_loops.hpp"

namespace inagg {
namespace {

constexpr uint32_t kAbsMask = 0x7fffffffu;
constexpr uint32_t kInfBits = 0x7f800000u;
constexpr double kRoundMagic = 6755399441055744.0;  // 1.5 * 2**52

float float_of(uint32_t u) {
    float v;
    std::memcpy(&v, &u, sizeof v);
    return v;
}

// rint(v) as int32 for |v| < 2**31 (see the header comment).
int32_t round_to_int(double v) {
    double t = v + kRoundMagic;
    uint64_t u;
    std::memcpy(&u, &t, sizeof u);
    return static_cast<int32_t>(static_cast<uint32_t>(u));
}

// Bits of the largest |x[i]| (sign cleared); at or above kInfBits when some value is inf/NaN.
INAGG_VALUE_LOOP uint32_t max_abs_bits(const float* x, size_t n) {
    uint32_t m = 0;
    for (size_t i = 0; i < n; ++i) {
        uint32_t u;
        std::memcpy(&u, x + i, sizeof u);
        m = std::max(m, u & kAbsMask);
    }
    return m;
}

}  // namespace

int shift_for(int n_workers) {
    int bits = 0;
    while ((1 << bits) < n_workers) ++bits;  // ceil(log2 n)
    return 30 - bits;
}

void block_exponents(const float* x, size_t n, size_t block, int8_t* exps, uint8_t* bad) {
    size_t n_blocks = (n + block - 1) / block;
    for (size_t b = 0; b < n_blocks; ++b) {
        uint32_t m = max_abs_bits(x + b * block, std::min(block, n - b * block));
        int e = 0;
        bool finite = m < kInfBits;
        if (finite) std::frexp(float_of(m), &e);
        bad[b] = !finite || e > kExpMax;
        if (bad[b] || m == 0) {
            exps[b] = kExpNone;
        } else {
            exps[b] = static_cast<int8_t>(std::max(e, kExpMin));
        }
    }
}

INAGG_VALUE_LOOP void quantize_be(const float* x, size_t n, int exp, int shift, uint32_t* q_be) {
    if (exp == kExpNone) {
        std::fill(q_be, q_be + n, 0u);
        return;
    }
    const double scale = std::ldexp(1.0, shift - exp);
    for (size_t i = 0; i < n; ++i) {
        auto q = static_cast<uint32_t>(round_to_int(static_cast<double>(x[i]) * scale));
        q_be[i] = __builtin_bswap32(q);
    }
}

INAGG_VALUE_LOOP void dequantize_be(const uint32_t* q_be, size_t n, int exp, int shift, float* y) {
    if (exp == kExpNone) {
        std::fill(y, y + n, 0.0f);
        return;
    }
    const double scale = std::ldexp(1.0, exp - shift);
    for (size_t i = 0; i < n; ++i) {
        auto q = static_cast<int32_t>(__builtin_bswap32(q_be[i]));
        y[i] = static_cast<float>(static_cast<double>(q) * scale);
    }
}

}  // namespace inagg

// Block floating-point codec (see codec.hpp), then the exact fixed-point codec of the small
// calls that ride in the control round (at the end). Every block step matches numpy's: frexp
// for exponents, float64 ldexp then round-half-to-even to quantize, float64 ldexp then one
// rounding to float32 to dequantize.
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
#include <vector>

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

INAGG_VALUE_LOOP void quantize_add(const float* x, size_t n, int exp, int shift, int32_t* acc) {
    if (exp == kExpNone) return;
    const double scale = std::ldexp(1.0, shift - exp);
    for (size_t i = 0; i < n; ++i) {
        auto q = static_cast<uint32_t>(round_to_int(static_cast<double>(x[i]) * scale));
        acc[i] = static_cast<int32_t>(static_cast<uint32_t>(acc[i]) + q);
    }
}

INAGG_VALUE_LOOP void dequantize_div(const int32_t* q, size_t n, int exp, int shift, float divisor, float* y) {
    if (exp == kExpNone) {
        std::fill(y, y + n, 0.0f);
        return;
    }
    const double scale = std::ldexp(1.0, exp - shift);
    for (size_t i = 0; i < n; ++i) y[i] = static_cast<float>(static_cast<double>(q[i]) * scale) / divisor;
}

}  // namespace inagg

// -- exact fixed point (inagg/wire/codec.py: fixed_encode, fixed_decode, round_to_float32) --------

namespace inagg {
namespace {

constexpr int kFixedFractionBits = 149;                     // float32 values are multiples of 2**-149
constexpr int kFixedBits = kExpMax + kFixedFractionBits;    // |x| * 2**149 < 2**276
constexpr uint32_t kMaxBiasedExp = kExpMax + 126;           // above: |x| >= 2**kExpMax, inf, NaN
constexpr int kSignificandBits = 24;

// A non-negative integer as digits 0 <= d[i] < 2**b (d.back() may be larger: the top carry).
struct Digits {
    std::vector<int64_t> d;
    int b;

    // Bits [lo, lo + count) (count <= 32) of the integer.
    uint64_t bits(int lo, int count) const {
        uint64_t r = 0;
        for (int i = lo / b; i < static_cast<int>(d.size()) && i * b < lo + count; ++i) {
            int at = i * b - lo;   // where digit i's bit 0 lands
            auto v = static_cast<uint64_t>(d[i]);
            r |= at >= 0 ? v << at : v >> -at;
        }
        return r & ((uint64_t(1) << count) - 1);
    }
    // Whether any bit below position `pos` is set.
    bool any_below(int pos) const {
        for (int i = 0; i * b < pos; ++i) {
            int width = std::min(b, pos - i * b);
            if (static_cast<uint64_t>(d[i]) & ((uint64_t(1) << width) - 1)) return true;
        }
        return false;
    }
    // Position of the highest set bit, -1 for zero.
    int top_bit() const {
        for (int i = static_cast<int>(d.size()) - 1; i >= 0; --i)
            if (d[i]) return i * b + 63 - __builtin_clzll(static_cast<uint64_t>(d[i]));
        return -1;
    }
};

// Carry the lane sums (times `sign`) into digits; the top carry goes last. Returns it (its sign
// is the value's).
int64_t carry_digits(const int32_t* sums, int n_limbs, int sign, Digits& out) {
    int64_t carry = 0;
    for (int i = 0; i < n_limbs; ++i) {
        int64_t t = sign * int64_t(sums[i]) + carry;
        int64_t digit = static_cast<int64_t>(static_cast<uint64_t>(t) & ((uint64_t(1) << out.b) - 1));
        carry = (t - digit) / (int64_t(1) << out.b);   // exact: floor division
        out.d[i] = digit;
    }
    out.d[n_limbs] = carry;
    return carry;
}

// magnitude * 2**-149 rounded to the nearest float32 (ties to even; inf when too large).
float round_to_float32(const Digits& magnitude) {
    int top = magnitude.top_bit();
    int drop = std::max(0, top + 1 - kSignificandBits);
    uint64_t kept = magnitude.bits(drop, kSignificandBits);
    if (drop && magnitude.bits(drop - 1, 1) && (magnitude.any_below(drop - 1) || (kept & 1))) ++kept;
    double exact = std::ldexp(static_cast<double>(kept), drop - kFixedFractionBits);
    return exact >= 0x1p128 ? INFINITY : static_cast<float>(exact);
}

}  // namespace

int limb_bits(int n_workers) { return shift_for(n_workers) + 1; }

int fixed_limbs(int n_workers) {
    int b = limb_bits(n_workers);
    return (kFixedBits + b - 1) / b;
}

bool fixed_encode(const float* x, size_t n, int n_workers, int32_t* limbs) {
    int b = limb_bits(n_workers), n_limbs = fixed_limbs(n_workers);
    uint64_t mask = (uint64_t(1) << b) - 1;
    bool ok = true;
    for (size_t j = 0; j < n; ++j) {
        uint32_t bits;
        std::memcpy(&bits, x + j, sizeof bits);
        uint32_t biased = bits >> 23 & 0xFF;
        bool good = biased <= kMaxBiasedExp;
        ok &= good;
        uint64_t significand = good ? (bits & 0x7FFFFF) | uint64_t(biased > 0) << 23 : 0;
        int shift = std::max<int>(biased, 1) - 1;   // |x| = significand * 2**(shift - 149)
        for (int i = 0; i < n_limbs; ++i) {
            int at = shift - i * b;   // where the significand's bit 0 lands in limb i
            uint64_t v = at >= 0 ? (at >= b ? 0 : significand << at)
                                 : (-at >= kSignificandBits ? 0 : significand >> -at);
            auto limb = static_cast<int32_t>(v & mask);
            limbs[j * n_limbs + i] = bits >> 31 ? -limb : limb;
        }
    }
    return ok;
}

void fixed_decode(const int32_t* sums, size_t n, int n_workers, float* y) {
    int n_limbs = fixed_limbs(n_workers);
    Digits digits{std::vector<int64_t>(n_limbs + 1), limb_bits(n_workers)};
    for (size_t j = 0; j < n; ++j) {
        const int32_t* s = sums + j * n_limbs;
        bool negative = carry_digits(s, n_limbs, 1, digits) < 0;
        if (negative) carry_digits(s, n_limbs, -1, digits);   // the digits of -value
        float magnitude = round_to_float32(digits);
        y[j] = negative ? -magnitude : magnitude;
    }
}

}  // namespace inagg

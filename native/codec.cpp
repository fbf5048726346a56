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
//   such bits order as the magnitudes do (in float16 and bfloat16 too), and inf/NaN are the
//   largest.
// A float16 or bfloat16 tensor is read and written in its own format: each value widens to
// float32 in a register and each result is rounded to the format there, so the loops touch
// the tensor's own bytes only.
#include "codec.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "value_loops.hpp"

namespace inagg {
namespace {

constexpr double kRoundMagic = 6755399441055744.0;  // 1.5 * 2**52

float float_of(uint32_t u) {
    float v;
    std::memcpy(&v, &u, sizeof v);
    return v;
}

uint32_t bits_of(float v) {
    uint32_t u;
    std::memcpy(&u, &v, sizeof u);
    return u;
}

// rint(v) as int32 for |v| < 2**31 (see the header comment).
int32_t round_to_int(double v) {
    double t = v + kRoundMagic;
    uint64_t u;
    std::memcpy(&u, &t, sizeof u);
    return static_cast<int32_t>(static_cast<uint32_t>(u));
}

// Each format's elements as float32 values (exact) and float32 values back as elements (to
// nearest, ties to even; the codec's results are never NaN). Branch-free, so the value loops
// that inline them still vectorize.
struct Float32Values {
    using Element = float;
    static float load(float v) { return v; }
    static float store(float y) { return y; }
};

struct BFloat16Values {  // bfloat16 is the top half of a float32
    using Element = uint16_t;
    static float load(uint16_t v) { return float_of(uint32_t(v) << 16); }
    static uint16_t store(float y) {
        uint32_t u = bits_of(y);
        return static_cast<uint16_t>((u + 0x7fffu + (u >> 16 & 1)) >> 16);
    }
};

// IEEE binary16 (F. Giesen's conversions; tests/test_codec.py checks every one)
struct Float16Values {
    using Element = uint16_t;
    static float load(uint16_t h) {
        uint32_t o = uint32_t(h & 0x7fffu) << 13;
        uint32_t exp = o & 0x0f800000u;
        o += (127u - 15) << 23;
        o += exp == 0x0f800000u ? (128u - 16) << 23 : 0;                          // inf, NaN
        uint32_t sub = bits_of(float_of(o + (1u << 23)) - float_of(113u << 23));  // exact
        return float_of((exp == 0 ? sub : o) | uint32_t(h & 0x8000u) << 16);
    }
    static uint16_t store(float y) {
        constexpr uint32_t kF16Max = (127u + 16) << 23, kDenormMagic = ((127u - 15) + (23 - 10) + 1)
                                                                       << 23;
        uint32_t u = bits_of(y);
        uint32_t sign = u & 0x80000000u;
        u ^= sign;
        uint32_t big = u > 0x7f800000u ? 0x7e00u : 0x7c00u;
        uint32_t denormal = bits_of(float_of(u) + float_of(kDenormMagic)) - kDenormMagic;  // rounds
        uint32_t normal = (u + ((15u - 127u) << 23) + 0xfffu + (u >> 13 & 1)) >> 13;
        uint32_t o = u >= kF16Max ? big : u < (113u << 23) ? denormal : normal;
        return static_cast<uint16_t>(o | sign >> 16);
    }
};

// Bits of the largest |x[i]| (sign cleared): such bits order as the magnitudes do, in every format.
INAGG_VALUE_LOOP uint32_t max_abs_bits32(const uint32_t* x, size_t n) {
    uint32_t m = 0;
    for (size_t i = 0; i < n; ++i) m = std::max(m, x[i] & 0x7fffffffu);
    return m;
}

INAGG_VALUE_LOOP uint32_t max_abs_bits16(const uint16_t* x, size_t n) {
    uint32_t m = 0;
    for (size_t i = 0; i < n; ++i) m = std::max(m, uint32_t(x[i] & 0x7fffu));
    return m;
}

// The float32 value of the largest |x[i]| (inf/NaN when some value is).
float max_abs(const void* x, Format f, size_t n) {
    if (f == Format::Float32) return float_of(max_abs_bits32(static_cast<const uint32_t*>(x), n));
    auto m = static_cast<uint16_t>(max_abs_bits16(static_cast<const uint16_t*>(x), n));
    return f == Format::Float16 ? Float16Values::load(m) : BFloat16Values::load(m);
}

template <class V, bool kBigEndian>
[[gnu::always_inline]] inline void quantize_loop(const void* x, size_t n, double scale,
                                                 uint32_t* q) {
    auto in = static_cast<const typename V::Element*>(x);
    for (size_t i = 0; i < n; ++i) {
        auto v = static_cast<uint32_t>(round_to_int(static_cast<double>(V::load(in[i])) * scale));
        q[i] = kBigEndian ? __builtin_bswap32(v) : v;
    }
}

template <class V, bool kBigEndian>
[[gnu::always_inline]] inline void dequantize_loop(const uint32_t* q, size_t n, double scale,
                                                   float divisor, void* y) {
    auto out = static_cast<typename V::Element*>(y);
    auto value = [&](size_t i) {
        auto s = static_cast<int32_t>(kBigEndian ? __builtin_bswap32(q[i]) : q[i]);
        return static_cast<float>(static_cast<double>(s) * scale);
    };
    if (divisor == 1.0f) {
        for (size_t i = 0; i < n; ++i) out[i] = V::store(value(i));
    } else {
        for (size_t i = 0; i < n; ++i) out[i] = V::store(value(i) / divisor);
    }
}

// One loop per format and byte order, each built for the CPU (value_loops.hpp).
INAGG_VALUE_LOOP void quantize_values(const void* x, Format f, size_t n, double scale,
                                      bool big_endian, uint32_t* q) {
    switch (f) {
        case Format::Float32:
            return big_endian ? quantize_loop<Float32Values, true>(x, n, scale, q)
                              : quantize_loop<Float32Values, false>(x, n, scale, q);
        case Format::Float16:
            return big_endian ? quantize_loop<Float16Values, true>(x, n, scale, q)
                              : quantize_loop<Float16Values, false>(x, n, scale, q);
        case Format::BFloat16:
            return big_endian ? quantize_loop<BFloat16Values, true>(x, n, scale, q)
                              : quantize_loop<BFloat16Values, false>(x, n, scale, q);
    }
}

INAGG_VALUE_LOOP void dequantize_values(const uint32_t* q, size_t n, double scale, float divisor,
                                        bool big_endian, Format f, void* y) {
    switch (f) {
        case Format::Float32:
            return big_endian ? dequantize_loop<Float32Values, true>(q, n, scale, divisor, y)
                              : dequantize_loop<Float32Values, false>(q, n, scale, divisor, y);
        case Format::Float16:
            return big_endian ? dequantize_loop<Float16Values, true>(q, n, scale, divisor, y)
                              : dequantize_loop<Float16Values, false>(q, n, scale, divisor, y);
        case Format::BFloat16:
            return big_endian ? dequantize_loop<BFloat16Values, true>(q, n, scale, divisor, y)
                              : dequantize_loop<BFloat16Values, false>(q, n, scale, divisor, y);
    }
}

void quantize_block(const void* x, Format f, size_t n, int exp, int shift, bool big_endian,
                    uint32_t* q) {
    if (exp == kExpNone) {
        std::fill(q, q + n, 0u);
        return;
    }
    quantize_values(x, f, n, std::ldexp(1.0, shift - exp), big_endian, q);
}

void dequantize_block(const uint32_t* q, size_t n, int exp, int shift, float divisor,
                      bool big_endian, Format f, void* y) {
    if (exp == kExpNone) {
        std::memset(y, 0, n * format_bytes(f));
        return;
    }
    dequantize_values(q, n, std::ldexp(1.0, exp - shift), divisor, big_endian, f, y);
}

}  // namespace

size_t format_bytes(Format f) { return f == Format::Float32 ? 4 : 2; }

int shift_for(int n_workers) {
    int bits = 0;
    while ((1 << bits) < n_workers) ++bits;  // ceil(log2 n)
    return 30 - bits;
}

void block_exponents(const void* x, Format f, size_t n, size_t block, int8_t* exps, uint8_t* bad) {
    size_t n_blocks = (n + block - 1) / block;
    for (size_t b = 0; b < n_blocks; ++b) {
        float m = max_abs(element_at(x, f, b * block), f, std::min(block, n - b * block));
        int e = 0;
        bool finite = std::isfinite(m);
        if (finite) std::frexp(m, &e);
        bad[b] = !finite || e > kExpMax;
        if (bad[b] || m == 0) {
            exps[b] = kExpNone;
        } else {
            exps[b] = static_cast<int8_t>(std::max(e, kExpMin));
        }
    }
}

void quantize_be(const void* x, Format f, size_t n, int exp, int shift, uint32_t* q_be) {
    quantize_block(x, f, n, exp, shift, true, q_be);
}

void dequantize_be(const uint32_t* q_be, size_t n, int exp, int shift, float divisor, Format f,
                   void* y) {
    dequantize_block(q_be, n, exp, shift, divisor, true, f, y);
}

void quantize_blocks(const void* x, Format f, size_t n, size_t block, const int8_t* exps, int shift,
                     int32_t* q) {
    for (size_t b = 0, i = 0; i < n; ++b, i += block)
        quantize_block(element_at(x, f, i), f, std::min(block, n - i), exps[b], shift, false,
                       reinterpret_cast<uint32_t*>(q + i));
}

void dequantize_blocks(const int32_t* q, size_t n, size_t block, const int8_t* exps, int shift,
                       float divisor, Format f, void* y) {
    for (size_t b = 0, i = 0; i < n; ++b, i += block)
        dequantize_block(reinterpret_cast<const uint32_t*>(q + i), std::min(block, n - i), exps[b],
                         shift, divisor, false, f, element_at(y, f, i));
}

INAGG_VALUE_LOOP void quantize_add(const float* x, size_t n, int exp, int shift, int32_t* acc) {
    if (exp == kExpNone) return;
    const double scale = std::ldexp(1.0, shift - exp);
    for (size_t i = 0; i < n; ++i) {
        auto q = static_cast<uint32_t>(round_to_int(static_cast<double>(x[i]) * scale));
        acc[i] = static_cast<int32_t>(static_cast<uint32_t>(acc[i]) + q);
    }
}

INAGG_VALUE_LOOP void dequantize_div(const int32_t* q, size_t n, int exp, int shift, float divisor,
                                     float* y) {
    if (exp == kExpNone) {
        std::fill(y, y + n, 0.0f);
        return;
    }
    const double scale = std::ldexp(1.0, exp - shift);
    for (size_t i = 0; i < n; ++i)
        y[i] = static_cast<float>(static_cast<double>(q[i]) * scale) / divisor;
}

}  // namespace inagg

// -- exact fixed point (hostlib/wire/codec.py: fixed_encode, fixed_decode, round_to_float32) --

namespace inagg {
namespace {

constexpr int kFixedFractionBits = 149;                   // float32 values are multiples of 2**-149
constexpr int kFixedBits = kExpMax + kFixedFractionBits;  // |x| * 2**149 < 2**276
constexpr uint32_t kMaxBiasedExp = kExpMax + 126;         // above: |x| >= 2**kExpMax, inf, NaN
constexpr int kSignificandBits = 24;

// A non-negative integer as digits 0 <= d[i] < 2**b (d.back() may be larger: the top carry).
struct Digits {
    std::vector<int64_t> d;
    int b;

    // Bits [lo, lo + count) (count <= 32) of the integer.
    uint64_t bits(int lo, int count) const {
        uint64_t r = 0;
        for (int i = lo / b; i < static_cast<int>(d.size()) && i * b < lo + count; ++i) {
            int at = i * b - lo;  // where digit i's bit 0 lands
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
        int64_t digit =
            static_cast<int64_t>(static_cast<uint64_t>(t) & ((uint64_t(1) << out.b) - 1));
        carry = (t - digit) / (int64_t(1) << out.b);  // exact: floor division
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
    if (drop && magnitude.bits(drop - 1, 1) && (magnitude.any_below(drop - 1) || (kept & 1)))
        ++kept;
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
        int shift = std::max<int>(biased, 1) - 1;  // |x| = significand * 2**(shift - 149)
        for (int i = 0; i < n_limbs; ++i) {
            int at = shift - i * b;  // where the significand's bit 0 lands in limb i
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
        if (negative) carry_digits(s, n_limbs, -1, digits);  // the digits of -value
        float magnitude = round_to_float32(digits);
        y[j] = negative ? -magnitude : magnitude;
    }
}

}  // namespace inagg

// Block floating-point codec (see codec.hpp). Every step matches numpy's: frexp for exponents,
// float64 ldexp then round-half-to-even (nearbyint in the default rounding mode) to quantize,
// float64 ldexp then one rounding to float32 to dequantize.
#include "codec.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <cmath>

namespace inagg {

int shift_for(int n_workers) {
    int bits = 0;
    while ((1 << bits) < n_workers) ++bits;  // ceil(log2 n)
    return 30 - bits;
}

void block_exponents(const float* x, size_t n, size_t block, int8_t* exps, uint8_t* bad) {
    size_t n_blocks = (n + block - 1) / block;
    for (size_t b = 0; b < n_blocks; ++b) {
        const float* v = x + b * block;
        size_t len = std::min(block, n - b * block);
        float maxabs = 0.0f;
        bool finite = true;
        for (size_t i = 0; i < len; ++i) {
            float a = std::fabs(v[i]);
            finite &= std::isfinite(a);
            maxabs = std::max(maxabs, a);
        }
        int e = 0;
        if (finite) std::frexp(maxabs, &e);
        bad[b] = !finite || e > kExpMax;
        if (bad[b] || maxabs == 0.0f) {
            exps[b] = kExpNone;
        } else {
            exps[b] = static_cast<int8_t>(std::max(e, kExpMin));
        }
    }
}

void quantize_be(const float* x, size_t n, int exp, int shift, uint32_t* q_be) {
    if (exp == kExpNone) {
        std::fill(q_be, q_be + n, 0u);
        return;
    }
    for (size_t i = 0; i < n; ++i) {
        double scaled = std::nearbyint(std::ldexp(static_cast<double>(x[i]), shift - exp));
        q_be[i] = htonl(static_cast<uint32_t>(static_cast<int32_t>(scaled)));
    }
}

void dequantize_be(const uint32_t* q_be, size_t n, int exp, int shift, float* y) {
    if (exp == kExpNone) {
        std::fill(y, y + n, 0.0f);
        return;
    }
    for (size_t i = 0; i < n; ++i) {
        auto q = static_cast<int32_t>(ntohl(q_be[i]));
        y[i] = static_cast<float>(std::ldexp(static_cast<double>(q), exp - shift));
    }
}

}  // namespace inagg

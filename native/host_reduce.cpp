// The host-local reduce's loops over every value (hostlib/worker/host_reduce.py documents the
// protocol): the ranks of one host sum their tensors in shared memory exactly as the switch would
// have summed them, each rank over one range of the values, with the GIL released. Float32 values
// are quantized with the job's agreed block exponents and the shift of all the job's ranks
// (codec.hpp) and summed as int32, block by block (a block's sums stay in cache), so the sum does
// not depend on the order of the ranks and every value is bit-identical to the switch path's.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "codec.hpp"
#include "value_loops.hpp"

namespace nb = nanobind;

namespace inagg {
namespace {

template <typename T>
using Array = nb::ndarray<T, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// The values [begin, end) of the ranks' float32 inputs, quantized with exps[i / k] and summed per
// block into a block-sized buffer, then handed to `done(first value, count, exponent, sums)`.
template <typename Done>
void sum_blocks(const std::vector<const float*>& inputs, size_t begin, size_t end, size_t k,
                const int8_t* exps, int shift, Done done) {
    std::vector<int32_t> acc(k);
    for (size_t at = begin; at < end;) {
        size_t block = at / k;
        size_t count = std::min(end, (block + 1) * k) - at;
        std::fill(acc.begin(), acc.begin() + count, 0);
        for (const float* x : inputs) quantize_add(x + at, count, exps[block], shift, acc.data());
        done(at, count, exps[block], acc.data());
        at += count;
    }
}

constexpr size_t kIntChunk = 4096;  // int32 sums are added input by input over chunks this long

// acc[i] += x[i], wrapping as the switch's int32 sum.
INAGG_VALUE_LOOP void add_wrapping(const int32_t* x, size_t n, int32_t* acc) {
    for (size_t i = 0; i < n; ++i)
        acc[i] = static_cast<int32_t>(static_cast<uint32_t>(acc[i]) + static_cast<uint32_t>(x[i]));
}

template <typename T>
std::vector<const T*> pointers(const std::vector<Array<const T>>& inputs, size_t end) {
    std::vector<const T*> out;
    for (const auto& x : inputs) {
        if (x.shape(0) < end)
            throw std::invalid_argument("an input is shorter than the range to reduce");
        out.push_back(x.data());
    }
    return out;
}

void check_range(size_t begin, size_t end, size_t out, size_t k, size_t exps) {
    if (begin > end || out < end)
        throw std::invalid_argument("the range to reduce does not fit the output");
    if (k == 0 || exps < (end + k - 1) / k)
        throw std::invalid_argument("fewer exponents than the range's blocks");
}

void host_sum_quantized(std::vector<Array<const float>> inputs, size_t begin, size_t end, size_t k,
                        Array<const int8_t> exps, int shift, Array<int32_t> sums) {
    check_range(begin, end, sums.shape(0), k, exps.shape(0));
    auto xs = pointers(inputs, end);
    int32_t* out = sums.data();
    nb::gil_scoped_release release;
    sum_blocks(
        xs, begin, end, k, exps.data(), shift,
        [out](size_t at, size_t n, int, const int32_t* acc) { std::copy(acc, acc + n, out + at); });
}

void host_reduce_float(std::vector<Array<const float>> inputs, size_t begin, size_t end, size_t k,
                       Array<const int8_t> exps, int shift, float divisor, Array<float> y) {
    check_range(begin, end, y.shape(0), k, exps.shape(0));
    auto xs = pointers(inputs, end);
    float* out = y.data();
    nb::gil_scoped_release release;
    sum_blocks(xs, begin, end, k, exps.data(), shift,
               [out, shift, divisor](size_t at, size_t n, int exp, const int32_t* acc) {
                   dequantize_div(acc, n, exp, shift, divisor, out + at);
               });
}

void host_dequantize(Array<const int32_t> sums, size_t begin, size_t end, size_t k,
                     Array<const int8_t> exps, int shift, float divisor, Array<float> y) {
    check_range(begin, end, std::min(sums.shape(0), y.shape(0)), k, exps.shape(0));
    const int32_t* q = sums.data();
    const int8_t* e = exps.data();
    float* out = y.data();
    nb::gil_scoped_release release;
    std::vector<int32_t> block(k);  // y may be the sums' own memory
    for (size_t at = begin; at < end;) {
        size_t count = std::min(end, (at / k + 1) * k) - at;
        std::copy(q + at, q + at + count, block.begin());
        dequantize_div(block.data(), count, e[at / k], shift, divisor, out + at);
        at += count;
    }
}

void host_sum_int(std::vector<Array<const int32_t>> inputs, size_t begin, size_t end,
                  Array<int32_t> sums) {
    check_range(begin, end, sums.shape(0), 1, end);
    auto xs = pointers(inputs, end);
    int32_t* out = sums.data();
    nb::gil_scoped_release release;
    for (size_t at = begin; at < end; at += kIntChunk) {
        size_t count = std::min(kIntChunk, end - at);
        std::fill(out + at, out + at + count, 0);
        for (const int32_t* x : xs) add_wrapping(x + at, count, out + at);
    }
}

}  // namespace

void bind_host_reduce(nb::module_& m) {
    m.def("host_sum_quantized", &host_sum_quantized,
          "sums[begin:end] = the int32 sum of the inputs' values quantized with exps (one per k "
          "values)");
    m.def("host_reduce_float", &host_reduce_float,
          "y[begin:end] = the dequantized host_sum_quantized, divided by divisor");
    m.def("host_dequantize", &host_dequantize,
          "y[begin:end] = sums dequantized with exps (one per k values), divided by divisor");
    m.def("host_sum_int", &host_sum_int, "sums[begin:end] = the wrapping int32 sum of the inputs");
}

}  // namespace inagg

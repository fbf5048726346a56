// Python bindings of the worker's stream and the codec (inagg.hostlib._native.Stream,
// block_exponents, quantize, dequantize). Every call that waits on the network releases the GIL for
// its whole duration; arrays are numpy buffers that Python allocated, written in place.
#include <arpa/inet.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <stdexcept>
#include <string>

#include "codec.hpp"
#include "stream.hpp"

namespace nb = nanobind;

namespace inagg {
namespace {

template <typename T>
using Array = nb::ndarray<T, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
// A float tensor's values in any of the codec's formats (format_of).
using Values = nb::ndarray<nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using ConstValues = nb::ndarray<nb::ro, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// The codec format of an array: float32, float16, or bfloat16 passed as its uint16 bits (numpy
// has no bfloat16: inagg.hostlib.wire.codec.native_values gives its BFLOAT16 arrays so).
template <typename A>
Format format_of(const A& x) {
    auto d = x.dtype();
    bool float_code = d.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Float);
    if (float_code && d.bits == 32) return Format::Float32;
    if (float_code && d.bits == 16) return Format::Float16;
    if (d.bits == 16 && (d.code == static_cast<uint8_t>(nb::dlpack::dtype_code::UInt) ||
                         d.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat)))
        return Format::BFloat16;
    throw std::invalid_argument(
        "values must be float32, float16 or bfloat16 (as its uint16 bits); pass "
        "inagg.hostlib.wire.codec.native_values(x)");
}

GrantView grant_view(int job, int epoch, uint32_t slot_base, uint32_t slot_count, uint32_t k,
                     const std::string& ip, int port, uint32_t overhead) {
    GrantView g;
    g.job = static_cast<uint16_t>(job);
    g.epoch = static_cast<uint16_t>(epoch);
    g.slot_base = slot_base;
    g.slot_count = slot_count;
    g.k = k;
    g.overhead = overhead;
    g.aggregator.sin_family = AF_INET;
    g.aggregator.sin_port = htons(static_cast<uint16_t>(port));
    if (inet_pton(AF_INET, ip.c_str(), &g.aggregator.sin_addr) != 1)
        throw std::invalid_argument("aggregator address is not an IPv4 address: " + ip);
    return g;
}

nb::dict counters_dict(const Stream& s) {
    const StreamCounters& c = s.counters();
    nb::dict d, drops;
    d["packets_sent"] = c.packets_sent;
    d["packets_received"] = c.packets_received;
    d["wire_bytes_sent"] = c.wire_bytes_sent;
    d["wire_bytes_received"] = c.wire_bytes_received;
    d["retransmissions"] = c.retransmissions;
    d["fast_retransmissions"] = c.fast_retransmissions;
    d["backoffs"] = c.backoffs;
    d["bursts"] = c.bursts;
    d["spurious_retransmissions"] = c.spurious_retransmissions;
    d["host_results"] = c.host_results;
    d["congestion_marks"] = c.congestion_marks;
    d["elided_results"] = c.elided_results;
    for (size_t i = 1; i < kResultChecks; ++i)
        if (c.drops[i]) drops[result_check_name(static_cast<ResultCheck>(i))] = c.drops[i];
    d["result_drops"] = drops;
    return d;
}

void check_workers(int n_workers) {
    if (n_workers < 1)
        throw std::invalid_argument("n_workers must be >= 1, got " + std::to_string(n_workers));
}

void check_blocks(size_t size, size_t k, size_t exps, size_t bad) {
    if (exps < (size + k - 1) / k || bad < exps)
        throw std::invalid_argument("exponent arrays shorter than the tensor's blocks");
}

// The codec (codec.hpp): the block exponents, quantization and the small calls' fixed point.
void bind_codec(nb::module_& m) {
    m.def("shift_for", &shift_for);
    m.def("block_exponents",
          [](ConstValues x, size_t block, Array<int8_t> exps, Array<uint8_t> bad) {
              check_blocks(x.shape(0), block, exps.shape(0), bad.shape(0));
              Format f = format_of(x);
              nb::gil_scoped_release release;
              block_exponents(x.data(), f, x.shape(0), block, exps.data(), bad.data());
          });
    m.def("quantize_be", [](ConstValues x, int exp, int shift, Array<uint32_t> out) {
        if (out.shape(0) < x.shape(0)) throw std::invalid_argument("output shorter than input");
        quantize_be(x.data(), format_of(x), x.shape(0), exp, shift, out.data());
    });
    m.def(
        "dequantize_be",
        [](Array<const uint32_t> q, int exp, int shift, Values out, float divisor) {
            if (out.shape(0) < q.shape(0)) throw std::invalid_argument("output shorter than input");
            dequantize_be(q.data(), q.shape(0), exp, shift, divisor, format_of(out), out.data());
        },
        nb::arg("q"), nb::arg("exp"), nb::arg("shift"), nb::arg("out"), nb::arg("divisor") = 1.0f);
    m.def("quantize_blocks",
          [](ConstValues x, size_t block, Array<const int8_t> exps, int shift, Array<int32_t> q) {
              check_blocks(x.shape(0), block, exps.shape(0), exps.shape(0));
              if (q.shape(0) < x.shape(0)) throw std::invalid_argument("output shorter than input");
              Format f = format_of(x);
              nb::gil_scoped_release release;
              quantize_blocks(x.data(), f, x.shape(0), block, exps.data(), shift, q.data());
          });
    m.def("dequantize_blocks", [](Array<const int32_t> q, size_t block, Array<const int8_t> exps,
                                  int shift, float divisor, Values out) {
        check_blocks(out.shape(0), block, exps.shape(0), exps.shape(0));
        if (q.shape(0) < out.shape(0)) throw std::invalid_argument("sums shorter than output");
        Format f = format_of(out);
        nb::gil_scoped_release release;
        dequantize_blocks(q.data(), out.shape(0), block, exps.data(), shift, divisor, f,
                          out.data());
    });
    m.def("limb_bits", &limb_bits);
    m.def("fixed_limbs", &fixed_limbs);
    m.def("fixed_encode", [](Array<const float> x, int n_workers, Array<int32_t> limbs) {
        check_workers(n_workers);
        if (limbs.shape(0) < x.shape(0) * size_t(fixed_limbs(n_workers)))
            throw std::invalid_argument("limbs shorter than fixed_limbs(n_workers) per value");
        return fixed_encode(x.data(), x.shape(0), n_workers, limbs.data());
    });
    m.def("fixed_decode", [](Array<const int32_t> sums, int n_workers, Array<float> y) {
        check_workers(n_workers);
        if (sums.shape(0) < y.shape(0) * size_t(fixed_limbs(n_workers)))
            throw std::invalid_argument("sums shorter than fixed_limbs(n_workers) per value");
        fixed_decode(sums.data(), y.shape(0), n_workers, y.data());
    });
}

// Stream.control_round: (ok, the agreed exponent, the result's flags, the round trip's seconds).
std::tuple<bool, int, int, double> control_round(Stream& s, Array<const int32_t> lanes, int exp0,
                                                 uint8_t flags, Array<int32_t> summed) {
    if (summed.shape(0) < lanes.shape(0)) throw std::invalid_argument("summed shorter than lanes");
    int8_t agreed = kExpNone;
    uint8_t result_flags = 0;
    double rtt = 0;
    nb::gil_scoped_release release;
    bool ok = s.control_round(lanes.data(), lanes.shape(0), static_cast<int8_t>(exp0), flags,
                              summed.data(), &agreed, &result_flags, &rtt);
    return {ok, agreed, result_flags, rtt};
}

// A reduce-scatter's part as Python passes it: [first, end) pairs (none: an allreduce).
using Ranges = std::vector<std::pair<int64_t, int64_t>>;

bool stream_float(Stream& s, Values x, Array<const int8_t> exps, Array<const uint8_t> bad, int exp0,
                  uint32_t window, size_t k, float divisor, const Ranges& part) {
    check_blocks(x.shape(0), k, exps.shape(0), bad.shape(0));
    BlockCall call;
    call.part = check_part(part, x.shape(0));
    call.data = x.data(), call.size = x.shape(0), call.is_float = true;
    call.format = format_of(x), call.divisor = divisor;
    call.local_exps = exps.data(), call.bad = bad.data(), call.exp0 = static_cast<int8_t>(exp0);
    call.window = window;
    nb::gil_scoped_release release;
    return s.stream_blocks(call);
}

bool stream_int(Stream& s, Array<int32_t> x, uint32_t window, const Ranges& part) {
    BlockCall call;
    call.part = check_part(part, x.shape(0));
    call.data = x.data(), call.size = x.shape(0), call.window = window;
    nb::gil_scoped_release release;
    return s.stream_blocks(call);
}

// The congestion window, lent by Python for a call and taken back after it
// (hostlib/worker/native_stream.py: _lend_congestion, _take_congestion).
std::tuple<double, double, bool, uint32_t, uint32_t, double, double> congestion(Stream& s) {
    const CongestionWindow& c = s.congestion();
    return {c.size, c.alpha, c.slow_start, c.acked, c.marked, c.round, c.peak};
}

void set_congestion(Stream& s, double size, double alpha, bool slow_start, uint32_t acked,
                    uint32_t marked, double round, double peak, double minimum, double maximum) {
    CongestionWindow& c = s.congestion();
    c.size = size, c.alpha = alpha, c.slow_start = slow_start, c.acked = acked, c.marked = marked;
    c.round = round, c.peak = peak, c.minimum = minimum, c.maximum = maximum;
}

void bind_stream_class(nb::module_& m) {
    nb::class_<Stream>(m, "Stream")
        .def(nb::init<int, int, int, double, double, double, double>(), nb::arg("fd"),
             nb::arg("rank"), nb::arg("n_workers"), nb::arg("rto_min"), nb::arg("rto_max"),
             nb::arg("stall_timeout"), nb::arg("stuck_timeout"))
        .def("set_grant",
             [](Stream& s, int job, int epoch, uint32_t slot_base, uint32_t slot_count, uint32_t k,
                const std::string& ip, int port, uint32_t overhead) {
                 s.set_grant(grant_view(job, epoch, slot_base, slot_count, k, ip, port, overhead));
             })
        .def("control_round", &control_round)
        .def("stream_float", &stream_float)
        .def("stream_int", &stream_int)
        .def("congestion", &congestion)
        .def("set_congestion", &set_congestion)
        .def("counters", &counters_dict)
        .def("overflow", &Stream::overflow)
        .def("abort", &Stream::abort, "Stop the call in progress (from another thread)")
        .def("remaining", &Stream::remaining)
        .def("waiting_slots", &Stream::waiting_slots);
}

}  // namespace

void bind_stream(nb::module_& m) {
    // a Communicator's I/O thread is a daemon that may still hold its Stream at interpreter exit
    nb::set_leak_warnings(false);
    nb::list names;
    for (size_t i = 0; i < kResultChecks; ++i)
        names.append(result_check_name(static_cast<ResultCheck>(i)));
    m.attr("RESULT_CHECKS") = names;
    bind_codec(m);
    bind_stream_class(m);
    m.def("check_part", [](const Ranges& ranges, size_t size) {
        std::vector<std::pair<size_t, size_t>> part;
        for (const Range& r : check_part(ranges, size)) part.emplace_back(r.first, r.end);
        return part;
    });
}

}  // namespace inagg

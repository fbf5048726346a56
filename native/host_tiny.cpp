// A tiny call of the host-local reduce in C++: the whole exchange of a call of a few values on
// one host (hostlib/worker/host_tiny.py calls it for a job's calls of at most 1 KiB).
//
// Why a file of its own: such a call's time is not its arithmetic but the Python of its protocol
// around two messages (~80 us of CPU per call and rank, against gloo's C++), and on a loaded
// machine each microsecond between two ranks' messages costs several of wall time. This file runs
// the same protocol (hostlib/worker/host_reduce.py documents it) with the GIL released: the same
// frames (host_group.py's Message) on the same Unix sockets, the same rows of the same shared
// memory and the same sums (codec.hpp's exact fixed point for float32, wrapping int32), for the
// common case only: every rank's call the same, room in the buffer, finite values, a reply within
// the wait's slice. Anything else stops it where it stands and hands the Python protocol what it
// received (taken(), sent()), which carries on from there. So there is one implementation of
// every refusal, error and wait (a dead rank named, the group's failure and timeout), and the
// Python path, which this one must match bit for bit (tests/test_host_tiny.py), stays its
// specification.
//
// A wait spins for `spin` seconds first (poll(2) that does not block: a peer running on another
// core answers within microseconds, with no wake-up to pay), then blocks in poll(2) until the
// slice ends.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "codec.hpp"

namespace nb = nanobind;

namespace inagg {
namespace {

using Clock = std::chrono::steady_clock;
using Values = nb::ndarray<nb::c_contig, nb::device::cpu>;
using Bytes = nb::ndarray<uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

constexpr uint8_t kReady = 0, kResult = 4;  // host_reduce.py's _READY and _RESULT
constexpr size_t kHeaderBytes = 36;         // host_group.py's _HEADER, "<BxxxIqqqI"
// What call() returns when it did not finish the call (else the K of the path's next call).
constexpr int64_t kHanded = -1;      // Python carries on with taken() (the messages received)
constexpr int64_t kNotSent = -2;     // a follower's READY did not go: Python runs the call
constexpr int64_t kSendFailed = -3;  // the leader's RESULT went to the first sent() ranks only

// One message of host_group.py's protocol.
struct Frame {
    uint8_t kind = 0;
    uint32_t call = 0;
    int64_t a = 0, b = 0, c = 0;
    std::string text;
    int fd = -1;  // a descriptor passed with it (SCM_RIGHTS), or -1
};

std::string pack(const Frame& f) {
    std::string out(kHeaderBytes, '\0');
    uint32_t length = static_cast<uint32_t>(f.text.size());
    out[0] = static_cast<char>(f.kind);
    std::memcpy(&out[4], &f.call, 4);  // little-endian, as "<" packs (x86-64, aarch64)
    std::memcpy(&out[8], &f.a, 8);
    std::memcpy(&out[16], &f.b, 8);
    std::memcpy(&out[24], &f.c, 8);
    std::memcpy(&out[32], &length, 4);
    return out + f.text;
}

// All of `data` on the socket; false when it failed (a peer gone: Python's send names it).
bool send_all(int fd, const std::string& data) {
    for (size_t at = 0; at < data.size();) {
        ssize_t n = send(fd, data.data() + at, data.size() - at, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        at += static_cast<size_t>(n);
    }
    return true;
}

bool read_exactly(int fd, char* out, size_t n) {
    for (size_t at = 0; at < n;) {
        ssize_t got = recv(fd, out + at, n - at, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return false;
        at += static_cast<size_t>(got);
    }
    return true;
}

// The next frame on `fd` (Link.recv's reading); nullopt at end of file or an error, which the
// Python protocol then meets itself (and names the rank).
std::optional<Frame> read_frame(int fd) {
    char head[kHeaderBytes];
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    iovec io{head, kHeaderBytes};
    msghdr msg{};
    msg.msg_iov = &io;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    ssize_t got;
    while ((got = recvmsg(fd, &msg, 0)) < 0 && errno == EINTR) {
    }
    if (got <= 0) return std::nullopt;
    Frame f;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
            std::memcpy(&f.fd, CMSG_DATA(c), sizeof(int));
    size_t have = static_cast<size_t>(got);
    if (!read_exactly(fd, head + have, kHeaderBytes - have)) return std::nullopt;
    uint32_t length;
    f.kind = static_cast<uint8_t>(head[0]);
    std::memcpy(&f.call, head + 4, 4);
    std::memcpy(&f.a, head + 8, 8);
    std::memcpy(&f.b, head + 16, 8);
    std::memcpy(&f.c, head + 24, 8);
    std::memcpy(&length, head + 32, 4);
    f.text.resize(length);
    if (length && !read_exactly(fd, f.text.data(), length)) return std::nullopt;
    return f;
}

// Until one of `fds` is readable (or hung up): spins until `spin_until`, then blocks, at most
// until `deadline`. Whether one is (false on an error too: Python's wait meets it again).
bool wait_readable(std::vector<pollfd>& fds, Clock::time_point spin_until,
                   Clock::time_point deadline) {
    for (;;) {
        Clock::time_point now = Clock::now();
        int ms = 0;
        if (now >= spin_until) {
            if (now >= deadline) return false;
            ms = static_cast<int>(
                std::ceil(std::chrono::duration<double, std::milli>(deadline - now).count()));
        }
        int ready = poll(fds.data(), fds.size(), ms);
        if (ready > 0) return true;
        if (ready < 0 && errno != EINTR) return false;
    }
}

// One call as call() checked it: its word (host_reduce.py's _Call.word) and where its values lie.
struct Call {
    uint32_t number;
    int64_t word;
    size_t n;
    bool is_float;
    void* x;         // the caller's values (float32 or int32), summed in place
    uint8_t* rows;   // the ranks' inputs: row i at i * n values
    int32_t* wire;   // the int32 sums, or a float call's summed fixed-point limbs
    float* result;   // a float call's result
    int64_t k_next;  // the leader's answer: the K of the path's next call
};

class HostTiny {
public:
    // `fds`: the leader's sockets to its host's other ranks (by local index 1, 2, ...), or
    // another rank's one socket to its leader; `index`: this rank's local index.
    HostTiny(std::vector<int> fds, int index, int n_ranks, int n_workers, double spin)
        : fds_(std::move(fds)), index_(index), n_ranks_(n_ranks), n_workers_(n_workers),
          spin_(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(spin))) {
        bool leader = index_ == 0;
        if (leader ? n_ranks_ != static_cast<int>(fds_.size()) + 1 : fds_.size() != 1)
            throw std::invalid_argument(
                "a leader has one socket per other rank of its host, a follower one to its leader");
    }

    // The shared buffer (held until the next one: the caller's view of its mapping).
    void use(Bytes buffer) { buffer_ = buffer; }

    int64_t call(uint32_t number, int64_t word, Values x, bool one_round, size_t wire_at,
                 size_t result_at, int64_t k_next, double seconds);

    // The messages received before a hand-over: (local index, kind, call, a, b, c, text, fd).
    std::vector<std::tuple<int, int, uint32_t, int64_t, int64_t, int64_t, std::string, int>> taken()
        const {
        std::vector<std::tuple<int, int, uint32_t, int64_t, int64_t, int64_t, std::string, int>>
            out;
        for (const auto& [i, f] : taken_)
            out.emplace_back(i, f.kind, f.call, f.a, f.b, f.c, f.text, f.fd);
        return out;
    }
    size_t sent() const { return sent_; }  // after kSendFailed: the ranks that got the RESULT

private:
    Call describe(uint32_t number, int64_t word, Values& x, bool one_round, size_t wire_at,
                  size_t result_at, int64_t k_next);
    int64_t lead(const Call& c, Clock::time_point spin_until, Clock::time_point deadline);
    int64_t follow(const Call& c, Clock::time_point spin_until, Clock::time_point deadline);
    bool gather(const Call& c, Clock::time_point spin_until, Clock::time_point deadline);
    bool reduce(const Call& c);
    void copy_out(const Call& c) const;
    const void* row(const Call& c, int i) const {
        return c.rows + static_cast<size_t>(i) * c.n * 4;
    }

    std::vector<int> fds_;
    int index_, n_ranks_, n_workers_;
    Clock::duration spin_;
    Bytes buffer_;
    std::vector<std::pair<int, Frame>> taken_;
    std::vector<pollfd> polled_;
    std::vector<int32_t> limbs_;  // one rank's fixed-point limbs
    size_t sent_ = 0;
};

Call HostTiny::describe(uint32_t number, int64_t word, Values& x, bool one_round, size_t wire_at,
                        size_t result_at, int64_t k_next) {
    Call c{number,          word,     word < 0 ? 0 : static_cast<size_t>(word >> 2),
           (word & 1) != 0, x.data(), nullptr,
           nullptr,         nullptr,  k_next};
    bool float32 = x.dtype() == nb::dtype<float>(), int32 = x.dtype() == nb::dtype<int32_t>();
    if (word < 0 || x.size() != c.n || !(c.is_float ? float32 && one_round : int32))
        throw std::invalid_argument(
            "a tiny call takes the float32 values of a call that rides in one round, or int32 "
            "values, as many as its word says");
    size_t lanes = c.is_float ? c.n * static_cast<size_t>(fixed_limbs(n_workers_)) : c.n;
    size_t size = buffer_.is_valid() ? buffer_.shape(0) : 0;
    if (static_cast<size_t>(n_ranks_) * c.n * 4 > size || wire_at + lanes * 4 > size ||
        (c.is_float && result_at + c.n * 4 > size) || wire_at % 4 || result_at % 4)
        throw std::invalid_argument("the call's areas do not fit the shared buffer");
    c.rows = buffer_.data();
    c.wire = reinterpret_cast<int32_t*>(buffer_.data() + wire_at);
    c.result = reinterpret_cast<float*>(buffer_.data() + result_at);
    return c;
}

int64_t HostTiny::call(uint32_t number, int64_t word, Values x, bool one_round, size_t wire_at,
                       size_t result_at, int64_t k_next, double seconds) {
    Call c = describe(number, word, x, one_round, wire_at, result_at, k_next);
    taken_.clear();
    sent_ = 0;
    nb::gil_scoped_release release;
    std::memcpy(c.rows + static_cast<size_t>(index_) * c.n * 4, c.x, c.n * 4);
    Clock::time_point now = Clock::now();
    Clock::time_point deadline =
        now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    Clock::time_point spin_until = std::min(now + spin_, deadline);
    return index_ == 0 ? lead(c, spin_until, deadline) : follow(c, spin_until, deadline);
}

int64_t HostTiny::lead(const Call& c, Clock::time_point spin_until, Clock::time_point deadline) {
    if (!gather(c, spin_until, deadline) || !reduce(c)) return kHanded;
    std::string result = pack(Frame{kResult, c.number, 0, 0, c.k_next, {}, -1});
    for (; sent_ < fds_.size(); ++sent_)
        if (!send_all(fds_[sent_], result)) return kSendFailed;
    copy_out(c);
    return c.k_next;
}

// One READY from every other rank, each for this call with this word and its row written.
bool HostTiny::gather(const Call& c, Clock::time_point spin_until, Clock::time_point deadline) {
    polled_.clear();
    for (int fd : fds_) polled_.push_back(pollfd{fd, POLLIN, 0});
    for (size_t got = 0; got < fds_.size();) {
        if (!wait_readable(polled_, spin_until, deadline)) return false;
        for (size_t i = 0; i < polled_.size(); ++i) {
            if (polled_[i].fd < 0 || polled_[i].revents == 0) continue;
            std::optional<Frame> f = read_frame(polled_[i].fd);
            if (!f) return false;
            taken_.emplace_back(static_cast<int>(i) + 1, std::move(*f));
            polled_[i].fd = -1;  // poll(2) skips it from now on
            ++got;
        }
    }
    for (const auto& [i, f] : taken_)
        if (f.kind != kReady || f.call != c.number || f.a != c.word || f.c != 1 || f.fd >= 0)
            return false;
    return true;
}

// host_reduce.py's _reduce for a serial call on one host: false (nothing decided) when a value
// has no fixed point (inf, NaN, |x| >= 2**127): the Python protocol fails the call.
bool HostTiny::reduce(const Call& c) {
    size_t lanes = c.is_float ? c.n * static_cast<size_t>(fixed_limbs(n_workers_)) : c.n;
    std::fill(c.wire, c.wire + lanes, 0);
    limbs_.resize(lanes);
    bool good = true;
    for (int j = 0; j < n_ranks_; ++j) {
        const int32_t* add = static_cast<const int32_t*>(row(c, j));
        if (c.is_float) {
            good = fixed_encode(static_cast<const float*>(row(c, j)), c.n, n_workers_,
                                limbs_.data()) &&
                   good;
            add = limbs_.data();
        }
        for (size_t i = 0; i < lanes; ++i)  // wrapping, as numpy's and the switch's int32 sums
            c.wire[i] = static_cast<int32_t>(static_cast<uint32_t>(c.wire[i]) +
                                             static_cast<uint32_t>(add[i]));
    }
    if (!good) return false;
    if (c.is_float) {
        fixed_decode(c.wire, c.n, n_workers_, c.result);
        if (c.word & 2)
            for (size_t i = 0; i < c.n; ++i) c.result[i] /= static_cast<float>(n_workers_);
    }
    return true;
}

int64_t HostTiny::follow(const Call& c, Clock::time_point spin_until, Clock::time_point deadline) {
    if (!send_all(fds_[0], pack(Frame{kReady, c.number, c.word, 0, 1, {}, -1}))) return kNotSent;
    polled_.assign(1, pollfd{fds_[0], POLLIN, 0});
    if (!wait_readable(polled_, spin_until, deadline)) return kHanded;
    std::optional<Frame> f = read_frame(fds_[0]);
    if (!f) return kHanded;
    if (f->kind != kResult || !f->text.empty() || f->fd >= 0) {
        taken_.emplace_back(0, std::move(*f));
        return kHanded;
    }
    copy_out(c);
    return f->c;
}

void HostTiny::copy_out(const Call& c) const {
    std::memcpy(c.x, c.is_float ? static_cast<const void*>(c.result) : c.wire, c.n * 4);
}

}  // namespace

void bind_host_tiny(nb::module_& m) {
    nb::class_<HostTiny>(m, "HostTiny",
                         "A rank's tiny calls of the host-local reduce (native/host_tiny.cpp)")
        .def(nb::init<std::vector<int>, int, int, int, double>(), nb::arg("fds"), nb::arg("index"),
             nb::arg("n_ranks"), nb::arg("n_workers"), nb::arg("spin"))
        .def("use", &HostTiny::use, nb::arg("buffer"))
        .def("call", &HostTiny::call, nb::arg("number"), nb::arg("word"), nb::arg("x"),
             nb::arg("one_round"), nb::arg("wire_at"), nb::arg("result_at"), nb::arg("k_next"),
             nb::arg("seconds"),
             "One call: the K of the path's next call, or HANDED, NOT_SENT or SEND_FAILED")
        .def("taken", &HostTiny::taken)
        .def("sent", &HostTiny::sent);
    m.attr("TINY_HANDED") = kHanded;
    m.attr("TINY_NOT_SENT") = kNotSent;
    m.attr("TINY_SEND_FAILED") = kSendFailed;
}

}  // namespace inagg

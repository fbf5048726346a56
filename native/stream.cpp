// The worker's window protocol (see stream.hpp and hostlib/worker/stream_reference.py, its
// specification).
#include "stream.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iterator>
#include <stdexcept>
#include <string>

#include "codec.hpp"

namespace inagg {
namespace {

constexpr size_t kBatch = 32;  // datagrams per recvmmsg
// Seconds, before the first RTT sample (rounds.py INITIAL_RTO).
constexpr double kInitialRto = 0.05;
// The longest backoff in RTOs (rounds.py MAX_BACKOFF).
constexpr double kMaxBackoff = 8;
// The RTO never exceeds this many minimum RTTs (rounds.py RTO_OVER_MIN_RTT).
constexpr double kRtoOverMinRtt = 32;
// Seconds a fast retransmission marks the path lossy (rounds.py LOSS_MEMORY).
constexpr double kLossMemory = 1.0;
// answered_ per block: its result came and left the tensor unchanged (an overflowed block), or
// was written in place (its input kept in kept_).
constexpr uint8_t kAnswered = 1, kWritten = 2;

double now_seconds() {
    using namespace std::chrono;
    return duration<double>(steady_clock::now().time_since_epoch()).count();
}

}  // namespace

const char* result_check_name(ResultCheck c) {
    static const char* names[] = {"accepted",     "foreign_source", "truncated",    "not_a_result",
                                  "wrong_job",    "wrong_epoch",    "no_round",     "wrong_set",
                                  "wrong_offset", "wrong_count",    "wrong_length", "wrong_flags",
                                  "wrong_round",  "missing_values"};
    return names[static_cast<size_t>(c)];
}

RttEstimator::RttEstimator(double rto_min, double rto_max)
    : rto_min_(rto_min), rto_max_(rto_max), rto_(std::max(rto_min, kInitialRto)) {}

void RttEstimator::sample(double rtt) {
    if (srtt_ < 0) {
        srtt_ = rtt;
        rttvar_ = rtt / 2;
    } else {
        rttvar_ = 0.75 * rttvar_ + 0.25 * std::fabs(srtt_ - rtt);
        srtt_ = 0.875 * srtt_ + 0.125 * rtt;
    }
    min_rtt_ = std::min(min_rtt_, rtt);
    // capped: a round's RTT holds the other ranks' recovery (see rounds.py RttEstimator)
    rto_ = std::max(rto_min_,
                    std::min({2 * srtt_ + 4 * rttvar_, kRtoOverMinRtt * min_rtt_, rto_max_}));
}

bool LossDetector::delivered(const Transmission& t, double now) {
    bool after_silence = probes_ > 0;
    progress_ = now;
    probe_until_ = -1e300;
    probes_ = 0;
    if (!t.retransmitted && t.sent_at >= newest_sent_) {
        newest_sent_ = t.sent_at;
        newest_rtt_ = now - t.sent_at;
    }
    return after_silence;
}

void LossDetector::restart_timer(Transmission& t, const Transmission& answered, bool after_silence,
                                 double now) const {
    if (after_silence || t.last_sent >= answered.last_sent)
        t.deadline = std::max(t.deadline, now + timeout(now));
}

Loss LossDetector::verdict(const Transmission& t, double now) const {
    if (now >= t.deadline) return Loss::Timeout;
    if (t.last_sent < newest_sent_ &&
        now >= t.last_sent + newest_rtt_ + rtt_.reorder_window(lossy(now)))
        return Loss::Fast;
    return Loss::None;
}

void LossDetector::saw_loss(double now) { lossy_until_ = now + kLossMemory; }

double LossDetector::probe(double now) {
    double rto = std::min(
        {rtt_.rto() * std::ldexp(1.0, probes_ + 1), kMaxBackoff * rtt_.rto(), rtt_.rto_max()});
    ++probes_;
    probe_until_ = now + rto;
    return rto;
}

double LossDetector::next_rto(const Transmission& t, bool backoff, double now) const {
    if (backoff) return std::min({2 * t.rto, kMaxBackoff * timeout(now), rtt_.rto_max()});
    return timeout(now);
}

constexpr double kAlphaGain = 1.0 / 16;  // DCTCP's g (rounds.py ALPHA_GAIN)

void CongestionWindow::on_result(bool was_marked) {
    acked += 1;
    marked += was_marked;
    if (slow_start && !was_marked) size = std::min(size + 1, maximum);
    if (acked < round) return;
    alpha = (1 - kAlphaGain) * alpha + kAlphaGain * double(marked) / acked;
    if (marked) {
        size = std::max(minimum, size * (1 - alpha / 2));
        slow_start = false;
    } else if (!slow_start) {
        size = std::min(size + 1, maximum);
    }
    acked = marked = 0;
    round = size;
    peak = std::max(peak, size);
}

Stream::Stream(int fd, int rank, int n_workers, double rto_min, double rto_max,
               double stall_timeout, double stuck_timeout)
    : socket_(fd), rank_(rank), n_workers_(n_workers), shift_(shift_for(n_workers)),
      stall_timeout_(stall_timeout), stuck_timeout_(stuck_timeout), rtt_(rto_min, rto_max) {
    // A blocking socket waits in recvmmsg itself (MSG_WAITFORONE), at most one scan tick: one
    // system call per batch. A non-blocking one (Python gave it a timeout) is polled when empty.
    int fl = fcntl(fd, F_GETFL);
    timeval tick{};
    tick.tv_sec = static_cast<time_t>(scan_tick());
    tick.tv_usec = static_cast<suseconds_t>((scan_tick() - tick.tv_sec) * 1e6);
    blocking_ = fl >= 0 && !(fl & O_NONBLOCK) &&
                setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tick, sizeof(tick)) == 0;
}

void Stream::set_grant(const GrantView& grant) {
    grant_ = grant;
    next_round_.assign(grant.slot_count, 0);  // every slot of a new grant starts at round 0
    rounds_.assign(grant.slot_count, Round{});
    packet_bytes_ = kHeaderBytes + 4 * size_t(grant.k);
    packets_.assign(packet_bytes_ * grant.slot_count, 0);
    // one spare word per buffer: a longer datagram shows as a wrong length, not a right one
    rx_ = RecvBatch(kBatch, packet_bytes_ + 4);
    rx_next_ = 0;
}

void Stream::start_call(uint32_t window) {
    rounds_.assign(window, Round{});  // buffers for the slots this call uses, not the whole grant
    packets_.resize(packet_bytes_ * window);
    outstanding_ = 0;
    send_queue_.clear();
    overflow_.clear();
    remaining_ = 0;
    part_.clear();  // an allreduce unless stream_blocks says otherwise
    next_scan_ = now_seconds() + scan_tick();
}

std::vector<Range> check_part(const std::vector<std::pair<int64_t, int64_t>>& ranges, size_t size) {
    std::vector<Range> part;
    for (auto [first, end] : ranges) {
        const char* problem = nullptr;
        if (end < first)
            problem = "a range whose end lies before its first value";
        else if (first < 0 || end > static_cast<int64_t>(size))
            problem = "a range outside the tensor";
        else if (first != end && !part.empty() && size_t(first) < part.back().end)
            problem = size_t(first) < part.back().first ? "ranges not sorted by their first value"
                                                        : "ranges that overlap";
        if (problem)
            throw std::invalid_argument("values to keep of a tensor of " + std::to_string(size) +
                                        " values: " + problem +
                                        "; pass sorted, disjoint [first, end) ranges within the "
                                        "tensor's values");
        if (first == end) continue;
        if (!part.empty() && size_t(first) == part.back().end)
            part.back().end = size_t(end);
        else
            part.push_back({size_t(first), size_t(end)});
    }
    return part;
}

bool Stream::owns(size_t offset, size_t count) const {
    // the last range starting at or before offset
    auto after = std::upper_bound(part_.begin(), part_.end(), offset,
                                  [](size_t v, const Range& r) { return v < r.first; });
    return after != part_.begin() && offset + count <= std::prev(after)->end;
}

bool Stream::may_elide(const Round& r) const {
    if (part_.empty() || r.priming || !r.count) return false;
    size_t end = size_t(r.offset) + r.count;
    // the last range starting before the block's end: it ends last of those that might meet it
    auto after = std::lower_bound(part_.begin(), part_.end(), end,
                                  [](const Range& a, size_t v) { return a.first < v; });
    return after == part_.begin() || std::prev(after)->end <= r.offset;
}

void Stream::build(uint32_t idx, uint32_t chunk, bool priming, uint16_t count, int8_t exp,
                   uint8_t flags, double now) {
    Round& r = rounds_[idx];
    r.round = next_round_[idx];
    next_round_[idx] = static_cast<uint8_t>((r.round + 1) % kRoundCycle);
    r.chunk = chunk;
    r.priming = priming;
    r.offset = chunk * grant_.k;
    r.count = count;
    r.length = kHeaderBytes + (count ? 4 * size_t(grant_.k) : 0);
    r.sent_at = r.last_sent = now;
    r.rto = loss_.timeout(now);
    r.deadline = now + r.rto;
    r.retransmitted = false;
    r.active = true;
    ++outstanding_;
    Header h;
    h.msg_type = kMsgContribution;
    h.flags = static_cast<uint8_t>(flags | (r.round >> 1) << kRoundTagShift);
    h.job = grant_.job;
    h.worker = static_cast<uint8_t>(rank_);
    h.exp = exp;
    h.epoch = grant_.epoch;
    h.set = r.round & 1;
    h.slot = grant_.slot_base + idx;
    h.count = count;
    h.offset = r.offset;
    write_header(packet(idx), h);
    if (count) std::fill(payload(idx) + count, payload(idx) + grant_.k, 0u);
    queue_send(idx);
}

void Stream::send_block(const BlockCall& call, uint32_t idx, uint32_t chunk, double now) {
    size_t offset = size_t(chunk) * grant_.k;
    auto count = static_cast<uint16_t>(std::min<size_t>(grant_.k, call.size - offset));
    uint32_t* out = payload(idx);
    uint8_t flags = owns(offset, count) ? kFlagMine : 0;
    int8_t exp = kExpNone;
    if (call.is_float) {
        if (call.bad[chunk]) {
            flags |= kFlagOverflow;
            std::fill(out, out + count, 0u);
        } else {
            quantize_be(element_at(call.data, call.format, offset), call.format, count,
                        agreed_[chunk], shift_, out);
        }
        size_t ahead = size_t(chunk) + call.window;
        size_t n_blocks = agreed_.size();
        exp = ahead < n_blocks ? call.local_exps[ahead] : kExpNone;
    } else {
        const int32_t* x = static_cast<const int32_t*>(call.data) + offset;
        for (size_t i = 0; i < count; ++i) out[i] = htonl(static_cast<uint32_t>(x[i]));
    }
    build(idx, chunk, false, count, exp, flags, now);
}

void Stream::queue_send(uint32_t idx) { send_queue_.push_back(idx); }

// The queued rounds' packets, all to the aggregator, as GSO sends where the socket takes them
// (a window of full rounds walks the stack once per 60 KB instead of once per packet).
void Stream::flush_sends() {
    send_datagrams_.clear();
    for (uint32_t idx : send_queue_)
        send_datagrams_.push_back(Datagram{grant_.aggregator, packet(idx), rounds_[idx].length});
    SendResult result =
        socket_.send(send_datagrams_);  // the rest are lost: loss detection resends them
    if (result.refused)
        throw os_error("sendmmsg to the aggregator on " + socket_.name(), result.refusal);
    size_t sent = result.sent;
    counters_.packets_sent += sent;
    for (size_t i = 0; i < sent; ++i)
        counters_.wire_bytes_sent += send_datagrams_[i].len + grant_.overhead;
    send_queue_.clear();
}

// Fast retransmits and timeouts on a delivering path at once; rounds that timed out on a silent
// path at once on a lossy path, else one probe at a time (stream_reference.py
// SlotStream._resend_lost).
void Stream::resend_lost(double now) {
    bool lossy = loss_.lossy(now);
    uint64_t silent = 0;
    int64_t probe = -1;
    for (uint32_t idx = 0; idx < rounds_.size(); ++idx) {
        Round& r = rounds_[idx];
        Loss loss = r.active ? loss_.verdict(r, now) : Loss::None;
        if (loss == Loss::None) continue;
        bool backoff = loss == Loss::Timeout && loss_.silent(r);
        silent += backoff;
        if (backoff && !lossy) {
            if (probe < 0 || r.last_sent < rounds_[probe].last_sent) probe = idx;
            continue;
        }
        if (loss == Loss::Fast) {
            counters_.fast_retransmissions += 1;
            loss_.saw_loss(now);
        }
        resend(idx, loss_.next_rto(r, backoff, now), now);
    }
    if (probe >= 0) {
        // the episode's probe is pending: the silent rounds wait
        if (!loss_.may_probe(now)) return;
        resend(static_cast<uint32_t>(probe), loss_.probe(now), now);
    }
    if (silent) {
        counters_.backoffs += probe >= 0 ? 1 : silent;
        // half the window or more timing out at once on a silent path: a burst (rounds.py is_burst)
        counters_.bursts += silent >= std::max<uint64_t>(2, rounds_.size() / 2);
    }
}

void Stream::resend(uint32_t idx, double rto, double now) {
    Round& r = rounds_[idx];
    if (!r.retransmitted) {
        packet(idx)[field::kFlags] |= kFlagRetransmit;
        r.retransmitted = true;
    }
    counters_.retransmissions += 1;
    r.rto = rto;
    r.deadline = now + rto;
    r.last_sent = now;
    queue_send(idx);
}

// The next batch of datagrams into rx_: a blocking socket waits in recvmmsg (one scan tick at
// most), a non-blocking one is polled for `wait` seconds when empty.
void Stream::receive_batch(double wait) {
    size_t got = socket_.receive(rx_, blocking_ ? MSG_WAITFORONE : MSG_DONTWAIT);
    if (!got && !blocking_ && socket_.wait(POLLIN, wait)) socket_.receive(rx_, MSG_DONTWAIT);
    rx_next_ = 0;
}

ResultCheck Stream::check(const uint8_t* d, size_t n, const sockaddr_in& from,
                          uint32_t* idx) const {
    if (from.sin_family != AF_INET || from.sin_addr.s_addr != grant_.aggregator.sin_addr.s_addr ||
        from.sin_port != grant_.aggregator.sin_port)
        return ResultCheck::ForeignSource;
    if (n < kHeaderBytes) return ResultCheck::Truncated;
    Header h = read_header(d);
    if (h.version != kVersion || h.msg_type != kMsgResult) return ResultCheck::NotAResult;
    if (h.flags & ~kResultFlags) return ResultCheck::WrongFlags;
    if (h.job != grant_.job) return ResultCheck::WrongJob;
    if (h.epoch != grant_.epoch) return ResultCheck::WrongEpoch;
    if (h.slot < grant_.slot_base || h.slot - grant_.slot_base >= rounds_.size() ||
        !rounds_[h.slot - grant_.slot_base].active)
        return ResultCheck::NoRound;
    *idx = h.slot - grant_.slot_base;
    const Round& r = rounds_[*idx];
    if (h.set != (r.round & 1)) return ResultCheck::WrongSet;
    if (round_tag(h.flags) != r.round >> 1) return ResultCheck::WrongRound;
    if (h.offset != r.offset) return ResultCheck::WrongOffset;
    if (h.count != r.count) return ResultCheck::WrongCount;
    if (n == kHeaderBytes + (h.count ? 4 * size_t(grant_.k) : 0)) return ResultCheck::Accepted;
    if (n != kHeaderBytes) return ResultCheck::WrongLength;
    return may_elide(r) ? ResultCheck::Accepted : ResultCheck::MissingValues;  // values elided
}

bool Stream::await_result(uint32_t* idx, const uint8_t** result, double* progress,
                          double patience) {
    for (;;) {
        while (rx_next_ < rx_.size()) {
            size_t i = rx_next_++;
            const uint8_t* d = rx_.data(i);
            size_t n = rx_.len(i);
            counters_.packets_received += 1;
            counters_.wire_bytes_received += n + grant_.overhead;
            ResultCheck verdict = check(d, n, rx_.from(i), idx);
            if (verdict != ResultCheck::Accepted) {
                counters_.drops[static_cast<size_t>(verdict)] += 1;
                // a late copy the aggregator sent for our retransmission: it was not needed
                if (n > field::kFlags && (d[field::kFlags] & kFlagRetransmit) &&
                    (verdict == ResultCheck::NoRound || verdict == ResultCheck::WrongSet ||
                     verdict == ResultCheck::WrongRound)) {
                    counters_.spurious_retransmissions += 1;
                }
                continue;
            }
            Round& r = rounds_[*idx];
            r.active = false;
            --outstanding_;
            result_len_ = n;
            if (d[field::kFlags] & kFlagFromHost) counters_.host_results += 1;
            bool marked = d[field::kFlags] & kFlagCongestion;
            counters_.congestion_marks += marked;
            cwnd_.on_result(marked);
            double now = now_seconds();
            if (!r.retransmitted) rtt_.sample(now - r.sent_at);
            bool after_silence = loss_.delivered(r, now);
            for (Round& other : rounds_)
                if (other.active) loss_.restart_timer(other, r, after_silence, now);
            *progress = now;
            *result = d;
            return true;
        }
        flush_sends();
        double now = now_seconds();
        // only on a drained socket: after a deschedule, the answers of rounds that look lost
        // may wait in it (stream_reference.py SlotStream._await)
        if (now >= next_scan_ && rx_.size() < kBatch) {
            resend_lost(now);
            flush_sends();
            next_scan_ = now + scan_tick();
        }
        if (aborted_.load(std::memory_order_relaxed) || now - *progress > patience) return false;
        receive_batch(next_scan_ - now);
    }
}

bool Stream::control_round(const int32_t* lanes, size_t n_lanes, int8_t exp0, uint8_t flags,
                           int32_t* summed, int8_t* agreed_exp0, uint8_t* result_flags,
                           double* rtt) {
    start_call(1);
    double start = now_seconds();
    for (size_t i = 0; i < n_lanes; ++i) payload(0)[i] = htonl(static_cast<uint32_t>(lanes[i]));
    build(0, 0, true, static_cast<uint16_t>(n_lanes), exp0, flags, start);
    uint32_t idx = 0;
    const uint8_t* res = nullptr;
    double progress = start;
    if (!await_result(&idx, &res, &progress, stall_timeout_)) return false;
    *rtt = progress - rounds_[0].sent_at;
    for (size_t i = 0; i < n_lanes; ++i)
        summed[i] = static_cast<int32_t>(load_be32(res + kHeaderBytes + 4 * i));
    Header h = read_header(res);
    *agreed_exp0 = h.exp;
    *result_flags = h.flags;
    return true;
}

bool Stream::stream_blocks(const BlockCall& call) {
    start_call(std::min(call.window, grant_.slot_count));
    part_ = call.part;
    size_t k = grant_.k;
    size_t n_blocks = (call.size + k - 1) / k;
    agreed_.assign(call.is_float ? n_blocks : 0, kExpNone);
    if (call.is_float) agreed_[0] = call.exp0;
    answered_.assign(n_blocks, 0);
    size_t bytes = call.size * (call.is_float ? format_bytes(call.format) : 4);
    if (kept_.size() < bytes) kept_.resize(bytes);  // grows once: no zeroing per call
    oldest_ = 0;
    deferred_ = {};
    double now = now_seconds();
    defer(0, 0);
    for (uint32_t i = 1; i < call.window; ++i) {
        if (call.is_float) {  // prime: fetch the agreed exponent of block i
            build(i, i, true, 0, call.local_exps[i], 0, now);
        } else {
            defer(i, i);
        }
    }
    release(call, now);
    remaining_ = n_blocks;
    double progress = now;
    while (remaining_) {
        uint32_t idx = 0;
        const uint8_t* res = nullptr;
        if (!await_result(&idx, &res, &progress, stuck_timeout_)) {
            restore_input(call);
            return false;
        }
        const Round& r = rounds_[idx];
        Header h = read_header(res);
        size_t next = r.priming ? r.chunk : size_t(r.chunk) + call.window;
        if (!r.priming) {
            --remaining_;
            bool overflowed = call.is_float && (h.flags & kFlagOverflow);
            bool elided = result_len_ == kHeaderBytes;  // check() let it in: not this rank's
            answered_[r.chunk] = overflowed || elided ? kAnswered : kWritten;
            while (oldest_ < n_blocks && answered_[oldest_]) ++oldest_;
            if (overflowed) {
                overflow_.push_back(r.chunk);
            } else if (elided) {
                counters_.elided_results += 1;
            } else {
                write_block(call, r, res);
            }
        }
        if (next < n_blocks) {
            if (call.is_float) agreed_[next] = h.exp;
            defer(idx, static_cast<uint32_t>(next));
        }
        release(call, progress);
    }
    flush_sends();
    return true;
}

void Stream::write_block(const BlockCall& call, const Round& r, const uint8_t* result) {
    keep_input(call, r);
    auto values = reinterpret_cast<const uint32_t*>(result + kHeaderBytes);
    if (!call.is_float) {
        int32_t* out = static_cast<int32_t*>(call.data) + r.offset;
        for (size_t i = 0; i < r.count; ++i) out[i] = static_cast<int32_t>(ntohl(values[i]));
        return;
    }
    dequantize_be(values, r.count, agreed_[r.chunk], shift_, call.divisor, call.format,
                  element_at(call.data, call.format, r.offset));
}

// One copy of the block's input while it is in cache (it is read next to be overwritten), not a
// copy of the whole tensor before the call.
void Stream::keep_input(const BlockCall& call, const Round& r) {
    size_t elem = call.is_float ? format_bytes(call.format) : 4;
    std::memcpy(kept_.data() + r.offset * elem, static_cast<uint8_t*>(call.data) + r.offset * elem,
                r.count * elem);
}

void Stream::restore_input(const BlockCall& call) {
    size_t elem = call.is_float ? format_bytes(call.format) : 4;
    size_t k = grant_.k;
    for (size_t c = 0; c < answered_.size(); ++c) {
        if (answered_[c] != kWritten) continue;
        size_t offset = c * k * elem, count = std::min(k, call.size - c * k) * elem;
        std::memcpy(static_cast<uint8_t*>(call.data) + offset, kept_.data() + offset, count);
    }
}

// The deferred blocks that the congestion window allows, smallest first: a block goes when it is
// fewer than the window's size after this rank's oldest unanswered block, so every rank sends the
// blocks in the same order and the oldest one a rank waits for is always sent by all.
void Stream::release(const BlockCall& call, double now) {
    while (!deferred_.empty() && deferred_.top().first < oldest_ + cwnd_.allowed()) {
        auto [chunk, idx] = deferred_.top();
        deferred_.pop();
        send_block(call, idx, chunk, now);
    }
}

std::vector<uint32_t> Stream::waiting_slots() const {
    std::vector<uint32_t> out;
    for (uint32_t i = 0; i < rounds_.size(); ++i)
        if (rounds_[i].active) out.push_back(grant_.slot_base + i);
    return out;
}

}  // namespace inagg

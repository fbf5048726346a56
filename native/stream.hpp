// The worker's stream in C++: the window protocol of
// hostlib/worker/stream_reference.py::SlotStream (the executable specification; read its docstring
// for the protocol) without the Python per-packet cost. Python (hostlib/worker/stream.py, over
// stream_base.py) keeps the parts that run once per call: the control vector's encoding and
// decoding, the window choice and the errors. This class runs the two
// per-packet phases of a call with the GIL released: the control round on slot 0 (which also
// carries a small call's values, so that call is done in one round trip) and the streaming of
// the blocks (priming, one-round-ahead exponents, quantization, result matching, loss detection
// and retransmission, stall timeout), sending and receiving in sendmmsg/recvmmsg batches on
// the UDP socket that Python opened (net.hpp: a socket error raises, a full queue is loss).
#pragma once

#include <netinet/in.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <queue>
#include <utility>
#include <vector>

#include "codec.hpp"
#include "net.hpp"
#include "protocol.hpp"

namespace inagg {

// Verdict on a received datagram; the twin of inagg.hostlib.worker.call_protocol.ResultCheck (same
// order).
enum class ResultCheck : uint8_t {
    Accepted,
    ForeignSource,
    Truncated,
    NotAResult,
    WrongJob,
    WrongEpoch,
    NoRound,
    WrongSet,
    WrongOffset,
    WrongCount,
    WrongLength,
    WrongFlags,    // a flag no aggregator sets on a result (FLAG_FROM_SWITCH, an unknown bit)
    WrongRound,    // the round tag is not the outstanding round's (a result of an older round)
    MissingValues  // values elided for a block this rank must get (its shard's, an allreduce's)
};
constexpr size_t kResultChecks = static_cast<size_t>(ResultCheck::MissingValues) + 1;
const char* result_check_name(ResultCheck c);

struct StreamCounters {
    uint64_t packets_sent = 0, packets_received = 0, wire_bytes_sent = 0, wire_bytes_received = 0;
    uint64_t retransmissions = 0, fast_retransmissions = 0, backoffs = 0, bursts = 0,
             spurious_retransmissions = 0, host_results = 0;
    uint64_t elided_results = 0;    // accepted results without values: another rank's shard
    uint64_t congestion_marks = 0;  // accepted results that carried FLAG_CONGESTION
    std::array<uint64_t, kResultChecks> drops{};  // indexed by ResultCheck (Accepted unused)
};

struct GrantView {
    uint16_t job = 0, epoch = 0;
    uint32_t slot_base = 0, slot_count = 1, k = 1;
    sockaddr_in aggregator{};
    uint32_t overhead = 0;  // wire bytes per datagram below the inagg header
};

// The scan tick is rto_min / 20 (rounds.py TICKS_PER_RTO_MIN).
constexpr double kTicksPerRtoMin = 20;

// RFC 6298 style smoothed RTT -> retransmission timeout, at least rto_min, capped at a few
// minimum RTTs (inagg.hostlib.worker.rounds.RttEstimator: why, and why there is no adaptive floor).
class RttEstimator {
public:
    RttEstimator(double rto_min, double rto_max);
    void sample(double rtt);
    double rto() const { return rto_; }
    // How late a round may be behind a later-sent answered one before it counts as lost
    // (inagg.hostlib.worker.rounds.RttEstimator.reorder_window).
    double reorder_window(bool lossy) const {
        return std::max(lossy ? 0.0 : rto_min_, std::max(srtt_, 0.0)) / 4;
    }
    // How often expired rounds are looked for (inagg.hostlib.worker.rounds.RttEstimator.scan_tick).
    double scan_tick() const { return rto_min_ / kTicksPerRtoMin; }
    // The timeout on a path that is losing rounds
    // (inagg.hostlib.worker.rounds.RttEstimator.lossy_timeout).
    double lossy_timeout() const {
        return srtt_ < 0 ? rto_ : std::min(rto_, std::max(2 * srtt_, scan_tick()));
    }
    double rto_min() const { return rto_min_; }
    double rto_max() const { return rto_max_; }

private:
    double rto_min_, rto_max_, srtt_ = -1.0, rttvar_ = 0.0, min_rtt_ = 1e300, rto_;
};

// A round's transmission times and RTO as loss detection sees them.
struct Transmission {
    double sent_at = 0, last_sent = 0, deadline = 0, rto = 0;  // first and latest transmission
    bool retransmitted = false;
};

enum class Loss : uint8_t { None, Fast, Timeout };

// Time-based loss detection of the rounds in flight (RACK, RFC 8985); the twin of
// inagg.hostlib.worker.rounds.LossDetector (read its docstring for why).
class LossDetector {
public:
    explicit LossDetector(const RttEstimator& rtt) : rtt_(rtt) {}
    // t was answered at now: moves the fast-retransmit reference; the caller then restarts the
    // timers of the rounds still outstanding (restart_timer). Returns whether the answer ended a
    // silent episode (a probe was pending).
    bool delivered(const Transmission& t, double now);
    // The timer of a round still outstanding when `answered` was answered at now: restarted, for
    // an RTO, if it was last sent no earlier than `answered` was (queued behind every copy), or
    // after a silent episode (every round waited out the same stall).
    void restart_timer(Transmission& t, const Transmission& answered, bool after_silence,
                       double now) const;
    Loss verdict(const Transmission& t, double now) const;
    bool silent(const Transmission& t) const { return progress_ <= t.last_sent; }
    // No probe of a silent path is pending.
    bool may_probe(double now) const { return now >= probe_until_; }
    // A probe of a silent path is sent now: its timeout
    // (inagg.hostlib.worker.rounds.LossDetector.probe).
    double probe(double now);
    // A round was fast-retransmitted: the path is lossy for kLossMemory seconds.
    void saw_loss(double now);
    // The timeout of a round sent or restarted now: the RTO, on a lossy path the probe timeout.
    double timeout(double now) const { return lossy(now) ? rtt_.lossy_timeout() : rtt_.rto(); }
    bool lossy(double now) const { return now < lossy_until_; }
    // The RTO of a round resent now (backoff: its RTO expired on a silent path).
    double next_rto(const Transmission& t, bool backoff, double now) const;

private:
    const RttEstimator& rtt_;
    double newest_sent_ = -1e300, newest_rtt_ = 0, progress_ = -1e300, lossy_until_ = -1e300;
    double probe_until_ = -1e300;  // a silent path's probe is pending until then
    int probes_ = 0;               // probes sent since the last answer
};

// A rank's congestion window within a call, DCTCP on the results' congestion marks; the twin
// of inagg.hostlib.worker.rounds.CongestionWindow (read its docstring for why).
struct CongestionWindow {
    double size = 16;  // data rounds this rank may have in flight
    double alpha = 1;  // the estimated fraction of results marked
    bool slow_start = true;
    uint32_t acked = 0, marked = 0;  // results and marked ones since this round trip began
    double round = 16;               // results that make this round trip: the size when it began
    double peak = 0;                 // the largest size since Python last set the goal
    double minimum = 1, maximum = 16;

    void on_result(bool was_marked);
    // How many data rounds from the oldest unanswered one on this rank may be sent.
    uint32_t allowed() const { return static_cast<uint32_t>(std::max(1.0, size)); }
};

// A range [first, end) of a call's values.
struct Range {
    size_t first = 0, end = 0;
};

// `ranges` ([first, end) pairs) of a tensor of `size` values as a reduce-scatter's part: sorted,
// disjoint, none empty, none touching the next. Checked in order: an empty range is left out
// (once it lies in the tensor), one that starts where the one before ends is joined to it; a
// range reversed, outside the tensor, unsorted or overlapping throws std::invalid_argument
// naming the problem. The twin of inagg.hostlib.worker.call_protocol.check_part.
std::vector<Range> check_part(const std::vector<std::pair<int64_t, int64_t>>& ranges, size_t size);

// What a call's block phase streams: the tensor and its exponents (float calls).
struct BlockCall {
    void* data = nullptr;  // int32_t*, or a float tensor's values in `format`
    size_t size = 0;
    bool is_float = false;
    Format format = Format::Float32;
    // Float calls: results are divided by it (an average) before rounding to format.
    float divisor = 1.0f;
    const int8_t* local_exps = nullptr;  // this rank's block exponents (float calls)
    const uint8_t* bad = nullptr;        // blocks holding inf/NaN/too large (float calls)
    int8_t exp0 = kExpNone;              // agreed exponent of block 0 (from the control round)
    uint32_t window = 1;
    // A reduce-scatter: the values this rank keeps, a part as check_part gives it (several
    // ranges for a host's leader whose ranks are not consecutive; none: an allreduce). Blocks
    // wholly in one range carry FLAG_MINE; a block wholly outside all of them may be answered
    // without its values (elided), and is then left as it was.
    std::vector<Range> part;
};

class Stream {
public:
    // No result for stall_timeout ends a control round (a peer late to the call looks the same
    // as a stalled slot), for stuck_timeout a call's blocks (every peer is in the call).
    Stream(int fd, int rank, int n_workers, double rto_min, double rto_max, double stall_timeout,
           double stuck_timeout);

    void set_grant(const GrantView& grant);

    // Slot 0's round with the control packet's lanes (the control vector, then a small call's
    // values), this rank's exponent of block 0 and flags (FLAG_OVERFLOW: a small call's bad
    // value); fills `summed` (same length), the agreed exponent of block 0 and the result's
    // flags. False: no result before the stall timeout.
    bool control_round(const int32_t* lanes, size_t n_lanes, int8_t exp0, uint8_t flags,
                       int32_t* summed, int8_t* agreed_exp0, uint8_t* result_flags, double* rtt);

    // Allreduce the blocks in place. False: stalled (remaining() and waiting_slots() say what),
    // the tensor as it was (restore_input). Blocks whose result carried FLAG_OVERFLOW are left
    // unchanged and listed in overflow(); so are a reduce-scatter's blocks whose values were
    // elided (another rank's shard).
    bool stream_blocks(const BlockCall& call);

    // From another thread: the call in progress returns false (as stalled) at its next tick,
    // and so does every later one (the job failed).
    void abort() { aborted_.store(true, std::memory_order_relaxed); }

    const StreamCounters& counters() const { return counters_; }
    // The congestion window, carried from call to call by Python (WindowControl).
    CongestionWindow& congestion() { return cwnd_; }
    const std::vector<uint32_t>& overflow() const { return overflow_; }
    // After a stall: blocks still missing and the slots waiting for a result.
    size_t remaining() const { return remaining_; }
    std::vector<uint32_t> waiting_slots() const;

private:
    struct Round : Transmission {
        bool active = false, priming = false;
        uint8_t round = 0;  // the slot's round counter mod kRoundCycle: set = low bit, tag = rest
        uint32_t chunk = 0, offset = 0;
        uint16_t count = 0;
        size_t length = 0;  // bytes of the packet in this slot's buffer
    };

    uint8_t* packet(uint32_t idx) { return packets_.data() + idx * packet_bytes_; }
    uint32_t* payload(uint32_t idx) {
        return reinterpret_cast<uint32_t*>(packet(idx) + kHeaderBytes);
    }
    void build(uint32_t idx, uint32_t chunk, bool priming, uint16_t count, int8_t exp,
               uint8_t flags, double now);
    void send_block(const BlockCall& call, uint32_t idx, uint32_t chunk, double now);
    // Block `chunk` may go on slot idx once the congestion window allows it.
    void defer(uint32_t idx, uint32_t chunk) { deferred_.push({chunk, idx}); }
    void release(const BlockCall& call, double now);
    // Before block r's result is written in place: its input, kept in kept_; after a stall,
    // restore_input puts every written block's input back, so the call can run again.
    void keep_input(const BlockCall& call, const Round& r);
    // Block r's result (int32 sums, or dequantized) in place, its input kept first.
    void write_block(const BlockCall& call, const Round& r, const uint8_t* result);
    // A result of round r may come without its values: a data round of a block that meets no
    // range of this rank's reduce-scatter part (the running call's, from its BlockCall).
    bool may_elide(const Round& r) const;
    // Block `offset` of `count` values is wholly in one range of this rank's part: its
    // contribution is MINE.
    bool owns(size_t offset, size_t count) const;
    void restore_input(const BlockCall& call);
    void queue_send(uint32_t idx);
    void flush_sends();
    void resend_lost(double now);
    void resend(uint32_t idx, double rto, double now);
    void receive_batch(double wait);
    ResultCheck check(const uint8_t* data, size_t n, const sockaddr_in& from, uint32_t* idx) const;
    // Receive until some round completes (its slot index in *idx); false on stall.
    // `patience`: seconds without a result that make a stall.
    bool await_result(uint32_t* idx, const uint8_t** result, double* progress, double patience);
    void start_call(uint32_t window);
    // How often expired rounds are looked for (and the longest a receive waits).
    double scan_tick() const { return rtt_.scan_tick(); }

    Socket socket_;
    int rank_, n_workers_, shift_;
    bool blocking_ = false;  // the socket blocks: recvmmsg waits (SO_RCVTIMEO = one scan tick)
    double stall_timeout_, stuck_timeout_;
    std::atomic<bool> aborted_{false};
    RttEstimator rtt_;
    LossDetector loss_{rtt_};
    GrantView grant_;
    std::vector<uint8_t> next_round_;  // per slot: its next round, mod kRoundCycle
    std::vector<Round> rounds_;
    std::vector<uint8_t> packets_;
    size_t packet_bytes_ = 0;
    uint32_t outstanding_ = 0;
    std::vector<uint32_t> send_queue_;
    std::vector<Datagram> send_datagrams_;  // the queued rounds' packets, for socket_.send
    RecvBatch rx_;                          // the received batch
    size_t rx_next_ = 0;                    // the next one of it to look at
    size_t result_len_ = 0;                 // bytes of the result await_result accepted
    std::vector<Range> part_;               // the running call's part (BlockCall)
    double next_scan_ = 0;
    StreamCounters counters_;
    std::vector<int8_t> agreed_;  // agreed block exponents of the running float call
    CongestionWindow cwnd_;
    // per block of the running call: its result came (kAnswered), and was written (kWritten)
    std::vector<uint8_t> answered_;
    std::vector<uint8_t> kept_;  // the written blocks' inputs, at their byte offsets in the tensor
    size_t oldest_ = 0;          // the first block without a result
    // blocks ready to go, (block, slot), smallest block first
    std::priority_queue<std::pair<uint32_t, uint32_t>, std::vector<std::pair<uint32_t, uint32_t>>,
                        std::greater<>>
        deferred_;
    std::vector<uint32_t> overflow_;
    size_t remaining_ = 0;
};

}  // namespace inagg

// Loss and delay on the software switch's ports, where the kernel has no netem (make run's links
// with a "loss" or "delay"): each port drops a seeded, reproducible share of the frames it
// receives (ingress) and of those it sends (egress), holds the others back for the port
// direction's delay, and counts what it saw, dropped and delayed.
//
// A frame's fate is a pure function of (seed, port, direction, its index among the frames that
// port and direction saw): loss_hash below, dropped when the hash is under the loss fraction's
// share of 2^64; the delay is constant per port direction, so held frames leave in the order
// they came (no reordering). So the Python twin (bmv2_env/softswitch/impair.py) decides every
// frame alike, and a run with one seed drops the same frames of the same sequence (what the
// network delivers still varies with the timing of the frames).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

namespace inagg {

// splitmix64's finalizer: a bijection of 64-bit words that mixes every bit into every bit.
uint64_t mix64(uint64_t x);
// The hash deciding frame `n` (0, 1, ...) of `port`'s direction (`egress` or ingress).
uint64_t loss_hash(uint64_t seed, uint16_t port, bool egress, uint64_t n);

class PortImpairments {
public:
    // (port, egress, frames seen, dropped, loss fraction, delay in us, frames delayed) of each
    // impaired direction.
    using Stat = std::tuple<uint16_t, bool, uint64_t, uint64_t, double, int64_t, uint64_t>;
    // What becomes of a frame: dropped, or passed on `delay_us` later (0: at once).
    struct Fate {
        bool dropped;
        int64_t delay_us;
    };

    explicit PortImpairments(uint64_t seed = 0) : seed_(seed) {}
    PortImpairments(const PortImpairments&) = delete;
    PortImpairments& operator=(const PortImpairments&) = delete;
    // Drop `fraction` (0..1) of the frames of `port`'s direction; before the loop starts only
    // (the table is read without a lock). std::invalid_argument outside 0..1.
    void set_loss(uint16_t port, bool egress, double fraction);
    // Hold the frames of `port`'s direction `delay_us` (>= 0) back; before the loop starts.
    void set_delay(uint16_t port, bool egress, int64_t delay_us);
    void set_seed(uint64_t seed) { seed_ = seed; }
    // The fate of the next frame of `port`'s direction; counts it. One thread calls this.
    Fate next(uint16_t port, bool egress);
    std::vector<Stat> stats() const;

private:
    struct Impairment {
        double fraction = 0;
        uint64_t threshold = 0;  // dropped when the hash is below; `all`: every frame
        bool all = false;
        int64_t delay_us = 0;
        std::atomic<uint64_t> seen{0};
        std::atomic<uint64_t> dropped{0};
        std::atomic<uint64_t> delayed{0};
    };
    Impairment& at(uint16_t port, bool egress);
    uint64_t seed_;
    std::map<std::pair<uint16_t, bool>, std::unique_ptr<Impairment>> table_;
};

// Frames held back for their port direction's delay, released in time order (ties: the order
// they were held).
class DelayLine {
public:
    struct Frame {
        uint16_t port;
        bool egress;
        std::vector<uint8_t> bytes;
    };
    void hold(int64_t release_us, uint16_t port, bool egress, const uint8_t* data, size_t len);
    bool empty() const { return held_.empty(); }
    // The earliest release time of a held frame (the line is not empty).
    int64_t next_release() const { return held_.begin()->first.first; }
    // The frames due at `now_us`, earliest first, out of the line.
    std::vector<Frame> take_due(int64_t now_us);

private:
    std::map<std::pair<int64_t, uint64_t>, Frame> held_;
    uint64_t seq_ = 0;
};

}  // namespace inagg

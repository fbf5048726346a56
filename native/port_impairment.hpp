// Impairments on the software switch's ports, where the kernel has no netem (make run's links with
// a "loss", "delay", "jitter", "duplicate" or "reorder"): each impaired port direction drops a
// seeded, reproducible share of its frames, holds the others back for its delay (plus a jitter
// drawn per frame), sends a share of them twice, lets a share leave at once ahead of the held
// ones (netem's reorder), and counts what it saw, dropped, delayed, duplicated, and what left
// behind a frame that came after it (reordered: measured as frames leave, jitter's too).
//
// A frame's fate is a pure function of (seed, port, direction, its index n among the frames
// that port and direction saw, the decision): impair_hash below, one independent draw per
// decision (salt). So the Python twin (bmv2_env/softswitch/impair.py) decides every frame alike,
// and a run with one seed treats the same frames of the same sequence alike (what the network
// delivers still varies with the timing of the frames).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

namespace inagg {

// splitmix64's finalizer: a bijection of 64-bit words that mixes every bit into every bit.
uint64_t mix64(uint64_t x);
// The decisions' draws (salts) for one frame.
enum Draw : uint64_t {
    kLossDraw = 0,
    kDuplicateDraw = 1,
    kReorderDraw = 2,
    kJitterDraw = 3,
    kCopyJitterDraw = 4
};
// The draw `salt` of frame `n` (0, 1, ...) of `port`'s direction (`egress` or ingress).
uint64_t impair_hash(uint64_t seed, uint16_t port, bool egress, uint64_t n, uint64_t salt);

// A share of frames, decided by a draw: hit when the draw is below fraction * 2^64.
struct Share {
    double fraction = 0;
    uint64_t threshold = 0;
    bool all = false;  // fraction 1: every frame
    // std::invalid_argument outside 0..1, naming `what`.
    void set(double f, const char* what);
    bool hit(uint64_t draw) const { return all || draw < threshold; }
};

class PortImpairments {
public:
    // What one impaired direction was asked and what it did.
    struct Stat {
        uint16_t port;
        bool egress;
        uint64_t seen, dropped, delayed, duplicated, reordered;
        double loss, duplicate, reorder;  // fractions asked
        int64_t delay_us, jitter_us;      // asked
    };
    // What becomes of a frame: dropped, or passed on `delay_us` later (0: at once), and when
    // `duplicated`, a copy too, `copy_delay_us` later. `n`: its index, for left().
    struct Fate {
        bool dropped;
        int64_t delay_us;
        bool duplicated;
        int64_t copy_delay_us;
        uint64_t n;
    };

    explicit PortImpairments(uint64_t seed = 0) : seed_(seed) {}
    PortImpairments(const PortImpairments&) = delete;
    PortImpairments& operator=(const PortImpairments&) = delete;
    // The setters run before the loop starts only (the table is read without a lock); each
    // throws std::invalid_argument on a value out of range (fractions 0..1, times >= 0).
    void set_loss(uint16_t port, bool egress, double fraction);
    void set_delay(uint16_t port, bool egress, int64_t delay_us);
    // Each frame's delay drawn uniformly in delay +- jitter_us (whole us, at least 0).
    void set_jitter(uint16_t port, bool egress, int64_t jitter_us);
    void set_duplicate(uint16_t port, bool egress, double fraction);
    // This share of the frames leaves at once instead of after the delay (netem's reorder).
    void set_reorder(uint16_t port, bool egress, double fraction);
    void set_seed(uint64_t seed) { seed_ = seed; }
    // The fate of the next frame of `port`'s direction; counts it. One thread calls this.
    Fate next(uint16_t port, bool egress);
    // Frame `n` of `port`'s direction (or its copy) leaves now: reordered when a later one of
    // that direction already left. The thread of next() calls this.
    void left(uint16_t port, bool egress, uint64_t n);
    std::vector<Stat> stats() const;

private:
    struct Impairment {
        Share loss, duplicate, reorder;
        int64_t delay_us = 0, jitter_us = 0;
        int64_t latest_left = -1;  // the highest index that left yet
        std::atomic<uint64_t> seen{0}, dropped{0}, delayed{0}, duplicated{0}, reordered{0};
    };
    Impairment& at(uint16_t port, bool egress);
    int64_t delay_of(const Impairment& imp, uint16_t port, bool egress, uint64_t n,
                     uint64_t salt) const;
    uint64_t seed_;
    std::map<std::pair<uint16_t, bool>, std::unique_ptr<Impairment>> table_;
};

// Frames held back for their port direction's delay, released in time order (ties: the order
// they were held); jitter makes a later frame's release come first (reordering, as netem's
// time-sorted queue does).
class DelayLine {
public:
    struct Frame {
        uint16_t port;
        bool egress;
        uint64_t n;  // its index in its port direction (PortImpairments::Fate::n)
        std::vector<uint8_t> bytes;
    };
    void hold(int64_t release_us, uint16_t port, bool egress, uint64_t n, const uint8_t* data,
              size_t len);
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

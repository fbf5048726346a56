// Loss on the software switch's ports, where the kernel has no netem (make run's links with a
// "loss"): each port drops a seeded, reproducible share of the frames it receives (ingress) and
// of those it sends (egress), and counts what it saw and dropped.
//
// A frame's fate is a pure function of (seed, port, direction, its index among the frames that
// port and direction saw): loss_hash below, dropped when the hash is under the loss fraction's
// share of 2^64. So the Python twin (bmv2_env/softswitch/impair.py) decides every frame alike,
// and a run with one seed drops the same frames of the same sequence (what the network delivers
// still varies with the timing of the frames).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

namespace inagg {

// splitmix64's finalizer: a bijection of 64-bit words that mixes every bit into every bit.
uint64_t mix64(uint64_t x);
// The hash deciding frame `n` (0, 1, ...) of `port`'s direction (`egress` or ingress).
uint64_t loss_hash(uint64_t seed, uint16_t port, bool egress, uint64_t n);

class PortImpairments {
public:
    // (port, egress, frames seen, frames dropped, loss fraction) of each impaired direction.
    using Stat = std::tuple<uint16_t, bool, uint64_t, uint64_t, double>;

    explicit PortImpairments(uint64_t seed = 0) : seed_(seed) {}
    PortImpairments(const PortImpairments&) = delete;
    PortImpairments& operator=(const PortImpairments&) = delete;
    // Drop `fraction` (0..1) of the frames of `port`'s direction; before the loop starts only
    // (the table is read without a lock). std::invalid_argument outside 0..1.
    void set_loss(uint16_t port, bool egress, double fraction);
    void set_seed(uint64_t seed) { seed_ = seed; }
    // Whether the next frame of `port`'s direction is dropped; counts it. One thread calls this.
    bool drop(uint16_t port, bool egress);
    bool empty() const { return loss_.empty(); }
    std::vector<Stat> stats() const;

private:
    struct Loss {
        double fraction = 0;
        uint64_t threshold = 0;  // dropped when the hash is below; `all`: every frame
        bool all = false;
        std::atomic<uint64_t> seen{0};
        std::atomic<uint64_t> dropped{0};
    };
    uint64_t seed_;
    std::map<std::pair<uint16_t, bool>, std::unique_ptr<Loss>> loss_;
};

}  // namespace inagg

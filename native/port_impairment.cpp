// Loss and delay on the software switch's ports (see port_impairment.hpp).
#include "port_impairment.hpp"

#include <cmath>
#include <stdexcept>

namespace inagg {

uint64_t mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

uint64_t loss_hash(uint64_t seed, uint16_t port, bool egress, uint64_t n) {
    uint64_t stream = seed ^ (uint64_t(port) << 49) ^ (uint64_t(egress) << 48);
    return mix64(mix64(stream) + n);
}

PortImpairments::Impairment& PortImpairments::at(uint16_t port, bool egress) {
    auto& entry = table_[{port, egress}];
    if (!entry) entry = std::make_unique<Impairment>();
    return *entry;
}

void PortImpairments::set_loss(uint16_t port, bool egress, double fraction) {
    if (!(fraction >= 0.0 && fraction <= 1.0))
        throw std::invalid_argument("port loss: the fraction must be in 0..1");
    Impairment& imp = at(port, egress);
    imp.fraction = fraction;
    imp.all = fraction >= 1.0;
    // exact: a double times 2^64, truncated (the twin's int(fraction * 2**64))
    imp.threshold = imp.all ? 0 : uint64_t(std::ldexp(fraction, 64));
}

void PortImpairments::set_delay(uint16_t port, bool egress, int64_t delay_us) {
    if (delay_us < 0) throw std::invalid_argument("port delay: must be >= 0 us");
    at(port, egress).delay_us = delay_us;
}

PortImpairments::Fate PortImpairments::next(uint16_t port, bool egress) {
    auto it = table_.find({port, egress});
    if (it == table_.end()) return {false, 0};
    Impairment& imp = *it->second;
    uint64_t n = imp.seen.fetch_add(1, std::memory_order_relaxed);
    if (imp.all || loss_hash(seed_, port, egress, n) < imp.threshold) {
        imp.dropped.fetch_add(1, std::memory_order_relaxed);
        return {true, 0};
    }
    if (imp.delay_us) imp.delayed.fetch_add(1, std::memory_order_relaxed);
    return {false, imp.delay_us};
}

std::vector<PortImpairments::Stat> PortImpairments::stats() const {
    std::vector<Stat> out;
    for (const auto& [key, imp] : table_)
        out.emplace_back(key.first, key.second, imp->seen.load(), imp->dropped.load(),
                         imp->fraction, imp->delay_us, imp->delayed.load());
    return out;
}

void DelayLine::hold(int64_t release_us, uint16_t port, bool egress, const uint8_t* data,
                     size_t len) {
    held_.emplace(std::make_pair(release_us, seq_++),
                  Frame{port, egress, std::vector<uint8_t>(data, data + len)});
}

std::vector<DelayLine::Frame> DelayLine::take_due(int64_t now_us) {
    std::vector<Frame> due;
    while (!held_.empty() && held_.begin()->first.first <= now_us) {
        due.push_back(std::move(held_.begin()->second));
        held_.erase(held_.begin());
    }
    return due;
}

}  // namespace inagg

// Impairments on the software switch's ports (see port_impairment.hpp).
#include "port_impairment.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace inagg {

uint64_t mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

uint64_t impair_hash(uint64_t seed, uint16_t port, bool egress, uint64_t n, uint64_t salt) {
    uint64_t stream = seed ^ (uint64_t(port) << 49) ^ (uint64_t(egress) << 48);
    return mix64(mix64(stream + salt * 0xD1B54A32D192ED03ULL) + n);
}

void Share::set(double f, const char* what) {
    if (!(f >= 0.0 && f <= 1.0))
        throw std::invalid_argument(std::string("port ") + what + ": the fraction must be in 0..1");
    fraction = f;
    all = f >= 1.0;
    // exact: a double times 2^64, truncated (the twin's int(fraction * 2**64))
    threshold = all ? 0 : uint64_t(std::ldexp(f, 64));
}

PortImpairments::Impairment& PortImpairments::at(uint16_t port, bool egress) {
    auto& entry = table_[{port, egress}];
    if (!entry) entry = std::make_unique<Impairment>();
    return *entry;
}

void PortImpairments::set_loss(uint16_t port, bool egress, double fraction) {
    at(port, egress).loss.set(fraction, "loss");
}

void PortImpairments::set_delay(uint16_t port, bool egress, int64_t delay_us) {
    if (delay_us < 0) throw std::invalid_argument("port delay: must be >= 0 us");
    at(port, egress).delay_us = delay_us;
}

void PortImpairments::set_jitter(uint16_t port, bool egress, int64_t jitter_us) {
    if (jitter_us < 0) throw std::invalid_argument("port jitter: must be >= 0 us");
    at(port, egress).jitter_us = jitter_us;
}

void PortImpairments::set_duplicate(uint16_t port, bool egress, double fraction) {
    at(port, egress).duplicate.set(fraction, "duplicate");
}

void PortImpairments::set_reorder(uint16_t port, bool egress, double fraction) {
    at(port, egress).reorder.set(fraction, "reorder");
}

// A kept frame's delay: the direction's, +- its jitter drawn uniformly (whole us), at least 0.
int64_t PortImpairments::delay_of(const Impairment& imp, uint16_t port, bool egress, uint64_t n,
                                  uint64_t salt) const {
    if (!imp.jitter_us) return imp.delay_us;
    uint64_t span = uint64_t(2 * imp.jitter_us + 1);
    int64_t offset = int64_t(impair_hash(seed_, port, egress, n, salt) % span) - imp.jitter_us;
    return std::max<int64_t>(0, imp.delay_us + offset);
}

PortImpairments::Fate PortImpairments::next(uint16_t port, bool egress) {
    auto it = table_.find({port, egress});
    if (it == table_.end()) return {false, 0, false, 0, 0};
    Impairment& imp = *it->second;
    uint64_t n = imp.seen.fetch_add(1, std::memory_order_relaxed);
    if (imp.loss.hit(impair_hash(seed_, port, egress, n, kLossDraw))) {
        imp.dropped.fetch_add(1, std::memory_order_relaxed);
        return {true, 0, false, 0, n};
    }
    bool at_once = imp.reorder.fraction > 0 &&
                   imp.reorder.hit(impair_hash(seed_, port, egress, n, kReorderDraw));
    Fate fate{false, at_once ? 0 : delay_of(imp, port, egress, n, kJitterDraw), false, 0, n};
    fate.duplicated = imp.duplicate.fraction > 0 &&
                      imp.duplicate.hit(impair_hash(seed_, port, egress, n, kDuplicateDraw));
    if (fate.duplicated) {
        fate.copy_delay_us = at_once ? 0 : delay_of(imp, port, egress, n, kCopyJitterDraw);
        imp.duplicated.fetch_add(1, std::memory_order_relaxed);
    }
    if (fate.delay_us) imp.delayed.fetch_add(1, std::memory_order_relaxed);
    return fate;
}

void PortImpairments::left(uint16_t port, bool egress, uint64_t n) {
    auto it = table_.find({port, egress});
    if (it == table_.end()) return;
    Impairment& imp = *it->second;
    if (int64_t(n) < imp.latest_left)
        imp.reordered.fetch_add(1, std::memory_order_relaxed);
    else
        imp.latest_left = int64_t(n);
}

std::vector<PortImpairments::Stat> PortImpairments::stats() const {
    std::vector<Stat> out;
    for (const auto& [key, imp] : table_)
        out.push_back(Stat{key.first, key.second, imp->seen.load(), imp->dropped.load(),
                           imp->delayed.load(), imp->duplicated.load(), imp->reordered.load(),
                           imp->loss.fraction, imp->duplicate.fraction, imp->reorder.fraction,
                           imp->delay_us, imp->jitter_us});
    return out;
}

void DelayLine::hold(int64_t release_us, uint16_t port, bool egress, uint64_t n,
                     const uint8_t* data, size_t len) {
    held_.emplace(std::make_pair(release_us, seq_++),
                  Frame{port, egress, n, std::vector<uint8_t>(data, data + len)});
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

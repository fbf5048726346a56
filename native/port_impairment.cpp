// Loss on the software switch's ports (see port_impairment.hpp).
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

void PortImpairments::set_loss(uint16_t port, bool egress, double fraction) {
    if (!(fraction >= 0.0 && fraction <= 1.0))
        throw std::invalid_argument("port loss: the fraction must be in 0..1");
    auto loss = std::make_unique<Loss>();
    loss->fraction = fraction;
    loss->all = fraction >= 1.0;
    // exact: a double times 2^64, truncated (the twin's int(fraction * 2**64))
    loss->threshold = loss->all ? 0 : uint64_t(std::ldexp(fraction, 64));
    loss_[{port, egress}] = std::move(loss);
}

bool PortImpairments::drop(uint16_t port, bool egress) {
    auto it = loss_.find({port, egress});
    if (it == loss_.end()) return false;
    Loss& loss = *it->second;
    uint64_t n = loss.seen.fetch_add(1, std::memory_order_relaxed);
    bool dropped = loss.all || loss_hash(seed_, port, egress, n) < loss.threshold;
    if (dropped) loss.dropped.fetch_add(1, std::memory_order_relaxed);
    return dropped;
}

std::vector<PortImpairments::Stat> PortImpairments::stats() const {
    std::vector<Stat> out;
    for (const auto& [key, loss] : loss_)
        out.emplace_back(key.first, key.second, loss->seen.load(), loss->dropped.load(),
                         loss->fraction);
    return out;
}

}  // namespace inagg

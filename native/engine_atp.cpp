// ATP's aggregator sharing in the slot engine: the switch's hashed pool and the host
// aggregator's rule for a switch's sum. The twin of hostlib/aggregator/atp_reference.py, whose
// docstring holds the decision table and why each row is exact; keep them in step.
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "checksums.hpp"
#include "engine.hpp"

namespace inagg {
namespace {

// A round's owner tag, never 0: job 16 | epoch 16 | slot 15 | set 1 | round tag 3 bits.
uint64_t atp_identity(const Header& h) {
    return uint64_t(h.job) << 35 | uint64_t(h.epoch) << 19 | uint64_t(h.slot) << 4 |
           uint64_t(h.set) << 3 | round_tag(h.flags);
}

// Each job's offset into the pool: job * 2^32 / golden ratio (atp_reference.py JOB_SPREAD).
constexpr uint32_t kJobSpread = 0x9E3779B1;

// The pool slot of a round: CRC-32 (zlib's) of its identity's 8 big-endian bytes plus the job's
// offset (mod 2^32: CRC is linear, so without it two jobs' rounds could alias round for round),
// modulo the pool.
uint32_t atp_aggregator(uint64_t identity, int64_t base, int64_t count) {
    uint8_t bytes[8];
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<uint8_t>(identity >> (56 - 8 * i));
    uint32_t spread = static_cast<uint32_t>(identity >> 35) * kJobSpread;
    return static_cast<uint32_t>(base +
                                 uint32_t(crc32(bytes, sizeof bytes) + spread) % uint64_t(count));
}

bool overlaps_pool(int64_t base, int64_t count, const JobConfig& job) {
    return count && base < job.slot_base + job.slot_count && job.slot_base < base + count;
}

std::string range_text(int64_t base, int64_t count) {
    return "[" + std::to_string(base) + ", " + std::to_string(base + count) + ")";
}

}  // namespace

void Engine::set_atp_pool(int64_t base, int64_t count) {
    if (result_flags_) {
        throw std::invalid_argument(
            "the ATP pool is a switch's: the host aggregator takes its ATP jobs' rounds in their "
            "own slots");
    }
    if (count < 0 || base < 0 || base + count > n_slots_) {
        throw std::invalid_argument("ATP pool " + range_text(base, count) + " outside the " +
                                    std::to_string(n_slots_) + " slots");
    }
    for (const auto& [id, job] : jobs_) {
        if (!job.has_atp_peer && overlaps_pool(base, count, job)) {
            throw std::invalid_argument("ATP pool " + range_text(base, count) + " overlaps job " +
                                        std::to_string(id) + "'s window " +
                                        range_text(job.slot_base, job.slot_count));
        }
    }
    bool atp_jobs = std::any_of(jobs_.begin(), jobs_.end(),
                                [](const auto& entry) { return entry.second.has_atp_peer; });
    if (!count && atp_jobs) {
        throw std::invalid_argument("ATP jobs are configured: remove them before the pool");
    }
    pool_base_ = base;
    pool_count_ = count;
    std::fill(pool_round_.begin() + base, pool_round_.begin() + base + count, 0);
}

size_t Engine::atp_held() const {
    size_t held = 0;
    for (int64_t a = pool_base_; a < pool_base_ + pool_count_; ++a)
        held += !atp_free(pool_round_[a]);
    return held;
}

// A job fits the switch's ATP pool: an ATP job needs a pool, a window job stays out of it.
void Engine::check_atp(const JobConfig& job) const {
    if (result_flags_) return;
    std::string name = "job " + std::to_string(job.job_id) + ": ";
    if (job.has_atp_peer && !pool_count_) {
        throw std::invalid_argument(name +
                                    "an ATP job needs the switch's ATP pool: set_atp_pool first");
    }
    if (!job.has_atp_peer && overlaps_pool(pool_base_, pool_count_, job)) {
        throw std::invalid_argument(name + "slots " + range_text(job.slot_base, job.slot_count) +
                                    " overlap the ATP pool");
    }
}

// Two jobs' windows overlap (an ATP job's slots on a switch are the host's: none here).
bool Engine::shares_slots(const JobConfig& a, const JobConfig& b) const {
    bool on_switch_atp = !result_flags_ && (a.has_atp_peer || b.has_atp_peer);
    return !on_switch_atp && a.slot_base < b.slot_base + b.slot_count &&
           b.slot_base < a.slot_base + a.slot_count;
}

// An ATP job's packet from the other end: on a switch the host aggregator's RESULT, on the host
// aggregator the switch's sum.
bool Engine::from_peer(const JobConfig& job, const Header& h) const {
    if (!job.has_atp_peer) return false;
    if (result_flags_) return h.msg_type == kMsgContribution && (h.flags & kFlagFromSwitch);
    return h.msg_type == kMsgResult;
}

// No owner, or one whose job or epoch is gone (a stall's fresh epoch frees its rounds).
bool Engine::atp_free(uint64_t owner) const {
    if (!owner) return true;
    const JobConfig* job = this->job(static_cast<uint16_t>(owner >> 35));
    return !job || !job->has_atp_peer || job->epoch != int64_t((owner >> 19) & 0xFFFF);
}

// One admitted packet of an ATP job at the switch (atp_reference.py: AtpSharing._atp_switch).
Emit Engine::atp_switch(const JobConfig& job, JobCounters& ctr, const Header& h,
                        const uint8_t* data, size_t len, uint8_t* out) {
    uint64_t ident = atp_identity(h);
    uint32_t a = atp_aggregator(ident, pool_base_, pool_count_);
    Emit up{h.job, kUpstream, len};  // the packet itself, up to the host aggregator
    if (h.msg_type == kMsgResult) {  // ACK: the host's result passes
        if (pool_round_[a] == ident) pool_round_[a] = 0;
        last_outcome_ = Outcome::Ack;
        return Emit{};
    }
    SetState& set = sets_[h.set];
    if (pool_round_[a] != ident) {
        if (!atp_free(pool_round_[a])) {  // COLLISION
            ctr.collisions += 1;
            last_outcome_ = Outcome::Collision;
            std::memcpy(out, data, len);
            return up;
        }
        pool_round_[a] = ident;  // FIRST, mirrored up
        set.bitmap[a] = 0;
        Header at = h;
        at.slot = a;
        last_outcome_ = Outcome::First;
        accumulate(set, at, data + kHeaderBytes, true);
        Emit sum = atp_joined(job, ctr, h, a, out);
        if (sum.length) return sum;
        std::memcpy(out, data, len);
        return up;
    }
    if (set.offset[a] != h.offset || set.count[a] != h.count) {
        return drop_job(ctr, Outcome::BadRound);
    }
    bool done = set.seen[a] == job.members.size();
    if (set.bitmap[a] & (1u << h.worker)) {
        ctr.duplicates += 1;
        if (!done) {  // the host may hold it complete
            last_outcome_ = Outcome::DupPending;
            std::memcpy(out, data, len);
            return up;
        }
        last_outcome_ = Outcome::DupUpstream;
        return atp_up_sum(job, h, a, kFlagRetransmit, out);
    }
    Header at = h;  // ADD
    at.slot = a;
    last_outcome_ = Outcome::Add;
    accumulate(set, at, data + kHeaderBytes, false);
    return atp_joined(job, ctr, h, a, out);
}

// After FIRST/ADD on aggregator a: the worker's bit; the sum up when all are in.
Emit Engine::atp_joined(const JobConfig& job, JobCounters& ctr, const Header& h, uint32_t a,
                        uint8_t* out) {
    SetState& set = sets_[h.set];
    set.bitmap[a] |= 1u << h.worker;
    ctr.aggregated += 1;
    if (set.seen[a] < job.members.size()) {
        return Emit{};
    }
    ctr.results += 1;
    return atp_up_sum(job, h, a, 0, out);
}

// Aggregator a's complete sum as worker h.worker's contribution to the host, in the round's own
// wire slot and set.
Emit Engine::atp_up_sum(const JobConfig& job, const Header& h, uint32_t a, uint8_t extra_flags,
                        uint8_t* out) const {
    Header sum;
    sum.msg_type = kMsgContribution;
    sum.flags = sets_[h.set].flags[a] | kFlagFromSwitch | extra_flags;
    sum.worker = h.worker;
    sum.slot = h.slot;
    return Emit{h.job, kUpstream, write_round(a, h.set, job, sum, out)};
}

// A switch's complete sum of an ATP job's round at the host aggregator
// (atp_reference.py: AtpSharing._switch_sum).
Emit Engine::switch_sum(const JobConfig& job, JobCounters& ctr, const Header& h,
                        const uint8_t* payload, uint8_t* out) {
    claim_slot(h);  // a new grant's slot: reset first
    uint32_t slot = h.slot;
    SetState& set = sets_[h.set];
    uint8_t tag = round_tag(h.flags), stored = set.round[slot];
    uint32_t n = static_cast<uint32_t>(job.members.size());
    bool busy = set.bitmap[slot] != 0;
    bool same_round = set.offset[slot] == h.offset && set.count[slot] == h.count;
    if (tag == stored) {
        if (!busy) return drop_job(ctr, Outcome::StaleRound);  // all moved on
        if (!same_round) return drop_job(ctr, Outcome::BadRound);
        if (set.seen[slot] == n) {  // DUP_DONE: answer the resender
            return duplicate(job, ctr, h, RoundState{true, true, false}, out);
        }
    } else if (stored != kRoundTags && tag != (stored + 1) % kRoundTags) {
        return drop_job(ctr, Outcome::StaleRound);
    } else if (busy) {  // the set's round still has workers
        return drop_job(ctr, Outcome::BadRound);
    }
    accumulate(set, h, payload, true);
    last_outcome_ = Outcome::SwitchSum;
    uint32_t every = n == 32 ? ~0u : (1u << n) - 1;
    set.seen[slot] = n;
    set.bitmap[slot] = every;
    sets_[1 - h.set].bitmap[slot] &= ~every;
    ctr.aggregated += 1;
    ctr.results += 1;
    return every_member(job, slot, h.set, h.worker, out);
}

// The host aggregator's header-only RESULT of a stale packet's round, to the switch alone: the ACK
// that frees whatever aggregator a late copy of it claimed there (atp_reference.py:
// AtpSharing._atp_release).
Emit Engine::atp_release(const JobConfig& job, const Header& h, uint8_t* out) const {
    Header r;
    r.msg_type = kMsgResult;
    r.flags = kFlagFromHost | (h.flags & kRoundTagMask);
    r.job = h.job;
    r.worker = h.worker;
    r.epoch = static_cast<uint16_t>(job.epoch);
    r.set = h.set;
    r.slot = h.slot;
    r.offset = h.offset;
    write_header(out, r);
    return Emit{h.job, kUpstream, kHeaderBytes};
}

}  // namespace inagg

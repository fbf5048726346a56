// The slot engine (see engine.hpp for why it exists). Each step below names the line of the
// Python engine's decision table (hostlib/aggregator/engine_reference.py) it implements; keep
// them in step.
#include "engine.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "value_loops.hpp"

namespace inagg {
namespace {

constexpr uint8_t kStickyFlags = kFlagOverflow | kFlagCongestion;
// A reset set's round tag: none yet, so its first opener's tag is its next (after a switch lost its
// slot state the workers are at any round; engine_reference.py ROUND_UNSET).
constexpr uint8_t kRoundUnset = kRoundTags;
// A set's owner when every member must get the values although some rank marked FLAG_MINE: a
// second rank did too, or a child switch's partial sum is in (engine_reference.py SHARED_ROUND).
constexpr int8_t kSharedRound = -2;

// The value loops: free functions over plain pointers and a local count, so the compiler sees
// that the stores cannot change the count (in a member function they could alias k_) and
// vectorizes them (value_loops.hpp).
INAGG_VALUE_LOOP void load_values(int32_t* values, const uint8_t* payload, uint32_t k) {
    for (size_t i = 0; i < k; ++i) values[i] = static_cast<int32_t>(load_be32(payload + 4 * i));
}

// int32 wrap-around sums, as the switch's registers do.
INAGG_VALUE_LOOP void add_values(int32_t* values, const uint8_t* payload, uint32_t k) {
    for (size_t i = 0; i < k; ++i)
        values[i] =
            static_cast<int32_t>(static_cast<uint32_t>(values[i]) + load_be32(payload + 4 * i));
}

INAGG_VALUE_LOOP void store_values(uint8_t* out, const int32_t* values, uint32_t k) {
    for (size_t i = 0; i < k; ++i) store_be32(out + 4 * i, static_cast<uint32_t>(values[i]));
}

std::string members_text(const std::vector<SenderId>& members) {
    std::string text = "(";
    for (size_t i = 0; i < members.size(); ++i) {
        text += (i ? ", " : "") + std::to_string(members[i]);
    }
    return text + (members.size() == 1 ? ",)" : ")");
}

std::string slots_text(const JobConfig& job) {
    return "[" + std::to_string(job.slot_base) + ", " +
           std::to_string(job.slot_base + job.slot_count) + ")";
}

// JobConfig.validate: the first bad field, with the Python engine's message. `n_slots`: the
// slots its range must fit (the host's for an ATP job on a switch: slot_space in Python).
void validate(const JobConfig& job, uint32_t n_slots) {
    std::string name = "job " + std::to_string(job.job_id) + ": ";
    if (job.job_id < 1 || job.job_id > 0xFFFF) {
        throw std::invalid_argument(name + "job_id must be in 1..65535");
    }
    if (job.epoch < 0 || job.epoch > 0xFFFF) {
        throw std::invalid_argument(name + "epoch must be in 0..65535");
    }
    size_t n = job.members.size();
    if (n < 1 || n > kMaxWorkers) {
        throw std::invalid_argument(name + "needs 1.." + std::to_string(kMaxWorkers) +
                                    " workers, got " + std::to_string(n));
    }
    std::vector<SenderId> sorted = job.members;
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
        throw std::invalid_argument(name + "duplicate worker addresses " +
                                    members_text(job.members));
    }
    if (job.slot_count < 1 || job.slot_base < 0 || job.slot_base + job.slot_count > n_slots) {
        throw std::invalid_argument(name + "slots " + slots_text(job) + " outside the pool of " +
                                    std::to_string(n_slots));
    }
    if (job.n_children < 0 || job.n_children > int64_t(n)) {
        throw std::invalid_argument(name + "n_children must be in 0.." + std::to_string(n));
    }
    if (job.has_atp_peer && (job.has_uplink || job.n_children)) {
        throw std::invalid_argument(name +
                                    "ATP sharing and an aggregation tree do not mix: give the job "
                                    "an atp_peer or an uplink, not both");
    }
    if (!job.has_uplink) return;
    const Uplink& up = job.uplink;
    if (up.rank < 0 || up.rank >= int64_t(kMaxWorkers)) {
        throw std::invalid_argument(name + "uplink rank must be in 0.." +
                                    std::to_string(kMaxWorkers - 1));
    }
    if (up.slot_base < 0 || up.slot_base > int64_t(kMaxSlot) + 1 - job.slot_count) {
        throw std::invalid_argument(name + "the parent's slots [" + std::to_string(up.slot_base) +
                                    ", " + std::to_string(up.slot_base + job.slot_count) +
                                    ") are outside 0.." + std::to_string(kMaxSlot));
    }
}

}  // namespace

const char* outcome_name(Outcome outcome) {
    static constexpr std::array<const char*, kOutcomes> names = {
        "",           "first",        "add",       "stale_round", "dup_pending", "dup_done",
        "bad_round",  "dup_upstream", "bad_type",  "bad_worker",  "stale_epoch", "bad_slot",
        "bad_length", "bad_encap",    "truncated", "bad_version", "unknown_job", "parent_result",
        "dup_result", "collision",    "ack",       "switch_sum"};
    return names.at(static_cast<size_t>(outcome));
}

bool is_drop(Outcome outcome) {
    switch (outcome) {
        case Outcome::None:
        case Outcome::First:
        case Outcome::Add:
        case Outcome::DupPending:
        case Outcome::DupDone:
        case Outcome::DupUpstream:
        case Outcome::ParentResult:
        case Outcome::DupResult:
        case Outcome::Collision:
        case Outcome::Ack:
        case Outcome::SwitchSum: return false;
        default: return true;
    }
}

int p4_drop_code(Outcome outcome) {
    switch (outcome) {  // p4/include/constants.p4
        case Outcome::BadType: return 0;
        case Outcome::BadWorker: return 1;
        case Outcome::StaleEpoch: return 2;
        case Outcome::BadSlot: return 3;
        case Outcome::BadLength: return 4;
        case Outcome::StaleRound: return 5;
        case Outcome::BadEncap: return 6;
        case Outcome::BadRound: return 7;
        case Outcome::Truncated: return 0;
        case Outcome::BadVersion: return 1;
        default: return -1;
    }
}

Engine::Engine(uint32_t n_slots, uint32_t values_per_packet, bool host_mode)
    : n_slots_(n_slots), k_(values_per_packet), result_flags_(host_mode ? kFlagFromHost : 0) {
    if (n_slots < 1 || n_slots > kMaxSlot + 1) {
        throw std::invalid_argument("n_slots must be in 1.." + std::to_string(kMaxSlot + 1) +
                                    ", got " + std::to_string(n_slots));
    }
    if (values_per_packet < 1) {
        throw std::invalid_argument("values_per_packet must be >= 1");
    }
    tag_.assign(n_slots, 0);
    pool_round_.assign(n_slots, 0);
    for (SetState& set : sets_) {
        set.bitmap.assign(n_slots, 0);
        set.seen.assign(n_slots, 0);
        set.offset.assign(n_slots, 0);
        set.exp.assign(n_slots, kExpNone);
        set.owner.assign(n_slots, kNoOwner);
        set.flags.assign(n_slots, 0);
        set.round.assign(n_slots, kRoundUnset);
        set.count.assign(n_slots, 0);
        set.values.assign(static_cast<size_t>(n_slots) * k_, 0);
    }
}

// -- configuration ---------------------------------------------------------------------------

void Engine::set_job(const JobConfig& job) {
    validate(job, job.has_atp_peer && !result_flags_ ? kMaxSlot + 1 : n_slots_);
    check_atp(job);
    for (const auto& [id, other] : jobs_) {
        if (id != job.job_id && shares_slots(other, job)) {
            throw std::invalid_argument("job " + std::to_string(job.job_id) + ": slots " +
                                        slots_text(job) + " overlap job " + std::to_string(id));
        }
    }
    uint16_t id = static_cast<uint16_t>(job.job_id);
    jobs_[id] = job;
    counters_.try_emplace(id);
}

void Engine::remove_job(uint16_t job_id) { jobs_.erase(job_id); }

void Engine::replace_jobs(const std::vector<JobConfig>& wanted) {
    auto is_wanted = [&wanted](uint16_t id) {
        return std::any_of(wanted.begin(), wanted.end(),
                           [id](const JobConfig& j) { return j.job_id == id; });
    };
    for (uint16_t id : job_ids()) {
        if (!is_wanted(id)) {
            remove_job(id);
        }
    }
    for (const JobConfig& job : wanted) {
        const JobConfig* have = job.job_id >= 0 && job.job_id <= 0xFFFF
                                    ? this->job(static_cast<uint16_t>(job.job_id))
                                    : nullptr;
        if (!have || !(*have == job)) {
            if (have) {
                remove_job(static_cast<uint16_t>(job.job_id));
            }
            set_job(job);
        }
    }
}

const JobConfig* Engine::job(uint16_t job_id) const {
    auto it = jobs_.find(job_id);
    return it == jobs_.end() ? nullptr : &it->second;
}

std::vector<uint16_t> Engine::job_ids() const {
    std::vector<uint16_t> ids;
    for (const auto& entry : jobs_) {
        ids.push_back(entry.first);
    }
    return ids;
}

// -- data path -------------------------------------------------------------------------------

Emit Engine::drop_global(Outcome reason) {
    global_drops_[static_cast<size_t>(reason)] += 1;
    last_outcome_ = reason;
    return Emit{};
}

Emit Engine::drop_job(JobCounters& ctr, Outcome reason) {
    ctr.drops[static_cast<size_t>(reason)] += 1;
    last_outcome_ = reason;
    return Emit{};
}

// The per-job checks in the order of the P4 program's JobAdmission; None when admitted. A
// RESULT is admitted only on a job with an uplink: from its parent, in the parent's slots, or on
// an ATP job at a switch from its host aggregator.
Outcome Engine::admission(const JobConfig& job, const uint8_t* data, size_t len, SenderId sender,
                          bool framing_ok) const {
    Header h = read_header(data);
    bool from_parent = h.msg_type == kMsgResult && job.has_uplink;
    bool peer = from_peer(job, h);
    if (h.msg_type != kMsgContribution && !from_parent && !peer) {
        return Outcome::BadType;
    }
    if (from_parent || peer) {
        if (sender != (from_parent ? job.uplink.parent : job.atp_peer) ||
            (peer && h.worker >= job.members.size())) {
            return Outcome::BadWorker;
        }
    } else if (h.worker >= job.members.size() || job.members[h.worker] != sender) {
        return Outcome::BadWorker;
    }
    if (h.epoch != job.epoch) {
        return Outcome::StaleEpoch;
    }
    int64_t base = from_parent ? job.uplink.slot_base : job.slot_base;
    if (h.slot < base || h.slot >= base + job.slot_count) {
        return Outcome::BadSlot;
    }
    size_t payload = len - kHeaderBytes;
    if (!framing_ok || h.count > k_ || payload != (h.count ? 4 * static_cast<size_t>(k_) : 0)) {
        return Outcome::BadLength;
    }
    return Outcome::None;
}

Emit Engine::process(const uint8_t* data, size_t len, SenderId sender, bool framing_ok,
                     uint8_t* out) {
    if (len < kHeaderBytes) {
        return drop_global(Outcome::Truncated);
    }
    Header h = read_header(data);
    if (h.version != kVersion) {
        return drop_global(Outcome::BadVersion);
    }
    auto found = jobs_.find(h.job);
    if (found == jobs_.end()) {
        return drop_global(Outcome::UnknownJob);
    }
    const JobConfig& job = found->second;
    JobCounters& ctr = counters_[h.job];
    ctr.packets += 1;
    Outcome refused = admission(job, data, len, sender, framing_ok);
    if (refused != Outcome::None) {
        return drop_job(ctr, refused);
    }
    if (job.has_atp_peer && !result_flags_) {
        return atp_switch(job, ctr, h, data, len, out);
    }
    Emit emit;
    if (job.has_atp_peer && from_peer(job, h)) {
        emit = switch_sum(job, ctr, h, data + kHeaderBytes, out);
    } else {
        if (h.msg_type == kMsgResult) {  // the parent's slot -> ours
            h.slot = static_cast<uint32_t>(h.slot - job.uplink.slot_base + job.slot_base);
        }
        emit = aggregate(job, ctr, h, data + kHeaderBytes, out);
    }
    if (job.has_atp_peer && last_outcome_ == Outcome::StaleRound) {
        return atp_release(job, h, out);
    }
    return emit;
}

// The slot decision for an admitted contribution (one row of the decision table), or for the
// parent's result (docs/trees.md).
Emit Engine::aggregate(const JobConfig& job, JobCounters& ctr, const Header& h,
                       const uint8_t* payload, uint8_t* out) {
    claim_slot(h);
    uint32_t slot = h.slot;
    SetState& set = sets_[h.set];
    uint32_t bit = 1u << h.worker;
    uint32_t n = static_cast<uint32_t>(job.children());
    RoundState st{set.seen[slot] == n + (job.has_uplink ? 1 : 0),  // a tree's result: one more
                  set.offset[slot] == h.offset && set.count[slot] == h.count,
                  job.has_uplink && set.seen[slot] == n};
    bool this_round = round_tag(h.flags) == set.round[slot];
    if (h.msg_type == kMsgResult) {
        if (!this_round) {  // an older round's result
            return drop_job(ctr, Outcome::StaleRound);
        }
        return parent_result(job, ctr, h, st, payload, out);
    }
    if (this_round && (set.bitmap[slot] & bit)) {
        return duplicate(job, ctr, h, st, out);
    }
    Outcome outcome = open_or_join(set, h, st, payload);
    if (outcome != Outcome::First && outcome != Outcome::Add) {
        return drop_job(ctr, outcome);
    }
    return joined(job, ctr, h, out);
}

// A contribution whose bit is clear in the set, or of the set's next round: FIRST (the next round
// tag on an empty set), ADD, or the drop's reason (the decision table's rows).
Outcome Engine::open_or_join(SetState& set, const Header& h, RoundState st,
                             const uint8_t* payload) {
    uint32_t slot = h.slot;
    uint8_t tag = round_tag(h.flags);
    if (tag != set.round[slot]) {
        if (set.round[slot] != kRoundUnset &&
            tag != (set.round[slot] + 1) % kRoundTags) {  // a copy of an older round
            return Outcome::StaleRound;
        }
        if (set.bitmap[slot] != 0) {  // never sent: the set's round still has workers
            return Outcome::BadRound;
        }
        last_outcome_ = Outcome::First;  // FIRST
        accumulate(set, h, payload, true);
        return Outcome::First;
    }
    if (set.bitmap[slot] == 0 || st.complete || st.sent_up) {  // STALE: all moved on, all in
        return Outcome::StaleRound;
    }
    if (!st.same_round) {  // BAD_ROUND
        return Outcome::BadRound;
    }
    last_outcome_ = Outcome::Add;  // ADD
    accumulate(set, h, payload, false);
    return Outcome::Add;
}

// After FIRST/ADD: the worker's bit moves to the packet's set; the round leaves when complete.
Emit Engine::joined(const JobConfig& job, JobCounters& ctr, const Header& h, uint8_t* out) {
    uint32_t slot = h.slot;
    uint32_t bit = 1u << h.worker;
    sets_[h.set].bitmap[slot] |= bit;
    sets_[1 - h.set].bitmap[slot] &= ~bit;
    ctr.aggregated += 1;
    if (sets_[h.set].seen[slot] < static_cast<uint32_t>(job.children())) {
        return Emit{};
    }
    ctr.results += 1;
    if (job.has_uplink) {  // this level's part: up
        return Emit{h.job, kUpstream, write_upstream(slot, h.set, job, 0, out)};
    }
    return every_member(job, slot, h.set, h.worker, out, owner(slot, h.set));
}

// The round in (slot, s) complete: its result to every member, its values to `owner` alone where
// the round has one (a reduce-scatter's; kNoOwner: to every member).
Emit Engine::every_member(const JobConfig& job, uint32_t slot, int s, uint8_t worker, uint8_t* out,
                          int32_t owner) {
    return Emit{static_cast<uint16_t>(job.job_id), kEveryMember,
                write_result(slot, s, job, worker, 0, out), owner};
}

// The first packet of a new owner/epoch in a slot resets it.
void Engine::claim_slot(const Header& h) {
    uint32_t tag = static_cast<uint32_t>(h.job) << 16 | h.epoch;
    if (tag_[h.slot] != tag) {
        tag_[h.slot] = tag;
        for (SetState& set : sets_) {
            set.bitmap[h.slot] = 0;
            set.seen[h.slot] = 0;
            set.round[h.slot] = kRoundUnset;  // its first opener's tag is its next
        }
    }
}

// A contribution the set already holds: a bad round, pending, up at the parent, or its result
// again.
Emit Engine::duplicate(const JobConfig& job, JobCounters& ctr, const Header& h, RoundState st,
                       uint8_t* out) {
    if (!st.same_round) {  // BAD_ROUND
        return drop_job(ctr, Outcome::BadRound);
    }
    ctr.duplicates += 1;
    if (st.complete) {  // DUP_DONE
        ctr.resent_results += 1;
        last_outcome_ = Outcome::DupDone;
        return Emit{h.job, h.worker,
                    write_result(h.slot, h.set, job, h.worker, kFlagRetransmit, out),
                    owner(h.slot, h.set)};
    }
    if (st.sent_up) {  // DUP_UPSTREAM
        last_outcome_ = Outcome::DupUpstream;
        return Emit{h.job, kUpstream, write_upstream(h.slot, h.set, job, kFlagRetransmit, out)};
    }
    last_outcome_ = Outcome::DupPending;  // DUP_PENDING
    return Emit{};
}

// The parent's result: stored and sent to every member when the set sent its sum up and waits
// for it (hostlib/aggregator/engine_reference.py: AggregationEngine._parent_result).
Emit Engine::parent_result(const JobConfig& job, JobCounters& ctr, const Header& h, RoundState st,
                           const uint8_t* payload, uint8_t* out) {
    if (!st.same_round) {
        return drop_job(ctr, Outcome::BadRound);
    }
    if (st.complete) {
        ctr.duplicates += 1;
        last_outcome_ = Outcome::DupResult;
        return Emit{};
    }
    if (!st.sent_up) {
        return drop_job(ctr, Outcome::StaleRound);
    }
    last_outcome_ = Outcome::ParentResult;
    SetState& set = sets_[h.set];
    set.seen[h.slot] += 1;
    set.exp[h.slot] = h.exp;
    set.flags[h.slot] =
        static_cast<uint8_t>(h.flags & ~(kFlagRetransmit | kFlagFromSwitch | kRoundTagMask));
    int32_t* values = &set.values[static_cast<size_t>(h.slot) * k_];
    if (h.count) {
        load_values(values, payload, k_);
    } else {
        std::fill(values, values + k_, 0);
    }
    return Emit{h.job, kEveryMember, write_result(h.slot, h.set, job, h.worker, 0, out),
                owner(h.slot, h.set)};
}

// A contribution into the set's registers: the first overwrites them, a further one adds.
void Engine::accumulate(SetState& set, const Header& h, const uint8_t* payload, bool first) {
    uint32_t slot = h.slot;
    int32_t* values = &set.values[static_cast<size_t>(slot) * k_];
    if (first) {
        set.seen[slot] = 1;
        set.exp[slot] = h.exp;
        set.flags[slot] = h.flags & kStickyFlags;
        set.round[slot] = round_tag(h.flags);
        set.offset[slot] = h.offset;
        set.count[slot] = h.count;
        note_owner(set, h, true);
        if (h.count) {
            load_values(values, payload, k_);
        } else {
            std::fill(values, values + k_, 0);
        }
        return;
    }
    note_owner(set, h, false);
    set.seen[slot] += 1;
    set.exp[slot] = std::max(set.exp[slot], h.exp);
    set.flags[slot] |= h.flags & kStickyFlags;
    if (h.count) {
        add_values(values, payload, k_);
    }
}

// FLAG_MINE makes its sender the round's owner; a second owner, or a child switch's partial sum
// (whose members all need the values), makes the round shared.
void Engine::note_owner(SetState& set, const Header& h, bool first) {
    int8_t& owner = set.owner[h.slot];
    if (first) owner = kNoOwner;
    if (h.flags & kFlagFromSwitch) {
        owner = kSharedRound;
    } else if (h.flags & kFlagMine) {
        owner = owner == kNoOwner ? static_cast<int8_t>(h.worker) : kSharedRound;
    }
}

int32_t Engine::owner(uint32_t slot, int s) const {
    int8_t owner = sets_[s].owner[slot];
    return owner >= 0 ? owner : kNoOwner;
}

void Engine::process_batch(const std::vector<Received>& packets, std::vector<uint8_t>& arena,
                           std::vector<Emitted>& emitted, std::vector<Outcome>& outcomes) {
    std::vector<uint8_t> result(max_result_bytes());
    for (size_t i = 0; i < packets.size(); ++i) {
        const Received& p = packets[i];
        Emit emit = process(p.data, p.len, p.sender, p.framing_ok, result.data());
        if (emit.length) {
            emitted.push_back(Emitted{i, arena.size(), emit});
            arena.insert(arena.end(), result.begin(), result.begin() + emit.length);
        }
        outcomes.push_back(last_outcome_);
    }
}

size_t Engine::write_result(uint32_t slot, int s, const JobConfig& job, uint8_t worker,
                            uint8_t extra_flags, uint8_t* out) const {
    Header h;
    h.msg_type = kMsgResult;
    h.flags = sets_[s].flags[slot] | result_flags_ | extra_flags;
    h.worker = worker;
    h.slot = slot;
    return write_round(slot, s, job, h, out);
}

// This level's partial sum as a contribution to the parent: from our rank there, in the
// parent's slot.
size_t Engine::write_upstream(uint32_t slot, int s, const JobConfig& job, uint8_t extra_flags,
                              uint8_t* out) const {
    Header h;
    h.msg_type = kMsgContribution;
    h.flags = sets_[s].flags[slot] | kFlagFromSwitch | extra_flags;
    h.worker = static_cast<uint8_t>(job.uplink.rank);
    h.slot = static_cast<uint32_t>(slot - job.slot_base + job.uplink.slot_base);
    return write_round(slot, s, job, h, out);
}

// The round held in (slot, s) under header `h` (msg_type, flags, worker and the wire slot set).
size_t Engine::write_round(uint32_t slot, int s, const JobConfig& job, Header h,
                           uint8_t* out) const {
    const SetState& set = sets_[s];
    h.job = static_cast<uint16_t>(job.job_id);
    h.exp = set.exp[slot];
    h.epoch = static_cast<uint16_t>(job.epoch);
    h.flags |= static_cast<uint8_t>(set.round[slot] << kRoundTagShift);
    h.set = static_cast<uint8_t>(s);
    h.count = set.count[slot];
    h.offset = set.offset[slot];
    write_header(out, h);
    if (!h.count) {
        return kHeaderBytes;
    }
    store_values(out + kHeaderBytes, &set.values[static_cast<size_t>(slot) * k_], k_);
    return kHeaderBytes + 4 * static_cast<size_t>(k_);
}

}  // namespace inagg

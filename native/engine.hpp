// The slot engine: hostlib/aggregator/engine_reference.py::AggregationEngine in C++, decision
// for decision.
//
// Why it exists: the per-packet slot logic (owner tag, shadow sets, worker bitmap, exponent max,
// duplicate/stale handling, counters) is the hot loop of the host aggregator and of the software
// switch. In Python it costs tens of microseconds a packet; here it is a few hundred
// nanoseconds, and it runs without the GIL. The Python engine stays the executable
// specification: tests/test_engine_native.py feeds both the same random packet sequences and
// requires the same packets out, the same outcomes and the same counters.
//
// This header is plain C++17 (no Python): the packet loops (native/host_loop.*, the software
// switch's loop) call it directly; native/bindings.cpp exposes it to Python.
//
// Senders are integers (SenderId), not addresses: the caller maps each packet's source to an id
// and configures each job's members with the same mapping. The host aggregator packs an IPv4
// UDP source as (address << 16) | port (sender_id_ipv4); the software switch checks
// worker_table's binding itself and gives the claimed rank when it matches (switch_pipeline.hpp).
// Any injective mapping works; the engine only compares.
//
// Thread safety: none inside. A caller that shares an Engine between threads (a packet loop and
// a control thread that changes jobs) holds Engine::mutex() around every call.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "protocol.hpp"

namespace inagg {

// What the engine did with one packet. The slot decisions carry their P4 codes (SLOT_* in
// p4/include/constants.p4); the rest are drop reasons named as inagg.hostlib.wire.protocol
// names them. inagg.hostlib.wire.protocol.Outcome is the Python twin
// (tests/test_protocol_twin.py ties all three).
enum class Outcome : uint8_t {
    None = 0,           // nothing processed yet
    First = 1,          // first contribution of a round: overwrite the set
    Add = 2,            // a further contribution: add
    StaleRound = 3,     // drop: reordered packet of a finished round
    DupPending = 4,     // drop: duplicate of a contribution to an unfinished round
    DupDone = 5,        // duplicate of a finished round: the stored result back to the sender
    BadRound = 6,       // drop: offset or count differ from the round's
    DupUpstream = 7,    // duplicate, the round's partial sum is up at the parent: resend it up
    BadType = 8,        // drop: not a contribution (nor a parent's result)
    BadWorker = 9,      // drop: rank not bound to this sender
    StaleEpoch = 10,    // drop: epoch is not the job's
    BadSlot = 11,       // drop: slot outside the job's range
    BadLength = 12,     // drop: payload is not 0 or K values, count > K, bad framing
    BadEncap = 13,      // drop: encapsulation is not the job's (the switch's pipeline decides it)
    Truncated = 14,     // drop, no job: shorter than an inagg header
    BadVersion = 15,    // drop, no job: unknown protocol version
    UnknownJob = 16,    // drop, no job: job not configured here
    ParentResult = 17,  // the parent's result for a round sent up: stored, sent to every member
    DupResult = 18,     // the parent's result again, already stored: drop
    Collision = 19,     // ATP, switch: the round's aggregator is another's: the packet goes up
    Ack = 20,           // ATP, switch: the host aggregator's result passes (frees its aggregator)
    SwitchSum = 21,     // ATP, host aggregator: a switch's complete sum, stored and multicast
};
constexpr size_t kOutcomes = 22;

// "first", "add", ..., "unknown_job": the names the Python engine and the counters use.
const char* outcome_name(Outcome outcome);
// Whether the outcome is a drop (counted under its name in the job's or the global drops).
bool is_drop(Outcome outcome);
// The P4 program's code of a drop, the index of its counter: DROP_* for a job's drops,
// GLOBAL_DROP_* for truncated/bad_version; -1 for the rest (unknown_job: the switch forwards).
int p4_drop_code(Outcome outcome);

using SenderId = uint64_t;

// A UDP sender as the host aggregator identifies it: IPv4 address (host order) and port.
constexpr SenderId sender_id_ipv4(uint32_t addr, uint16_t port) {
    return (static_cast<SenderId>(addr) << 16) | port;
}

// Where a non-root aggregator of a tree sends its partial sums
// (inagg.hostlib.aggregator.engine_reference.Uplink, docs/trees.md): the parent (the sender its
// results come from), this aggregator's rank there and the job's first slot there.
struct Uplink {
    SenderId parent = 0;
    int64_t rank = 0;       // 0..kMaxWorkers - 1
    int64_t slot_base = 0;  // [slot_base, slot_base + slot_count) inside 0..kMaxSlot

    bool operator==(const Uplink& o) const {
        return parent == o.parent && rank == o.rank && slot_base == o.slot_base;
    }
};

// What the engine must know about one job (inagg.hostlib.aggregator.engine_reference.JobConfig):
// members[r] is the one sender allowed to claim rank r; results go to every member, or with an
// uplink each round's sum goes up first and the parent's result to every member. Numbers are wide
// so that set_job, not a conversion, names an out-of-range value.
struct JobConfig {
    int64_t job_id = 0;     // 1..65535
    int64_t epoch = 0;      // 0..65535
    int64_t slot_base = 0;  // [slot_base, slot_base + slot_count) inside the pool
    int64_t slot_count = 0;
    std::vector<SenderId> members;
    bool has_uplink = false;  // false: this aggregator completes the job's rounds
    Uplink uplink;
    // Contributions that complete a round (0: every member): a tree's switch knows its
    // children by sparse ids, the other members are placeholders no sender matches.
    int64_t n_children = 0;
    // ATP sharing (hostlib/aggregator/atp_reference.py): on a switch the host aggregator whose
    // results free the pool's aggregators, on the host aggregator the switch whose sums it takes.
    bool has_atp_peer = false;
    SenderId atp_peer = 0;

    size_t children() const { return n_children ? size_t(n_children) : members.size(); }
    bool operator==(const JobConfig& o) const {
        return job_id == o.job_id && epoch == o.epoch && slot_base == o.slot_base &&
               slot_count == o.slot_count && members == o.members && has_uplink == o.has_uplink &&
               (!has_uplink || uplink == o.uplink) && n_children == o.n_children &&
               has_atp_peer == o.has_atp_peer && (!has_atp_peer || atp_peer == o.atp_peer);
    }
};

// Per-job counters, named as the P4 program's counters; drops indexed by Outcome.
struct JobCounters {
    uint64_t packets = 0;
    uint64_t aggregated = 0;
    uint64_t duplicates = 0;
    uint64_t results = 0;
    uint64_t resent_results = 0;
    uint64_t collisions = 0;  // ATP: contributions whose aggregator another round held
    std::array<uint64_t, kOutcomes> drops{};
};

constexpr int32_t kEveryMember = -1;
constexpr int32_t kUpstream = -2;
constexpr int32_t kNoOwner = -1;

// The packet a processed packet causes, if any (never more than one): `length` bytes of inagg
// header + payload written into the caller's buffer, for one rank of `job` or all of them.
// A reduce-scatter's round has an owner (the one rank whose contributions carried FLAG_MINE):
// only the owner gets the values, every other rank the header alone (values elided, count kept),
// which still answers its round (length_for).
struct Emit {
    uint16_t job = 0;
    int32_t rank = -1;         // kEveryMember (a completed round), kUpstream (a contribution to the
                               // job's parent), else that rank
    size_t length = 0;         // 0: nothing to send
    int32_t owner = kNoOwner;  // the rank the values go to; kNoOwner: to every rank

    // The bytes of the result that rank `rank` gets.
    size_t length_for(int32_t to) const {
        return owner != kNoOwner && to != owner && length > kHeaderBytes ? kHeaderBytes : length;
    }
};

class Engine;

// One received packet for Engine::process_batch.
struct Received {
    const uint8_t* data = nullptr;
    size_t len = 0;
    SenderId sender = 0;
    bool framing_ok = true;
};

// A packet a batch caused: `emit.length` bytes at `at` in the batch's output arena, caused by
// packet number `packet` of the batch.
struct Emitted {
    size_t packet = 0;
    size_t at = 0;
    Emit emit;
};

class Engine {
public:
    // Throws std::invalid_argument (same messages as the Python engine) for a bad pool.
    Engine(uint32_t n_slots, uint32_t values_per_packet, bool host_mode);

    uint32_t n_slots() const { return n_slots_; }
    uint32_t values_per_packet() const { return k_; }
    // Bytes a result can take: the size of the buffer process() writes into.
    size_t max_result_bytes() const { return kHeaderBytes + 4 * static_cast<size_t>(k_); }

    // -- configuration (inagg.hostlib.aggregator.engine_reference.AggregationEngine's set_job,
    // remove_job, replace_jobs) --
    void set_job(const JobConfig& job);  // throws std::invalid_argument
    void remove_job(uint16_t job_id);
    void replace_jobs(const std::vector<JobConfig>& wanted);
    const JobConfig* job(uint16_t job_id) const;  // nullptr when not configured
    std::vector<uint16_t> job_ids() const;
    // A switch's slots [base, base + count) for ATP jobs (count 0: none); throws
    // std::invalid_argument on the host aggregator, outside the slots, over a window job's.
    void set_atp_pool(int64_t base, int64_t count);
    // Aggregators of the pool a live round holds (its job and epoch still configured).
    size_t atp_held() const;

    // -- data path --
    // One received inagg packet (header + payload) from `sender`; framing_ok false: the
    // encapsulation's own length disagrees (bad_length). A packet to send is written to `out`
    // (at least max_result_bytes()) and described by the returned Emit (length 0: none).
    Emit process(const uint8_t* data, size_t len, SenderId sender, bool framing_ok, uint8_t* out);
    Outcome last_outcome() const { return last_outcome_; }
    // process() for each packet in order; results appended to `arena` and `emitted`, each
    // packet's outcome to `outcomes`. The caller holds mutex() if the engine is shared.
    void process_batch(const std::vector<Received>& packets, std::vector<uint8_t>& arena,
                       std::vector<Emitted>& emitted, std::vector<Outcome>& outcomes);

    // -- counters --
    const std::map<uint16_t, JobCounters>& counters() const { return counters_; }
    const std::array<uint64_t, kOutcomes>& global_drops() const { return global_drops_; }

    std::mutex& mutex() { return mutex_; }

private:
    struct SetState {  // one shadow set of every slot
        std::vector<uint32_t> bitmap, seen, offset;
        std::vector<int8_t> exp;
        // the round's owner: a rank, kNoOwner, or kSharedRound (FLAG_MINE from two ranks, or a
        // child switch in: every member gets the values)
        std::vector<int8_t> owner;
        std::vector<uint8_t> flags, round;  // round: the tag of the set's round
        std::vector<uint16_t> count;
        std::vector<int32_t> values;  // n_slots * K
    };

    Emit drop_global(Outcome reason);
    Emit drop_job(JobCounters& ctr, Outcome reason);
    Emit aggregate(const JobConfig& job, JobCounters& ctr, const Header& h, const uint8_t* payload,
                   uint8_t* out);
    void claim_slot(const Header& h);
    // A set's state for the packet's round: the decision table's columns.
    struct RoundState {
        bool complete, same_round, sent_up;
    };
    Emit duplicate(const JobConfig& job, JobCounters& ctr, const Header& h, RoundState st,
                   uint8_t* out);
    Outcome open_or_join(SetState& set, const Header& h, RoundState st, const uint8_t* payload);
    Emit joined(const JobConfig& job, JobCounters& ctr, const Header& h, uint8_t* out);
    Emit parent_result(const JobConfig& job, JobCounters& ctr, const Header& h, RoundState st,
                       const uint8_t* payload, uint8_t* out);
    void accumulate(SetState& set, const Header& h, const uint8_t* payload, bool first);
    static void note_owner(SetState& set, const Header& h, bool first);
    int32_t owner(uint32_t slot, int s) const;
    Outcome admission(const JobConfig& job, const uint8_t* data, size_t len, SenderId sender,
                      bool framing_ok) const;
    size_t write_result(uint32_t slot, int s, const JobConfig& job, uint8_t worker,
                        uint8_t extra_flags, uint8_t* out) const;
    size_t write_upstream(uint32_t slot, int s, const JobConfig& job, uint8_t extra_flags,
                          uint8_t* out) const;
    size_t write_round(uint32_t slot, int s, const JobConfig& job, Header h, uint8_t* out) const;
    Emit every_member(const JobConfig& job, uint32_t slot, int s, uint8_t worker, uint8_t* out,
                      int32_t owner = kNoOwner);

    // ATP sharing (native/engine_atp.cpp; hostlib/aggregator/atp_reference.py's twin).
    bool from_peer(const JobConfig& job, const Header& h) const;
    void check_atp(const JobConfig& job) const;
    bool shares_slots(const JobConfig& a, const JobConfig& b) const;
    bool atp_free(uint64_t owner) const;
    Emit atp_switch(const JobConfig& job, JobCounters& ctr, const Header& h, const uint8_t* data,
                    size_t len, uint8_t* out);
    Emit atp_joined(const JobConfig& job, JobCounters& ctr, const Header& h, uint32_t a,
                    uint8_t* out);
    Emit atp_up_sum(const JobConfig& job, const Header& h, uint32_t a, uint8_t extra_flags,
                    uint8_t* out) const;
    Emit switch_sum(const JobConfig& job, JobCounters& ctr, const Header& h, const uint8_t* payload,
                    uint8_t* out);
    Emit atp_release(const JobConfig& job, const Header& h, uint8_t* out) const;

    uint32_t n_slots_, k_;
    uint8_t result_flags_;
    std::map<uint16_t, JobConfig> jobs_;
    std::map<uint16_t, JobCounters> counters_;
    std::array<uint64_t, kOutcomes> global_drops_{};
    Outcome last_outcome_ = Outcome::None;
    std::vector<uint32_t> tag_;               // (job_id << 16) | epoch of each slot's owner
    int64_t pool_base_ = 0, pool_count_ = 0;  // the switch's ATP pool
    std::vector<uint64_t> pool_round_;        // an ATP pool slot's round (atp_identity), 0 free
    std::array<SetState, 2> sets_;
    std::mutex mutex_;
};

}  // namespace inagg

// The software switch's per-packet pipeline: p4/inagg.p4 in C++, the twin of
// bmv2_env/softswitch/pipeline_reference.py::SoftPipeline (which stays the reference; the
// conformance suite runs both).
//
// process() takes one frame from an ingress port and appends the frames to send to an
// OutputBatch: the parser (Ethernet/IPv4/UDP to the inagg port, or RoCEv2 UC WRITE ONLY with the
// "INAG" immediate), TreeUplink + JobAdmission, the slot engine (native/engine.hpp, the same
// engine the host aggregator runs), JobCounters, ResultReplication + ReplicaRewrite (per-replica
// MAC/IPv4/UDP port or QP/rkey) or UpstreamSend (a tree's partial sum to the parent), the IPv4
// checksum and RoCE's ICRC; frames of no admitted job go to Forwarding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "engine.hpp"
#include "switch_tables.hpp"

namespace inagg {

// The frames one batch of received frames causes. A forwarded frame points into the receive
// buffer (valid until the batch is sent); a result is built in the batch's own arena.
class OutputBatch {
public:
    void forward(uint16_t port, const uint8_t* frame, size_t len) {
        frames_.push_back({port, frame, 0, len});
    }
    // Room for a new frame of `len` bytes out of `port`; valid until the next reserve().
    // `flags_at`: where the frame's inagg flags are, for mark() (0: the frame has none to mark).
    uint8_t* reserve(uint16_t port, size_t len, size_t flags_at = 0) {
        size_t at = arena_.size();
        arena_.resize(at + len);
        frames_.push_back({port, nullptr, at, len, flags_at});
        return arena_.data() + at;
    }
    // Set `flag` in frame i's inagg flags, where it has some to mark; whether it had.
    bool mark(size_t i, uint8_t flag) {
        const Entry& e = frames_[i];
        if (!e.flags_at) return false;
        arena_[e.offset + e.flags_at] |= flag;
        return true;
    }
    size_t size() const { return frames_.size(); }
    uint16_t port(size_t i) const { return frames_[i].port; }
    size_t len(size_t i) const { return frames_[i].len; }
    const uint8_t* data(size_t i) const {
        const Entry& e = frames_[i];
        return e.external ? e.external : arena_.data() + e.offset;
    }
    void clear() {
        frames_.clear();
        arena_.clear();
    }

private:
    struct Entry {
        uint16_t port;
        const uint8_t* external;
        size_t offset;
        size_t len;
        size_t flags_at = 0;
    };
    std::vector<Entry> frames_;
    std::vector<uint8_t> arena_;
};

// The engine's identity of a sender as the switch sees it. Admission checks worker_table
// itself (the claimed rank's binding against the frame's ingress port, IPv4, MAC and UDP
// source), then hands the engine bound_sender_id(rank) when it matches and kForgedSender when
// not; the engine's member r is bound_sender_id(r), or unbound_sender_id(r) for a rank no entry
// binds, which no packet is given, so it matches nobody (a worker_table miss in P4).
constexpr SenderId bound_sender_id(uint8_t rank) { return rank; }
constexpr SenderId unbound_sender_id(uint8_t rank) { return SenderId(1) << 63 | rank; }
constexpr SenderId kForgedSender = SenderId(1) << 62;
// A RESULT from the address uplink_table names as the job's parent (docs/trees.md): the
// engine's uplink parent of every job with an uplink.
constexpr SenderId kParentSender = SenderId(1) << 61;
// A RESULT to or from the host aggregator's port from its address (AtpPool): the engine's
// atp_peer of every ATP job.
constexpr SenderId kAtpPeerSender = SenderId(1) << 60;

class SwitchPipeline {
public:
    // job_drops holds n_drop_reasons cells per job (inagg.hostlib.wire.protocol.DROP_REASONS); a
    // drop's cell is its engine outcome's p4_drop_code.
    SwitchPipeline(uint32_t n_slots, uint32_t values_per_packet,
                   const std::array<size_t, kCounters>& counter_sizes, size_t n_drop_reasons);

    void process(uint16_t port, const uint8_t* frame, size_t len, OutputBatch& out);

    SwitchTables& tables() { return tables_; }
    SwitchCounters& counters() { return counters_; }
    Engine& engine() { return engine_; }
    // Held by the packet loop for each batch and by the control plane for each write, so a
    // batch never sees half a P4Runtime Write (recursive: a write's mirror steps nest).
    std::recursive_mutex& mutex() { return mutex_; }

private:
    // SourceGuard: true when a host port's frame claims an aggregator's place (dropped, counted).
    bool source_guard(uint16_t port, const uint8_t* frame, size_t len, uint8_t encap);
    // ...the TNA program's (guard_rows): the reason of the first row the frame matches, or -1.
    int guard_row_reason(uint16_t port, const uint8_t* frame, size_t len, uint8_t encap) const;
    void forwarding(uint16_t port, const uint8_t* frame, size_t len, OutputBatch& out);
    // Calls send(p) for each port l2_table sends a frame to dst_mac that came in on `port` out of.
    template <class Send>
    void each_l2_port(uint16_t port, uint64_t dst_mac, Send send) const;
    void admission(uint16_t port, const uint8_t* frame, size_t len, uint8_t encap,
                   OutputBatch& out);
    // A frame to or from the host aggregator's port: an ATP job's through the engine.
    void atp_admission(uint16_t port, const uint8_t* frame, size_t len, OutputBatch& out);
    // A complete sum up to the host aggregator, from this switch's aggregator address.
    void atp_sum(uint16_t port, const uint8_t* frame, size_t len, size_t result_len,
                 OutputBatch& out);
    // The engine's id of the sender of an inagg frame, for the rank it claims (see above);
    // `atp`: the frame is to or from the host aggregator's port.
    SenderId sender(uint16_t port, const uint8_t* frame, size_t at, bool atp = false) const;
    void count_global(Outcome reason);
    void count_outcome(size_t job, Outcome outcome, bool result);
    void replicate(uint16_t port, const uint8_t* frame, size_t len, uint8_t encap,
                   const JobAdmit& admit, bool unicast, const Emit& emit, OutputBatch& out);
    void upstream_send(const uint8_t* frame, size_t len, uint8_t encap, uint16_t job_id,
                       size_t result_len, OutputBatch& out);
    static size_t result_frame_len(uint8_t encap, size_t result_len);
    void write_result_frame(const uint8_t* frame, uint8_t encap, const ReplicaAddress* rewrite,
                            size_t result_len, uint8_t* out, size_t cut = 0) const;
    // write_result_frame to `dst` with this switch's aggregator address as the source.
    void write_from_switch(const uint8_t* frame, uint8_t encap, const ReplicaAddress& dst,
                           uint64_t src_mac, uint32_t src_addr, uint16_t src_udp_port,
                           size_t result_len, uint8_t* out) const;

    SwitchTables tables_;
    Engine engine_;
    SwitchCounters counters_;
    size_t n_drop_reasons_;
    std::vector<uint8_t> result_;  // the engine's result for the packet being processed
    std::recursive_mutex mutex_;
};

}  // namespace inagg

// The software switch's match-action state, as the P4 program declares it
// (p4/include/source_guard.p4, job_admission.p4, tree_uplink.p4, forwarding.p4, replica_rewrite.p4,
// job_counters.p4) and the Python P4Runtime server writes it (bmv2_env/softswitch/pipeline.py
// mirrors every accepted TableEntry / MulticastGroupEntry into here): exact-match tables as hash
// maps (and the ternary rows of the TNA program's host_port_table, p4/tofino/source_guard.p4, per
// port), the packet replication engine's groups, and the indexed packet counters that P4Runtime
// reads back.
#pragma once

#include <array>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace inagg {

// job_table's admit action (JobAdmission).
struct JobAdmit {
    uint8_t job_index = 0;
    uint16_t slot_base = 0;
    uint16_t slot_count = 0;
    uint8_t n_workers = 0;
    uint16_t epoch = 0;
    uint16_t mcast_grp = 0;
    uint8_t encap = 0;
};

// worker_table's bind_worker (JobAdmission): the one sender that may claim a rank. udp_port 0
// binds no port (RoCEv2 senders take theirs from the flow label).
struct WorkerBinding {
    uint16_t port = 0;
    uint32_t addr = 0;
    uint64_t mac = 0;
    uint16_t udp_port = 0;
};

// replica_table's set_worker_address / set_roce_worker_address (ReplicaRewrite).
struct ReplicaAddress {
    uint64_t mac = 0;
    uint32_t addr = 0;
    bool roce = false;
    uint16_t udp_port = 0;  // UDP encapsulation
    uint32_t qp = 0;        // RoCE encapsulation
    uint32_t rkey = 0;
};

// uplink_table's set_uplink (TreeUplink, docs/trees.md): where a switch below the root of an
// aggregation tree sends its partial sums, and the parent whose results it admits.
struct UplinkEntry {
    uint16_t port = 0;
    uint8_t rank = 0;
    uint16_t slot_base = 0;
    uint64_t mac = 0;  // the parent's aggregator address
    uint32_t addr = 0;
    uint16_t udp_port = 0;
    uint64_t src_mac = 0;  // this switch's aggregator address
    uint32_t src_addr = 0;
    uint16_t src_udp_port = 0;
};

// host_port_table's guard_host_port (SourceGuard): a host-facing port, the switch's aggregator
// address no frame from it may carry, the host aggregator's, and whether it sits on this port.
struct GuardPort {
    uint32_t aggregator_addr = 0;
    uint32_t host_aggregator = 0;
    bool is_aggregator = false;
};

// host_port_table as the TNA program declares it (p4/tofino/source_guard.p4): ternary rows on
// what a frame shows, each refusing with a GUARD_DROP reason. Per field (kGuardRowFields, in
// this order: IPv4 valid, IPv4 source, inagg valid, inagg type, inagg flags) a value and a mask;
// a field matches when (field & mask) == value, so mask 0 matches anything.
constexpr size_t kGuardRowFields = 5;
struct GuardRow {
    int32_t priority = 0;
    std::array<uint32_t, kGuardRowFields> value{};
    std::array<uint32_t, kGuardRowFields> mask{};
    uint8_t reason = 0;

    bool same_match(const GuardRow& o) const {
        return priority == o.priority && value == o.value && mask == o.mask;
    }
};

// The switch's ATP state (docs/atp.md; pipeline_reference.py's AtpPool): its slots for ATP jobs'
// rounds (count 0: none, and no frame is taken for ATP), the host aggregator those jobs' workers
// address (IPv4, UDP port: a frame to or from that port is inagg too) and this switch's
// aggregator address, the source of the sums it sends up (the host aggregator's atp_peer).
struct AtpPool {
    uint16_t base = 0;
    uint16_t count = 0;
    uint32_t host_addr = 0;
    uint16_t host_port = 0;
    uint64_t switch_mac = 0;
    uint32_t switch_addr = 0;
    uint16_t switch_udp_port = 0;
};

// What the pipeline needs of an ATP job's admission (pipeline_reference.py's AtpAdmit; its
// window, epoch and ranks are the engine's).
struct AtpAdmit {
    uint8_t job_index = 0;
    uint8_t n_workers = 0;
};

// l2_table's actions (Forwarding); `arg` is the port of forward or the group of flood.
// A forward to kDropPort leaves nowhere: v1model's drop port (BMv2 drops a packet whose
// egress_spec is 511), and on Tofino a port no pipe has (P4Testgen's tests expect a drop).
constexpr uint16_t kDropPort = 511;
enum class L2Kind : uint8_t { Drop, Forward, Flood };
struct L2Action {
    L2Kind kind = L2Kind::Drop;
    uint16_t arg = 0;
};

// One copy the packet replication engine makes: egress port and instance (egress_rid).
struct Replica {
    uint16_t port = 0;
    uint16_t instance = 0;
};

struct SwitchTables {
    std::unordered_map<uint16_t, JobAdmit> jobs;                     // job_id
    std::unordered_map<uint32_t, WorkerBinding> workers;             // job_id << 8 | rank
    std::unordered_map<uint32_t, ReplicaAddress> replicas;           // job_id << 16 | replica
    std::unordered_map<uint16_t, UplinkEntry> uplinks;               // job_id
    std::unordered_map<uint64_t, L2Action> l2;                       // dst MAC
    std::unordered_map<uint16_t, GuardPort> host_ports;              // ingress port
    std::unordered_map<uint16_t, std::vector<GuardRow>> guard_rows;  // ingress port: by priority
    L2Action l2_default;
    std::unordered_map<uint16_t, std::vector<Replica>> groups;  // multicast group id
    AtpPool atp;
    std::unordered_map<uint16_t, AtpAdmit> atp_jobs;  // job_id

    static uint32_t replica_key(uint16_t job_id, uint16_t replica) {
        return uint32_t(job_id) << 16 | replica;
    }
    static uint32_t worker_key(uint16_t job_id, uint8_t rank) {
        return uint32_t(job_id) << 8 | rank;
    }
};

// The counters of JobCounters, in P4Info order of their names' meaning.
enum class Counter : uint8_t {
    JobPackets,
    JobAggregated,
    JobDuplicates,
    JobResults,
    JobDrops,
    GlobalDrops,
    GuardDrops,    // SourceGuard's, by GUARD_DROP_* (size 0 where the program has no guard)
    JobCollisions  // ATP's (size 0 where the program has no ATP pool)
};
constexpr size_t kCounters = size_t(Counter::JobCollisions) + 1;

// Indexed packet counters. One thread counts at a time (the switch's lock); Python reads them
// through array views at any time, so each cell is written with a relaxed atomic store and an
// aligned 64-bit read never sees half an update.
class SwitchCounters {
public:
    explicit SwitchCounters(const std::array<size_t, kCounters>& sizes) {
        for (size_t c = 0; c < kCounters; ++c) cells_[c].assign(sizes[c], 0);
    }

    // Out-of-range indices are ignored, as BMv2 ignores them.
    void count(Counter c, size_t index) {
        std::vector<int64_t>& cells = cells_[size_t(c)];
        if (index >= cells.size()) return;
        int64_t* cell = &cells[index];
        __atomic_store_n(cell, __atomic_load_n(cell, __ATOMIC_RELAXED) + 1, __ATOMIC_RELAXED);
    }

    // P4Runtime MODIFY of one cell (the controller zeroes a job row's counters); false when
    // the index is out of range.
    bool set(Counter c, size_t index, int64_t value) {
        std::vector<int64_t>& cells = cells_[size_t(c)];
        if (index >= cells.size()) return false;
        __atomic_store_n(&cells[index], value, __ATOMIC_RELAXED);
        return true;
    }

    std::vector<int64_t>& cells(Counter c) { return cells_[size_t(c)]; }

private:
    std::array<std::vector<int64_t>, kCounters> cells_;
};

}  // namespace inagg

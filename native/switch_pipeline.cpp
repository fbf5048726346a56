// The software switch's pipeline (see switch_pipeline.hpp). Each method is one P4 control, as in
// bmv2_env/softswitch/pipeline_reference.py::SoftPipeline; keep the two in step.
#include "switch_pipeline.hpp"

#include <algorithm>
#include <cstring>

#include "checksums.hpp"
#include "switch_frame.hpp"

namespace inagg {

using namespace frame;

SwitchPipeline::SwitchPipeline(uint32_t n_slots, uint32_t values_per_packet,
                               const std::array<size_t, kCounters>& counter_sizes,
                               size_t n_drop_reasons)
    : engine_(n_slots, values_per_packet, false), counters_(counter_sizes),
      n_drop_reasons_(n_drop_reasons), result_(engine_.max_result_bytes()) {}

void SwitchPipeline::process(uint16_t port, const uint8_t* f, size_t len, OutputBatch& out) {
    uint8_t encap = parse_encap(f, len);
    bool atp =
        encap != kEncapRoce && atp_frame(f, len, tables_.atp.count ? tables_.atp.host_port : 0);
    if (atp) encap = kEncapUdp;
    if (source_guard(port, f, len, encap)) return;
    if (encap == kEncapNone) {
        forwarding(port, f, len, out);
    } else if (atp) {
        atp_admission(port, f, len, out);
    } else {
        admission(port, f, len, encap, out);
    }
}

// SourceGuard (p4/include/source_guard.p4): on a host port, a frame from the switch's aggregator
// address, or from the host aggregator's off its port, is GUARD_DROP_AGGREGATOR_ADDR; an inagg
// RESULT off the host aggregator's port, or a FLAG_FROM_SWITCH packet, GUARD_DROP_RESULT.
bool SwitchPipeline::source_guard(uint16_t port, const uint8_t* f, size_t len, uint8_t encap) {
    int row = guard_row_reason(port, f, len, encap);
    if (row >= 0) {
        counters_.count(Counter::GuardDrops, size_t(row));
        return true;
    }
    auto hit = tables_.host_ports.find(port);
    if (hit == tables_.host_ports.end()) return false;
    const GuardPort& g = hit->second;
    if (len >= kIpAt + kIp && load_be16(f + kEthType) == 0x0800) {  // the parser's ipv4 valid
        uint32_t src = load_be32(f + kIpAt + kIpSrc);
        if (src == g.aggregator_addr || (!g.is_aggregator && src == g.host_aggregator)) {
            counters_.count(Counter::GuardDrops, kGuardDropAggregatorAddr);
            return true;
        }
    }
    size_t at = encap == kEncapRoce ? kRoceInaggAt : kInaggAt;
    if (encap == kEncapNone || len < at + kHeaderBytes) return false;  // no inagg header
    bool result = (f[at + field::kVersionType] & 0xF) == kMsgResult && !g.is_aggregator;
    if (result || (f[at + field::kFlags] & kFlagFromSwitch)) {
        counters_.count(Counter::GuardDrops, kGuardDropResult);
        return true;
    }
    return false;
}

// The TNA program's rows match what its parser extracts: IPv4 (validity, source) and the inagg
// header of a UDP frame to the inagg port (validity, type, flags); rows are kept by priority.
int SwitchPipeline::guard_row_reason(uint16_t port, const uint8_t* f, size_t len,
                                     uint8_t encap) const {
    auto rows = tables_.guard_rows.find(port);
    if (rows == tables_.guard_rows.end()) return -1;
    bool ipv4 = len >= kIpAt + kIp && load_be16(f + kEthType) == 0x0800;
    bool inagg = encap == kEncapUdp && len >= kInaggAt + kHeaderBytes;
    std::array<uint32_t, kGuardRowFields> fields{
        ipv4, ipv4 ? load_be32(f + kIpAt + kIpSrc) : 0u, inagg,
        inagg ? uint32_t(f[kInaggAt + field::kVersionType] & 0xF) : 0u,
        inagg ? uint32_t(f[kInaggAt + field::kFlags]) : 0u};
    for (const GuardRow& r : rows->second) {
        bool match = true;
        for (size_t i = 0; i < kGuardRowFields; ++i)
            match = match && (fields[i] & r.mask[i]) == r.value[i];
        if (match) return r.reason;
    }
    return -1;
}

// The IPv4 header checksum the deparser writes into a frame it parsed as IPv4 (EtherType 0x0800,
// the 20-byte header there): none (-1) when the frame carries it already or is not IPv4.
static int deparsed_ipv4_checksum(const uint8_t* f, size_t len) {
    if (len < kEth + kIp || load_be16(f + kEthType) != 0x0800) return -1;
    uint8_t header[kIp];
    std::memcpy(header, f + kIpAt, kIp);
    header[kIpChecksum] = header[kIpChecksum + 1] = 0;
    uint16_t sum = ipv4_checksum(header);
    return sum == load_be16(f + kIpAt + kIpChecksum) ? -1 : sum;
}

// One forwarded copy: as it came, or (the deparser's checksum differs) a copy with it.
static void forward_copy(uint16_t port, const uint8_t* f, size_t len, int checksum,
                         OutputBatch& out) {
    if (checksum < 0) {
        out.forward(port, f, len);
        return;
    }
    uint8_t* copy = out.reserve(port, len);
    std::memcpy(copy, f, len);
    store_be16(copy + kIpAt + kIpChecksum, static_cast<uint16_t>(checksum));
}

template <class Send>
void SwitchPipeline::each_l2_port(uint16_t port, uint64_t dst_mac, Send send) const {
    auto hit = tables_.l2.find(dst_mac);
    const L2Action& action = hit == tables_.l2.end() ? tables_.l2_default : hit->second;
    if (action.kind == L2Kind::Forward) {
        if (action.arg != kDropPort) send(action.arg);
    } else if (action.kind == L2Kind::Flood) {
        auto group = tables_.groups.find(action.arg);
        if (group == tables_.groups.end()) return;
        for (const Replica& r : group->second)
            if (r.port != port) send(r.port);
    }
}

void SwitchPipeline::forwarding(uint16_t port, const uint8_t* f, size_t len, OutputBatch& out) {
    if (len < kEth) return;
    int checksum = deparsed_ipv4_checksum(f, len);
    each_l2_port(port, load_be48(f), [&](uint16_t to) { forward_copy(to, f, len, checksum, out); });
}

void SwitchPipeline::admission(uint16_t port, const uint8_t* f, size_t len, uint8_t encap,
                               OutputBatch& out) {
    size_t at = encap == kEncapRoce ? kRoceInaggAt : kInaggAt;
    if (len < at + kHeaderBytes) {
        count_global(Outcome::Truncated);
        return;
    }
    if (header_version(f + at) != kVersion) {
        count_global(Outcome::BadVersion);
        return;
    }
    auto admitted = tables_.jobs.find(header_job(f + at));
    if (admitted == tables_.jobs.end()) {  // not admitted to the switch: forward untouched
        forwarding(port, f, len, out);
        return;
    }
    const JobAdmit& admit = admitted->second;
    if (encap != admit.encap) {
        count_outcome(admit.job_index, Outcome::BadEncap, false);
        return;
    }
    // The inagg bytes end where UDP says (RoCE: before the ICRC, and RETH's DMA length must
    // agree); a UDP length too short for the header the P4 parser extracts is bad_length.
    size_t inagg_end = udp_end(f);
    bool framing_ok = true;
    if (encap == kEncapRoce) {
        framing_ok = len >= inagg_end &&
                     load_be32(f + kInaggAt + kRoceDmaLen) == inagg_end - kRoceIcrcBytes - at;
        inagg_end -= kRoceIcrcBytes;
    }
    if (inagg_end < at + kHeaderBytes) {
        framing_ok = false;
        inagg_end = at + kHeaderBytes;
    }
    Emit emit = engine_.process(f + at, std::min(inagg_end, len) - at, sender(port, f, at),
                                framing_ok, result_.data());
    Outcome outcome = engine_.last_outcome();
    count_outcome(admit.job_index, outcome, emit.length != 0);
    if (!emit.length) return;
    if (emit.rank == kUpstream) {
        upstream_send(f, len, encap, emit.job, emit.length, out);
    } else {
        replicate(port, f, len, encap, admit, outcome == Outcome::DupDone, emit, out);
    }
}

// ATP (pipeline_reference.py: SoftPipeline.atp_admission): an ATP job's contribution or the
// host aggregator's RESULT through the engine; anything else to admission when it is to the
// inagg port, else forwarded untouched. What goes up
// is the contribution itself (forwarded on) or a complete sum (atp_sum); a RESULT frees its
// aggregator and goes on, unless it is addressed to this switch (a release).
void SwitchPipeline::atp_admission(uint16_t port, const uint8_t* f, size_t len, OutputBatch& out) {
    auto hit = len >= kInaggAt + kHeaderBytes ? tables_.atp_jobs.find(header_job(f + kInaggAt))
                                              : tables_.atp_jobs.end();
    if (hit == tables_.atp_jobs.end() || header_version(f + kInaggAt) != kVersion) {
        if (load_be16(f + kUdpAt + kUdpDstPort) == kInaggUdpPort) {  // the switch's own job's
            admission(port, f, len, kEncapUdp, out);
        } else {
            forwarding(port, f, len, out);
        }
        return;
    }
    const AtpAdmit& admit = hit->second;
    size_t inagg_end = udp_end(f);
    bool framing_ok = inagg_end >= kInaggAt + kHeaderBytes;  // else bad_length, as in admission
    inagg_end = std::max(inagg_end, kInaggAt + kHeaderBytes);
    Emit emit = engine_.process(f + kInaggAt, std::min(inagg_end, len) - kInaggAt,
                                sender(port, f, kInaggAt, true), framing_ok, result_.data());
    Outcome outcome = engine_.last_outcome();
    bool sums = emit.length && (outcome == Outcome::Add || outcome == Outcome::DupUpstream ||
                                (outcome == Outcome::First && admit.n_workers == 1));
    count_outcome(admit.job_index, outcome, sums);
    if ((f[kInaggAt + field::kVersionType] & 0xF) == kMsgResult) {
        if (load_be32(f + kIpAt + kIpDst) != tables_.atp.switch_addr) forwarding(port, f, len, out);
    } else if (sums) {
        atp_sum(port, f, len, emit.length, out);
    } else if (emit.length) {
        forwarding(port, f, len, out);
    }
}

// The completing contribution's frame from this switch's aggregator address, the sum as its
// payload, forwarded as the contribution would be; lengths and trailer as for a result.
void SwitchPipeline::atp_sum(uint16_t port, const uint8_t* f, size_t len, size_t result_len,
                             OutputBatch& out) {
    const AtpPool& p = tables_.atp;
    ReplicaAddress host{
        load_be48(f + kEthDst), load_be32(f + kIpAt + kIpDst), false, p.host_port, 0, 0};
    size_t end = udp_end(f);
    size_t trailer = len > end ? len - end : 0;
    size_t frame_len = result_frame_len(kEncapUdp, result_len);
    each_l2_port(port, host.mac, [&](uint16_t to) {
        uint8_t* o = out.reserve(to, frame_len + trailer);
        write_from_switch(f, kEncapUdp, host, p.switch_mac, p.switch_addr, p.switch_udp_port,
                          result_len, o);
        std::memcpy(o + frame_len, f + end, trailer);
    });
}

SenderId SwitchPipeline::sender(uint16_t port, const uint8_t* f, size_t at, bool atp) const {
    uint32_t addr = load_be32(f + kIpAt + kIpSrc);
    uint64_t mac = load_be48(f + kEthSrc);
    uint16_t udp_port = load_be16(f + kUdpAt + kUdpSrcPort);
    bool result = (f[at + field::kVersionType] & 0xF) == kMsgResult;
    if (result && atp) {  // the host aggregator's
        const AtpPool& p = tables_.atp;
        return addr == p.host_addr && udp_port == p.host_port ? kAtpPeerSender : kForgedSender;
    }
    if (result) {  // the parent's, in a tree
        auto up = tables_.uplinks.find(header_job(f + at));
        if (up == tables_.uplinks.end()) return kForgedSender;
        const UplinkEntry& u = up->second;
        bool parent = u.port == port && u.addr == addr && u.mac == mac && u.udp_port == udp_port;
        return parent ? kParentSender : kForgedSender;
    }
    uint8_t rank = header_worker(f + at);
    auto hit = tables_.workers.find(SwitchTables::worker_key(header_job(f + at), rank));
    if (hit == tables_.workers.end()) return kForgedSender;
    const WorkerBinding& w = hit->second;
    bool same = w.port == port && w.addr == addr && w.mac == mac &&
                (w.udp_port == 0 || w.udp_port == udp_port);
    return same ? bound_sender_id(rank) : kForgedSender;
}

void SwitchPipeline::count_global(Outcome reason) {
    if (int code = p4_drop_code(reason); code >= 0)
        counters_.count(Counter::GlobalDrops, size_t(code));
}

void SwitchPipeline::count_outcome(size_t job, Outcome outcome, bool result) {
    counters_.count(Counter::JobPackets, job);
    if (outcome == Outcome::First || outcome == Outcome::Add) {
        counters_.count(Counter::JobAggregated, job);
        if (result) counters_.count(Counter::JobResults, job);
    } else if (outcome == Outcome::DupPending || outcome == Outcome::DupDone ||
               outcome == Outcome::DupUpstream || outcome == Outcome::DupResult) {
        counters_.count(Counter::JobDuplicates, job);
    } else if (int code = p4_drop_code(outcome); code >= 0) {
        counters_.count(Counter::JobDrops, job * n_drop_reasons_ + size_t(code));
    } else if (outcome == Outcome::Collision) {
        counters_.count(Counter::JobCollisions, job);
    }
}

void SwitchPipeline::replicate(uint16_t port, const uint8_t* f, size_t len, uint8_t encap,
                               const JobAdmit& admit, bool unicast, const Emit& emit,
                               OutputBatch& out) {
    size_t at = encap == kEncapRoce ? kRoceInaggAt : kInaggAt;
    uint16_t job_id = header_job(f + at);
    Replica asker{
        port, uint16_t(header_worker(f + at) + 1)};  // DUP_DONE: replica = the sender's rank + 1
    const Replica* first = &asker;
    const Replica* last = first + 1;
    if (!unicast) {
        auto group = tables_.groups.find(admit.mcast_grp);
        if (group == tables_.groups.end()) return;
        first = group->second.data();
        last = first + group->second.size();
    }
    // As BMv2 does, the bytes after the UDP payload (Ethernet padding, a trailer: what the
    // parser did not extract) follow the deparsed headers of every copy.
    size_t end = udp_end(f);
    size_t trailer = len > end ? len - end : 0;
    for (const Replica* r = first; r != last; ++r) {
        // a reduce-scatter's round: the values to its owner only, the header to the others
        size_t result_len = emit.length_for(int32_t(r->instance) - 1);
        size_t frame_len = result_frame_len(encap, result_len);
        const ReplicaAddress* rewrite = nullptr;
        if (r->instance) {
            auto hit = tables_.replicas.find(SwitchTables::replica_key(job_id, r->instance));
            if (hit == tables_.replicas.end()) continue;
            rewrite = &hit->second;
        }
        // a UDP result's flags may be marked on its way out (SwitchLoop); RoCE's ICRC covers them
        uint8_t* o = out.reserve(r->port, frame_len + trailer,
                                 encap == kEncapRoce ? 0 : kInaggAt + field::kFlags);
        write_result_frame(f, encap, rewrite, result_len, o, emit.length - result_len);
        std::memcpy(o + frame_len, f + end, trailer);
    }
}

// UpstreamSend: the partial sum as a contribution to the parent, from this switch's
// aggregator address to the parent's, out of the uplink port (docs/trees.md); lengths and
// trailer as for a result.
void SwitchPipeline::upstream_send(const uint8_t* f, size_t len, uint8_t encap, uint16_t job_id,
                                   size_t result_len, OutputBatch& out) {
    auto hit = tables_.uplinks.find(job_id);
    if (hit == tables_.uplinks.end()) return;  // the engine's uplink came from this entry
    const UplinkEntry& u = hit->second;
    size_t end = udp_end(f);
    size_t trailer = len > end ? len - end : 0;
    size_t frame_len = result_frame_len(encap, result_len);
    uint8_t* o = out.reserve(u.port, frame_len + trailer);
    ReplicaAddress parent{u.mac, u.addr, false, u.udp_port, 0, 0};
    write_from_switch(f, encap, parent, u.src_mac, u.src_addr, u.src_udp_port, result_len, o);
    std::memcpy(o + frame_len, f + end, trailer);
}

void SwitchPipeline::write_from_switch(const uint8_t* f, uint8_t encap, const ReplicaAddress& dst,
                                       uint64_t src_mac, uint32_t src_addr, uint16_t src_udp_port,
                                       size_t result_len, uint8_t* o) const {
    write_result_frame(f, encap, &dst, result_len, o);
    store_be48(o + kEthSrc, src_mac);
    store_be32(o + kIpAt + kIpSrc, src_addr);
    store_be16(o + kUdpAt + kUdpSrcPort, src_udp_port);
    store_be16(o + kIpAt + kIpChecksum, 0);
    store_be16(o + kIpAt + kIpChecksum, ipv4_checksum(o + kIpAt));
    if (encap == kEncapRoce) {
        size_t udp_len = load_be16(o + kUdpAt + kUdpLength);
        roce_icrc(o + kIpAt, kIp + udp_len, o + kRoceInaggAt + result_len);
    }
}

size_t SwitchPipeline::result_frame_len(uint8_t encap, size_t result_len) {
    return encap == kEncapRoce ? kRoceInaggAt + result_len + kRoceIcrcBytes : kInaggAt + result_len;
}

// The result in the trigger's encapsulation: addresses and ports swapped (the source is the
// switch address the worker sent to), then ReplicaRewrite's fields, the UDP length and the
// checksums; the IPv4 total length stays the trigger's, as BMv2 leaves it, less the `cut` bytes
// of values a reduce-scatter's result elides for this replica (RoCE: its RETH DMA length too).
void SwitchPipeline::write_result_frame(const uint8_t* f, uint8_t encap,
                                        const ReplicaAddress* rewrite, size_t result_len,
                                        uint8_t* o, size_t cut) const {
    bool roce = encap == kEncapRoce;
    size_t at = roce ? kRoceInaggAt : kInaggAt;
    size_t udp_len = kUdp + (at - kInaggAt) + result_len + (roce ? kRoceIcrcBytes : 0);
    std::memcpy(o + kEthDst, f + kEthSrc, 6);
    std::memcpy(o + kEthSrc, f + kEthDst, 6);
    std::memcpy(o + kEthType, f + kEthType, 2);
    uint8_t* ip = o + kIpAt;
    std::memcpy(ip, f + kIpAt, kIpSrc);
    std::memcpy(ip + kIpSrc, f + kIpAt + kIpDst, 4);
    std::memcpy(ip + kIpDst, f + kIpAt + kIpSrc, 4);
    uint8_t* udp = o + kUdpAt;
    std::memcpy(udp + kUdpSrcPort, f + kUdpAt + kUdpDstPort, 2);
    std::memcpy(udp + kUdpDstPort, f + kUdpAt + kUdpSrcPort, 2);
    if (roce) std::memcpy(o + kInaggAt, f + kInaggAt, kRoceHeaderBytes);
    if (cut) {
        uint16_t total = load_be16(ip + kIpTotalLength);
        store_be16(ip + kIpTotalLength, uint16_t(total > cut ? total - cut : 0));
        if (roce) {
            uint32_t dma = load_be32(o + kInaggAt + kRoceDmaLen);
            store_be32(o + kInaggAt + kRoceDmaLen, uint32_t(dma > cut ? dma - cut : 0));
        }
    }
    if (rewrite) {
        store_be48(o, rewrite->mac);
        store_be32(ip + kIpDst, rewrite->addr);
        store_be16(udp + kUdpDstPort, rewrite->roce ? kRoceUdpPort : rewrite->udp_port);
        if (rewrite->roce && roce) {  // on a UDP frame BTH and RETH are not valid: no-ops
            uint8_t* q = o + kInaggAt + kRoceQp;
            q[0] = uint8_t(rewrite->qp >> 16);
            store_be16(q + 1, uint16_t(rewrite->qp));
            store_be32(o + kInaggAt + kRoceRkey, rewrite->rkey);
        }
    }
    store_be16(ip + kIpChecksum, 0);
    store_be16(ip + kIpChecksum, ipv4_checksum(ip));
    store_be16(udp + kUdpLength, uint16_t(udp_len));
    store_be16(udp + kUdpChecksum, 0);
    std::memcpy(o + at, result_.data(), result_len);
    if (roce) roce_icrc(ip, kIp + udp_len, o + at + result_len);
}

}  // namespace inagg

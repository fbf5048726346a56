/* inagg for BMv2 (v1model): multi-tenant in-network aggregation of int32 gradient blocks.
 * This file only wires the controls in include/; each one documents its decisions. */
#include <core.p4>
#include <v1model.p4>

#include "include/size.p4"
#include "include/types.p4"
#include "include/parser.p4"
#include "include/checksum.p4"
#include "include/source_guard.p4"
#include "include/tree_uplink.p4"
#include "include/job_admission.p4"
#include "include/slot_state.p4"
#include "include/round_owner.p4"
#include "include/value_aggregation.p4"
#include "include/result_replication.p4"
#include "include/upstream_send.p4"
#include "include/forwarding.p4"
#include "include/job_counters.p4"
#include "include/replica_rewrite.p4"
#include "include/result_elision.p4"
#include "include/congestion_mark.p4"
#include "include/roce_icrc.p4"

control InaggIngress(inout headers_t hdr, inout metadata_t meta,
                     inout standard_metadata_t sm) {
    SourceGuard() source_guard;
    TreeUplink() tree_uplink;
    JobAdmission() admission;
    SlotState() slot_state;
    RoundOwner() round_owner;
    ValueAggregation() value_aggregation;
    ResultReplication() result_replication;
    UpstreamSend() upstream_send;
    Forwarding() forwarding;
    JobCounters() job_counters;

    apply {
        source_guard.apply(hdr, meta, sm);
        if (meta.guard_drop == 1) {
            mark_to_drop(sm);
            return;
        }
        tree_uplink.apply(hdr, meta);
        admission.apply(hdr, meta, sm);
        if (meta.verdict == VERDICT_AGGREGATE) {
            slot_state.apply(hdr, meta);
            round_owner.apply(hdr, meta);
            value_aggregation.apply(hdr, meta);
            if (meta.send_up == 1) {
                upstream_send.apply(hdr, meta, sm);
            } else {
                result_replication.apply(hdr, meta, sm);
            }
        } else if (meta.verdict == VERDICT_FORWARD) {
            forwarding.apply(hdr, meta, sm);
        } else {
            mark_to_drop(sm);
        }
        job_counters.apply(hdr, meta);
    }
}

control InaggEgress(inout headers_t hdr, inout metadata_t meta,
                    inout standard_metadata_t sm) {
    ReplicaRewrite() replica_rewrite;
    ResultElision() result_elision;
    CongestionMark() congestion_mark;
    RoceIcrc() roce_icrc;

    apply {
        replica_rewrite.apply(hdr, meta, sm);
        result_elision.apply(hdr, meta);
        congestion_mark.apply(hdr, sm);
        roce_icrc.apply(hdr, meta);
    }
}

@pkginfo(name="inagg", version="1")
V1Switch(InaggParser(), InaggVerifyChecksum(), InaggIngress(), InaggEgress(),
         InaggComputeChecksum(), InaggDeparser()) main;

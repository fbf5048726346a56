/* inagg for Tofino (TNA, Tofino 1 and 2): multi-tenant in-network aggregation of int32
 * gradient blocks, on the wire protocol of p4/include/. This file only wires the controls of
 * this directory; each one documents its decisions, docs/tofino.md the resource budget. */
#include <core.p4>
#if __TARGET_TOFINO__ == 2
#include <t2na.p4>
#else
#include <tna.p4>
#endif

#include "size.p4"
#include "types.p4"
#include "parser.p4"
#include "source_guard.p4"
#include "slot_inputs.p4"
#include "job_admission.p4"
#include "slot_claim.p4"
#include "round_record.p4"
#include "slot_state.p4"
#include "value_lanes.p4"
#include "recirc_spread.p4"
#include "result_replication.p4"
#include "forwarding.p4"
#include "job_counters.p4"
#include "replica_rewrite.p4"

/* Metadata starts zeroed: no control spends a stage initialising its fields. */
@pa_auto_init_metadata
control InaggIngress(inout tofino_headers_t hdr, inout tofino_ingress_md_t meta,
                     in ingress_intrinsic_metadata_t ig_intr_md,
                     in ingress_intrinsic_metadata_from_parser_t ig_prsr_md,
                     inout ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md,
                     inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {
    SourceGuard() source_guard;
    SlotInputs() slot_inputs;
    JobAdmission() admission;
    SlotClaim() slot_claim;
    RoundRecord() round_record;
    SlotState() slot_state;
    ValueLanes() value_lanes;
    RecircSpread() recirc_spread;
    ResultReplication() result_replication;
    Forwarding() forwarding;
    JobCounters() job_counters;

    apply {
        if (!hdr.bridged.isValid()) {          /* a first pass (a harvest pass parsed it) */
            hdr.bridged.setValid();
            hdr.bridged.ingress_port = ig_intr_md.ingress_port;
            hdr.bridged.replica = 0;
            hdr.bridged.harvest = HARVEST_NONE;
            hdr.bridged.flooded = 0;
#if __TARGET_TOFINO__ == 2
            hdr.bridged.owner = 0;             /* the parser's start read the frame's first */
            hdr.bridged.pad1 = 0;              /* bytes into them (parser.p4) */
#endif
        }

        slot_inputs.apply(hdr, meta, ig_intr_md);
        recirc_spread.apply(hdr, meta, ig_intr_md);
        admission.apply(hdr, meta, ig_intr_md);
        slot_claim.apply(hdr, meta, ig_prsr_md);
        if (meta.verdict == VERDICT_AGGREGATE) {
            round_record.apply(hdr, meta);
        }
        value_lanes.apply(hdr, meta);       /* before the rest of the round logic: the lanes
                                               wait for round_record only, nothing for them */
        if (meta.verdict == VERDICT_AGGREGATE || meta.verdict == VERDICT_HARVEST) {
            slot_state.apply(hdr, meta);
        }
        /* (The same test again, not one block: in one block bf-p4c places the result's tables
           before the lanes and needs a 13th stage.) */
        if (meta.verdict == VERDICT_AGGREGATE || meta.verdict == VERDICT_HARVEST) {
            result_replication.apply(hdr, meta, ig_intr_md, ig_dprsr_md, ig_tm_md);
        } else if (meta.verdict == VERDICT_FORWARD) {
            forwarding.apply(hdr, ig_dprsr_md, ig_tm_md);
            source_guard.apply(hdr, ig_intr_md, ig_dprsr_md);   /* after: its drop wins */
        } else {
            ig_dprsr_md.drop_ctl = 1;
        }
        job_counters.apply(meta, ig_intr_md);
    }
}

control InaggEgress(inout tofino_headers_t hdr, inout tofino_egress_md_t meta,
                    in egress_intrinsic_metadata_t eg_intr_md,
                    in egress_intrinsic_metadata_from_parser_t eg_prsr_md,
                    inout egress_intrinsic_metadata_for_deparser_t eg_dprsr_md,
                    inout egress_intrinsic_metadata_for_output_port_t eg_oport_md) {
    ReplicaRewrite() replica_rewrite;

    apply {
        replica_rewrite.apply(hdr, eg_intr_md, eg_dprsr_md);
    }
}

Pipeline(InaggIngressParser(), InaggIngress(), InaggIngressDeparser(),
         InaggEgressParser(), InaggEgress(), InaggEgressDeparser()) pipe;

@pkginfo(name="inagg", version="1")
Switch(pipe) main;

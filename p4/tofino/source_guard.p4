/* SourceGuard (Tofino): a host cannot pass itself off as an aggregator (docs/security.md).
 *
 * The same table and action as p4/include/source_guard.p4 (host_port_table on the ingress
 * port, guard_host_port(aggregator_addr, host_aggregator, is_aggregator)), so the controller
 * programs both targets alike. Tofino gateways compare a field with a constant, so the action
 * computes differences (as JobAdmission does) and the next stage's ternary table with const
 * entries turns them into the verdict, for the traffic the switch forwards (InaggIngress
 * applies it on the forwarding branch only):
 *
 *   forwarded frame on a host port                       | verdict
 *   -----------------------------------------------------+-------------------------------------
 *   IPv4 source = the switch's aggregator address        | drop GUARD_DROP_AGGREGATOR_ADDR
 *   IPv4 source = the host aggregator's, off its port    | drop GUARD_DROP_AGGREGATOR_ADDR
 *   inagg RESULT, off the host aggregator's port         | drop GUARD_DROP_RESULT
 *   inagg FLAG_FROM_SWITCH                               | drop GUARD_DROP_RESULT
 *   anything else, or a port with no entry               | Forwarding
 *
 * Only forwarded frames reach it: a forged result goes to a worker's own UDP port, which no
 * parser takes for inagg, so it is forwarded and dropped here. The inagg packets of an admitted
 * job stay SlotClaim's (one stage-1 table that decides and claims the slot at once; a guard
 * before it would cost a stage): a RESULT there is DROP_BAD_TYPE (this program has no tree
 * uplinks), a frame from an aggregator's address DROP_BAD_WORKER (no rank is bound to it), and
 * a bound rank's FLAG_FROM_SWITCH is ignored as on any contribution (docs/tofino.md).
 */
#ifndef _INAGG_TOFINO_SOURCE_GUARD_P4_
#define _INAGG_TOFINO_SOURCE_GUARD_P4_

#include "types.p4"

control SourceGuard(in tofino_headers_t hdr, inout tofino_ingress_md_t meta,
                    in ingress_intrinsic_metadata_t ig_intr_md,
                    inout ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md) {
    Counter<bit<32>, bit<8>>((bit<32>) GUARD_DROP_REASONS, CounterType_t.PACKETS) guard_drops;

    action guard_host_port(bit<32> aggregator_addr, bit<32> host_aggregator, bit<1> is_aggregator) {
        meta.guard_port = 1w1 ++ is_aggregator;
        meta.guard_addr_diff = hdr.ipv4.src_addr ^ aggregator_addr;
        meta.guard_host_diff = hdr.ipv4.src_addr ^ host_aggregator;
    }

    /* A port with no entry: written, not left to initialisation (the fields are @pa_no_init in
     * inagg.p4, so they can share containers with admission's differences, dead by now). */
    action open_port() {
        meta.guard_port = GUARD_PORT_OPEN;
    }

    table host_port_table {
        key = { ig_intr_md.ingress_port: exact @name("port"); }
        actions = { guard_host_port; @defaultonly open_port; }
        const default_action = open_port();
        size = TOFINO_HOST_PORT_TABLE_SIZE;
    }

    /* The verdict on the differences, and its count. */
    action refuse(bit<8> reason) {
        ig_dprsr_md.drop_ctl = 1;      /* whatever Forwarding then does: no copy leaves */
        guard_drops.count(reason);
    }

    table guard_checks {
        key = {
            meta.guard_port: ternary;
            hdr.ipv4.isValid(): ternary;
            meta.guard_addr_diff: ternary;
            meta.guard_host_diff: ternary;
            hdr.inagg.isValid(): ternary;
            hdr.inagg.msg_type: ternary;
            hdr.inagg.flags: ternary;
        }
        actions = { refuse; NoAction; }
        const entries = {
            (GUARD_PORT_HOST &&& 2, true, 0, _, _, _, _): refuse(GUARD_DROP_AGGREGATOR_ADDR);
            (GUARD_PORT_HOST, true, _, 0, _, _, _): refuse(GUARD_DROP_AGGREGATOR_ADDR);
            (GUARD_PORT_HOST, _, _, _, true, MSG_RESULT, _): refuse(GUARD_DROP_RESULT);
            (GUARD_PORT_HOST &&& 2, _, _, _, true, _, FLAG_FROM_SWITCH &&& FLAG_FROM_SWITCH): refuse(GUARD_DROP_RESULT);
        }
        default_action = NoAction();
        size = 4;
    }

    apply {
        host_port_table.apply();
        guard_checks.apply();
    }
}

#endif /* _INAGG_TOFINO_SOURCE_GUARD_P4_ */

/* SourceGuard (Tofino 1 and 2): a host cannot pass itself off as an aggregator (docs/security.md).
 *
 * The comparisons are the match's, not the action's: host_port_table is one ternary table on
 * the ingress port and the headers a forged frame shows, and the controller writes up to four
 * rows per host-facing port (controller/switch.py: SourceGuard.port_updates), each refusing
 * with its reason; no action data is compared in the pipeline, so the guard needs no metadata
 * and no stage of differences (the BMv2 program's table, exact on the port with the addresses
 * as action data, took two 32-bit differences here: on Tofino 1 that ran out of PHV or of
 * stages, docs/tofino.md):
 *
 *   rows the controller writes for a host port (highest priority first) | verdict
 *   --------------------------------------------------------------------+--------------------------
 *   port, IPv4 valid, source = the switch's aggregator address          | refuse(AGGREGATOR_ADDR)
 *   port, IPv4 valid, source = the host aggregator's (not on its port)  | refuse(AGGREGATOR_ADDR)
 *   port, inagg valid, msg_type = RESULT (not the host aggregator's)    | refuse(RESULT)
 *   port, inagg valid, flags & FLAG_FROM_SWITCH                         | refuse(RESULT)
 *   no row matches (a port with no rows: a link, a recirculation port)  | NoAction: Forwarding
 *
 * refuse drops (drop_ctl) and counts guard_drops[reason]. InaggIngress applies it on the
 * forwarding branch only, after l2_table (its drop wins; it needs no stage of its own: it reads
 * only headers and the ingress port): a forged result goes to a worker's own UDP port, which no
 * parser takes for inagg, so it is forwarded and dropped here.
 * The inagg packets of an admitted job stay SlotClaim's (one stage-1 table that decides and
 * claims the slot at once; a guard before it would cost a stage): a RESULT there is
 * DROP_BAD_TYPE (this program has no tree uplinks), a frame from an aggregator's address
 * DROP_BAD_WORKER (no rank is bound to it), and a bound rank's FLAG_FROM_SWITCH is ignored as
 * on any contribution (docs/tofino.md).
 */
#ifndef _INAGG_TOFINO_SOURCE_GUARD_P4_
#define _INAGG_TOFINO_SOURCE_GUARD_P4_

#include "types.p4"

control SourceGuard(in tofino_headers_t hdr, in ingress_intrinsic_metadata_t ig_intr_md,
                    inout ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md) {
    Counter<bit<32>, bit<8>>((bit<32>) GUARD_DROP_REASONS, CounterType_t.PACKETS) guard_drops;

    action refuse(bit<8> reason) {
        ig_dprsr_md.drop_ctl = 1;      /* whatever Forwarding did: no copy leaves */
        guard_drops.count(reason);
    }

    table host_port_table {
        key = {
            ig_intr_md.ingress_port: exact @name("port");
            hdr.ipv4.isValid(): ternary @name("ipv4_valid");
            hdr.ipv4.src_addr: ternary @name("src_addr");
            hdr.inagg.isValid(): ternary @name("inagg_valid");
            hdr.inagg.msg_type: ternary @name("msg_type");
            hdr.inagg.flags: ternary @name("flags");
        }
        actions = { refuse; @defaultonly NoAction; }
        const default_action = NoAction();
        size = TOFINO_HOST_PORT_TABLE_SIZE;
    }

    apply {
        host_port_table.apply();
    }
}

#endif /* _INAGG_TOFINO_SOURCE_GUARD_P4_ */

/* UpstreamSend: a round complete at a switch below the root of an aggregation tree leaves as
 * one contribution to the parent (docs/trees.md).
 *
 *   outcome            | the packet becomes
 *   -------------------+--------------------------------------------------------------------
 *   SLOT_FIRST/ADD     | the partial sum (ValueAggregation left it in the values) from this
 *   (last child in)    | switch's rank at the parent, FLAG_FROM_SWITCH + the round's sticky
 *                      | flags, its maximum exponent, offset and count
 *   SLOT_DUP_UPSTREAM  | the same, from the stored sum, with FLAG_RETRANSMIT (a child resent:
 *                      | the sum or the parent's result may be lost)
 *
 * The slot moves into the parent's numbering (slot - slot_base + up_slot_base); epoch and set
 * stay. Addressed from this switch's aggregator address to the parent's, out of the uplink port.
 */
#ifndef _INAGG_UPSTREAM_SEND_P4_
#define _INAGG_UPSTREAM_SEND_P4_

#include <core.p4>
#include <v1model.p4>
#include "types.p4"

control UpstreamSend(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t sm) {
    apply {
        hdr.inagg.msg_type = MSG_CONTRIBUTION;
        hdr.inagg.flags = meta.res_flags | FLAG_FROM_SWITCH;
        if (meta.outcome == SLOT_DUP_UPSTREAM) {
            hdr.inagg.flags = hdr.inagg.flags | FLAG_RETRANSMIT;
        }
        hdr.inagg.worker_id = meta.up_rank;
        hdr.inagg.exp = (int<8>) meta.res_exp;
        hdr.inagg.count = meta.res_count;
        hdr.inagg.offset = meta.res_offset;
        hdr.inagg.slot = (bit<15>) ((bit<16>) hdr.inagg.slot - meta.slot_base + meta.up_slot_base);

        hdr.ethernet.src_addr = meta.up_src_mac;
        hdr.ethernet.dst_addr = meta.up_mac;
        hdr.ipv4.src_addr = meta.up_src_addr;
        hdr.ipv4.dst_addr = meta.up_addr;
        hdr.udp.src_port = meta.up_src_udp_port;
        hdr.udp.dst_port = meta.up_udp_port;
        hdr.udp.checksum = 0;
        sm.egress_spec = meta.up_port;
    }
}

#endif /* _INAGG_UPSTREAM_SEND_P4_ */

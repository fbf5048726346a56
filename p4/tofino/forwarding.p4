/* Forwarding (Tofino): ordinary traffic and the inagg traffic of jobs not admitted to the
 * switch, by destination MAC; the same l2_table as p4/include/forwarding.p4.
 *
 *   l2_table on ethernet.dst_addr | action
 *   ------------------------------+-------------------------------------------------
 *   forward(port)                 | out of that port
 *   flood(group)                  | to every port of the group but the ingress one
 *   miss                          | drop
 */
#ifndef _INAGG_TOFINO_FORWARDING_P4_
#define _INAGG_TOFINO_FORWARDING_P4_

#include "types.p4"

control Forwarding(inout tofino_headers_t hdr,
                   inout ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md,
                   inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {
    action forward(PortId_t port) {
        ig_tm_md.ucast_egress_port = port;
    }

    action flood(bit<16> group) {
        ig_tm_md.mcast_grp_a = group;
        hdr.bridged.flooded = 1;
    }

    action drop() {
        ig_dprsr_md.drop_ctl = 1;
    }

    table l2_table {
        key = { hdr.ethernet.dst_addr: exact @name("dst_addr"); }
        actions = { forward; flood; drop; }
        default_action = drop();
        size = TOFINO_L2_TABLE_SIZE;
    }

    apply {
        l2_table.apply();
    }
}

#endif /* _INAGG_TOFINO_FORWARDING_P4_ */

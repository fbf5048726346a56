/* Forwarding: ordinary traffic (ARP, ping, the controller's and the host aggregator's) and the
 * inagg traffic of jobs not admitted to the switch, by destination MAC.
 *
 *   l2_table on ethernet.dst_addr | action
 *   ------------------------------+-------------------------------------------------
 *   forward(port)                 | out of that port
 *   flood(group)                  | to every port of the group but the ingress one
 *   miss                          | drop
 */
#ifndef _INAGG_FORWARDING_P4_
#define _INAGG_FORWARDING_P4_

#include <core.p4>
#include <v1model.p4>
#include "types.p4"

control Forwarding(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t sm) {
    action forward(bit<9> port) {
        sm.egress_spec = port;
    }

    action flood(bit<16> group) {
        sm.mcast_grp = group;
        meta.flooded = 1;
    }

    action drop() {
        mark_to_drop(sm);
    }

    table l2_table {
        key = { hdr.ethernet.dst_addr: exact @name("dst_addr"); }
        actions = { forward; flood; drop; }
        default_action = drop();
        size = INAGG_L2_TABLE_SIZE;
    }

    apply {
        l2_table.apply();
    }
}

#endif /* _INAGG_FORWARDING_P4_ */

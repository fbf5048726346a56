/* ReplicaRewrite (egress): address each replica of a multicast result to its worker, and keep
 * flooded frames off the port they came in on.
 *
 *   packet                           | replica_table        | action
 *   ---------------------------------+----------------------+------------------------------
 *   inagg result, egress_rid != 0    | hit (job, rid)       | set worker's MAC, IPv4, UDP port
 *   inagg result, egress_rid != 0    | miss                 | drop
 *   flooded frame, egress = ingress  | -                    | drop
 *   anything else                    | -                    | unchanged
 */
#ifndef _INAGG_REPLICA_REWRITE_P4_
#define _INAGG_REPLICA_REWRITE_P4_

#include <core.p4>
#include <v1model.p4>
#include "metadata.p4"

control ReplicaRewrite(inout headers_t hdr, inout metadata_t meta,
                       inout standard_metadata_t sm) {
    action set_worker_address(bit<48> mac, bit<32> addr, bit<16> udp_port) {
        hdr.ethernet.dst_addr = mac;
        hdr.ipv4.dst_addr = addr;
        hdr.udp.dst_port = udp_port;
    }

    table replica_table {
        key = {
            hdr.inagg.job_id: exact @name("job_id");
            sm.egress_rid: exact @name("egress_rid");
        }
        actions = { set_worker_address; NoAction; }
        default_action = NoAction();
        size = 2048;
    }

    apply {
        if (hdr.inagg.isValid() && hdr.inagg.msg_type == MSG_RESULT && sm.egress_rid != 0) {
            if (!replica_table.apply().hit) {
                mark_to_drop(sm);
            }
        } else if (meta.flooded == 1 && sm.egress_port == sm.ingress_port) {
            mark_to_drop(sm);
        }
    }
}

#endif /* _INAGG_REPLICA_REWRITE_P4_ */

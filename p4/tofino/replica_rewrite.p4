/* ReplicaRewrite (Tofino egress): address each copy of a result to its worker, and keep
 * flooded frames off the port they came in on; as p4/include/replica_rewrite.p4 for UDP.
 *
 * A result's replica is its multicast egress_rid (rank + 1), or for a unicast DUP_DONE answer
 * the sender's rank + 1 that ResultReplication bridged.
 *
 *   packet                           | replica_table (job, replica) | action
 *   ---------------------------------+------------------------------+---------------------------
 *   inagg result, replica != 0       | set_worker_address           | worker's MAC, IPv4, UDP port
 *   inagg result, replica != 0       | miss                         | drop
 *   flooded frame, egress = ingress  | -                            | drop
 *   anything else                    | -                            | unchanged
 */
#ifndef _INAGG_TOFINO_REPLICA_REWRITE_P4_
#define _INAGG_TOFINO_REPLICA_REWRITE_P4_

#include "types.p4"

control ReplicaRewrite(inout tofino_headers_t hdr, in egress_intrinsic_metadata_t eg_intr_md,
                       inout egress_intrinsic_metadata_for_deparser_t eg_dprsr_md) {
    bit<16> replica = 0;

    action set_worker_address(bit<48> mac, bit<32> addr, bit<16> udp_port) {
        hdr.ethernet.dst_addr = mac;
        hdr.ipv4.dst_addr = addr;
        hdr.udp.dst_port = udp_port;
    }

    table replica_table {
        key = {
            hdr.inagg.job_id: exact @name("job_id");
            replica: exact @name("replica");
        }
        actions = { set_worker_address; NoAction; }
        default_action = NoAction();
        size = TOFINO_REPLICA_TABLE_SIZE;
    }

    apply {
        replica = (bit<16>) hdr.bridged.replica;
        if (eg_intr_md.egress_rid != 0) {
            replica = eg_intr_md.egress_rid;
        }
        if (hdr.inagg.isValid() && hdr.inagg.msg_type == MSG_RESULT && replica != 0) {
            if (!replica_table.apply().hit) {
                eg_dprsr_md.drop_ctl = 1;
            }
        } else if (hdr.bridged.flooded == 1 && eg_intr_md.egress_port == hdr.bridged.ingress_port) {
            eg_dprsr_md.drop_ctl = 1;
        }
    }
}

#endif /* _INAGG_TOFINO_REPLICA_REWRITE_P4_ */

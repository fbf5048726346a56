/* ReplicaRewrite (egress): address each copy of a result to its worker, and keep flooded
 * frames off the port they came in on.
 *
 * A result's replica is its multicast egress_rid (rank + 1), or for a unicast DUP_DONE answer
 * the sender's rank + 1 that ResultReplication put in meta.replica.
 *
 *   packet                           | replica_table (job, replica) | action
 *   ---------------------------------+------------------------------+---------------------------
 *   inagg result, replica != 0       | set_worker_address           | worker's MAC, IPv4, UDP port
 *   inagg result, replica != 0       | set_roce_worker_address      | worker's MAC, IPv4, UDP
 *                                    |                              | 4791, QP, rkey
 *   inagg result, replica != 0       | miss                         | drop
 *   flooded frame, egress = ingress  | -                            | drop
 *   anything else                    | -                            | unchanged
 *
 * The controller writes the action of the job's encapsulation (JobAdmission drops the other).
 */
#ifndef _INAGG_REPLICA_REWRITE_P4_
#define _INAGG_REPLICA_REWRITE_P4_

#include <core.p4>
#include <v1model.p4>
#include "types.p4"

control ReplicaRewrite(inout headers_t hdr, inout metadata_t meta,
                       inout standard_metadata_t sm) {
    action set_worker_address(bit<48> mac, bit<32> addr, bit<16> udp_port) {
        hdr.ethernet.dst_addr = mac;
        hdr.ipv4.dst_addr = addr;
        hdr.udp.dst_port = udp_port;
    }

    action set_roce_worker_address(bit<48> mac, bit<32> addr, bit<24> qp, bit<32> rkey) {
        hdr.ethernet.dst_addr = mac;
        hdr.ipv4.dst_addr = addr;
        hdr.udp.dst_port = ROCE_UDP_PORT;
        hdr.bth.dst_qp = qp;
        hdr.reth.rkey = rkey;
    }

    table replica_table {
        key = {
            hdr.inagg.job_id: exact @name("job_id");
            meta.replica: exact @name("replica");
        }
        actions = { set_worker_address; set_roce_worker_address; NoAction; }
        default_action = NoAction();
        size = INAGG_REPLICA_TABLE_SIZE;
    }

    apply {
        if (sm.egress_rid != 0) {
            meta.replica = sm.egress_rid;
        }
        if (hdr.inagg.isValid() && hdr.inagg.msg_type == MSG_RESULT && meta.replica != 0) {
            if (!replica_table.apply().hit) {
                mark_to_drop(sm);
            }
        } else if (meta.flooded == 1 && sm.egress_port == sm.ingress_port) {
            mark_to_drop(sm);
        }
    }
}

#endif /* _INAGG_REPLICA_REWRITE_P4_ */

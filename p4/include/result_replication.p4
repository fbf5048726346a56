/* ResultReplication: turn a packet that completes a round (or asks again for a finished one)
 * into the result, and send it on.
 *
 *   send_result | outcome        | where the result goes
 *   ------------+----------------+--------------------------------------------------------
 *   1           | SLOT_DUP_DONE  | unicast back out of the ingress port, FLAG_RETRANSMIT set,
 *               |                | replica = sender's rank + 1
 *   1           | FIRST/ADD      | the job's multicast group (one replica per worker, rid =
 *               |                | rank + 1)
 *   0           | any            | nowhere: the contribution is absorbed in the slot
 *
 * Either way ReplicaRewrite (egress) addresses each copy to its worker from replica_table: a
 * RoCE result needs the receiver's QP and rkey, which no packet carries.
 * The result reuses the packet, in its encapsulation: addresses and ports are swapped (source =
 * the switch's aggregator address the worker sent to), the header fields come from the slot's
 * registers; RoceIcrc recomputes a RoCE result's ICRC in egress.
 */
#ifndef _INAGG_RESULT_REPLICATION_P4_
#define _INAGG_RESULT_REPLICATION_P4_

#include <core.p4>
#include <v1model.p4>
#include "types.p4"

control ResultReplication(inout headers_t hdr, inout metadata_t meta,
                          inout standard_metadata_t sm) {
    apply {
        if (meta.send_result == 0) {
            mark_to_drop(sm);
            return;
        }
        hdr.inagg.msg_type = MSG_RESULT;
        hdr.inagg.flags = meta.res_flags;
        hdr.inagg.exp = (int<8>) meta.res_exp;
        hdr.inagg.count = meta.res_count;
        hdr.inagg.offset = meta.res_offset;

        bit<48> mac = hdr.ethernet.dst_addr;
        hdr.ethernet.dst_addr = hdr.ethernet.src_addr;
        hdr.ethernet.src_addr = mac;
        bit<32> addr = hdr.ipv4.dst_addr;
        hdr.ipv4.dst_addr = hdr.ipv4.src_addr;
        hdr.ipv4.src_addr = addr;
        bit<16> port = hdr.udp.dst_port;
        hdr.udp.dst_port = hdr.udp.src_port;
        hdr.udp.src_port = port;
        hdr.udp.checksum = 0;

        if (meta.outcome == SLOT_DUP_DONE) {
            hdr.inagg.flags = hdr.inagg.flags | FLAG_RETRANSMIT;
            sm.egress_spec = sm.ingress_port;
            meta.replica = (bit<16>) hdr.inagg.worker_id + 1;
        } else {
            sm.mcast_grp = meta.mcast_grp;
        }
    }
}

#endif /* _INAGG_RESULT_REPLICATION_P4_ */

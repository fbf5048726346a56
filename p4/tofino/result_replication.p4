/* ResultReplication (Tofino): turn a packet that completes a round (or asks again for a
 * finished one) into the result, and send it on; as p4/include/result_replication.p4.
 *
 *   send_result | outcome        | where the result goes
 *   ------------+----------------+--------------------------------------------------------
 *   1           | SLOT_DUP_DONE  | unicast back out of the ingress port (SlotState set
 *               |                | FLAG_RETRANSMIT),
 *               |                | bridged replica = sender's rank + 1
 *   1           | FIRST/ADD      | the job's multicast group through the PRE (one replica per
 *               |                | worker, rid = rank + 1)
 *   0           | any            | nowhere: the contribution is absorbed in the slot
 *
 * ReplicaRewrite (egress) addresses each copy; SlotState already wrote the result's flags and
 * exponent, ValueLanes its values.
 */
#ifndef _INAGG_TOFINO_RESULT_REPLICATION_P4_
#define _INAGG_TOFINO_RESULT_REPLICATION_P4_

#include "types.p4"

control ResultReplication(inout tofino_headers_t hdr, in tofino_ingress_md_t meta,
                          in ingress_intrinsic_metadata_t ig_intr_md,
                          inout ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md,
                          inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {
    /* The result in the packet's own headers: addresses and ports swapped (one action, so
     * the swaps happen at once), UDP checksum 0. */
    action make_result() {
        hdr.inagg.msg_type = MSG_RESULT;
        hdr.ethernet.dst_addr = hdr.ethernet.src_addr;
        hdr.ethernet.src_addr = hdr.ethernet.dst_addr;
        hdr.ipv4.dst_addr = hdr.ipv4.src_addr;
        hdr.ipv4.src_addr = hdr.ipv4.dst_addr;
        hdr.udp.dst_port = hdr.udp.src_port;
        hdr.udp.src_port = hdr.udp.dst_port;
        hdr.udp.checksum = 0;
    }

    action answer_sender() {
        ig_tm_md.ucast_egress_port = ig_intr_md.ingress_port;
        hdr.bridged.replica = hdr.inagg.worker_id + 1;
    }

    action multicast() {
        ig_tm_md.mcast_grp_a = meta.mcast_grp;
    }

    action absorb() {
        ig_dprsr_md.drop_ctl = 1;
    }

    apply {
        if (meta.send_result == 0) {
            absorb();
        } else {
            make_result();
            if (meta.outcome == SLOT_DUP_DONE) {
                answer_sender();
            } else {
                multicast();
            }
        }
    }
}

#endif /* _INAGG_TOFINO_RESULT_REPLICATION_P4_ */

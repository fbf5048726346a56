/* ResultReplication (Tofino): turn a packet that completes a round (or asks again for a
 * finished one) into the result, and send it on. A completed round's result takes two passes:
 * the first recirculates it through the pipe's recirculation port, so that its harvest pass
 * can retire the other set (slot_claim.p4: the contributor maps are in stage 1, the decision
 * in stage 4, and no worker may see the result before the retire: docs/tofino.md) and, on
 * Tofino 1, read the second value of every lane pair (value_pair.p4: an ALU returns one word
 * per pass; a Tofino 2 pass returns both); the harvest pass sends it as
 * p4/include/result_replication.p4 does. Only results recirculate (one packet in N per
 * round), DUP_DONE answers on Tofino 1, and the rare BAD_ROUND packet that must undo its map
 * bit.
 *
 *   pass    | meta.harvest (SlotState)  | what happens
 *   --------+---------------------------+--------------------------------------------------------
 *   first   | NONE                      | nowhere: the contribution is absorbed in the slot
 *   first   | RESULT (FIRST/ADD)        | the result, recirculated (by the slot's port:
 *           |                           |   recirc_spread.p4), bridged.harvest = RESULT
 *   first   | ANSWER (DUP_DONE)         | Tofino 2: unicast back out of the ingress port at once,
 *           |                           |   bridged replica = sender's rank + 1; Tofino 1: as
 *   first   | ANSWER_RETIRE (DUP_DONE)  | the result, recirculated, bridged.harvest = the same
 *   harvest | (RESULT, ANSWER_RETIRE)   | dropped where its retire found another owner (the job
 *           |                           | was torn down while it recirculated: slot_claim.p4)
 *   harvest | (ANSWER), Tofino 1        | dropped where its owner check (owned0/1) found another
 *           |                           | owner (slot_claim.p4: answer_set0/1)
 *   harvest | (RESULT)                  | the job's multicast group through the PRE (one replica
 *           |                           | per worker, rid = rank + 1)
 *   harvest | (ANSWER, ANSWER_RETIRE)   | unicast back out of the contribution's ingress port,
 *           |                           | bridged replica = sender's rank + 1
 *   first   | UNDO (BAD_ROUND)          | recirculated: its second pass takes the sender's bit
 *   second  | (UNDO)                    |   out of the set's map (slot_claim.p4), then drops it
 *
 * The first pass bypasses egress when it recirculates (the bridged header, with the harvest
 * code and the ingress port, travels in front of the packet); ReplicaRewrite (egress)
 * addresses each copy that leaves. SlotState already wrote the result's flags and exponent,
 * the first pass the values (Tofino 1: the first half, the harvest pass the second).
 */
#ifndef _INAGG_TOFINO_RESULT_REPLICATION_P4_
#define _INAGG_TOFINO_RESULT_REPLICATION_P4_

#include "types.p4"

control ResultReplication(inout tofino_headers_t hdr, in tofino_ingress_md_t meta,
                          in ingress_intrinsic_metadata_t ig_intr_md,
                          inout ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md,
                          inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {
    /* The result in the packet's own headers: source and destination swapped (through
     * temporaries: an action's statements run in order, so "dst = src; src = dst" would copy
     * back what it just wrote), UDP checksum 0. Its ports no longer say inagg: the caller
     * sets bridged.harvest, by which the parsers after this pass recognise it (parser.p4). */
    action make_result() {
        bit<48> mac = hdr.ethernet.dst_addr;
        bit<32> addr = hdr.ipv4.dst_addr;
        bit<16> port = hdr.udp.dst_port;
        hdr.inagg.msg_type = MSG_RESULT;
        hdr.ethernet.dst_addr = hdr.ethernet.src_addr;
        hdr.ethernet.src_addr = mac;
        hdr.ipv4.dst_addr = hdr.ipv4.src_addr;
        hdr.ipv4.src_addr = addr;
        hdr.udp.dst_port = hdr.udp.src_port;
        hdr.udp.src_port = port;
        hdr.udp.checksum = 0;
    }

    /* ... to the slot's recirculation port in this pipe (RecircSpread), for the second pass. */
    action recirculate() {
        make_result();
        hdr.bridged.harvest = meta.harvest;
#if __TARGET_TOFINO__ == 2
        hdr.bridged.owner = meta.owner_result[6:0];   /* for egress (replica_rewrite.p4) */
#endif
        ig_tm_md.ucast_egress_port = meta.recirc_port;
        ig_tm_md.bypass_egress = 1;
    }

    action answer_sender() {
        ig_tm_md.ucast_egress_port = hdr.bridged.ingress_port;
        hdr.bridged.replica = hdr.inagg.worker_id + 1;
    }

#if __TARGET_TOFINO__ == 2
    /* A DUP_DONE answer in its first pass (bridged.ingress_port is this pass's ingress port;
     * bridged.harvest = ANSWER tells egress's parser it is a result). */
    action answer_at_once() {
        make_result();
        hdr.bridged.harvest = meta.harvest;
        hdr.bridged.owner = meta.owner_result[6:0];
        answer_sender();
    }
#endif

    action multicast() {
        ig_tm_md.mcast_grp_a = meta.mcast_grp;
    }

    action absorb() {
        ig_dprsr_md.drop_ctl = 1;
    }

    apply {
        if (meta.verdict == VERDICT_HARVEST) {
            if (hdr.bridged.harvest == HARVEST_UNDO) {
                absorb();
#if __TARGET_TOFINO__ != 2
            } else if (hdr.bridged.harvest == HARVEST_ANSWER && meta.owned0 == 0 && meta.owned1 == 0) {
                absorb();      /* its owner check found another owner: the job was torn down */
#endif
            } else if (hdr.bridged.harvest == HARVEST_ANSWER) {
                answer_sender();
            } else if (meta.retired0 == 0 && meta.retired1 == 0) {
                absorb();      /* its retire found another owner: the job was torn down */
            } else if (hdr.bridged.harvest == HARVEST_RESULT) {
                multicast();
            } else {
                answer_sender();
            }
        } else if (meta.harvest == HARVEST_NONE) {
            absorb();
#if __TARGET_TOFINO__ == 2
        } else if (meta.harvest == HARVEST_ANSWER) {
            answer_at_once();
#endif
        } else {
            recirculate();
        }
    }
}

#endif /* _INAGG_TOFINO_RESULT_REPLICATION_P4_ */

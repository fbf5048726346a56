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
 *
 * Tofino 2 also sends a reduce-scatter's result (docs/protocol.md) with its values to its owner
 * alone, as p4/include/result_elision.p4 does on BMv2: where bridged.owner (SlotState's
 * round_owner, bridged by the first pass) names a replica and this copy is another's, the
 * header alone leaves: IPv4 and UDP lengths 4 K bytes less (the deparser recomputes the IPv4
 * checksum) and the frame truncated after the inagg header by the deparser
 * (mtu_trunc_len: egress parses no values, so it cannot invalidate them as BMv2 does). The
 * header keeps its count: a worker takes such a result for a block outside its shard. Tofino 1
 * has no owner (docs/tofino.md, "Reduce-scatter results") and no deparser truncation.
 *
 *   result copy (count != 0)                                | action
 *   --------------------------------------------------------+----------------------------------
 *   owner 0 or BRIDGED_OWNER_SHARED, or replica == owner    | unchanged: the values
 *   otherwise                                               | elide_values: the header alone
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

#if __TARGET_TOFINO__ == 2
    /* The frame's bytes up to the values: Ethernet, IPv4, UDP and the inagg header. */
    action elide_values() {
        hdr.ipv4.total_len = hdr.ipv4.total_len - 4 * TOFINO_VALUES_PER_PACKET;
        hdr.udp.length = hdr.udp.length - 4 * TOFINO_VALUES_PER_PACKET;
        eg_dprsr_md.mtu_trunc_len = 14 + 20 + 8 + (bit<14>) INAGG_HEADER_BYTES;
    }
#endif

    apply {
        replica = (bit<16>) hdr.bridged.replica;
        if (eg_intr_md.egress_rid != 0) {
            replica = eg_intr_md.egress_rid;
        }
        if (hdr.inagg.isValid() && hdr.inagg.msg_type == MSG_RESULT && replica != 0) {
            if (!replica_table.apply().hit) {
                eg_dprsr_md.drop_ctl = 1;
            }
#if __TARGET_TOFINO__ == 2
            if (hdr.inagg.count != 0 && hdr.bridged.owner != 0 && hdr.bridged.owner != BRIDGED_OWNER_SHARED
                && replica != (bit<16>) hdr.bridged.owner) {
                elide_values();
            }
#endif
        } else if (hdr.bridged.flooded == 1 && eg_intr_md.egress_port == hdr.bridged.ingress_port) {
            eg_dprsr_md.drop_ctl = 1;
        }
    }
}

#endif /* _INAGG_TOFINO_REPLICA_REWRITE_P4_ */

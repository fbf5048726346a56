/* TreeUplink: a job's place in an aggregation tree across switches (docs/trees.md).
 *
 * uplink_table (job_id -> set_uplink) holds, on every switch of a tree but its root, where the
 * switch sends its partial sums: the egress port toward the parent, its rank at the parent (its
 * bit in the parent's bitmap), the job's first slot on the parent, the parent's aggregator
 * address, and this switch's own (the one its children send to: results it sends down come
 * from it). JobAdmission admits a RESULT only from that parent; UpstreamSend addresses the
 * partial sums to it.
 *
 *   uplink_table on job_id | meta
 *   -----------------------+-----------------------------------------------------------
 *   set_uplink(...)        | has_uplink = 1, up_* = the parameters
 *   miss                   | has_uplink = 0: this switch completes the job's rounds (the
 *                          | root of its tree, or the only switch of the job)
 */
#ifndef _INAGG_TREE_UPLINK_P4_
#define _INAGG_TREE_UPLINK_P4_

#include <core.p4>
#include <v1model.p4>
#include "types.p4"

control TreeUplink(inout headers_t hdr, inout metadata_t meta) {
    action set_uplink(bit<9> port, bit<8> rank, bit<16> slot_base, bit<48> mac, bit<32> addr,
                      bit<16> udp_port, bit<48> src_mac, bit<32> src_addr, bit<16> src_udp_port) {
        meta.has_uplink = 1;
        meta.up_port = port;
        meta.up_rank = rank;
        meta.up_slot_base = slot_base;
        meta.up_mac = mac;
        meta.up_addr = addr;
        meta.up_udp_port = udp_port;
        meta.up_src_mac = src_mac;
        meta.up_src_addr = src_addr;
        meta.up_src_udp_port = src_udp_port;
    }

    table uplink_table {
        key = { hdr.inagg.job_id: exact @name("job_id"); }
        actions = { set_uplink; NoAction; }
        default_action = NoAction();
        size = INAGG_MAX_JOBS;
    }

    apply {
        meta.has_uplink = 0;
        if (hdr.inagg.isValid()) {
            uplink_table.apply();
        }
    }
}

#endif /* _INAGG_TREE_UPLINK_P4_ */

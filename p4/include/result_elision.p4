/* ResultElision (egress): a reduce-scatter's result carries its values to the round's owner
 * alone; every other replica gets the header alone (docs/protocol.md, "Reduce-scatter").
 *
 *   packet                                                      | action
 *   ------------------------------------------------------------+--------------------------------
 *   inagg result with values, meta.res_owner != 0 (RoundOwner), | every hdr.values[i] invalid; IPv4
 *   meta.replica != meta.res_owner (ReplicaRewrite's replica)   | and UDP lengths (and RoCE's DMA
 *                                                               | length) 4 K bytes less
 *   anything else                                               | unchanged
 *
 * The header keeps its count: a worker takes a header-only result with count > 0 for a block
 * outside its shard. It runs after ReplicaRewrite (which sets meta.replica of a multicast copy)
 * and before RoceIcrc, whose CRC then covers the header alone. A DUP_DONE answer follows the
 * same rule: its replica is the sender's.
 */
#ifndef _INAGG_RESULT_ELISION_P4_
#define _INAGG_RESULT_ELISION_P4_

#include <core.p4>
#include <v1model.p4>
#include "types.p4"

/* The payload's bytes: K int32 values. */
#define VALUE_BYTES (4 * (bit<16>) SWITCH_VALUES_PER_PACKET)
#define VALUE_DROP(i) hdr.values[i].setInvalid();

control ResultElision(inout headers_t hdr, in metadata_t meta) {
    apply {
        if (!hdr.inagg.isValid() || hdr.inagg.msg_type != MSG_RESULT || !hdr.values[0].isValid()
            || meta.res_owner == 0 || meta.replica == (bit<16>) meta.res_owner) {
            return;
        }
        FOR_EACH_VALUE(VALUE_DROP)
        hdr.ipv4.total_len = hdr.ipv4.total_len - VALUE_BYTES;
        hdr.udp.length = hdr.udp.length - VALUE_BYTES;
        if (hdr.reth.isValid()) {
            hdr.reth.dma_len = hdr.reth.dma_len - (bit<32>) VALUE_BYTES;
        }
    }
}

#endif /* _INAGG_RESULT_ELISION_P4_ */

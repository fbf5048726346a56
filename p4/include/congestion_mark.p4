/* CongestionMark (egress): an inagg packet leaving by a deep queue carries FLAG_CONGESTION, as
 * ECN's CE mark (ATP marks on queue depth the same way). Workers shrink their window on a marked
 * result before any queue overflows (inagg.hostlib.worker.stream.WindowControl); a contribution marked
 * on its way to a host aggregator marks its slot's result there (the flag is sticky).
 *
 *   packet                                                    | action
 *   ----------------------------------------------------------+------------------------
 *   inagg header valid, enq_qdepth >= INAGG_CONGESTION_QDEPTH | flags |= FLAG_CONGESTION
 *   anything else                                             | unchanged
 *
 * enq_qdepth is the egress queue's depth in packets when this packet was queued. TNA has the
 * same field, eg_intr_md.enq_qdepth (cells of 80 bytes, docs/tofino.md). It runs before
 * RoceIcrc, whose ICRC covers the flags; the UDP checksum is zero (checksum.p4).
 */
#ifndef _INAGG_CONGESTION_MARK_P4_
#define _INAGG_CONGESTION_MARK_P4_

#include <core.p4>
#include <v1model.p4>
#include "size.p4"
#include "types.p4"

control CongestionMark(inout headers_t hdr, in standard_metadata_t sm) {
    apply {
        if (hdr.inagg.isValid() && sm.enq_qdepth >= (bit<19>) INAGG_CONGESTION_QDEPTH) {
            hdr.inagg.flags = hdr.inagg.flags | FLAG_CONGESTION;
        }
    }
}

#endif /* _INAGG_CONGESTION_MARK_P4_ */

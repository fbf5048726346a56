/* ValueLanes (Tofino): the K values of an admitted contribution, one register per lane (value
 * i of every (slot, set) lives in lane i's register at index set ++ slot), so each lane is one
 * stateful ALU and one register access per packet, as Tofino demands.
 *
 *   bitmaps say           | lane register            | packet's value
 *   ----------------------+--------------------------+------------------------------
 *   first (SLOT_FIRST)    | = packet                 | unchanged (the sum so far)
 *   my bit set (DUP_*)    | unchanged                | = the stored sum (DUP_DONE's result;
 *                         |                          |   DUP_PENDING is dropped)
 *   else (ADD or STALE)   | += packet (int32 wrap)   | = the new sum
 *
 * SlotState's seen table decides (lane_op) from the bitmaps alone, before seen's count is
 * known, so that K lanes fit in the stages left; the one case this gets wrong, a STALE packet (seen finds it later), is dropped and
 * counted, and SlotState marks the finished round it was added to (slot_state.p4).
 * Header-only packets (count == 0, exponent priming) have no values and touch nothing.
 */
#ifndef _INAGG_TOFINO_VALUE_LANES_P4_
#define _INAGG_TOFINO_VALUE_LANES_P4_

#include "types.p4"
#include "value_lane.p4"

#define DECLARE_LANE(i) ValueLane() lane##i;
#define APPLY_LANE(i) lane##i.apply(hdr.values[i].v, meta.lane_op, meta.idx);

control ValueLanes(inout tofino_headers_t hdr, in tofino_ingress_md_t meta) {
    FOR_EACH_LANE(DECLARE_LANE)

    apply {
        if (hdr.values[0].isValid()) {
            FOR_EACH_LANE(APPLY_LANE)
        }
    }
}

#endif /* _INAGG_TOFINO_VALUE_LANES_P4_ */

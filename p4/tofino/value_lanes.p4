/* ValueLanes (Tofino): the K values of an admitted contribution, one register per lane (value
 * i of every (slot, set) lives in lane i's register at index set ++ slot), so each lane is one
 * stateful ALU and one register access per packet, as Tofino demands.
 *
 *   lane_choice (slot_state.p4)        | lane register          | packet's value
 *   -----------------------------------+------------------------+----------------------------
 *   empty set: FIRST                   | = packet               | unchanged
 *   this round, worker not in it: ADD  | += packet (int32 wrap) | = the new sum
 *   else                               | unchanged              | = the stored sum (DUP_DONE's
 *                                      |                        |   result; the rest is dropped)
 *
 * lane_choice is keyed on the contributor maps and the round record, so STALE, duplicates and
 * other-round packets never change a lane.
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

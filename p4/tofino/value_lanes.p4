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

control ValueLane(inout bit<32> v, in bit<2> lane_op, in slot_index_t idx) {
    Register<bit<32>, slot_index_t>(2 * TOFINO_SLOTS) lane;
    RegisterAction<bit<32>, slot_index_t, bit<32>>(lane) store = {
        void apply(inout bit<32> value) { value = v; }
    };
    RegisterAction<bit<32>, slot_index_t, bit<32>>(lane) add = {
        void apply(inout bit<32> value, out bit<32> sum) { value = value + v; sum = value; }
    };
    RegisterAction<bit<32>, slot_index_t, bit<32>>(lane) load = {
        void apply(inout bit<32> value, out bit<32> sum) { sum = value; }
    };

    action store_value() { store.execute(idx); }
    action add_value() { v = add.execute(idx); }
    action load_value() { v = load.execute(idx); }

    /* One table per lane (a stage holds 16 logical tables: four lanes and the result logic). */
    table lane_update {
        key = { lane_op: exact; }
        actions = { store_value; add_value; load_value; NoAction; }
        const default_action = NoAction();
        size = 4;
        const entries = {
            LANE_STORE: store_value();
            LANE_ADD: add_value();
            LANE_LOAD: load_value();
        }
    }

    apply {
        lane_update.apply();
    }
}

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

/* ValueLane (Tofino): one value lane of ValueLanes (value_lanes.p4): value i of every
 * (slot, set) in one register at index set ++ slot, one stateful ALU and one access per packet.
 *
 *   lane_op    | register                 | v (the packet's value)
 *   -----------+--------------------------+------------------------------
 *   LANE_STORE | = v                      | unchanged
 *   LANE_ADD   | += v (int32 wrap)        | = the new sum
 *   LANE_LOAD  | unchanged                | = the stored sum
 *   other      | unchanged                | unchanged
 */
#ifndef _INAGG_TOFINO_VALUE_LANE_P4_
#define _INAGG_TOFINO_VALUE_LANE_P4_

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

#endif /* _INAGG_TOFINO_VALUE_LANE_P4_ */

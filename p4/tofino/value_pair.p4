/* ValuePair (Tofino): one lane pair of ValueLanes (value_lanes.p4): values i and K/2 + i of
 * every (slot, set) in one 64-bit register word at index set ++ slot, one stateful ALU and one
 * access per pass. An ALU returns one 32-bit word per pass, so a pass adds both values but
 * returns the first; a result's harvest pass (result_replication.p4) returns the second.
 *
 *   round_kind, same_round | register                 | a (value i)        | b (value K/2 + i)
 *   -----------------------+--------------------------+--------------------+-----------------
 *   OPEN, 1                | = (a, b)                 | unchanged          | unchanged
 *   NEW, 1                 | += (a, b) (int32 wrap)   | = the new sum      | unchanged
 *   REPEAT, 1              | unchanged                | = the stored sum   | unchanged
 *   harvest pass           | unchanged                | unchanged          | = the stored sum
 *   other                  | unchanged                | unchanged          | unchanged
 */
#ifndef _INAGG_TOFINO_VALUE_PAIR_P4_
#define _INAGG_TOFINO_VALUE_PAIR_P4_

#include "types.p4"

control ValuePair(inout bit<32> a, inout bit<32> b, in bool present, in bit<2> verdict,
                  in bit<2> kind, in bit<1> same, in slot_index_t idx) {
    Register<value_pair_t, slot_index_t>(2 * TOFINO_SLOTS) pair;
    RegisterAction<value_pair_t, slot_index_t, bit<32>>(pair) store = {
        void apply(inout value_pair_t value) { value.first = a; value.second = b; }
    };
    RegisterAction<value_pair_t, slot_index_t, bit<32>>(pair) add = {
        void apply(inout value_pair_t value, out bit<32> sum) {
            value.first = value.first + a;
            value.second = value.second + b;
            sum = value.first;
        }
    };
    RegisterAction<value_pair_t, slot_index_t, bit<32>>(pair) load_first = {
        void apply(inout value_pair_t value, out bit<32> sum) { sum = value.first; }
    };
    RegisterAction<value_pair_t, slot_index_t, bit<32>>(pair) load_second = {
        void apply(inout value_pair_t value, out bit<32> sum) { sum = value.second; }
    };

    action store_values() { store.execute(idx); }
    action add_values() { a = add.execute(idx); }
    action load_values() { a = load_first.execute(idx); }
    action harvest_values() { b = load_second.execute(idx); }

    /* One table per pair (a stage holds 16 logical tables: four pairs and the result logic),
     * behind no gateway (present: the packet has values) and applied before the rest of the
     * round logic, so that the pairs fill every stage's spare ALUs from the fourth on. */
    @placement_priority(1)
    table pair_update {
        key = { present: exact; verdict: exact; kind: exact; same: exact; }
        actions = { store_values; add_values; load_values; harvest_values; NoAction; }
        const default_action = NoAction();
        size = 4;
        const entries = {
            (true, VERDICT_AGGREGATE, KIND_OPEN, 1): store_values();
            (true, VERDICT_AGGREGATE, KIND_NEW, 1): add_values();
            (true, VERDICT_AGGREGATE, KIND_REPEAT, 1): load_values();
            (true, VERDICT_HARVEST, 0, 0): harvest_values();
        }
    }

    apply {
        pair_update.apply();
    }
}

#endif /* _INAGG_TOFINO_VALUE_PAIR_P4_ */

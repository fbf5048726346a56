/* ValuePair (Tofino): one lane pair of ValueLanes (value_lanes.p4): values i and K/2 + i of
 * every (slot, set) in one 64-bit register word at index set ++ slot, one stateful ALU and one
 * access per pass. A pass adds both values; what it returns depends on the chip:
 *
 *   Tofino 1: an ALU returns one 32-bit word per pass, so a pass returns the first value and a
 *             result's harvest pass (result_replication.p4) the second (load_second).
 *   Tofino 2: a RegisterAction has up to four outputs (t2na's execute(index, out rv2)), so
 *             the pass returns both: a result leaves its first pass with every sum.
 *
 *   round_kind, same_round | register                 | a (value i)        | b (value K/2 + i)
 *   -----------------------+--------------------------+--------------------+-----------------
 *   OPEN, 1                | = (a, b)                 | unchanged          | unchanged
 *   NEW, 1                 | += (a, b) (int32 wrap)   | = the new sum      | T2: = the new sum
 *   REPEAT, 1              | unchanged                | = the stored sum   | T2: = the stored sum
 *   harvest pass (T1 only) | unchanged                | unchanged          | = the stored sum
 *   other                  | unchanged                | unchanged          | unchanged
 */
#ifndef _INAGG_TOFINO_VALUE_PAIR_P4_
#define _INAGG_TOFINO_VALUE_PAIR_P4_

#include "types.p4"

/* What add and load return, and how their action reads it: both words on Tofino 2, the first
 * on Tofino 1. */
#if __TARGET_TOFINO__ == 2
#define PAIR_OUTPUTS out bit<32> out_a, out bit<32> out_b
#define PAIR_RETURN out_a = value.first; out_b = value.second;
#define PAIR_EXECUTE(RA) a = RA.execute(idx, b)
#else
#define PAIR_OUTPUTS out bit<32> out_a
#define PAIR_RETURN out_a = value.first;
#define PAIR_EXECUTE(RA) a = RA.execute(idx)
#endif

control ValuePair(inout bit<32> a, inout bit<32> b, in bool present, in bit<2> verdict,
                  in bit<2> kind, in bit<1> same, in slot_index_t idx) {
    Register<value_pair_t, slot_index_t>(2 * TOFINO_SLOTS) pair;
    RegisterAction<value_pair_t, slot_index_t, bit<32>>(pair) store = {
        void apply(inout value_pair_t value) { value.first = a; value.second = b; }
    };
    RegisterAction<value_pair_t, slot_index_t, bit<32>>(pair) add = {
        void apply(inout value_pair_t value, PAIR_OUTPUTS) {
            value.first = value.first + a;
            value.second = value.second + b;
            PAIR_RETURN
        }
    };
    RegisterAction<value_pair_t, slot_index_t, bit<32>>(pair) load = {
        void apply(inout value_pair_t value, PAIR_OUTPUTS) { PAIR_RETURN }
    };
#if __TARGET_TOFINO__ != 2
    RegisterAction<value_pair_t, slot_index_t, bit<32>>(pair) load_second = {
        void apply(inout value_pair_t value, out bit<32> sum) { sum = value.second; }
    };
    action harvest_values() { b = load_second.execute(idx); }
#endif

    action store_values() { store.execute(idx); }
    action add_values() { PAIR_EXECUTE(add); }
    action load_values() { PAIR_EXECUTE(load); }

    /* One table per pair (a stage holds 16 logical tables: four pairs and the result logic),
     * behind no gateway (present: the packet has values) and applied before the rest of the
     * round logic, so that the pairs fill every stage's spare ALUs from the fourth on. */
    @placement_priority(1)
    table pair_update {
        key = { present: exact; verdict: exact; kind: exact; same: exact; }
        actions = {
            store_values; add_values; load_values; NoAction;
#if __TARGET_TOFINO__ != 2
            harvest_values;
#endif
        }
        const default_action = NoAction();
        size = 4;
        const entries = {
            (true, VERDICT_AGGREGATE, KIND_OPEN, 1): store_values();
            (true, VERDICT_AGGREGATE, KIND_NEW, 1): add_values();
            (true, VERDICT_AGGREGATE, KIND_REPEAT, 1): load_values();
#if __TARGET_TOFINO__ != 2
            (true, VERDICT_HARVEST, 0, 0): harvest_values();
#endif
        }
    }

    apply {
        pair_update.apply();
    }
}

#undef PAIR_OUTPUTS
#undef PAIR_RETURN
#undef PAIR_EXECUTE

#endif /* _INAGG_TOFINO_VALUE_PAIR_P4_ */

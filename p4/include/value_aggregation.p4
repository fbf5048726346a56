/* ValueAggregation: the K values of an admitted contribution against register `values`,
 * one int32 per (set, slot, i) at index (set * INAGG_SLOTS + slot) * K + i.
 *
 *   outcome          | values[(s, slot)]          | packet's values
 *   -----------------+----------------------------+------------------------------
 *   SLOT_FIRST       | = packet                   | unchanged (the sum so far)
 *   SLOT_ADD         | += packet (int32 wrap)     | = the new sum
 *   SLOT_DUP_DONE    | unchanged                  | = the stored sum (the result)
 *   SLOT_DUP_UPSTREAM| unchanged                  | = the stored partial sum (to the parent)
 *   parent's result, | = packet                   | unchanged (the result, sent down)
 *   stored           |                            |
 *   other            | unchanged                  | unchanged (the packet is dropped)
 *
 * So when a round completes, the completing packet already carries the full sum (or this
 * switch's partial sum, in an aggregation tree: docs/trees.md).
 * Header-only packets (count == 0, exponent priming) have no values and touch nothing.
 */
#ifndef _INAGG_VALUE_AGGREGATION_P4_
#define _INAGG_VALUE_AGGREGATION_P4_

#include <core.p4>
#include <v1model.p4>
#include "types.p4"

#define VALUE_STORE(i) values.write(meta.value_base + i, hdr.values[i].v);
#define VALUE_ADD(i) values.read(sum, meta.value_base + i); \
    sum = sum + hdr.values[i].v; \
    values.write(meta.value_base + i, sum); \
    hdr.values[i].v = sum;
#define VALUE_LOAD(i) values.read(hdr.values[i].v, meta.value_base + i);

control ValueAggregation(inout headers_t hdr, inout metadata_t meta) {
    register<bit<32>>(2 * INAGG_SLOTS * (bit<32>) SWITCH_VALUES_PER_PACKET) values;
    bit<32> sum;

    action store_values() { FOR_EACH_VALUE(VALUE_STORE) }
    action add_values()   { FOR_EACH_VALUE(VALUE_ADD) }
    action load_values()  { FOR_EACH_VALUE(VALUE_LOAD) }

    apply {
        if (!hdr.values[0].isValid()) {
            return;
        }
        if (meta.outcome == SLOT_FIRST || (meta.from_parent == 1 && meta.send_result == 1)) {
            store_values();
        } else if (meta.outcome == SLOT_ADD) {
            add_values();
        } else if (meta.outcome == SLOT_DUP_DONE || meta.outcome == SLOT_DUP_UPSTREAM) {
            load_values();
        }
    }
}

#endif /* _INAGG_VALUE_AGGREGATION_P4_ */

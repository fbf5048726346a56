/* ValueAggregation: the K values of an admitted contribution against register `values`,
 * one int32 per (set, slot, i) at index (set * INAGG_SLOTS + slot) * K + i.
 *
 *   outcome          | values[(s, slot)]          | packet's values
 *   -----------------+----------------------------+------------------------------
 *   SLOT_FIRST       | = packet                   | unchanged (the sum so far)
 *   SLOT_ADD         | += packet (int32 wrap)     | = the new sum
 *   SLOT_DUP_DONE    | unchanged                  | = the stored sum (the result)
 *   other            | unchanged                  | unchanged (the packet is dropped)
 *
 * So when a round completes, the completing packet already carries the full sum.
 * Header-only packets (count == 0, exponent priming) have no values and touch nothing.
 */
#ifndef _INAGG_VALUE_AGGREGATION_P4_
#define _INAGG_VALUE_AGGREGATION_P4_

#include <core.p4>
#include <v1model.p4>
#include "metadata.p4"

/* Apply M to every value index 0 .. SWITCH_VALUES_PER_PACKET - 1 (P4 has no loops in
 * controls; tests/test_p4_program.py checks the count matches the constant). */
#define FOR_EACH_VALUE(M) \
    M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) \
    M(8) M(9) M(10) M(11) M(12) M(13) M(14) M(15) \
    M(16) M(17) M(18) M(19) M(20) M(21) M(22) M(23) \
    M(24) M(25) M(26) M(27) M(28) M(29) M(30) M(31) \
    M(32) M(33) M(34) M(35) M(36) M(37) M(38) M(39) \
    M(40) M(41) M(42) M(43) M(44) M(45) M(46) M(47) \
    M(48) M(49) M(50) M(51) M(52) M(53) M(54) M(55) \
    M(56) M(57) M(58) M(59) M(60) M(61) M(62) M(63)

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
        if (meta.outcome == SLOT_FIRST) {
            store_values();
        } else if (meta.outcome == SLOT_ADD) {
            add_values();
        } else if (meta.outcome == SLOT_DUP_DONE) {
            load_values();
        }
    }
}

#endif /* _INAGG_VALUE_AGGREGATION_P4_ */

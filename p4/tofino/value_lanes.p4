/* ValueLanes (Tofino): the K values of an admitted contribution in K / 2 lane pairs
 * (value_pair.p4): values i and K/2 + i of every (slot, set) live in pair i's register at index
 * set ++ slot, so each pair is one stateful ALU and one register access per pass, as Tofino
 * demands, and 64 values take 32 of the chip's 48 ALUs.
 *
 *   round_kind, same_round (slot_state.p4) | pair register      | packet's values
 *   ---------------------------------------+--------------------+--------------------------------
 *   OPEN: the set's map was empty: FIRST   | = packet           | unchanged
 *   NEW, same round: ADD                   | += packet (wrap)   | = the new sums (Tofino 1: the
 *                                          |                    |   first half)
 *   REPEAT, same round                     | unchanged          | = the stored sums (DUP_DONE's
 *                                          |                    |   result; Tofino 1: first half)
 *   a result's harvest pass (Tofino 1)     | unchanged          | second half = the stored sums
 *   else                                   | unchanged          | unchanged (dropped)
 *
 * The keys come from the contributor map and the round record, so STALE, duplicates and
 * other-round packets never change a pair. Between a result's first pass and its harvest pass
 * no packet can change its round's pairs: every worker is in the round (a repeat), and the set
 * is opened again only after the other set's round, which needs this result, completes.
 * Header-only packets (count == 0, exponent priming) have no values and touch nothing.
 */
#ifndef _INAGG_TOFINO_VALUE_LANES_P4_
#define _INAGG_TOFINO_VALUE_LANES_P4_

#include "types.p4"
#include "value_pair.p4"

#define DECLARE_PAIR(i) ValuePair() pair##i;
#define APPLY_PAIR(i) pair##i.apply(hdr.values_lo[i].v, hdr.values_hi[i].v, hdr.values_lo[0].isValid(), \
                                    meta.verdict, meta.round_kind, meta.same_round, meta.idx);

control ValueLanes(inout tofino_headers_t hdr, in tofino_ingress_md_t meta) {
    FOR_EACH_PAIR(DECLARE_PAIR)

    apply {
        FOR_EACH_PAIR(APPLY_PAIR)
    }
}

#endif /* _INAGG_TOFINO_VALUE_LANES_P4_ */

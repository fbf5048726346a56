/* RoundRecord (Tofino): whether an aggregated packet belongs to its (slot, set)'s round, one
 * stage after SlotClaim joined the set's contributor map (slot_claim.p4): the round record,
 * and the two codes the rest of the round logic (slot_state.p4) and the lane pairs
 * (value_lanes.p4) are keyed on:
 *
 *   the set's old map | sender in it | round_record           | round_kind | same_round
 *   ------------------+--------------+------------------------+------------+---------------------
 *   empty             | -            | = (offset, count)      | OPEN       | 1
 *   not empty         | no           | compared               | NEW        | offset and count are
 *   not empty         | yes          | compared               | REPEAT     |   the record's
 *
 * The old map and the sender's bit in it pick the action (round_action's entries match bit w
 * for rank w), so "mine" costs no stage of its own; the lanes can start one stage later. Its
 * actions also note moved, for a repeat, the sender's bit in the other set's old map (matched
 * by the entries too: one bit of PHV), for SlotState's decision.
 *
 * Both chips check the round identity (docs/tofino.md, "Round identity"): the record keeps the
 * round tag beside the count (count32's bits 29-31), so same_round is 1 only for a packet of the
 * record's own tag, and round_tag, beside it in stage 2, holds the set's tag (a round_in: tag
 * << 5) under the slot owner that set it:
 *
 *   action         | the set's map | round_tag holds                         | answer
 *   ---------------+---------------+-----------------------------------------+----------------
 *   tag_open       | empty         | another owner's tag, or the one before  | round_next = 1,
 *   (tag_open_zero |               |   the packet's (tag 0's: tag 7,         |   stores its tag
 *    for tag 0)    |               |   TAG_LAST)                             |
 *   tag_open(_zero)| empty         | otherwise                               | round_next = 0
 *   tag_check      | not empty     | any tag                                 | round_diff: the
 *                  |               |                                         |   set's tag
 *
 * (a tag under another owner is ROUND_UNSET: a reset set's first opener sets it). SlotState's
 * decision refuses what neither accepts (TAG_REFUSALS in tna_slot_model.py is its twin).
 */
#ifndef _INAGG_TOFINO_ROUND_RECORD_P4_
#define _INAGG_TOFINO_ROUND_RECORD_P4_

#include "types.p4"

control RoundRecord(inout tofino_headers_t hdr, inout tofino_ingress_md_t meta) {
    /* The round's offset and count. */
    Register<round_record_t, slot_index_t>(2 * TOFINO_SLOTS) round_record;
    RegisterAction<round_record_t, slot_index_t, bit<1>>(round_record) round_open = {
        void apply(inout round_record_t value, out bit<1> same) {
            value.offset = hdr.inagg.offset;
            value.count = meta.count32;
            same = 1;
        }
    };
    RegisterAction<round_record_t, slot_index_t, bit<1>>(round_record) round_check = {
        void apply(inout round_record_t value, out bit<1> same) {
            if (value.offset == hdr.inagg.offset && value.count == meta.count32) {
                same = 1;
            } else {
                same = 0;
            }
        }
    };

    /* The set's round tag and the owner it was set under. An opener sets it only when its tag
     * is the next one (or the set holds none: another owner's tag, a reset slot); every other
     * packet reads it (round_diff). The tags are bytes (round_in: tag << 5) in a 32-bit word,
     * so the wrap from tag 7 to 0 is an action of its own (tag_open_zero, for tag 0); the
     * ALU's 32-bit round_in of Tofino 2's first version took the PHV Tofino 1's maps need. */
    Register<round_tag_t, slot_index_t>(2 * TOFINO_SLOTS) round_tag;
    RegisterAction<round_tag_t, slot_index_t, bit<1>>(round_tag) tag_open = {
        void apply(inout round_tag_t value, out bit<1> next) {
            if (value.owner != meta.tag || value.tag + (bit<32>) TAG_STEP == (bit<32>) meta.round_in) {
                value.owner = meta.tag;
                value.tag = (bit<32>) meta.round_in;
                next = 1;
            } else {
                next = 0;
            }
        }
    };
    RegisterAction<round_tag_t, slot_index_t, bit<1>>(round_tag) tag_open_zero = {
        void apply(inout round_tag_t value, out bit<1> next) {
            if (value.owner != meta.tag || value.tag == (bit<32>) TAG_LAST) {
                value.owner = meta.tag;
                value.tag = 0;
                next = 1;
            } else {
                next = 0;
            }
        }
    };
    /* The set's tag as it is (SlotState subtracts the packet's: bf-p4c subtracts in a
     * two-field register's ALU only what it writes back). */
    RegisterAction<round_tag_t, slot_index_t, bit<32>>(round_tag) tag_check = {
        void apply(inout round_tag_t value, out bit<32> set_tag) {
            set_tag = value.tag;
        }
    };
    action open_tag() { meta.round_next = tag_open.execute(meta.idx); }
    action open_tag_zero() { meta.round_next = tag_open_zero.execute(meta.idx); }
    action check_tag() { meta.round_diff = (bit<8>) tag_check.execute(meta.idx); }
    /* A table of its own (bf-p4c: one stateful ALU per address and action): the set's old
     * map picks open or check, as round_action's first rows do, and the packet's tag the
     * open. */
    table tag_action {
        key = {
            hdr.inagg.slot_set: ternary;
            meta.old_map0: ternary;
            meta.old_map1: ternary;
            meta.round_in: ternary;
        }
        actions = { open_tag; open_tag_zero; check_tag; NoAction; }
        const default_action = NoAction();   /* never taken: the last entry matches all */
        size = 5;
        const entries = {
            (0, 0, _, 0): open_tag_zero();
            (0, 0, _, _): open_tag();
            (1, _, 0, 0): open_tag_zero();
            (1, _, 0, _): open_tag();
            (_, _, _, _): check_tag();
        }
    }

    /* Each action notes the round kind, the record's answer and moved (a repeat whose sender's
     * bit is in the other set's old map too: its entries match that bit, so moved is one bit,
     * not the 32-bit old map & me, which Tofino 1's PHV has no room for beside the round check). */
#define ROUND_ACTION(NAME, KIND, RECORD, MOVED)                                               \
    action NAME() {                                                                         \
        meta.round_kind = KIND;                                                             \
        meta.same_round = round_##RECORD.execute(meta.idx);                                 \
        meta.moved = MOVED;                                                                 \
    }
    ROUND_ACTION(open_round0, KIND_OPEN, open, 0)
    ROUND_ACTION(check_new0, KIND_NEW, check, 0)
    ROUND_ACTION(check_repeat0, KIND_REPEAT, check, 0)
    ROUND_ACTION(check_moved0, KIND_REPEAT, check, 1)
    ROUND_ACTION(open_round1, KIND_OPEN, open, 0)
    ROUND_ACTION(check_new1, KIND_NEW, check, 0)
    ROUND_ACTION(check_repeat1, KIND_REPEAT, check, 0)
    ROUND_ACTION(check_moved1, KIND_REPEAT, check, 1)

    /* The set's old map and the sender's bit in it (and in the other set's) pick the action. */
#define REPEAT_OF(w) (0, 1 << w &&& 1 << w, 1 << w &&& 1 << w, w): check_moved0(); \
                     (0, 1 << w &&& 1 << w, _, w): check_repeat0(); \
                     (1, 1 << w &&& 1 << w, 1 << w &&& 1 << w, w): check_moved1(); \
                     (1, _, 1 << w &&& 1 << w, w): check_repeat1();
    table round_action {
        key = {
            hdr.inagg.slot_set: exact;
            meta.old_map0: ternary;
            meta.old_map1: ternary;
            hdr.inagg.worker_id: ternary;
        }
        actions = { open_round0; check_new0; check_repeat0; check_moved0; open_round1;
                    check_new1; check_repeat1; check_moved1; NoAction; }
        const default_action = NoAction();   /* never taken: the last entries match all */
        size = 132;
        const entries = {
            (0, 0, _, _): open_round0();
            (1, _, 0, _): open_round1();
            REPEAT_OF(0) REPEAT_OF(1) REPEAT_OF(2) REPEAT_OF(3) REPEAT_OF(4) REPEAT_OF(5)
            REPEAT_OF(6) REPEAT_OF(7) REPEAT_OF(8) REPEAT_OF(9) REPEAT_OF(10) REPEAT_OF(11)
            REPEAT_OF(12) REPEAT_OF(13) REPEAT_OF(14) REPEAT_OF(15) REPEAT_OF(16) REPEAT_OF(17)
            REPEAT_OF(18) REPEAT_OF(19) REPEAT_OF(20) REPEAT_OF(21) REPEAT_OF(22) REPEAT_OF(23)
            REPEAT_OF(24) REPEAT_OF(25) REPEAT_OF(26) REPEAT_OF(27) REPEAT_OF(28) REPEAT_OF(29)
            REPEAT_OF(30) REPEAT_OF(31)
            (0, _, _, _): check_new0();
            (1, _, _, _): check_new1();
        }
    }
#undef REPEAT_OF
#undef ROUND_ACTION

    apply {
        round_action.apply();
        tag_action.apply();
    }
}

#endif /* _INAGG_TOFINO_ROUND_RECORD_P4_ */

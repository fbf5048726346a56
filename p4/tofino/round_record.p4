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
 * actions also note moved, the sender's bit in the other set's old map, for SlotState's
 * decision.
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

    /* Each action notes the round kind, the record's answer and moved (OTHER: the other set). */
#define ROUND_ACTION(NAME, KIND, RECORD, OTHER)                                               \
    action NAME() {                                                                         \
        meta.round_kind = KIND;                                                             \
        meta.same_round = RECORD.execute(meta.idx);                                         \
        meta.moved = meta.old_map##OTHER & meta.me;                                         \
    }
    ROUND_ACTION(open_round0, KIND_OPEN, round_open, 1)
    ROUND_ACTION(check_new0, KIND_NEW, round_check, 1)
    ROUND_ACTION(check_repeat0, KIND_REPEAT, round_check, 1)
    ROUND_ACTION(open_round1, KIND_OPEN, round_open, 0)
    ROUND_ACTION(check_new1, KIND_NEW, round_check, 0)
    ROUND_ACTION(check_repeat1, KIND_REPEAT, round_check, 0)

    /* The set's old map and the sender's bit in it pick the action. */
#define REPEAT_OF(w) (0, 1 << w &&& 1 << w, _, w): check_repeat0(); \
                     (1, _, 1 << w &&& 1 << w, w): check_repeat1();
    table round_action {
        key = {
            hdr.inagg.slot_set: exact;
            meta.old_map0: ternary;
            meta.old_map1: ternary;
            hdr.inagg.worker_id: ternary;
        }
        actions = { open_round0; check_new0; check_repeat0; open_round1; check_new1;
                    check_repeat1; NoAction; }
        const default_action = NoAction();   /* never taken: the last entries match all */
        size = 68;
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
    }
}

#endif /* _INAGG_TOFINO_ROUND_RECORD_P4_ */

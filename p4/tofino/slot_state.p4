/* SlotState (Tofino): the per-slot bookkeeping of an admitted contribution, decided in full
 * BEFORE anything that a dropped packet could spoil is written.
 *
 * Why this layout: Tofino reaches each register once per packet pass, in stage order, so a
 * register cannot be read early and written late. The BMv2 program's decision (mine, empty,
 * complete, same round: p4/include/slot_state.p4) reads the bitmap, the count and the round
 * record before it writes any of them; here the state is kept so that the one register that is
 * written before the decision (the contributor bitmaps) is written only in ways that every
 * outcome but one allows, and the rest is written after the decision.
 *
 * Registers, in pipeline order (inagg/softswitch/tofino_model.py runs them in this order, and
 * tests/test_tofino_model.py holds the order to the stages bf-p4c placed them in):
 *
 *   register     | index      | holds
 *   -------------+------------+---------------------------------------------------------------
 *   slot_tag     | slot       | job_id ++ epoch: the owner; another owner restarts the slot
 *   contributors | slot       | both sets' contributor bitmaps W0, W1: who contributed to the
 *   mirror       | slot       |   set's current round (never cleared when a worker moves on; a
 *                |            |   set's map is emptied when a round of the OTHER set completes).
 *                |            |   Two registers with the same updates: one returns this set's
 *                |            |   old map, the other the other set's (one output per ALU)
 *   round_record | set ++ slot| the round's offset and count: written by FIRST, compared else
 *   seen,        | set ++ slot| keyed on the maps and round record: FIRST stores, ADD counts /
 *   exp_max,     |            |   maxes / ORs, anything else reads (seen: complete; the
 *   sticky_flags |            |   result's exponent and flags)
 *   lanes        | set ++ slot| value_lanes.p4, by the same keys (lane_choice)
 *
 * The decision for worker w (me = 1 << w), set s, o the other set, from the old maps, the
 * round record and seen (a worker's packet for s never clears its bit in o: "moved" = w's bit
 * in o = w went on to the next round, on o, after s's round completed, which emptied o):
 *
 *   Ws == 0                               -> FIRST (result at once when N == 1)
 *   w not in Ws, same round               -> ADD (result when seen reaches N)
 *   w not in Ws, other round              -> BAD_ROUND: dropped, counted
 *   w in Ws, complete, not moved, same    -> DUP_DONE: the stored round to w
 *   w in Ws, complete, not moved, other   -> BAD_ROUND
 *   w in Ws, complete, moved              -> STALE_ROUND: dropped, counted
 *   w in Ws, not complete                 -> DUP_PENDING (other round: BAD_ROUND)
 *
 * which is the BMv2 table row for row (Ws without the bits of workers in Wo is BMv2's bitmap;
 * complete is seen == N). The maps' update (Ws |= me; Wo = 0 when this packet completes s)
 * changes nothing for DUP, STALE and an other-round packet of w in Ws; seen, exponent, flags
 * and lanes change only for FIRST and ADD. The one write a dropped packet makes: an
 * other-round packet of a worker NOT in Ws sets its bit (the maps are read before
 * round_record can say "other round"); its values are never added and no result leaves
 * without every worker's, but that round of that slot waits for the epoch to change
 * (docs/tofino.md). No control-plane register write is ever needed.
 */
#ifndef _INAGG_TOFINO_SLOT_STATE_P4_
#define _INAGG_TOFINO_SLOT_STATE_P4_

#include "types.p4"

#define CONTRIBUTOR_ACTIONS(REG, OUT0, OUT1)                                                         \
    RegisterAction<bitmap_pair_t, slot_t, bit<32>>(REG) REG##_set0 = {                      \
        void apply(inout bitmap_pair_t value, out bit<32> old) {                            \
            old = value.OUT0;                                                                  \
            if (value.set0 == meta.others) { value.set1 = 0; }                              \
            value.set0 = value.set0 | meta.me;                                              \
        }                                                                                   \
    };                                                                                      \
    RegisterAction<bitmap_pair_t, slot_t, bit<32>>(REG) REG##_set1 = {                      \
        void apply(inout bitmap_pair_t value, out bit<32> old) {                            \
            old = value.OUT1;                                                                  \
            if (value.set1 == meta.others) { value.set0 = 0; }                              \
            value.set1 = value.set1 | meta.me;                                              \
        }                                                                                   \
    };                                                                                      \
    RegisterAction<bitmap_pair_t, slot_t, bit<32>>(REG) REG##_restart0 = {                  \
        void apply(inout bitmap_pair_t value, out bit<32> old) {                            \
            old = 0;                                                                        \
            value.set0 = meta.me;                                                           \
            value.set1 = 0;                                                                 \
        }                                                                                   \
    };                                                                                      \
    RegisterAction<bitmap_pair_t, slot_t, bit<32>>(REG) REG##_restart1 = {                  \
        void apply(inout bitmap_pair_t value, out bit<32> old) {                            \
            old = 0;                                                                        \
            value.set1 = meta.me;                                                           \
            value.set0 = 0;                                                                 \
        }                                                                                   \
    };

/* Which of the four actions: by the set and whether claim_slot restarted the slot. */
#define CONTRIBUTOR_APPLY(REG, DEST)                                                          \
    if (hdr.inagg.slot_set == 0) {                                                          \
        if (meta.reset == 1) { DEST = REG##_restart0.execute(meta.slot); }                  \
        else { DEST = REG##_set0.execute(meta.slot); }                                      \
    } else {                                                                                \
        if (meta.reset == 1) { DEST = REG##_restart1.execute(meta.slot); }                  \
        else { DEST = REG##_set1.execute(meta.slot); }                                      \
    }

control SlotState(inout tofino_headers_t hdr, inout tofino_ingress_md_t meta) {
    Register<bit<32>, slot_t>(TOFINO_SLOTS) slot_tag;
    RegisterAction<bit<32>, slot_t, bit<1>>(slot_tag) claim_slot = {
        void apply(inout bit<32> value, out bit<1> taken) {
            if (value != meta.tag) {
                value = meta.tag;
                taken = 1;
            } else {
                taken = 0;
            }
        }
    };

    /* contributors returns this set's old map, mirror the other set's. */
    Register<bitmap_pair_t, slot_t>(TOFINO_SLOTS) contributors;
    Register<bitmap_pair_t, slot_t>(TOFINO_SLOTS) mirror;
    CONTRIBUTOR_ACTIONS(contributors, set0, set1)
    CONTRIBUTOR_ACTIONS(mirror, set1, set0)

    /* The round's offset (lo) and count (hi). */
    Register<bitmap_pair_t, slot_index_t>(2 * TOFINO_SLOTS) round_record;
    RegisterAction<bitmap_pair_t, slot_index_t, bit<1>>(round_record) round_open = {
        void apply(inout bitmap_pair_t value, out bit<1> same) {
            value.set0 = hdr.inagg.offset;
            value.set1 = meta.count32;
            same = 1;
        }
    };
    RegisterAction<bitmap_pair_t, slot_index_t, bit<1>>(round_record) round_check = {
        void apply(inout bitmap_pair_t value, out bit<1> same) {
            if (value.set0 == hdr.inagg.offset && value.set1 == meta.count32) {
                same = 1;
            } else {
                same = 0;
            }
        }
    };

    /* Contributions summed into the round: the only count a result waits for. Returns 1 when
     * the round is (add: this packet makes it) complete. */
    Register<bit<8>, slot_index_t>(2 * TOFINO_SLOTS) seen;
    RegisterAction<bit<8>, slot_index_t, bit<1>>(seen) seen_first = {
        void apply(inout bit<8> value, out bit<1> complete) { value = 1; complete = 0; }
    };
    RegisterAction<bit<8>, slot_index_t, bit<1>>(seen) seen_add = {
        void apply(inout bit<8> value, out bit<1> complete) {
            if (value == meta.n_last) { complete = 1; } else { complete = 0; }
            value = value + 1;
        }
    };
    RegisterAction<bit<8>, slot_index_t, bit<1>>(seen) seen_read = {
        void apply(inout bit<8> value, out bit<1> complete) {
            if (value == meta.n_workers) { complete = 1; } else { complete = 0; }
        }
    };

    Register<bit<8>, slot_index_t>(2 * TOFINO_SLOTS) exp_max;
    RegisterAction<bit<8>, slot_index_t, bit<8>>(exp_max) exp_first = {
        void apply(inout bit<8> value, out bit<8> result) { value = meta.exp_biased; result = value; }
    };
    RegisterAction<bit<8>, slot_index_t, bit<8>>(exp_max) exp_add = {
        void apply(inout bit<8> value, out bit<8> result) {
            if (meta.exp_biased > value) {
                value = meta.exp_biased;
            }
            result = value;
        }
    };
    RegisterAction<bit<8>, slot_index_t, bit<8>>(exp_max) exp_read = {
        void apply(inout bit<8> value, out bit<8> result) { result = value; }
    };

    Register<bit<8>, slot_index_t>(2 * TOFINO_SLOTS) sticky_flags;
    RegisterAction<bit<8>, slot_index_t, bit<8>>(sticky_flags) flags_first = {
        void apply(inout bit<8> value, out bit<8> result) { value = meta.flags_in; result = value; }
    };
    RegisterAction<bit<8>, slot_index_t, bit<8>>(sticky_flags) flags_add = {
        void apply(inout bit<8> value, out bit<8> result) { value = value | meta.flags_in; result = value; }
    };
    RegisterAction<bit<8>, slot_index_t, bit<8>>(sticky_flags) flags_read = {
        void apply(inout bit<8> value, out bit<8> result) { result = value; }
    };

    /* The decision's inputs from the old maps, in one action (0 = the test holds). */
    action compare_maps() {
        meta.mine = meta.old_bitmap & meta.me;
        meta.moved = meta.old_other & meta.me;
        meta.done_gap = meta.old_bitmap ^ meta.others;
    }
    table map_tests {
        actions = { compare_maps; }
        const default_action = compare_maps();
        size = 1;
    }

    action open_round() { meta.same_round = round_open.execute(meta.idx); }
    action check_round() { meta.same_round = round_check.execute(meta.idx); }

    /* The outcome and what follows from it: whether a result leaves, the drop reason
     * (slot_drop: STALE and BAD_ROUND, counted in JobCounters). */
    action decide(bit<3> outcome, bit<1> send_result, bit<8> flags_out) {
        meta.outcome = outcome;
        meta.flags_out = flags_out;
        meta.send_result = send_result;
    }
    action refuse_round(bit<3> outcome, bit<8> reason) {
        meta.outcome = outcome;
        meta.drop_reason = reason;
        meta.slot_drop = 1;
    }
    table decision {
        key = {
            meta.old_bitmap: ternary @name("old_map");
            meta.mine: ternary;
            meta.moved: ternary;
            meta.same_round: ternary;
            meta.complete: ternary;
            meta.done_gap: ternary;
        }
        actions = { decide; refuse_round; NoAction; }
        const default_action = NoAction();
        size = 12;
        const entries = {
            (0, _, _, _, _, 0): decide(SLOT_FIRST, 1, 0);
            (0, _, _, _, _, _): decide(SLOT_FIRST, 0, 0);
            (_, 0, _, 0, _, _): refuse_round(SLOT_BAD_ROUND, DROP_BAD_ROUND);
            (_, 0, _, 1, 1, _): decide(SLOT_ADD, 1, 0);
            (_, 0, _, 1, 0, _): decide(SLOT_ADD, 0, 0);
            (_, _, 0, 1, 1, _): decide(SLOT_DUP_DONE, 1, FLAG_RETRANSMIT);
            (_, _, 0, 0, 1, _): refuse_round(SLOT_BAD_ROUND, DROP_BAD_ROUND);
            (_, _, _, _, 1, _): refuse_round(SLOT_STALE_ROUND, DROP_STALE_ROUND);
            (_, _, _, 0, _, _): refuse_round(SLOT_BAD_ROUND, DROP_BAD_ROUND);
            (_, _, _, 1, _, _): decide(SLOT_DUP_PENDING, 0, 0);
        }
    }

    /* seen, exponent, flags and the lanes' operation, from the maps and the round record
     * (not the decision, a stage later): FIRST stores, a packet of this round that is not in
     * it yet adds, anything else reads (what only DUP_DONE's result uses; every other outcome
     * is dropped). */
#define BY_MAPS(STORE, ADD, LOAD) \
        key = { meta.old_bitmap: ternary @name("old_map"); meta.mine: ternary; \
                meta.same_round: ternary; } \
        actions = { STORE; ADD; LOAD; NoAction; } \
        const default_action = NoAction(); \
        size = 3; \
        const entries = { (0, _, _): STORE(); (_, 0, 1): ADD(); (_, _, _): LOAD(); }

    action count_first() { meta.complete = seen_first.execute(meta.idx); }
    action count_add() { meta.complete = seen_add.execute(meta.idx); }
    action count_read() { meta.complete = seen_read.execute(meta.idx); }
    table seen_update { BY_MAPS(count_first, count_add, count_read) }

    action lanes_store() { meta.lane_op = LANE_STORE; }
    action lanes_add() { meta.lane_op = LANE_ADD; }
    action lanes_load() { meta.lane_op = LANE_LOAD; }
    table lane_choice { BY_MAPS(lanes_store, lanes_add, lanes_load) }

    action exp_store() { meta.exp_result = exp_first.execute(meta.idx); }
    action exp_max_in() { meta.exp_result = exp_add.execute(meta.idx); }
    action exp_load() { meta.exp_result = exp_read.execute(meta.idx); }
    table exp_update { BY_MAPS(exp_store, exp_max_in, exp_load) }

    action flags_store() { meta.flags_result = flags_first.execute(meta.idx); }
    action flags_or_in() { meta.flags_result = flags_add.execute(meta.idx); }
    action flags_load() { meta.flags_result = flags_read.execute(meta.idx); }
    table flags_update { BY_MAPS(flags_store, flags_or_in, flags_load) }

    apply {
        meta.reset = claim_slot.execute(meta.slot);
        CONTRIBUTOR_APPLY(contributors, meta.old_bitmap)
        CONTRIBUTOR_APPLY(mirror, meta.old_other)
        map_tests.apply();
        if (meta.old_bitmap == 0) {
            open_round();
        } else {
            check_round();
        }
        seen_update.apply();
        exp_update.apply();
        flags_update.apply();
        lane_choice.apply();
        decision.apply();
        hdr.inagg.exp = (int<8>) (meta.exp_result ^ 8w0x80);
        hdr.inagg.flags = meta.flags_result | meta.flags_out;   /* DUP_DONE: FLAG_RETRANSMIT */
    }
}

#endif /* _INAGG_TOFINO_SLOT_STATE_P4_ */

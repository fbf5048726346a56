/* SlotState (Tofino): the rest of the round logic of an admitted contribution, after SlotClaim
 * (slot_claim.p4) claimed the slot and joined the set's contributor map and RoundRecord
 * (round_record.p4) said whether the packet belongs to the round; decided in full BEFORE
 * anything that a dropped packet could spoil is written.
 *
 * Why this layout: Tofino reaches each register once per packet pass, in stage order, so a
 * register cannot be read early and written late. The BMv2 program's decision (mine, empty,
 * complete, same round: p4/include/slot_state.p4) reads the bitmap, the count and the round
 * record before it writes any of them; here the one register written before the decision (the
 * contributor map) is written only in ways that every outcome but one allows, and the rest is
 * written after the round record said whether the packet belongs to the round.
 *
 * Registers, in pipeline order (bmv2_env/softswitch/tna_slot_model.py runs them in this order, and
 * tests/test_tna_slot_model.py holds the order to the stages bf-p4c placed them in):
 *
 *   register     | index      | stage | holds
 *   -------------+------------+-------+--------------------------------------------------------
 *   map0, map1   | slot       | 1     | slot_claim.p4: owner tag and each set's contributor map
 *   round_record | set ++ slot| 2     | round_record.p4: the round's offset and count
 *   seen,        | set ++ slot| 3     | keyed on round_kind and same_round (BY_ROUND): an
 *   exp_max,     |            |       |   opening packet stores, a new sender of this round
 *   sticky_flags |            |       |   counts / maxes / ORs, a repeat reads (seen: complete;
 *                |            |       |   the result's exponent and flags)
 *   lane pairs   | set ++ slot| 3-11  | value_lanes.p4, by the same keys
 *   round_owner  | set ++ slot| 3     | Tofino 2: a reduce-scatter round's owner, by the same
 *                |            |       |   keys (below; pinned too)
 *
 * Stage 3 is pinned (@stage): 32 lane pairs and these three take 35 of the 36 stateful ALUs of
 * stages 3-11 (Tofino 2: all 36, with round_owner), and bf-p4c's greedy placement would
 * otherwise give the lanes stage 3 and push the decision (Tofino 2: the replication, which reads
 * round_owner's answer) past stage 11.
 *
 * The decision for worker w (me = 1 << w), set s, o the other set, from the old maps, the
 * round record and seen ("moved" = w's bit in o = w went on to the next round, on o, after s's
 * round completed, whose harvest pass emptied o):
 *
 *   round_kind | same | moved | complete | outcome
 *   -----------+------+-------+----------+--------------------------------------------------
 *   OPEN       | -    | -     | -        | FIRST (result at once when N == 1)
 *   NEW        | 1    | -     | -        | ADD (result when seen reaches N)
 *   NEW        | 0    | -     | -        | BAD_ROUND: dropped, counted
 *   REPEAT     | 1    | 0     | 1        | DUP_DONE: the stored round to w
 *   REPEAT     | 0    | 0     | 1        | BAD_ROUND
 *   REPEAT     | -    | 1     | 1        | STALE_ROUND: dropped, counted
 *   REPEAT     | 1/0  | -     | 0        | DUP_PENDING / BAD_ROUND
 *
 * which is the BMv2 table row for row (Ws without the bits of workers in Wo is BMv2's bitmap;
 * complete is seen == N). On Tofino 2 these rows take an opener only when its tag is the set's
 * next (round_next) and another packet only when it is the set's (round_diff 0; round_record.p4),
 * and the round tag refuses the rest (TAG_REFUSALS in tna_slot_model.py is their twin; next:
 * round_next, or round_diff TAG_BEHIND):
 *
 *   round_kind | next       | outcome
 *   -----------+------------+------------------------------------------------------------------
 *   OPEN       | 0          | STALE_ROUND, HARVEST_UNDO (a late copy of a finished round)
 *   NEW        | 1          | BAD_ROUND, HARVEST_UNDO (the next round, while this one runs)
 *   NEW        | 0          | STALE_ROUND, HARVEST_UNDO
 *   REPEAT     | 1          | BAD_ROUND
 *   REPEAT     | 0          | STALE_ROUND
 *
 * An opener that is refused has stored its round as OPEN does (seen, exponent, flags, lanes,
 * the record): harmless, its set held no round, and the next opener stores over it. A result leaves through a harvest pass (result_replication.p4):
 * HARVEST_RESULT for FIRST and ADD, whose harvest also retires o; HARVEST_ANSWER for DUP_DONE
 * (on Tofino 2 answered in the first pass: its pairs return both words, nothing to retire),
 * or HARVEST_ANSWER_RETIRE when o still holds a map equal to s's (maps_diff == 0: o's previous
 * round, complete, left behind because its result's harvest pass was lost; the retransmits
 * that lost result causes retire it, so a lost recirculation never wedges the slot).
 *
 * The map's update (Ws |= me) changes nothing for a repeat; seen, exponent, flags and lanes
 * change only for FIRST and ADD. The one write a dropped packet makes: an other-round packet
 * of a worker NOT in Ws sets its bit (the map is read before round_record can say "other
 * round"); its values are never added and no result leaves without every worker's (seen
 * counts sums, not bits), and its second pass (HARVEST_UNDO) takes the bit out again, so the
 * worker's real contribution joins the round (a copy of it that arrives in between is taken
 * for a duplicate; the worker's resend joins). No control-plane register write is ever needed.
 */
#ifndef _INAGG_TOFINO_SLOT_STATE_P4_
#define _INAGG_TOFINO_SLOT_STATE_P4_

#include "types.p4"

control SlotState(inout tofino_headers_t hdr, inout tofino_ingress_md_t meta) {
    /* Contributions summed into the round: the only count a result waits for; the high bit
     * (SEEN_HARVESTED) set by the result's harvest pass. Returns ROUND_* (add: ROUND_COMPLETE
     * when this packet completes the round). */
    Register<bit<8>, slot_index_t>(2 * TOFINO_SLOTS) seen;
    RegisterAction<bit<8>, slot_index_t, bit<2>>(seen) seen_first = {
        void apply(inout bit<8> value, out bit<2> done) { value = 1; done = ROUND_PENDING; }
    };
    RegisterAction<bit<8>, slot_index_t, bit<2>>(seen) seen_add = {
        void apply(inout bit<8> value, out bit<2> done) {
            if (value == meta.n_last) { done = ROUND_COMPLETE; } else { done = ROUND_PENDING; }
            value = value + 1;
        }
    };
    RegisterAction<bit<8>, slot_index_t, bit<2>>(seen) seen_read = {
        void apply(inout bit<8> value, out bit<2> done) {
            if (value == meta.n_workers) {
                done = ROUND_COMPLETE;
            } else if (value - meta.n_workers == SEEN_HARVESTED) {
                done = ROUND_HARVESTED;
            } else {
                done = ROUND_PENDING;
            }
        }
    };
    RegisterAction<bit<8>, slot_index_t, bit<2>>(seen) seen_harvested = {
        void apply(inout bit<8> value) { value = value | SEEN_HARVESTED; }
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

    /* The outcome and what follows from it: whether a result leaves and how (harvest), its
     * exponent and flags in the header, the drop reason (slot_drop: STALE and BAD_ROUND,
     * counted in JobCounters). */
    action decide(bit<3> outcome, bit<3> harvest, bit<8> flags_out) {
        meta.outcome = outcome;
        meta.harvest = harvest;
        hdr.inagg.exp = (int<8>) (meta.exp_result ^ 8w0x80);
        hdr.inagg.flags = meta.flags_result | flags_out;   /* DUP_DONE: FLAG_RETRANSMIT */
    }
    action refuse_round(bit<3> outcome, bit<8> reason, bit<3> harvest) {
        meta.outcome = outcome;
        meta.drop_reason = reason;
        meta.slot_drop = 1;
        meta.harvest = harvest;
#if __TARGET_TOFINO__ != 2
        hdr.inagg.flags = meta.flags_in;   /* no FLAG_RETRANSMIT: an undo pass keeps its me
                                              (slot_inputs.p4: worker_mask) */
#endif
    }
    table decision {
        key = {
            meta.round_kind: ternary;
            meta.same_round: ternary;
            meta.moved: ternary;
            meta.round_done: ternary;
            meta.n_workers: ternary;
            meta.round_next: ternary;
            meta.round_diff: ternary;
        }
        actions = { decide; refuse_round; NoAction; }
        const default_action = NoAction();
        size = 17;   /* and the round tag's 5 rows */
        const entries = {
#define OPENS , _, 1
#define THIS_ROUND , _, 0
            (KIND_OPEN, _, _, _, 1 OPENS): decide(SLOT_FIRST, HARVEST_RESULT, 0);
            (KIND_OPEN, _, _, _, _ OPENS): decide(SLOT_FIRST, HARVEST_NONE, 0);
            (KIND_NEW, 0, _, _, _ THIS_ROUND): refuse_round(SLOT_BAD_ROUND, DROP_BAD_ROUND, HARVEST_UNDO);
            (KIND_NEW, 1, _, ROUND_COMPLETE, _ THIS_ROUND): decide(SLOT_ADD, HARVEST_RESULT, 0);
            (KIND_NEW, 1, _, _, _ THIS_ROUND): decide(SLOT_ADD, HARVEST_NONE, 0);
            (KIND_REPEAT, 1, _, ROUND_COMPLETE, _ THIS_ROUND): decide(SLOT_DUP_DONE, HARVEST_ANSWER_RETIRE, FLAG_RETRANSMIT);
            (KIND_REPEAT, 1, 0, ROUND_HARVESTED, _ THIS_ROUND): decide(SLOT_DUP_DONE, HARVEST_ANSWER, FLAG_RETRANSMIT);
            (KIND_REPEAT, 0, _, ROUND_COMPLETE, _ THIS_ROUND): refuse_round(SLOT_BAD_ROUND, DROP_BAD_ROUND, HARVEST_NONE);
            (KIND_REPEAT, 0, 0, ROUND_HARVESTED, _ THIS_ROUND): refuse_round(SLOT_BAD_ROUND, DROP_BAD_ROUND, HARVEST_NONE);
            (KIND_REPEAT, _, _, ROUND_HARVESTED, _ THIS_ROUND): refuse_round(SLOT_STALE_ROUND, DROP_STALE_ROUND, HARVEST_NONE);
            (KIND_REPEAT, 0, _, _, _ THIS_ROUND): refuse_round(SLOT_BAD_ROUND, DROP_BAD_ROUND, HARVEST_NONE);
            (KIND_REPEAT, 1, _, _, _ THIS_ROUND): decide(SLOT_DUP_PENDING, HARVEST_NONE, 0);
            (KIND_OPEN, _, _, _, _, _, _): refuse_round(SLOT_STALE_ROUND, DROP_STALE_ROUND, HARVEST_UNDO);
            (KIND_NEW, _, _, _, _, _, TAG_BEHIND): refuse_round(SLOT_BAD_ROUND, DROP_BAD_ROUND, HARVEST_UNDO);
            (KIND_NEW, _, _, _, _, _, _): refuse_round(SLOT_STALE_ROUND, DROP_STALE_ROUND, HARVEST_UNDO);
            (KIND_REPEAT, _, _, _, _, _, TAG_BEHIND): refuse_round(SLOT_BAD_ROUND, DROP_BAD_ROUND, HARVEST_NONE);
            (KIND_REPEAT, _, _, _, _, _, _): refuse_round(SLOT_STALE_ROUND, DROP_STALE_ROUND, HARVEST_NONE);
#undef OPENS
#undef THIS_ROUND
        }
    }

    /* seen, exponent and flags by round_kind and same_round: an opening packet stores, a new
     * sender of this round adds, a repeat reads (what only DUP_DONE's result uses, and seen's
     * complete for STALE; every other outcome is dropped). value_lanes.p4 keys its pairs alike. */
#define BY_ROUND(STORE, ADD, LOAD) \
        key = { meta.round_kind: exact; meta.same_round: exact; } \
        actions = { STORE; ADD; LOAD; NoAction; } \
        const default_action = NoAction(); \
        size = 4; \
        const entries = { (KIND_OPEN, 1): STORE(); (KIND_NEW, 1): ADD(); \
                          (KIND_REPEAT, 1): LOAD(); (KIND_REPEAT, 0): LOAD(); }

    action count_first() { meta.round_done = seen_first.execute(meta.idx); }
    action count_add() { meta.round_done = seen_add.execute(meta.idx); }
    action count_read() { meta.round_done = seen_read.execute(meta.idx); }
    action count_harvested() { seen_harvested.execute(meta.idx); }
    /* BY_ROUND, and a result's harvest pass that retired the other set (where the slot's owner
     * was still its own: slot_claim.p4) marks its round. */
    @stage(3)
    table seen_update {
        key = { meta.retired0: exact; meta.retired1: exact; meta.round_kind: exact;
                meta.same_round: exact; }
        actions = { count_first; count_add; count_read; count_harvested; NoAction; }
        const default_action = NoAction();
        size = 6;
        const entries = {
            (0, 0, KIND_OPEN, 1): count_first();
            (0, 0, KIND_NEW, 1): count_add();
            (0, 0, KIND_REPEAT, 1): count_read();
            (0, 0, KIND_REPEAT, 0): count_read();
            (1, 0, 0, 0): count_harvested();
            (0, 1, 0, 0): count_harvested();
        }
    }

    action exp_store() { meta.exp_result = exp_first.execute(meta.idx); }
    action exp_max_in() { meta.exp_result = exp_add.execute(meta.idx); }
    action exp_load() { meta.exp_result = exp_read.execute(meta.idx); }
    @stage(3)
    table exp_update { BY_ROUND(exp_store, exp_max_in, exp_load) }

    action flags_store() { meta.flags_result = flags_first.execute(meta.idx); }
    action flags_or_in() { meta.flags_result = flags_add.execute(meta.idx); }
    action flags_load() { meta.flags_result = flags_read.execute(meta.idx); }
    @stage(3)
    table flags_update { BY_ROUND(flags_store, flags_or_in, flags_load) }

#if __TARGET_TOFINO__ == 2
    /* Reduce-scatter (docs/protocol.md): the round's owner, OWNER_NONE, OWNER_SHARED or the
     * replica (rank + 1) alone that gets the result's values, as p4/include/round_owner.p4's
     * slot_owner, by the same decision (owner_decision; its twin
     * inagg.hostlib.wire.protocol.OWNER_DECISION, whose rows tests/test_owner_decision.py runs on
     * the model of these actions too). SlotInputs' owner_input has folded from_switch and marked
     * into meta.owner_in (OWNER_SHARED, the sender's replica, OWNER_NONE); first is the
     * action, owned the register's value:
     *
     *   action (BY_ROUND)   | owner_in   | value (owned) | value after
     *   --------------------+------------+---------------+-----------------------------------
     *   owner_first (FIRST) | any        | any           | owner_in (shared, the sender, none)
     *   owner_add (ADD)     | OWNER_NONE | any           | kept (unmarked)
     *   owner_add (ADD)     | not NONE   | OWNER_NONE    | owner_in (the sender; shared)
     *   owner_add (ADD)     | not NONE   | not NONE      | OWNER_SHARED (a second mark)
     *   owner_read (repeat) | -          | -             | kept (what a DUP_DONE answer carries)
     *
     * Each returns the value after it into meta.owner_result: the result of the packet that
     * completes the round (its FIRST or ADD is the round's last update) and a DUP_DONE answer
     * carry it in bridged.owner (result_replication.p4), for the harvest pass and egress
     * (replica_rewrite.p4), which sends every other replica the header alone. Tofino 1 keeps
     * no owner (docs/tofino.md, "Reduce-scatter results"): every rank gets every block. */
    Register<bit<8>, slot_index_t>(2 * TOFINO_SLOTS) round_owner;
    RegisterAction<bit<8>, slot_index_t, bit<8>>(round_owner) owner_first = {
        void apply(inout bit<8> value, out bit<8> result) { value = meta.owner_in; result = value; }
    };
    RegisterAction<bit<8>, slot_index_t, bit<8>>(round_owner) owner_add = {
        void apply(inout bit<8> value, out bit<8> result) {
            if (meta.owner_in != OWNER_NONE) {
                if (value == OWNER_NONE) {
                    value = meta.owner_in;
                } else {
                    value = OWNER_SHARED;
                }
            }
            result = value;
        }
    };
    RegisterAction<bit<8>, slot_index_t, bit<8>>(round_owner) owner_read = {
        void apply(inout bit<8> value, out bit<8> result) { result = value; }
    };

    action owner_store() { meta.owner_result = owner_first.execute(meta.idx); }
    action owner_mark() { meta.owner_result = owner_add.execute(meta.idx); }
    action owner_load() { meta.owner_result = owner_read.execute(meta.idx); }
    /* Pinned beside the round state, in the place of a lane pair: unpinned, bf-p4c put it in
     * stage 11, after the lanes, and the replication that reads its answer in a 13th stage. */
    @stage(3)
    table owner_update { BY_ROUND(owner_store, owner_mark, owner_load) }
#endif

    /* How far the packet's tag is from its set's, for the decision (round_record.p4): in place,
     * a byte (the wrap of ROUND_TAGS for free). */
    action tag_distance() { meta.round_diff = meta.round_diff - meta.round_in; }

    apply {
        seen_update.apply();
        exp_update.apply();
        flags_update.apply();
#if __TARGET_TOFINO__ == 2
        owner_update.apply();
#endif
        tag_distance();
        decision.apply();
    }
}

#endif /* _INAGG_TOFINO_SLOT_STATE_P4_ */

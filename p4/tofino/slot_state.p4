/* SlotState (Tofino): the per-slot bookkeeping of an admitted contribution, with every
 * register array touched once per packet by its own stateful ALU.
 *
 * Registers: slot_tag per slot (job_id ++ epoch, the owner); bitmaps per slot (both sets'
 * worker bitmaps, one pair); per (slot, set) at index set ++ slot: seen (contributions of the
 * round), exponent max (biased so signed order is unsigned order) and the ORed sticky flags.
 *
 *   order | register | what it does
 *   ------+----------+------------------------------------------------------------------------
 *   1     | slot_tag | another owner (job, epoch): take the slot, reset = 1
 *   2     | bitmaps  | set my bit in this set, clear it in the other, return this set's old
 *         |          | map (reset: this set = me, the other = 0, old = 0)
 *   3     | seen,    | by the bitmaps: FIRST: = 1 / store; DUP: read; else + 1 / max / OR,
 *         | exp_max, | seen returning the count before (the result header's exponent and
 *         | flags    | flags come from exp_max and flags)
 *
 * The decision is p4/include/slot_state.p4's table: FIRST when the old map is 0 (or reset),
 * DUP when my bit was set (DONE when seen == N), STALE when the round was complete, else ADD.
 * Tofino reaches each register once per packet, so the bitmaps, exponent, flags and value
 * lanes are updated before seen tells ADD from STALE (SwitchML's order). STALE is dropped and
 * counted as on BMv2, and seen marks the round SEEN_TAINTED, so it is never served again (a
 * DUP_DONE needs seen == N): docs/tofino.md says when STALE can happen (a network that
 * reorders one worker's packets) and what it costs.
 * No control-plane register write is ever needed: a new owner resets the slot in the data plane.
 */
#ifndef _INAGG_TOFINO_SLOT_STATE_P4_
#define _INAGG_TOFINO_SLOT_STATE_P4_

#include "types.p4"

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

    /* Both sets' worker bitmaps of a slot in one register: one access sets my bit in this set
     * and clears it in the other, as a worker moves between the sets. */
    Register<bitmap_pair_t, slot_t>(TOFINO_SLOTS) bitmaps;
    RegisterAction<bitmap_pair_t, slot_t, bit<32>>(bitmaps) set0 = {
        void apply(inout bitmap_pair_t value, out bit<32> old) {
            old = value.set0;
            value.set0 = value.set0 | meta.me;
            value.set1 = value.set1 & ~meta.me;
        }
    };
    RegisterAction<bitmap_pair_t, slot_t, bit<32>>(bitmaps) set1 = {
        void apply(inout bitmap_pair_t value, out bit<32> old) {
            old = value.set1;
            value.set1 = value.set1 | meta.me;
            value.set0 = value.set0 & ~meta.me;
        }
    };
    RegisterAction<bitmap_pair_t, slot_t, bit<32>>(bitmaps) restart0 = {
        void apply(inout bitmap_pair_t value, out bit<32> old) {
            old = 0;
            value.set0 = meta.me;
            value.set1 = 0;
        }
    };
    RegisterAction<bitmap_pair_t, slot_t, bit<32>>(bitmaps) restart1 = {
        void apply(inout bitmap_pair_t value, out bit<32> old) {
            old = 0;
            value.set1 = meta.me;
            value.set0 = 0;
        }
    };

    Register<bit<8>, slot_index_t>(2 * TOFINO_SLOTS) seen;
    RegisterAction<bit<8>, slot_index_t, bit<8>>(seen) seen_first = {
        void apply(inout bit<8> value) { value = 1; }
    };
    /* Returns the count before this packet. A complete round (== N) gets SEEN_TAINTED: this
     * packet is STALE, and the value lanes, which run beside seen, have added it to the
     * round's stored sum, so the round may not be served again (DUP_DONE needs == N). */
    RegisterAction<bit<8>, slot_index_t, bit<8>>(seen) seen_add = {
        void apply(inout bit<8> value, out bit<8> before) {
            before = value;
            if (value == meta.n_workers || value >= SEEN_TAINTED) {
                value = value | SEEN_TAINTED;
            } else {
                value = value + 1;
            }
        }
    };
    RegisterAction<bit<8>, slot_index_t, bit<8>>(seen) seen_read = {
        void apply(inout bit<8> value, out bit<8> before) { before = value; }
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

    /* A table of its own, so the AND is an action and the gateways test its result. */
    action test_mine() {
        meta.mine = meta.old_bitmap & meta.me;
    }
    table mine {
        actions = { test_mine; }
        const default_action = test_mine();
        size = 1;
    }

    /* seen, exponent and flags, chosen by the bitmaps alone: FIRST, else ADD when my bit was
     * clear (mine == 0), else DUP. One table per register (Tofino addresses each register from
     * its own table), all three in the stage after the bitmaps; seen_update also says what the
     * value lanes do, so they follow it and cannot take these stateful ALUs and push the result
     * logic past the last stage. */
#define BY_BITMAPS(FIRST, ADD, DUP) \
        key = { meta.first: exact; meta.mine: ternary; } \
        actions = { FIRST; ADD; DUP; NoAction; } \
        const default_action = NoAction(); \
        size = 3; \
        const entries = { (1, _): FIRST(); (0, 0): ADD(); (0, _): DUP(); }

    action count_first() {
        seen_first.execute(meta.idx);
        meta.lane_op = LANE_STORE;
    }
    action count_add() {
        meta.seen_before = seen_add.execute(meta.idx);
        meta.lane_op = LANE_ADD;
    }
    action count_read() {
        meta.seen_before = seen_read.execute(meta.idx);
        meta.lane_op = LANE_LOAD;
    }
    table seen_update { BY_BITMAPS(count_first, count_add, count_read) }

    action exp_store() { meta.exp_result = exp_first.execute(meta.idx); }
    action exp_max_in() { meta.exp_result = exp_add.execute(meta.idx); }
    action exp_load() { meta.exp_result = exp_read.execute(meta.idx); }
    table exp_update { BY_BITMAPS(exp_store, exp_max_in, exp_load) }

    action flags_store() { meta.flags_result = flags_first.execute(meta.idx); }
    action flags_or_in() { meta.flags_result = flags_add.execute(meta.idx); }
    action flags_load() { meta.flags_result = flags_read.execute(meta.idx); }
    table flags_update { BY_BITMAPS(flags_store, flags_or_in, flags_load) }

    apply {
        meta.reset = claim_slot.execute(meta.slot);

        if (hdr.inagg.slot_set == 0) {
            if (meta.reset == 1) {
                meta.old_bitmap = restart0.execute(meta.slot);
            } else {
                meta.old_bitmap = set0.execute(meta.slot);
            }
        } else {
            if (meta.reset == 1) {
                meta.old_bitmap = restart1.execute(meta.slot);
            } else {
                meta.old_bitmap = set1.execute(meta.slot);
            }
        }
        mine.apply();
        if (meta.old_bitmap == 0) {
            meta.first = 1;
        }

        seen_update.apply();
        exp_update.apply();
        flags_update.apply();
        /* The outcome, and in the same branch whether a result leaves (a round completes, or
         * DUP_DONE): STALE is not absorbed (send_result stays 0, ResultReplication drops it)
         * and JobCounters counts it as a drop; the verdict is left alone, as the value lanes
         * are applied under it. */
        if (meta.first == 1) {
            meta.outcome = SLOT_FIRST;
            if (meta.n_last == 0) {
                meta.send_result = 1;
            }
        } else if (meta.mine != 0) {
            if (meta.seen_before == meta.n_workers) {
                meta.outcome = SLOT_DUP_DONE;
                meta.send_result = 1;
            } else {
                meta.outcome = SLOT_DUP_PENDING;
            }
        } else if (meta.seen_before == meta.n_workers || meta.seen_before[7:7] == 1) {
            meta.outcome = SLOT_STALE_ROUND;
            meta.drop_reason = DROP_STALE_ROUND;
        } else {
            meta.outcome = SLOT_ADD;
            if (meta.seen_before == meta.n_last) {
                meta.send_result = 1;
            }
        }
        hdr.inagg.exp = (int<8>) (meta.exp_result ^ 8w0x80);
        hdr.inagg.flags = meta.flags_result;
    }
}

#endif /* _INAGG_TOFINO_SLOT_STATE_P4_ */

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
 *   3     | seen     | FIRST: = 1; ADD: + 1 unless complete (== N), returns the count before;
 *         |          | DUP: read
 *   4     | exp_max, | FIRST: store; ADD: max / OR; DUP_DONE: read (the result's header)
 *         | flags    |
 *
 * The decision is p4/include/slot_state.p4's table: FIRST when the old map is 0 (or reset),
 * DUP when my bit was set (DONE when seen == N), STALE when the round was complete, else ADD.
 * Tofino reaches each register once per packet, so the bitmaps are updated before seen tells
 * ADD from STALE (SwitchML's order). STALE is dropped and counted as on BMv2, but its bitmap
 * update stands: docs/tofino.md says when that can happen (a network that reorders one
 * worker's packets) and what it costs.
 * No control-plane register write is ever needed: a new owner resets the slot in the data plane.
 */
#ifndef _INAGG_TOFINO_SLOT_STATE_P4_
#define _INAGG_TOFINO_SLOT_STATE_P4_

#include "sizes.p4"

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
    /* Returns the count before this packet; a complete round (== N) is left as it is. */
    RegisterAction<bit<8>, slot_index_t, bit<8>>(seen) seen_add = {
        void apply(inout bit<8> value, out bit<8> before) {
            before = value;
            if (value != meta.n_workers) {
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
    /* STALE: the lanes added its values to the finished round (they run beside seen), so the
     * round's stored result is marked as not representable: a retransmitted copy of it makes
     * the worker fall back, never use a wrong sum. */
    RegisterAction<bit<8>, slot_index_t, bit<8>>(sticky_flags) flags_taint = {
        void apply(inout bit<8> value) { value = value | FLAG_OVERFLOW; }
    };

    /* me = 1 << worker_id (Tofino has no shift by a variable amount). */
    action set_me(bit<32> me) {
        meta.me = me;
    }
    table worker_mask {
        key = { hdr.inagg.worker_id: exact; }
        actions = { set_me; }
        const default_action = set_me(0);
        size = 32;
        const entries = {
            0: set_me(1 << 0);   1: set_me(1 << 1);   2: set_me(1 << 2);   3: set_me(1 << 3);
            4: set_me(1 << 4);   5: set_me(1 << 5);   6: set_me(1 << 6);   7: set_me(1 << 7);
            8: set_me(1 << 8);   9: set_me(1 << 9);   10: set_me(1 << 10); 11: set_me(1 << 11);
            12: set_me(1 << 12); 13: set_me(1 << 13); 14: set_me(1 << 14); 15: set_me(1 << 15);
            16: set_me(1 << 16); 17: set_me(1 << 17); 18: set_me(1 << 18); 19: set_me(1 << 19);
            20: set_me(1 << 20); 21: set_me(1 << 21); 22: set_me(1 << 22); 23: set_me(1 << 23);
            24: set_me(1 << 24); 25: set_me(1 << 25); 26: set_me(1 << 26); 27: set_me(1 << 27);
            28: set_me(1 << 28); 29: set_me(1 << 29); 30: set_me(1 << 30); 31: set_me(1 << 31);
        }
    }

    /* The packet's slot, index, owner tag and register inputs, in one action. */
    action prepare() {
        meta.slot = hdr.inagg.slot[TOFINO_SLOT_BITS - 1:0];
        meta.idx = hdr.inagg.slot_set ++ hdr.inagg.slot[TOFINO_SLOT_BITS - 1:0];
        meta.tag = hdr.inagg.job_id ++ hdr.inagg.epoch;
        meta.exp_biased = (bit<8>) hdr.inagg.exp ^ 8w0x80;
        meta.flags_in = hdr.inagg.flags & (FLAG_OVERFLOW | FLAG_CONGESTION);
    }

    /* A table of its own, so the AND is an action and the gateways test its result. */
    action test_mine() {
        meta.mine = meta.old_bitmap & meta.me;
    }
    table mine {
        actions = { test_mine; }
        const default_action = test_mine();
        size = 1;
    }

    apply {
        worker_mask.apply();
        prepare();
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
        meta.first = 0;
        if (meta.old_bitmap == 0) {
            meta.first = 1;
        }

        bit<1> completes = 0;
        if (meta.first == 1) {
            meta.outcome = SLOT_FIRST;
            seen_first.execute(meta.idx);
            if (meta.n_last == 0) {
                completes = 1;
            }
        } else if (meta.mine != 0) {
            meta.seen_before = seen_read.execute(meta.idx);
            if (meta.seen_before == meta.n_workers) {
                meta.outcome = SLOT_DUP_DONE;
            } else {
                meta.outcome = SLOT_DUP_PENDING;
            }
        } else {
            meta.seen_before = seen_add.execute(meta.idx);
            if (meta.seen_before == meta.n_workers) {
                meta.outcome = SLOT_STALE;
            } else {
                meta.outcome = SLOT_ADD;
                if (meta.seen_before == meta.n_last) {
                    completes = 1;
                }
            }
        }

        bit<8> exp = 0;
        meta.send_result = 0;
        if (meta.outcome == SLOT_FIRST) {
            exp = exp_first.execute(meta.idx);
            hdr.inagg.flags = flags_first.execute(meta.idx);
        } else if (meta.outcome == SLOT_ADD) {
            exp = exp_add.execute(meta.idx);
            hdr.inagg.flags = flags_add.execute(meta.idx);
        } else if (meta.outcome == SLOT_DUP_DONE) {
            exp = exp_read.execute(meta.idx);
            hdr.inagg.flags = flags_read.execute(meta.idx);
        } else if (meta.outcome == SLOT_STALE) {
            flags_taint.execute(meta.idx);
        }
        hdr.inagg.exp = (int<8>) (exp ^ 8w0x80);
        if (meta.outcome == SLOT_DUP_DONE || completes == 1) {
            meta.send_result = 1;
        }
        if (meta.outcome == SLOT_STALE) {
            meta.verdict = VERDICT_DROP;
            meta.drop_reason = DROP_STALE_ROUND;
        }
    }
}

#endif /* _INAGG_TOFINO_SLOT_STATE_P4_ */

/* SlotState: the per-slot bookkeeping of an admitted contribution.
 *
 * Registers per slot: the owner tag (job_id << 16 | epoch); per (slot, set): worker bitmap,
 * contributions seen in the current round, max block exponent, ORed sticky flags, and the
 * round's offset and count. The first packet of a new (job, epoch) on a slot resets it: no
 * control-plane register write is ever needed (BMv2's P4Runtime cannot write registers).
 *
 * Decision for worker w, set s (o = the other set; "same round": the packet's offset and count
 * are the ones stored for the round in set s; "this round": the packet's round tag, flags bits
 * ROUND_TAG_MASK, is the one stored for set s, "next round": it is that tag + 1 mod ROUND_TAGS),
 * the const entries of table slot_decision, row for row (inagg.hostlib.wire.protocol.SLOT_DECISION
 * is the Python twin; tests/test_slot_decision.py holds it to these entries and the reference
 * engine to each row). N is the job's n_workers (this switch's children); in an aggregation tree
 * (docs/trees.md) a switch with an uplink counts the parent's result as one more, so its round
 * is complete at N + 1 and "sent up" at N:
 *
 *   mine: bit w in | empty:         | complete:   | same_round | sent_up:     | this_ | next_ | outcome
 *   bitmap[s]      | bitmap[s] == 0 | seen[s] ==  |            | uplink and   | round | round |
 *                  |                | N + uplink  |            | seen[s] == N |       |       |
 *   ---------------+----------------+-------------+------------+--------------+-------+-------+-----------
 *   any            | any            | any         | any        | any          | 0     | 0     | SLOT_STALE_ROUND: drop (an older round)
 *   0              | 1              | any         | any        | any          | 0     | 1     | SLOT_FIRST: overwrite set s, keep the tag
 *   0              | 0              | any         | any        | any          | 0     | 1     | SLOT_BAD_ROUND: drop (never sent)
 *   1              | any            | any         | any        | any          | 0     | 1     | SLOT_BAD_ROUND: drop (never sent)
 *   0              | 1              | any         | any        | any          | 1     | any   | SLOT_STALE_ROUND: drop (all moved on)
 *   0              | 0              | 0           | 1          | 0            | 1     | any   | SLOT_ADD: add, max exp, OR flags
 *   0              | 0              | 0           | 0          | 0            | 1     | any   | SLOT_BAD_ROUND: drop
 *   0              | 0              | 1           | any        | any          | 1     | any   | SLOT_STALE_ROUND: drop (reordered)
 *   0              | 0              | 0           | any        | 1            | 1     | any   | SLOT_STALE_ROUND: drop (all in
 *                  |                |             |            |              |       |       |   already: reordered)
 *   1              | any            | 0           | 1          | 0            | 1     | any   | SLOT_DUP_PENDING: drop
 *   1              | any            | 0           | 1          | 1            | 1     | any   | SLOT_DUP_UPSTREAM: the stored
 *                  |                |             |            |              |       |       |   partial sum up again
 *   1              | any            | 1           | 1          | any          | 1     | any   | SLOT_DUP_DONE: stored result to w
 *   1              | any            | any         | 0          | any          | 1     | any   | SLOT_BAD_ROUND: drop
 *   after FIRST/ADD: set bit w in bitmap[s], clear it in bitmap[o]; when seen == N the round
 *   leaves: multicast, or up to the parent with an uplink (UpstreamSend). Every packet that
 *   leaves carries the set's round tag.
 *
 * A RESULT from the parent (meta.from_parent, admitted by JobAdmission) is decided apart:
 *
 *   (another round tag than the set's: drop DROP_STALE_ROUND, an older round's result)
 *   same_round | complete | sent_up | action
 *   -----------+----------+---------+-----------------------------------------------------------
 *   0          | any      | any     | drop DROP_BAD_ROUND
 *   1          | 1        | any     | meta.dup_result: a duplicate, dropped
 *   1          | 0        | 1       | store it (seen = N + 1; its exponent, its flags less
 *              |          |         | RETRANSMIT and FROM_SWITCH; ValueAggregation its values),
 *              |          |         | multicast to the children
 *   1          | 0        | 0       | drop DROP_STALE_ROUND: no round here waits for it
 *
 * BAD_ROUND keeps a round's result what its first contribution announced: a packet claiming
 * other values (offset) or another length (count) never joins it, nor gets its result.
 *
 * FIRST is safe: a worker starts round r+2 of a slot only after round r+1's result, which
 * needs every worker's round r+1, and each of those cleared the worker's bit in set s; in a
 * tree, level by level. Only the set's next round tag opens it: a copy of round r delayed past
 * round r+1 finds set s empty with round r's own tag, and is stale. A reset slot holds no tag
 * in either set (ROUND_UNSET): each set's first opener sets it, rounds 0 and 1 normally, and after
 * a switch lost its slot state the rounds its workers are at (a copy that was late across that
 * loss could open a set once: docs/protocol.md).
 */
#ifndef _INAGG_SLOT_STATE_P4_
#define _INAGG_SLOT_STATE_P4_

#include <core.p4>
#include <v1model.p4>
#include "types.p4"

/* A reset set's round tag: none yet (tags are 0..ROUND_TAGS - 1). */
const bit<8> ROUND_UNSET = ROUND_TAGS;

control SlotState(inout headers_t hdr, inout metadata_t meta) {
    register<bit<32>>(INAGG_SLOTS)     slot_tag;
    register<bit<32>>(2 * INAGG_SLOTS) slot_bitmap;
    register<bit<8>>(2 * INAGG_SLOTS)  slot_seen;
    register<bit<8>>(2 * INAGG_SLOTS)  slot_exp;
    register<bit<8>>(2 * INAGG_SLOTS)  slot_flags;
    register<bit<32>>(2 * INAGG_SLOTS) slot_offset;
    register<bit<16>>(2 * INAGG_SLOTS) slot_count;
    register<bit<8>>(2 * INAGG_SLOTS)  slot_round;   /* the round tag of the set's round */

    /* The decision's inputs (the columns of the table above). */
    bit<1> mine = 0;
    bit<1> empty = 0;
    bit<1> complete = 0;
    bit<1> same_round = 0;
    bit<1> sent_up = 0;
    bit<1> this_round = 0;
    bit<1> next_round = 0;

    action set_outcome(bit<3> outcome) {
        meta.outcome = outcome;
    }

    /* The round stored in set idx, for the packet that leaves (result or partial sum). */
    action read_result(bit<32> idx) {
        bit<8> round_tag;
        slot_round.read(round_tag, idx);
        slot_flags.read(meta.res_flags, idx);
        meta.res_flags = meta.res_flags | (round_tag << ROUND_TAG_SHIFT);
        slot_exp.read(meta.res_exp, idx);
        slot_count.read(meta.res_count, idx);
        slot_offset.read(meta.res_offset, idx);
    }

    /* The table above; the entries cover every key, so the default is never taken. */
    table slot_decision {
        key = {
            mine: ternary @name("mine");
            empty: ternary @name("empty");
            complete: ternary @name("complete");
            same_round: ternary @name("same_round");
            sent_up: ternary @name("sent_up");
            this_round: ternary @name("this_round");
            next_round: ternary @name("next_round");
        }
        actions = { set_outcome; NoAction; }
        const default_action = NoAction();
        size = 13;
        const entries = {
            /* mine, empty, complete, same_round, sent_up, this_round, next_round */
            (_, _, _, _, _, 0, 0): set_outcome(SLOT_STALE_ROUND);
            (0, 1, _, _, _, 0, 1): set_outcome(SLOT_FIRST);
            (0, 0, _, _, _, 0, 1): set_outcome(SLOT_BAD_ROUND);
            (1, _, _, _, _, 0, 1): set_outcome(SLOT_BAD_ROUND);
            (0, 1, _, _, _, 1, _): set_outcome(SLOT_STALE_ROUND);
            (0, 0, 0, 1, 0, 1, _): set_outcome(SLOT_ADD);
            (0, 0, 0, 0, 0, 1, _): set_outcome(SLOT_BAD_ROUND);
            (0, 0, 1, _, _, 1, _): set_outcome(SLOT_STALE_ROUND);
            (0, 0, 0, _, 1, 1, _): set_outcome(SLOT_STALE_ROUND);
            (1, _, 0, 1, 0, 1, _): set_outcome(SLOT_DUP_PENDING);
            (1, _, 0, 1, 1, 1, _): set_outcome(SLOT_DUP_UPSTREAM);
            (1, _, 1, 1, _, 1, _): set_outcome(SLOT_DUP_DONE);
            (1, _, _, 0, _, 1, _): set_outcome(SLOT_BAD_ROUND);
        }
    }

    /* The parent's result into set idx (the second table above). */
    action store_parent_result(bit<32> idx) {
        slot_seen.write(idx, meta.n_workers + 1);
        slot_flags.write(idx, hdr.inagg.flags & ~(FLAG_RETRANSMIT | FLAG_FROM_SWITCH | ROUND_TAG_MASK));
        slot_exp.write(idx, (bit<8>) hdr.inagg.exp);
        meta.send_result = 1;
    }

    apply {
        bit<32> slot = (bit<32>) hdr.inagg.slot;
        bit<32> idx = slot;
        bit<32> other = slot + INAGG_SLOTS;
        if (hdr.inagg.slot_set == 1) {
            idx = slot + INAGG_SLOTS;
            other = slot;
        }
        meta.value_base = idx * (bit<32>) SWITCH_VALUES_PER_PACKET;

        bit<32> tag;
        bit<32> my_tag = ((bit<32>) hdr.inagg.job_id << 16) | (bit<32>) hdr.inagg.epoch;
        slot_tag.read(tag, slot);
        if (tag != my_tag) {                     /* new owner or epoch: reset both sets */
            slot_tag.write(slot, my_tag);
            slot_bitmap.write(slot, 0);
            slot_bitmap.write(slot + INAGG_SLOTS, 0);
            slot_seen.write(slot, 0);
            slot_seen.write(slot + INAGG_SLOTS, 0);
            slot_round.write(slot, ROUND_UNSET);     /* its first opener's tag is its next */
            slot_round.write(slot + INAGG_SLOTS, ROUND_UNSET);
        }

        bit<32> bitmap;
        bit<8> seen;
        slot_bitmap.read(bitmap, idx);
        slot_seen.read(seen, idx);
        bit<32> me = (bit<32>) 1 << hdr.inagg.worker_id;
        bit<32> round_offset;
        bit<16> round_count;
        slot_offset.read(round_offset, idx);
        slot_count.read(round_count, idx);
        if ((bitmap & me) != 0) {
            mine = 1;
        }
        if (bitmap == 0) {
            empty = 1;
        }
        if (seen == meta.n_workers + (bit<8>) meta.has_uplink) {
            complete = 1;
        }
        if (meta.has_uplink == 1 && seen == meta.n_workers) {
            sent_up = 1;
        }
        if (round_offset == hdr.inagg.offset && round_count == hdr.inagg.count) {
            same_round = 1;
        }
        bit<8> stored_round;
        slot_round.read(stored_round, idx);
        bit<8> round_in = (hdr.inagg.flags & ROUND_TAG_MASK) >> ROUND_TAG_SHIFT;
        if (round_in == stored_round) {
            this_round = 1;
        }
        if (stored_round == ROUND_UNSET || round_in == ((stored_round + 1) & (ROUND_TAGS - 1))) {
            next_round = 1;
        }
        meta.send_result = 0;
        meta.send_up = 0;
        if (meta.from_parent == 1) {
            if (this_round == 0) {
                meta.verdict = VERDICT_DROP;
                meta.drop_reason = DROP_STALE_ROUND;
            } else if (same_round == 0) {
                meta.verdict = VERDICT_DROP;
                meta.drop_reason = DROP_BAD_ROUND;
            } else if (complete == 1) {
                meta.dup_result = 1;
            } else if (sent_up == 1) {
                store_parent_result(idx);
                read_result(idx);
            } else {
                meta.verdict = VERDICT_DROP;
                meta.drop_reason = DROP_STALE_ROUND;
            }
            return;
        }
        slot_decision.apply();

        bit<8> flags = 0;
        bit<8> exp = 0;
        if (meta.outcome == SLOT_FIRST) {
            seen = 1;
            flags = hdr.inagg.flags & (FLAG_OVERFLOW | FLAG_CONGESTION);
            exp = (bit<8>) hdr.inagg.exp;
            slot_offset.write(idx, hdr.inagg.offset);
            slot_count.write(idx, hdr.inagg.count);
            slot_round.write(idx, round_in);
        } else if (meta.outcome == SLOT_ADD) {
            seen = seen + 1;
            slot_flags.read(flags, idx);
            flags = flags | (hdr.inagg.flags & (FLAG_OVERFLOW | FLAG_CONGESTION));
            slot_exp.read(exp, idx);
            if ((int<8>) exp < hdr.inagg.exp) {
                exp = (bit<8>) hdr.inagg.exp;
            }
        }
        if (meta.outcome == SLOT_FIRST || meta.outcome == SLOT_ADD) {
            slot_seen.write(idx, seen);
            slot_flags.write(idx, flags);
            slot_exp.write(idx, exp);
            slot_bitmap.write(idx, bitmap | me);
            bit<32> other_bitmap;
            slot_bitmap.read(other_bitmap, other);
            slot_bitmap.write(other, other_bitmap & ~me);
        }

        bool round_done = (meta.outcome == SLOT_FIRST || meta.outcome == SLOT_ADD)
                          && seen == meta.n_workers;
        if (meta.outcome == SLOT_DUP_DONE || meta.outcome == SLOT_DUP_UPSTREAM || round_done) {
            meta.send_result = 1;
            read_result(idx);
        }
        if (meta.outcome == SLOT_DUP_UPSTREAM || (round_done && meta.has_uplink == 1)) {
            meta.send_up = 1;
        }
        if (meta.outcome == SLOT_STALE_ROUND) {
            meta.verdict = VERDICT_DROP;
            meta.drop_reason = DROP_STALE_ROUND;
        } else if (meta.outcome == SLOT_BAD_ROUND) {
            meta.verdict = VERDICT_DROP;
            meta.drop_reason = DROP_BAD_ROUND;
        }
    }
}

#endif /* _INAGG_SLOT_STATE_P4_ */

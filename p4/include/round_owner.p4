/* RoundOwner: the owner of each (slot, set)'s round in a reduce-scatter (docs/protocol.md,
 * "Reduce-scatter"), beside SlotState, and the owner a leaving result is for.
 *
 * A worker marks its contribution to a block wholly in its shard with FLAG_MINE. Register
 * slot_owner per (slot, set): OWNER_NONE, OWNER_SHARED, or the owner's replica (its rank + 1).
 * A contribution that joins a round (SLOT_FIRST or SLOT_ADD) updates it by the const entries of
 * table owner_decision, row for row (inagg.hostlib.wire.protocol.OWNER_DECISION is the Python
 * twin; tests/test_owner_decision.py holds it to these entries and the reference engine, and its
 * C++ twin, to each row):
 *
 *   first:       | from_switch:      | marked:     | owned:             | update
 *   SLOT_FIRST   | FLAG_FROM_SWITCH  | FLAG_MINE   | slot_owner != NONE |
 *   -------------+-------------------+-------------+--------------------+-----------------------
 *   any          | 1                 | any         | any                | OWNER_SHARED (a child
 *                |                   |             |                    |   switch's sum: its members all need the values)
 *   1            | 0                 | 1           | any                | the sender
 *   1            | 0                 | 0           | any                | OWNER_NONE
 *   0            | 0                 | 1           | 0                  | the sender
 *   0            | 0                 | 1           | 1                  | OWNER_SHARED (a second mark)
 *   0            | 0                 | 0           | any                | kept
 *
 * FIRST overwrites whatever the set's previous round left, so nothing else resets the register.
 * A packet that leaves as a result (meta.send_result: the round completed, a DUP_DONE answer, the
 * parent's result in a tree) takes the set's owner into meta.res_owner (0 when it has none or it
 * is shared); ResultElision (egress) sends every other replica the header alone. A partial sum
 * sent up never carries FLAG_MINE (its flags are the slot's sticky ones): the parent sends every
 * child switch the values.
 */
#ifndef _INAGG_ROUND_OWNER_P4_
#define _INAGG_ROUND_OWNER_P4_

#include <core.p4>
#include <v1model.p4>
#include "types.p4"

/* On a contribution (FROM_HOST's bit, which only results carry): the block is wholly in the
 * sender's shard. The wire's twin is inagg.hostlib.wire.protocol.FLAG_MINE; it lives here, not
 * in constants.p4, as only this program reads it. */
const bit<8> FLAG_MINE = 0x02;

/* slot_owner's values besides a replica (1..32). */
const bit<8> OWNER_NONE   = 0;
const bit<8> OWNER_SHARED = 0xFF;

/* owner_decision's updates (inagg.hostlib.wire.protocol.OwnerUpdate). */
const bit<2> OWNER_KEEP       = 0;
const bit<2> OWNER_SET_NONE   = 1;
const bit<2> OWNER_SET_SENDER = 2;
const bit<2> OWNER_SET_SHARED = 3;

control RoundOwner(inout headers_t hdr, inout metadata_t meta) {
    register<bit<8>>(2 * INAGG_SLOTS) slot_owner;

    /* The decision's inputs (the columns of the table above) and its update. */
    bit<1> first = 0;
    bit<1> from_switch = 0;
    bit<1> marked = 0;
    bit<1> owned = 0;
    bit<2> update = OWNER_KEEP;

    action set_owner_update(bit<2> owner_update) {
        update = owner_update;
    }

    /* The table above; the entries cover every key, so the default is never taken. */
    table owner_decision {
        key = {
            first: ternary @name("first");
            from_switch: ternary @name("from_switch");
            marked: ternary @name("marked");
            owned: ternary @name("owned");
        }
        actions = { set_owner_update; NoAction; }
        const default_action = NoAction();
        size = 6;
        const entries = {
            /* first, from_switch, marked, owned */
            (_, 1, _, _): set_owner_update(OWNER_SET_SHARED);
            (1, 0, 1, _): set_owner_update(OWNER_SET_SENDER);
            (1, 0, 0, _): set_owner_update(OWNER_SET_NONE);
            (0, 0, 1, 0): set_owner_update(OWNER_SET_SENDER);
            (0, 0, 1, 1): set_owner_update(OWNER_SET_SHARED);
            (0, 0, 0, _): set_owner_update(OWNER_KEEP);
        }
    }

    apply {
        bit<32> idx = (bit<32>) hdr.inagg.slot;
        if (hdr.inagg.slot_set == 1) {
            idx = idx + INAGG_SLOTS;
        }
        bit<8> owner;
        slot_owner.read(owner, idx);
        if (meta.from_parent == 0 && (meta.outcome == SLOT_FIRST || meta.outcome == SLOT_ADD)) {
            if (meta.outcome == SLOT_FIRST) {
                first = 1;
            }
            if ((hdr.inagg.flags & FLAG_FROM_SWITCH) != 0) {
                from_switch = 1;
            }
            if ((hdr.inagg.flags & FLAG_MINE) != 0) {
                marked = 1;
            }
            if (owner != OWNER_NONE) {
                owned = 1;
            }
            owner_decision.apply();
            if (update == OWNER_SET_NONE) {
                owner = OWNER_NONE;
            } else if (update == OWNER_SET_SENDER) {
                owner = hdr.inagg.worker_id + 1;
            } else if (update == OWNER_SET_SHARED) {
                owner = OWNER_SHARED;
            }
            slot_owner.write(idx, owner);
        }
        meta.res_owner = 0;
        if (meta.send_result == 1 && owner != OWNER_SHARED) {
            meta.res_owner = owner;
        }
    }
}

#endif /* _INAGG_ROUND_OWNER_P4_ */

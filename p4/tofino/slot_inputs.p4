/* SlotInputs (Tofino): what SlotState's registers take from the packet, computed in the first
 * stage beside job admission (it depends on nothing else), so the slot registers can start as
 * soon as admission has decided.
 *
 *   meta field | from
 *   -----------+---------------------------------------------------------------
 *   me         | worker_mask: 1 << worker_id (Tofino cannot shift by a variable)
 *   slot, idx  | the header's slot (low TOFINO_SLOT_BITS bits), set ++ slot
 *   tag        | job_id ++ epoch: the slot owner tag
 *   exp_biased | exponent ^ 0x80 (signed order as unsigned, for the max)
 *   flags_in   | the sticky flags the packet brings (overflow, congestion) and its round tag
 *   count_gap  | K - count (its borrow bit: count > K, for JobAdmission's checks)
 *   owner_in   | Tofino 2, owner_input: the reduce-scatter owner the packet brings (below)
 */
#ifndef _INAGG_TOFINO_SLOT_INPUTS_P4_
#define _INAGG_TOFINO_SLOT_INPUTS_P4_

#include "types.p4"

control SlotInputs(in tofino_headers_t hdr, inout tofino_ingress_md_t meta,
                   in ingress_intrinsic_metadata_t ig_intr_md) {
    /* me = 1 << worker_id (Tofino has no shift by a variable amount). */
    action set_me(bit<32> me) {
        meta.me = me;
    }
#if __TARGET_TOFINO__ == 2
#define ME_KEYS    hdr.inagg.worker_id: exact;
#define ME_ROW(w)  w: set_me(1 << w);
#define ME_SIZE    32
#else
    /* Tofino 1: a DUP_DONE answer's harvest pass gets me = 0, so that its owner check,
     * map<s>_undo (slot_claim.p4: answer_set0/1), takes no bit out: it only answers whether
     * the slot's owner is still the packet's. Told by what the pass parsed, so that no stage
     * waits: a second pass comes on a recirculation or loopback port (a first pass never
     * does), and of the second passes only a DUP_DONE answer (HARVEST_ANSWER, _RETIRE, whose
     * retire needs no me) carries FLAG_RETRANSMIT (slot_state.p4: decide sets it; an undo's
     * first pass clears the sender's). (Keyed on the bridged code instead, the table had to
     * come before ingress sets a first pass's bridged header: that try did not assemble.) */
#define ME_KEYS    hdr.inagg.worker_id: ternary; \
                   ig_intr_md.ingress_port[6:0]: ternary @name("port_local"); \
                   hdr.inagg.flags: ternary;
#define ME_ROW(w)  (w, _, _): set_me(1 << w);
#define ME_SIZE    34
#endif
    table worker_mask {
        key = { ME_KEYS }
        actions = { set_me; }
        const default_action = set_me(0);
        size = ME_SIZE;
        const entries = {
#if __TARGET_TOFINO__ != 2
            (_, RECIRC_PORT_LOCAL, FLAG_RETRANSMIT &&& FLAG_RETRANSMIT): set_me(0);
            (_, LOOPBACK_BASE &&& LOOPBACK_MASK, FLAG_RETRANSMIT &&& FLAG_RETRANSMIT): set_me(0);
#endif
            ME_ROW(0)  ME_ROW(1)  ME_ROW(2)  ME_ROW(3)  ME_ROW(4)  ME_ROW(5)  ME_ROW(6)  ME_ROW(7)
            ME_ROW(8)  ME_ROW(9)  ME_ROW(10) ME_ROW(11) ME_ROW(12) ME_ROW(13) ME_ROW(14) ME_ROW(15)
            ME_ROW(16) ME_ROW(17) ME_ROW(18) ME_ROW(19) ME_ROW(20) ME_ROW(21) ME_ROW(22) ME_ROW(23)
            ME_ROW(24) ME_ROW(25) ME_ROW(26) ME_ROW(27) ME_ROW(28) ME_ROW(29) ME_ROW(30) ME_ROW(31)
        }
    }
#undef ME_KEYS
#undef ME_ROW
#undef ME_SIZE

    /* The packet's slot, index, owner tag and register inputs, in one action. */
    action prepare() {
        meta.slot = hdr.inagg.slot[TOFINO_SLOT_BITS - 1:0];
        meta.idx = hdr.inagg.slot_set ++ hdr.inagg.slot[TOFINO_SLOT_BITS - 1:0];
        meta.tag = hdr.inagg.job_id ++ hdr.inagg.epoch;
        meta.exp_biased = (bit<8>) hdr.inagg.exp ^ 8w0x80;
        meta.flags_in = hdr.inagg.flags & (FLAG_OVERFLOW | FLAG_CONGESTION | ROUND_TAG_MASK);
        meta.count_gap = TOFINO_VALUES_PER_PACKET - hdr.inagg.count;
    }

    /* The round check (round_record.p4): the packet's round tag in round_in (tag << 5: a byte,
     * in which the next tag is round_in + TAG_STEP with the wrap of ROUND_TAGS), and in bits
     * 29-31 of count32 beside the count (the round record keeps both, so only a packet of its
     * own tag's round matches it); one row per tag (an action cannot shift a slice and OR it
     * in at once). */
    action round_tags(bit<16> tag_high, bit<8> tag_byte) {
        meta.round_in = tag_byte;
        meta.count32[15:0] = hdr.inagg.count;   /* in halves: an OR would tie count32's */
        meta.count32[31:16] = tag_high;          /* container to count's (PHV, docs/tofino.md) */
    }
#define TAG_ROW(t) t: round_tags(16w0 + t << 13, 8w0 + t << 5);
    table round_tag_of {
        key = { hdr.inagg.flags[6:4]: exact @name("round_tag"); }
        actions = { round_tags; }
        const default_action = round_tags(0, 0);   /* never taken: a row per tag */
        size = 8;
        const entries = { TAG_ROW(0) TAG_ROW(1) TAG_ROW(2) TAG_ROW(3) TAG_ROW(4) TAG_ROW(5)
                          TAG_ROW(6) TAG_ROW(7) }
    }
#undef TAG_ROW

#if __TARGET_TOFINO__ == 2
    /* The owner a contribution brings to its round (slot_state.p4's round_owner: FIRST stores
     * it, ADD marks the round with it): a child switch's sum (FLAG_FROM_SWITCH) makes the round
     * shared, FLAG_MINE its sender's replica, else none. The from_switch and marked columns of
     * p4/include/round_owner.p4's owner_decision (inagg.hostlib.wire.protocol.OWNER_DECISION);
     * its first and owned columns are the register's (owner_first, owner_add). */
    action bring_owner(bit<8> owner) {
        meta.owner_in = owner;
    }
    action bring_sender() {
        meta.owner_in = hdr.inagg.worker_id + 1;
    }
    table owner_input {
        key = {
            hdr.inagg.flags: ternary;
        }
        actions = { bring_owner; bring_sender; }
        const default_action = bring_owner(OWNER_NONE);
        size = 2;
        const entries = {
            FLAG_FROM_SWITCH &&& FLAG_FROM_SWITCH: bring_owner(OWNER_SHARED);
            FLAG_MINE &&& FLAG_MINE: bring_sender();
        }
    }
#endif

    apply {
        worker_mask.apply();
        prepare();
        round_tag_of.apply();
#if __TARGET_TOFINO__ == 2
        owner_input.apply();
#endif
    }
}

#endif /* _INAGG_TOFINO_SLOT_INPUTS_P4_ */

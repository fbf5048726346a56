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
 */
#ifndef _INAGG_TOFINO_SLOT_INPUTS_P4_
#define _INAGG_TOFINO_SLOT_INPUTS_P4_

#include "types.p4"

control SlotInputs(in tofino_headers_t hdr, inout tofino_ingress_md_t meta) {
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
#if __TARGET_TOFINO__ != 2
        meta.count32 = (bit<32>) hdr.inagg.count;
#endif
        meta.exp_biased = (bit<8>) hdr.inagg.exp ^ 8w0x80;
        meta.flags_in = hdr.inagg.flags & (FLAG_OVERFLOW | FLAG_CONGESTION | ROUND_TAG_MASK);
        meta.count_gap = TOFINO_VALUES_PER_PACKET - hdr.inagg.count;
    }

#if __TARGET_TOFINO__ == 2
    /* Tofino 2 (round identity, round_record.p4): the packet's round tag in bits 29-31, where
     * the tag after t is t + 1 << 29 with the wrap of ROUND_TAGS, and beside the count (the
     * round record keeps both, so only a packet of its own tag's round matches it); one row per
     * tag (an action cannot shift a slice and OR it in at once). */
    action round_tags(bit<32> tag) {
        meta.round_in = tag;
        meta.count32 = (bit<32>) hdr.inagg.count | tag;
    }
#define TAG_ROW(t) t: round_tags(32w0 + t << 29);
    table round_tag_of {
        key = { hdr.inagg.flags[6:4]: exact @name("round_tag"); }
        actions = { round_tags; }
        const default_action = round_tags(0);   /* never taken: a row per tag */
        size = 8;
        const entries = { TAG_ROW(0) TAG_ROW(1) TAG_ROW(2) TAG_ROW(3) TAG_ROW(4) TAG_ROW(5)
                          TAG_ROW(6) TAG_ROW(7) }
    }
#undef TAG_ROW
#endif

    apply {
        worker_mask.apply();
        prepare();
#if __TARGET_TOFINO__ == 2
        round_tag_of.apply();
#endif
    }
}

#endif /* _INAGG_TOFINO_SLOT_INPUTS_P4_ */

/* SlotClaim (Tofino): JobAdmission's checks, and in the same stage what an admitted
 * contribution first does to its slot: claim it for its (job, epoch) and join the set's
 * contributor map. One table does both because only a table's own action can reach a register
 * in the stage where the table decides: the maps are touched by a packet that passed every
 * check, one stage after the lookups (JobAdmission), so that the round logic (slot_state.p4)
 * and the 32 lane pairs (value_lanes.p4) fit the 12 stages.
 *
 * The checks, in the order of p4/include/job_admission.p4, first failing one wins:
 *   second pass (result_replication)  -> retire the other set (HARVEST_RESULT, _ANSWER_RETIRE),
 *                                        or take the sender's bit out of its set (HARVEST_UNDO)
 *   not inagg (parser's encap is 0)   -> forward
 *   parser error before the header   -> drop GLOBAL_DROP_TRUNCATED
 *   version != INAGG_VERSION          -> drop GLOBAL_DROP_BAD_VERSION
 *   job not in job_table              -> forward
 *   encapsulation is not the job's    -> drop DROP_BAD_ENCAP (only UDP is parsed here)
 *   msg_type != MSG_CONTRIBUTION      -> drop DROP_BAD_TYPE
 *   rank not bound to this sender     -> drop DROP_BAD_WORKER (port, IPv4, MAC, UDP port)
 *   epoch != the job's epoch          -> drop DROP_STALE_EPOCH
 *   slot outside [base, base + count) -> drop DROP_BAD_SLOT
 *   payload not 0 or K values         -> drop DROP_BAD_LENGTH
 *   otherwise                         -> aggregate: claim the slot, join set s's map
 *
 * Registers (index: the slot), one per set, both reached by every aggregated packet:
 *
 *   register | word         | set s's packet (join)          | the other set's (peek)
 *   ---------+--------------+--------------------------------+-----------------------------
 *   map0     | tag, W0      | tag differs (another job or epoch): tag = this one's, map =
 *   map1     | tag, W1      |   me (join) or 0 (peek), returns 0: the slot starts afresh
 *            |              | else returns W_s, W_s |= me     | else returns W_o
 *   second pass: retire (W = 0) or undo (W &= ~me), where the tag is still the packet's;
 *            each returns whether it was (retired0, retired1; Tofino 1's answer: owned0, owned1)
 *
 * W_s is the set's current round's contributors; a worker's bit is never cleared when it moves
 * on: a completed round's harvest pass retires the OTHER set (W_o = 0, its round is over: every
 * worker sent this round after receiving that one's result), so a worker's bit in W_o says
 * it went on to the next round (slot_state.p4's STALE). A second pass (result_replication.p4)
 * is recognised by the recirculation port and the bridged header; only the packet's own first
 * pass sends it, so it is never checked again.
 */
#ifndef _INAGG_TOFINO_SLOT_CLAIM_P4_
#define _INAGG_TOFINO_SLOT_CLAIM_P4_

#include "types.p4"

/* The UDP length of a header-only packet and of one with K values. */
const bit<16> UDP_LENGTH_PRIMING = 8 + (bit<16>) INAGG_HEADER_BYTES;
const bit<16> UDP_LENGTH_VALUES  = UDP_LENGTH_PRIMING + 4 * TOFINO_VALUES_PER_PACKET;

/* The checks as ternary patterns over the keys of table checks (0 = equal): PASS_n matches
 * when the first n checks pass (a first pass, n keys); the entries pad them with wildcards
 * and end with the set. */
#define WORKER_OK  1, 0 &&& 0xE0, 0 &&& 0xC0, 0 &&& 0x80, 0, 0, 0, 0
#define PASS_1     true, HARVEST_NONE
#define PASS_2     PASS_1, INAGG_VERSION
#define PASS_3     PASS_2, 1
#define PASS_4     PASS_3, 0
#define PASS_5     PASS_4, MSG_CONTRIBUTION
#define PASS_13    PASS_5, WORKER_OK
#define PASS_14    PASS_13, 0
/* slot_lead == 0 or negative, slot_room not negative (the entries before "aggregate" catch
 * slot_room == 0, as the first catches rank_room == 0) */
#define PASS_16    PASS_14, 0, 0 &&& 0x8000
#define PASS_16N   PASS_14, 0x8000 &&& 0x8000, 0 &&& 0x8000
#define PASS_18    PASS_16, 0, 0
#define PASS_18N   PASS_16N, 0, 0
#define ANY_SET    _

#define MAP_ACTIONS(REG)                                                                     \
    RegisterAction<owner_map_t, slot_t, bit<32>>(REG) REG##_join = {                        \
        void apply(inout owner_map_t value, out bit<32> old) {                              \
            if (value.tag != meta.tag) {                                                    \
                value.tag = meta.tag;                                                       \
                value.map = meta.me;                                                        \
                old = 0;                                                                    \
            } else {                                                                        \
                old = value.map;                                                            \
                value.map = value.map | meta.me;                                            \
            }                                                                               \
        }                                                                                   \
    };                                                                                      \
    RegisterAction<owner_map_t, slot_t, bit<32>>(REG) REG##_peek = {                        \
        void apply(inout owner_map_t value, out bit<32> old) {                              \
            if (value.tag != meta.tag) {                                                    \
                value.tag = meta.tag;                                                       \
                value.map = 0;                                                              \
                old = 0;                                                                    \
            } else {                                                                        \
                old = value.map;                                                            \
            }                                                                               \
        }                                                                                   \
    };                                                                                      \
    RegisterAction<owner_map_t, slot_t, bit<1>>(REG) REG##_retire = {                       \
        void apply(inout owner_map_t value, out bit<1> owned) {                             \
            if (value.tag == meta.tag) {                                                    \
                value.map = 0;                                                              \
                owned = 1;                                                                  \
            } else {                                                                        \
                owned = 0;                                                                  \
            }                                                                               \
        }                                                                                   \
    };                                                                                      \
    RegisterAction<owner_map_t, slot_t, bit<1>>(REG) REG##_undo = {                         \
        void apply(inout owner_map_t value, out bit<1> owned) {                             \
            if (value.tag == meta.tag) {                                                    \
                value.map = value.map & ~meta.me;                                           \
                owned = 1;                                                                  \
            } else {                                                                        \
                owned = 0;                                                                  \
            }                                                                               \
        }                                                                                   \
    };

/* The rows of checks up to its last "aggregate" row: the second pass (RETIRE0: a result of
 * set 0, whose other set retires; RETIRE1 of set 1; UNDO0: a dropped packet of set 0 whose
 * sender's bit leaves set 0; UNDO1), then the aggregate rows with every row before them that
 * takes a packet they would match (REFUSE(reason): what such a row does), so that checks_map1
 * decides as checks does. */
#define SECOND_PASS(CODE, SET) (true, CODE, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, SET)
#define CLAIM_ROWS(RETIRE0, RETIRE1, UNDO0, UNDO1, ANSWER0, ANSWER1, AGGREGATE0, AGGREGATE1, REFUSE) \
    SECOND_PASS(HARVEST_RESULT, 0): RETIRE0();                                                  \
    SECOND_PASS(HARVEST_RESULT, 1): RETIRE1();                                                  \
    SECOND_PASS(HARVEST_ANSWER_RETIRE, 0): RETIRE0();                                           \
    SECOND_PASS(HARVEST_ANSWER_RETIRE, 1): RETIRE1();                                           \
    SECOND_PASS(HARVEST_UNDO, 0): UNDO0();                                                      \
    SECOND_PASS(HARVEST_UNDO, 1): UNDO1();                                                      \
    SECOND_PASS(HARVEST_ANSWER, 0): ANSWER0();                                                  \
    SECOND_PASS(HARVEST_ANSWER, 1): ANSWER1();                                                  \
    (PASS_5, _, _, _, 0, _, _, _, _, _, _, _, _, _, _, _, ANY_SET): REFUSE(DROP_BAD_WORKER);    \
    (PASS_14, 0, 0, _, _, _, _, ANY_SET): REFUSE(DROP_BAD_SLOT);          /* slot_room == 0 */  \
    (PASS_14, 0x8000 &&& 0x8000, 0, _, _, _, _, ANY_SET): REFUSE(DROP_BAD_SLOT);                \
    (PASS_18, 0, UDP_LENGTH_PRIMING, 0): AGGREGATE0();                                          \
    (PASS_18, 0, UDP_LENGTH_PRIMING, 1): AGGREGATE1();                                          \
    (PASS_18N, 0, UDP_LENGTH_PRIMING, 0): AGGREGATE0();                                         \
    (PASS_18N, 0, UDP_LENGTH_PRIMING, 1): AGGREGATE1();                                         \
    (PASS_18, 0, _, ANY_SET): REFUSE(DROP_BAD_LENGTH);                                          \
    (PASS_18N, 0, _, ANY_SET): REFUSE(DROP_BAD_LENGTH);                                         \
    (PASS_18, _, UDP_LENGTH_VALUES, 0): AGGREGATE0();                                           \
    (PASS_18, _, UDP_LENGTH_VALUES, 1): AGGREGATE1();                                           \
    (PASS_18N, _, UDP_LENGTH_VALUES, 0): AGGREGATE0();                                          \
    (PASS_18N, _, UDP_LENGTH_VALUES, 1): AGGREGATE1();
#define REFUSED(reason) refuse(reason)
#define SKIPPED(reason) NoAction()

/* The keys of both tables (0 = equal; rank_room and slot_room: bit 7 / 15 is the sign). */
#define CHECK_KEYS                                                                          \
    key = {                                                                                 \
        hdr.inagg.isValid(): exact @name("has_header");                                    \
        hdr.bridged.harvest: ternary @name("harvest");                                     \
        hdr.inagg.version: ternary;                                                         \
        meta.admitted: ternary;                                                             \
        meta.encap_diff: ternary;                                                           \
        hdr.inagg.msg_type: ternary;                                                        \
        meta.bound: ternary;                                                                \
        hdr.inagg.worker_id: ternary;                                                       \
        meta.n_workers: ternary;                                                            \
        meta.rank_room: ternary;                                                            \
        meta.port_diff: ternary;                                                            \
        meta.addr_diff: ternary;                                                            \
        meta.mac_diff: ternary;                                                             \
        meta.udp_port_diff: ternary;                                                        \
        meta.epoch_diff: ternary;                                                           \
        meta.slot_lead: ternary;                                                            \
        meta.slot_room: ternary;                                                            \
        ig_prsr_md.parser_err: ternary;                                                     \
        meta.count_gap[15:15]: ternary @name("count_above");                               \
        hdr.inagg.count: ternary;                                                           \
        hdr.udp.length: ternary;                                                            \
        hdr.inagg.slot_set: ternary @name("slot_set");                                     \
    }

#if __TARGET_TOFINO__ != 2
/* Tofino 1: the map ALUs' 1-bit outputs (retire's retired0/retired1, answer_set0/1's
 * owned0/owned1) each in a 32-bit container: bf-p4c left them in 8-bit ones once owned came,
 * and its assembler failed ("action bus slice (0..31) can't fit in a single slot for 8 bit
 * access"; before, retired0 and retired1 happened to get 32-bit ones). One field per table,
 * as retired0/retired1: a field both tables write puts checks_map1 a stage after checks
 * (bf-p4c then needed 16 stages). */
@pa_container_size("ingress", "meta.owned0", 32)
@pa_container_size("ingress", "meta.owned1", 32)
@pa_container_size("ingress", "meta.retired0", 32)
@pa_container_size("ingress", "meta.retired1", 32)
#endif
control SlotClaim(inout tofino_headers_t hdr, inout tofino_ingress_md_t meta,
                  in ingress_intrinsic_metadata_from_parser_t ig_prsr_md) {
    Register<owner_map_t, slot_t>(TOFINO_SLOTS) map0;
    Register<owner_map_t, slot_t>(TOFINO_SLOTS) map1;
    MAP_ACTIONS(map0)
    MAP_ACTIONS(map1)

    /* checks: the verdict and map0's part (a table reaches one stateful ALU). aggregate: the
     * packet joins set s, and sees the other set's map. */
    action aggregate_set0() {
        meta.verdict = VERDICT_AGGREGATE;
        meta.n_last = meta.n_workers - 1;
        meta.old_map0 = map0_join.execute(meta.slot);
    }
    action aggregate_set1() {
        meta.verdict = VERDICT_AGGREGATE;
        meta.n_last = meta.n_workers - 1;
        meta.old_map0 = map0_peek.execute(meta.slot);
    }
    /* A second pass; for a set-1 result (HARVEST_RESULT, _ANSWER_RETIRE) set 0's round is
     * over: its map retires (a set-0 result's set 1: checks_map1), and retired0 (retired1)
     * says whether the slot's owner was still the packet's: SlotState marks the round
     * harvested, ResultReplication sends it, only then; HARVEST_UNDO of set 0: the sender's
     * bit leaves set 0's map. */
    action harvest() {
        meta.verdict = VERDICT_HARVEST;
    }
    action retire_set0() {
        meta.verdict = VERDICT_HARVEST;
        meta.retired0 = map0_retire.execute(meta.slot);
    }
    action undo_set0() {
        meta.verdict = VERDICT_HARVEST;
        map0_undo.execute(meta.slot);
    }
#if __TARGET_TOFINO__ != 2
    /* Tofino 1's DUP_DONE answer of set 0 (HARVEST_ANSWER): its harvest pass reads the second
     * half of the lanes, which are the next owner's if the job was torn down meanwhile; undo
     * with me = 0 (slot_inputs.p4) changes no bit and answers whether the owner is still the
     * packet's (owned0; set 1's: owned1): only then is the answer sent (result_replication.p4). */
    action answer_set0() {
        meta.verdict = VERDICT_HARVEST;
        meta.owned0 = map0_undo.execute(meta.slot);
    }
#define ANSWER_SET0 answer_set0
#define ANSWER_SET1 answer_set1
#else
#define ANSWER_SET0 harvest
#define ANSWER_SET1 NoAction
#endif
    /* (Named apart from Forwarding's forward/drop: the controller finds actions by short name.) */
    action pass_on() {
        meta.verdict = VERDICT_FORWARD;
    }
    /* A GLOBAL_DROP_* reason when meta.admitted is 0, the job's DROP_* reason when 1. */
    action refuse(bit<8> reason) {
        meta.verdict = VERDICT_DROP;
        meta.drop_reason = reason;
    }

    /* The checks of the table above, first failing one wins: the second pass first, then
     * "aggregate" when all pass, then one entry per check, latest first, each matching when
     * every earlier check passes (so the check it names is the first that fails). */
    table checks {
        CHECK_KEYS
        actions = { aggregate_set0; aggregate_set1; harvest; retire_set0; undo_set0;
#if __TARGET_TOFINO__ != 2
                    answer_set0;
#endif
                    pass_on; refuse; }
        const default_action = pass_on();
        size = 48;
        const entries = {
            CLAIM_ROWS(harvest, retire_set0, undo_set0, harvest, ANSWER_SET0, harvest,
                       aggregate_set0, aggregate_set1, REFUSED)
            (PASS_16, _, _, _, _, ANY_SET): refuse(DROP_BAD_LENGTH);
            (PASS_16N, _, _, _, _, ANY_SET): refuse(DROP_BAD_LENGTH);
            (PASS_14, _, _, _, _, _, _, ANY_SET): refuse(DROP_BAD_SLOT);
            (PASS_13, _, _, _, _, _, _, _, ANY_SET): refuse(DROP_STALE_EPOCH);
            (PASS_5, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, ANY_SET): refuse(DROP_BAD_WORKER);
            (PASS_4, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, ANY_SET): refuse(DROP_BAD_TYPE);
            (PASS_3, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, ANY_SET): refuse(DROP_BAD_ENCAP);
            (PASS_2, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, ANY_SET): pass_on();  /* not admitted */
            (PASS_1, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, ANY_SET): refuse(GLOBAL_DROP_BAD_VERSION);
            (false, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, ANY_SET): refuse(GLOBAL_DROP_TRUNCATED);
        }
    }

    /* map1's part of the same decision: the same keys and rows up to the last aggregate one. */
    action join_set1() { meta.old_map1 = map1_join.execute(meta.slot); }
    action peek_set0() { meta.old_map1 = map1_peek.execute(meta.slot); }
    action retire_set1() { meta.retired1 = map1_retire.execute(meta.slot); }
    action undo_set1() { map1_undo.execute(meta.slot); }
#if __TARGET_TOFINO__ != 2
    action answer_set1() { meta.owned1 = map1_undo.execute(meta.slot); }
#endif
    table checks_map1 {
        CHECK_KEYS
        actions = { join_set1; peek_set0; retire_set1; undo_set1;
#if __TARGET_TOFINO__ != 2
                    answer_set1;
#endif
                    NoAction; }
        const default_action = NoAction();
        size = 24;
        const entries = {
            CLAIM_ROWS(retire_set1, NoAction, NoAction, undo_set1, NoAction, ANSWER_SET1,
                       peek_set0, join_set1, SKIPPED)
        }
    }

    apply {
        if (meta.encap != 0) {
            checks.apply();
            checks_map1.apply();
        }
    }
}

#endif /* _INAGG_TOFINO_SLOT_CLAIM_P4_ */

/* inagg for Tofino: the types the controls share, in one file (headers, bridged header,
 * metadata, and the codes of their fields). Sizes are in size.p4.
 *
 * The wire format (inagg_h, inagg_value_h, the standard headers) and its constants come from
 * the shared p4/include/headers.p4 and constants.p4, so the BMv2 and Tofino programs cannot
 * drift apart; tests/test_tofino_program.py also checks that nothing here redefines them.
 */
#ifndef _INAGG_TOFINO_TYPES_P4_
#define _INAGG_TOFINO_TYPES_P4_

#include "size.p4"
#include "../include/headers.p4"

typedef bit<(TOFINO_SLOT_BITS + 1)> slot_index_t;   /* set ++ slot */
typedef bit<TOFINO_SLOT_BITS>       slot_t;

/* What ingress hands to egress in front of the Ethernet header (egress has no ingress port
 * and no view of ingress metadata on Tofino), and what the first pass of a result hands to
 * second pass (slot_claim.p4): the recirculated packet starts with this header. */
header bridged_h {
    bit<7>   owner;          /* Tofino 2: a result's reduce-scatter owner, the replica (rank +
                                1) alone that gets its values; 0 (none) or OWNER_SHARED's low 7
                                bits: every replica does (slot_state.p4: round_owner). Tofino 1
                                keeps no owner: never written there, a pad */
    PortId_t ingress_port;   /* the contribution's ingress port (kept by the harvest pass) */
    bit<8>   replica;        /* unicast DUP_DONE answer: the sender's rank + 1; else 0 */
    bit<4>   pad1;
    bit<3>   harvest;        /* HARVEST_*: what the second pass does with this packet; not
                                NONE: a result (or undo) make_result built, whose parsers
                                (second pass, egress) take its headers on this code, not on
                                the UDP port make_result swapped away (parser.p4) */
    bit<1>   flooded;        /* L2 flood: egress prunes the ingress port */
}

/* bridged.harvest: 0 on a packet's first pass; SlotState's decision (meta.harvest) sets it on
 * a packet that takes a second pass (recirculated, result_replication.p4): a result, for its
 * harvest pass, or a dropped packet that set its sender's bit in a round it is not part of. */
const bit<3> HARVEST_NONE          = 0;
const bit<3> HARVEST_RESULT        = 1;  /* a completed round: multicast; the other set retires */
const bit<3> HARVEST_ANSWER        = 2;  /* DUP_DONE: the stored round, unicast to its sender
                                            (Tofino 2: from the first pass, no second one) */
const bit<3> HARVEST_ANSWER_RETIRE = 3;  /* DUP_DONE, and the other set still holds the
                                            previous round (its result's harvest pass was lost):
                                            it retires too */
const bit<3> HARVEST_UNDO          = 4;  /* BAD_ROUND of a sender new to the round: its bit
                                            leaves the set's map again; then dropped */

/* seen (slot_state.p4): contributions summed, and SEEN_HARVESTED once the round's result had
 * its harvest pass; seen_read tells them apart (meta.round_done). */
const bit<8> SEEN_HARVESTED  = 0x80;
const bit<2> ROUND_PENDING   = 0;   /* not complete */
const bit<2> ROUND_COMPLETE  = 1;   /* complete, its result's harvest pass not (yet) seen */
const bit<2> ROUND_HARVESTED = 3;   /* complete, and the harvest retired the other set */

/* The pipe-local recirculation port (Tofino 1: 68 in every pipe; Tofino 2: 6, its front-panel
 * ports start at 8): a pipe's recirculation port when the controller names no loopback ports
 * for it (recirc_spread.p4). The ingress parser takes a second pass on it and on the eight
 * pipe-local ports LOOPBACK_BASE &&& LOOPBACK_MASK (Tofino 1: 56-63, Tofino 2: 64-71; eight
 * lanes at the end of each pipe's front-panel ports), which the program reserves for loopback: the
 * operator puts some of them in loopback and names them, the controller refuses a host or
 * link there (recirc_spread.p4's @inagg_recirculation_ports). Reserved at build time because this
 * bf-p4c does not compile a parser value set (docs/tofino.md, "Recirculation capacity"). */
#if __TARGET_TOFINO__ == 2
const bit<7> RECIRC_PORT_LOCAL = 6;
const bit<7> LOOPBACK_BASE = 64;
#else
const bit<7> RECIRC_PORT_LOCAL = 68;
const bit<7> LOOPBACK_BASE = 56;
#endif
const bit<7> LOOPBACK_MASK = 0x78;

/* Reduce-scatter (docs/protocol.md; Tofino 2 only, slot_state.p4's round_owner): the round's
 * owner per (slot, set), as p4/include/round_owner.p4 keeps it: OWNER_NONE, OWNER_SHARED or the
 * owner's replica (rank + 1), which a contribution marked FLAG_MINE (FROM_HOST's bit, which
 * only results carry otherwise) brings. The same values as round_owner.p4's
 * (tests/test_owner_decision.py). */
const bit<8> FLAG_MINE    = 0x02;
const bit<8> OWNER_NONE   = 0;
const bit<8> OWNER_SHARED = 0xFF;
const bit<7> BRIDGED_OWNER_SHARED = 0x7F;   /* OWNER_SHARED in bridged.owner's 7 bits */

/* Pipes per chip (both chips as built here: 4), the index of JobCounters' recirculation
 * counters (ingress_port[8:7]). */
const bit<32> TOFINO_PIPES = 4;

/* A slot's owner tag and one set's contributor map: one 64-bit register word. */
struct owner_map_t {
    bit<32> tag;
    bit<32> map;
}

/* A round's record: offset and count. */
struct round_record_t {
    bit<32> offset;
    bit<32> count;
}

/* The round tag as the round check carries it (round_record.p4): meta.round_in = tag << 5, one
 * byte, so that the next tag is round_in + TAG_STEP and a difference of two tags wraps mod 8 in
 * an 8-bit container for free. */
const bit<8> TAG_STEP = 1 << 5;
const bit<8> TAG_LAST = 7 << 5;   /* tag 7's round_in: the tag before tag 0 */
const bit<8> TAG_BEHIND = 0xE0;   /* -TAG_STEP: round_diff of the set's next round */

/* A (slot, set)'s round tag (round_record.p4: a round_in), with the slot owner it was set
 * under: a tag under another owner is none (ROUND_UNSET). */
struct round_tag_t {
    bit<32> owner;
    bit<32> tag;
}

/* Two values of a (slot, set): one 64-bit register word of a lane pair. */
struct value_pair_t {
    bit<32> first;
    bit<32> second;
}

struct tofino_headers_t {
    bridged_h     bridged;
    ethernet_h    ethernet;
    ipv4_h        ipv4;
    udp_h         udp;
    inagg_h       inagg;
    inagg_value_h[TOFINO_PAIRS] values_lo;   /* values 0 .. K/2 - 1: the first of each pair */
    inagg_value_h[TOFINO_PAIRS] values_hi;   /* values K/2 .. K - 1: the second */
}

/* What ingress does with a packet. */
const bit<2> VERDICT_FORWARD   = 0;  /* ordinary traffic, or a job not admitted to the switch */
const bit<2> VERDICT_AGGREGATE = 1;  /* admitted contribution: slot logic applies            */
const bit<2> VERDICT_DROP      = 2;  /* dropped and counted (drop_reason)                    */
const bit<2> VERDICT_HARVEST   = 3;  /* a result's harvest pass                              */

/* SlotState's decision (meta.outcome): SLOT_* of the shared constants.p4; 0 = none. */

/* How a packet relates to its (slot, set)'s round (meta.round_kind, set by round_action from
 * the contributor map, and by the harvest pass); with meta.same_round it keys seen, exponent,
 * flags and the lane pairs (slot_state.p4, value_lanes.p4). */
const bit<2> KIND_OPEN    = 1;   /* the set's map was empty: this packet opens the round      */
const bit<2> KIND_NEW     = 2;   /* the sender is not in the map yet                          */
const bit<2> KIND_REPEAT  = 3;   /* the sender is in the map already                          */
/* 0: no round logic (forwarded, dropped) or the harvest pass (bridged.harvest != 0) */

struct tofino_ingress_md_t {
    bit<2>       encap;          /* parser: ENCAP_UDP for an inagg packet, 0 for other traffic */
    bit<2>       verdict;
    bit<8>       drop_reason;    /* DROP_* of the job, or GLOBAL_DROP_* when not admitted */
    bit<1>       admitted;       /* job_table hit */
    bit<8>       job_index;
    bit<8>       n_workers;
    bit<8>       n_last;         /* n_workers - 1: seen before the completing packet */
    bit<16>      mcast_grp;
    bit<1>       bound;          /* worker_table hit */
    /* JobAdmission's differences (0 = equal; borrow bits for the range checks) */
    bit<2>       encap_diff;
    bit<8>       rank_room;      /* n_workers - worker_id */
    PortId_t     port_diff;
    bit<32>      addr_diff;
    bit<48>      mac_diff;
    bit<16>      udp_port_diff;
    bit<16>      epoch_diff;
    bit<16>      slot_abs;       /* the header's slot as a 16-bit number (parser) */
    bit<16>      slot_lead;      /* slot_base - slot */
    bit<16>      slot_room;      /* slot_end - slot */
    bit<16>      count_gap;      /* K - count */
    /* SlotClaim and SlotState */
    bit<32>      me;             /* 1 << worker_id */
    bit<32>      tag;            /* job_id ++ epoch: the slot owner tag */
    slot_index_t idx;            /* set ++ slot: a (slot, set)'s register index */
    slot_t       slot;
    bit<32>      count32;        /* the header's count, as the round record stores it */
    bit<32>      old_map0;       /* set 0's contributors before this packet */
    bit<32>      old_map1;       /* set 1's contributors before this packet */
    bit<1>       moved;          /* a repeat whose sender is in the other set's old map too (it
                                    went on to that set's round; round_record.p4) */
    bit<2>       round_kind;     /* KIND_* */
    bit<1>       same_round;     /* offset and count are the round record's (or it opens) */
    bit<1>       retired0;       /* a second pass that retired set 0's map (checks) ... */
    bit<1>       retired1;       /* ... or set 1's (checks_map1): its round is harvested. 0 when
                                    the slot's owner tag is no longer the packet's (the job was
                                    torn down while it recirculated): nothing is marked or sent */
    bit<1>       owned0;         /* Tofino 1's DUP_DONE answer of set 0 on its harvest pass:
                                    the slot's owner is still the packet's (checks) ... */
    bit<1>       owned1;         /* ... of set 1 (checks_map1; slot_claim.p4) */
    bit<2>       round_done;     /* seen: ROUND_* (ADD: ROUND_COMPLETE when this packet completes it) */
    bit<1>       slot_drop;      /* STALE_ROUND or BAD_ROUND: dropped, counted */
    bit<8>       exp_biased;     /* exponent ^ 0x80: signed order as unsigned */
    bit<8>       exp_result;     /* the round's biased exponent max after this packet */
    bit<8>       flags_result;   /* the round's sticky flags after this packet */
    bit<8>       flags_in;       /* the sticky flags this packet brings */
    bit<3>       outcome;        /* SLOT_* (constants.p4); 0 until SlotState decides */
    bit<3>       harvest;        /* HARVEST_*: the packet's second pass; 0: none */
    PortId_t     recirc_port;    /* RecircSpread: the port this slot's passes recirculate by */
    /* the round check (round_record.p4), in bytes: the 32-bit fields Tofino 2 first used left
       Tofino 1 without the PHV its contributor maps need (docs/tofino.md, "Round identity") */
    bit<8>       round_in;       /* the packet's round tag << 5 (slot_inputs.p4) */
    bit<1>       round_next;     /* an opener: round_in is the set's tag + 1 mod ROUND_TAGS, or
                                    the set holds none (round_record.p4) */
    bit<8>       round_diff;     /* another packet: the set's tag (round_record.p4), less the
                                    packet's (slot_state.p4): 0 this round, TAG_BEHIND the next,
                                    else an older round's copy */
#if __TARGET_TOFINO__ == 2
    bit<8>       owner_in;       /* the owner this contribution brings (slot_inputs.p4:
                                    owner_input): its replica when marked FLAG_MINE,
                                    OWNER_SHARED from a child switch, else OWNER_NONE */
    bit<8>       owner_result;   /* the round's owner after this packet (round_owner) */
#endif
}

struct tofino_egress_md_t { }

#endif /* _INAGG_TOFINO_TYPES_P4_ */

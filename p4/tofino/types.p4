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
 * and no view of ingress metadata on Tofino). */
header bridged_h {
    bit<7>   pad0;
    PortId_t ingress_port;
    bit<8>   replica;        /* unicast DUP_DONE answer: the sender's rank + 1; else 0 */
    bit<7>   pad1;
    bit<1>   flooded;        /* L2 flood: egress prunes the ingress port */
}

struct bitmap_pair_t {
    bit<32> set0;
    bit<32> set1;
}

struct tofino_headers_t {
    bridged_h     bridged;
    ethernet_h    ethernet;
    ipv4_h        ipv4;
    udp_h         udp;
    inagg_h       inagg;
    inagg_value_h[TOFINO_VALUES_PER_PACKET] values;
}

/* What ingress does with a packet. */
const bit<2> VERDICT_FORWARD   = 0;  /* ordinary traffic, or a job not admitted to the switch */
const bit<2> VERDICT_AGGREGATE = 1;  /* admitted contribution: slot logic applies            */
const bit<2> VERDICT_DROP      = 2;  /* dropped and counted (drop_reason)                    */

/* SlotState's decision (meta.outcome): SLOT_* of the shared constants.p4; 0 = none. */

/* What the value lanes (and the exponent and flags) do, by SlotState's decision: store (FIRST),
 * add (ADD), load (DUP_DONE); 0: nothing (every other outcome). */
const bit<2> LANE_STORE        = 1;
const bit<2> LANE_ADD          = 2;
const bit<2> LANE_LOAD         = 3;

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
    bit<8>       rank_gap;       /* worker_id - n_workers */
    PortId_t     port_diff;
    bit<32>      addr_diff;
    bit<48>      mac_diff;
    bit<16>      udp_port_diff;
    bit<16>      epoch_diff;
    bit<16>      slot_abs;       /* the header's slot as a 16-bit number (parser) */
    bit<16>      slot_count;
    bit<16>      slot_lead;      /* slot_base - slot */
    bit<16>      slot_room;      /* slot_lead + slot_count */
    bit<16>      count_gap;      /* K - count */
    /* SlotState */
    bit<32>      me;             /* 1 << worker_id */
    bit<32>      tag;            /* job_id ++ epoch: the slot owner tag */
    slot_index_t idx;            /* set ++ slot: a (slot, set)'s register index */
    slot_t       slot;
    bit<1>       reset;          /* the slot had another owner: this packet starts afresh */
    bit<32>      others;         /* ((1 << n_workers) - 1) ^ me: the contributors before the
                                    completing packet */
    bit<32>      count32;        /* the header's count, as the round record stores it */
    bit<32>      old_bitmap;     /* this set's contributors before this packet */
    bit<32>      old_other;      /* the other set's contributors before this packet */
    bit<32>      mine;           /* old_bitmap & me (0: w had not contributed to this round) */
    bit<32>      moved;          /* old_other & me (w went on to the other set's round) */
    bit<32>      done_gap;       /* old_bitmap ^ others (0: this packet completes the round) */
    bit<1>       complete;       /* seen: the round is complete (ADD: this packet completes it) */
    bit<1>       same_round;     /* offset and count are the round record's (or FIRST) */
    bit<8>       flags_out;      /* FLAG_RETRANSMIT on a DUP_DONE answer */
    bit<1>       slot_drop;      /* STALE_ROUND or BAD_ROUND: dropped, counted */
    bit<8>       exp_biased;     /* exponent ^ 0x80: signed order as unsigned */
    bit<8>       exp_result;     /* the round's biased exponent max after this packet */
    bit<8>       flags_result;   /* the round's sticky flags after this packet */
    bit<8>       flags_in;       /* the sticky flags this packet brings */
    bit<2>       lane_op;        /* LANE_*: what the value lanes do */
    bit<3>       outcome;        /* SLOT_* (constants.p4); 0 until SlotState decides */
    bit<1>       send_result;
}

struct tofino_egress_md_t { }

#endif /* _INAGG_TOFINO_TYPES_P4_ */

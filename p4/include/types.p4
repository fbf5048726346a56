/* The types of the v1model program, in one file: the headers it parses (headers_t, of the wire
 * headers in headers.p4) and the per-packet metadata the controls share (metadata_t), with the
 * codes of its fields. Sizes are in size.p4, wire constants in constants.p4.
 */
#ifndef _INAGG_TYPES_P4_
#define _INAGG_TYPES_P4_

#include "size.p4"
#include "headers.p4"

/* The headers of a packet: the payload is a stack of SWITCH_VALUES_PER_PACKET values, or absent
 * when count == 0. */
struct headers_t {
    ethernet_h    ethernet;
    ipv4_h        ipv4;
    udp_h         udp;
    bth_h         bth;
    reth_h        reth;
    immdt_h       immdt;
    inagg_h       inagg;
    inagg_value_h[SWITCH_VALUES_PER_PACKET] values;
    icrc_h        icrc;
}

/* What ingress does with a packet. */
const bit<2> VERDICT_FORWARD   = 0;  /* ordinary traffic, or a job not admitted to the switch */
const bit<2> VERDICT_AGGREGATE = 1;  /* admitted contribution: slot logic applies            */
const bit<2> VERDICT_DROP      = 2;  /* dropped and counted (drop_reason)                    */

const bit<8> NO_DROP           = 0xFF;

struct metadata_t {
    bit<1>  guard_drop;       /* SourceGuard: a host port's frame claims an aggregator's place */
    bit<2>  verdict;
    bit<8>  drop_reason;      /* DROP_* of the job, or GLOBAL_DROP_* when not admitted */
    bit<1>  admitted;         /* job_table hit */
    bit<8>  job_index;        /* row of the job's counters */
    bit<16> slot_base;
    bit<16> slot_count;
    bit<8>  n_workers;
    bit<16> epoch;
    bit<16> mcast_grp;
    bit<3>  outcome;          /* SLOT_* */
    bit<1>  send_result;      /* round complete now, or DUP_DONE */
    bit<32> value_base;       /* first index of the (slot, set) in register `values` */
    bit<8>  res_flags;        /* stored round state, copied into the result header */
    bit<8>  res_exp;
    bit<16> res_count;
    bit<32> res_offset;
    bit<1>  flooded;          /* L2 flood: egress prunes the ingress port */
    bit<16> values_left;      /* parser: values still to extract */
    bit<2>  encap;            /* parser: ENCAP_* of an inagg packet, 0 for other traffic */
    bit<2>  job_encap;        /* the admitted job's ENCAP_* */
    bit<16> replica;          /* result for rank replica - 1 (0: none); egress_rid or unicast */
    bit<8>  res_owner;        /* RoundOwner: the replica alone given the values (0: every one) */
    /* Aggregation trees (docs/trees.md): the job's uplink_table entry (TreeUplink)... */
    bit<1>  has_uplink;       /* this switch sends its partial sums to a parent */
    bit<9>  up_port;
    bit<8>  up_rank;          /* this switch's child index at the parent */
    bit<16> up_slot_base;     /* the job's first slot on the parent */
    bit<48> up_mac;           /* the parent's aggregator address */
    bit<32> up_addr;
    bit<16> up_udp_port;
    bit<48> up_src_mac;       /* this switch's aggregator address, which its children use */
    bit<32> up_src_addr;
    bit<16> up_src_udp_port;
    /* ...and what admission and SlotState decided. */
    bit<1>  from_parent;      /* an admitted RESULT from the parent */
    bit<1>  dup_result;       /* the parent's result again, already stored: a duplicate */
    bit<1>  send_up;          /* the packet leaves as a contribution to the parent */
}

#endif /* _INAGG_TYPES_P4_ */

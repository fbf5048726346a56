/* Per-packet metadata shared by the controls, and the switch's build parameters. */
#ifndef _INAGG_METADATA_P4_
#define _INAGG_METADATA_P4_

#include "headers.p4"

/* Aggregator slots in the switch's pool (per shadow set). The controller reads the pool size
 * from the P4Info (size of register slot_tag), never from its own copy of this number. */
#define INAGG_SLOTS 1024
/* Jobs the switch can hold at once (job_table size, counter rows). */
#define INAGG_MAX_JOBS 64

/* Apply M to every value index 0 .. SWITCH_VALUES_PER_PACKET - 1 (P4 has no loops in
 * controls; tests/test_p4_program.py checks the count matches the constant). */
#define FOR_EACH_VALUE(M) \
    M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) \
    M(8) M(9) M(10) M(11) M(12) M(13) M(14) M(15) \
    M(16) M(17) M(18) M(19) M(20) M(21) M(22) M(23) \
    M(24) M(25) M(26) M(27) M(28) M(29) M(30) M(31) \
    M(32) M(33) M(34) M(35) M(36) M(37) M(38) M(39) \
    M(40) M(41) M(42) M(43) M(44) M(45) M(46) M(47) \
    M(48) M(49) M(50) M(51) M(52) M(53) M(54) M(55) \
    M(56) M(57) M(58) M(59) M(60) M(61) M(62) M(63)

/* What ingress does with a packet. */
const bit<2> VERDICT_FORWARD   = 0;  /* ordinary traffic, or a job not admitted to the switch */
const bit<2> VERDICT_AGGREGATE = 1;  /* admitted contribution: slot logic applies            */
const bit<2> VERDICT_DROP      = 2;  /* dropped and counted (drop_reason)                    */

const bit<8> NO_DROP           = 0xFF;

struct metadata_t {
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
}

#endif /* _INAGG_METADATA_P4_ */

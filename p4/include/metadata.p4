/* Per-packet metadata shared by the controls, and the switch's build parameters. */
#ifndef _INAGG_METADATA_P4_
#define _INAGG_METADATA_P4_

#include "headers.p4"

/* Aggregator slots in the switch's pool (per shadow set). The controller reads the pool size
 * from the P4Info (size of register slot_tag), never from its own copy of this number. */
#define INAGG_SLOTS 1024
/* Jobs the switch can hold at once (job_table size, counter rows). */
#define INAGG_MAX_JOBS 64

/* What ingress does with a packet. */
const bit<2> VERDICT_FORWARD   = 0;  /* ordinary traffic, or a job not admitted to the switch */
const bit<2> VERDICT_AGGREGATE = 1;  /* admitted contribution: slot logic applies            */
const bit<2> VERDICT_DROP      = 2;  /* dropped and counted (drop_reason)                    */

/* SlotState's decision for an admitted contribution (see slot_state.p4). */
const bit<3> SLOT_FIRST        = 1;
const bit<3> SLOT_ADD          = 2;
const bit<3> SLOT_STALE        = 3;
const bit<3> SLOT_DUP_PENDING  = 4;
const bit<3> SLOT_DUP_DONE     = 5;

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
}

#endif /* _INAGG_METADATA_P4_ */

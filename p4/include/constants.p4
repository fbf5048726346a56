/* inagg wire-protocol constants: the single P4 definition.
 * hostlib/wire/protocol.py is the Python twin; tests/test_protocol_twin.py fails when they drift.
 */
#ifndef _INAGG_CONSTANTS_P4_
#define _INAGG_CONSTANTS_P4_

/* Protocol version carried in every inagg header. */
const bit<4>  INAGG_VERSION        = 1;

/* Default UDP destination port of inagg traffic (workers and aggregators may be configured
 * with another one; the switch learns it from its config table, this is the parser default). */
const bit<16> INAGG_UDP_PORT       = 0xA66A;

/* The same inagg packet carried as RoCEv2 (hostlib/wire/roce.py explains the choices): UDP to
 * ROCE_UDP_PORT, BTH with a UC RDMA WRITE ONLY WITH IMMEDIATE, RETH, the immediate
 * ROCE_INAGG_IMMEDIATE ("INAG"), the inagg header and payload, then the 4-byte ICRC. */
const bit<16> ROCE_UDP_PORT        = 4791;
const bit<8>  ROCE_OPCODE_UC_WRITE_ONLY_IMM = 0x2B;
const bit<32> ROCE_INAGG_IMMEDIATE = 0x494E4147;
const bit<16> ROCE_HEADER_BYTES    = 32;    /* BTH 12 + RETH 16 + ImmDt 4 */
const bit<16> ROCE_ICRC_BYTES      = 4;

/* Encapsulations: how a packet carries the inagg header (parser's verdict), and the one a job
 * admitted to the switch uses (job_table's encap parameter). */
const bit<2>  ENCAP_UDP            = 1;
const bit<2>  ENCAP_ROCE           = 2;

/* Message types. */
const bit<4>  MSG_CONTRIBUTION     = 1;   /* worker -> aggregator: my values for (slot, set) */
const bit<4>  MSG_RESULT           = 2;   /* aggregator -> worker: the sum for (slot, set)   */

/* Flag bits. */
const bit<8>  FLAG_RETRANSMIT      = 0x01; /* sender resent this packet after a timeout       */
const bit<8>  FLAG_FROM_HOST       = 0x02; /* result computed by a host aggregator            */
const bit<8>  FLAG_CONGESTION      = 0x04; /* ECN-style mark, ORed into the slot              */
const bit<8>  FLAG_OVERFLOW        = 0x08; /* some worker's block was not representable       */
const bit<8>  FLAG_FROM_SWITCH     = 0x80; /* a switch's partial sum to its parent (docs/trees.md) */

/* The round tag: bits 4..6 of the flags byte are no flags but the round's identity beyond its
 * set. A worker counts the rounds of each slot from 0 at every grant; round k goes on set
 * k mod 2 with tag (k / 2) mod ROUND_TAGS, and every result carries its round's tag. A slot keeps
 * the tag of each set's round, so a copy of any other round of the set (a copy delayed by fewer
 * than 2 * ROUND_TAGS - 2 rounds of its slot) is recognised as stale (docs/protocol.md). */
const bit<8>  ROUND_TAG_MASK       = 0x70;
const bit<8>  ROUND_TAG_SHIFT      = 4;
const bit<8>  ROUND_TAGS           = 8;

/* Block exponent meaning "no value" (all-zero block, no next block). */
const int<8>  EXP_NONE             = -128;

/* Most workers a job can have: the width of the per-slot worker bitmap. */
const bit<8>  MAX_WORKERS          = 32;

/* Bytes of the inagg header (without payload). */
const bit<8>  INAGG_HEADER_BYTES   = 16;

/* SlotState's decision for an admitted contribution (meta.outcome; the rows of the table in
 * slot_state.p4). inagg.hostlib.wire.protocol.Outcome and native/engine.hpp's inagg::Outcome use the same
 * values for the same rows. */
const bit<3>  SLOT_FIRST           = 1;    /* first contribution of a round: overwrite     */
const bit<3>  SLOT_ADD             = 2;    /* a further contribution: add                  */
const bit<3>  SLOT_STALE_ROUND     = 3;    /* drop: reordered packet of a finished round   */
const bit<3>  SLOT_DUP_PENDING     = 4;    /* duplicate, round unfinished: drop            */
const bit<3>  SLOT_DUP_DONE        = 5;    /* duplicate, round finished: result to sender  */
const bit<3>  SLOT_BAD_ROUND       = 6;    /* drop: offset or count differ from the round's */
const bit<3>  SLOT_DUP_UPSTREAM    = 7;    /* duplicate, round's sum up at the parent: resend */

/* Drop reasons of an admitted job: the per-job drop counter's index is
 * job_index * DROP_REASONS + reason. */
const bit<8>  DROP_BAD_TYPE        = 0;    /* not a contribution                          */
const bit<8>  DROP_BAD_WORKER      = 1;    /* rank not bound to this sender               */
const bit<8>  DROP_STALE_EPOCH     = 2;    /* epoch is not the job's current one          */
const bit<8>  DROP_BAD_SLOT        = 3;    /* slot outside the job's range                */
const bit<8>  DROP_BAD_LENGTH      = 4;    /* payload is not 0 or K values, count > K     */
const bit<8>  DROP_STALE_ROUND     = 5;    /* reordered packet of a finished round        */
const bit<8>  DROP_BAD_ENCAP       = 6;    /* encapsulation is not the job's (UDP / RoCEv2) */
const bit<8>  DROP_BAD_ROUND       = 7;    /* offset or count differ from the slot's round */
const bit<8>  DROP_REASONS         = 8;

/* Drops that belong to no job: index of the global drop counter. */
const bit<8>  GLOBAL_DROP_TRUNCATED   = 0; /* shorter than an inagg header                */
const bit<8>  GLOBAL_DROP_BAD_VERSION = 1; /* unknown protocol version                    */
const bit<8>  GLOBAL_DROP_REASONS     = 2;

/* Frames SourceGuard drops on a host port: index of its guard_drops counter. */
const bit<8>  GUARD_DROP_AGGREGATOR_ADDR = 0; /* IPv4 source is an aggregator's address    */
const bit<8>  GUARD_DROP_RESULT          = 1; /* a result, or a switch's partial sum        */
const bit<8>  GUARD_DROP_REASONS         = 2;

#endif /* _INAGG_CONSTANTS_P4_ */

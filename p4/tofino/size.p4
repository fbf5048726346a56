/* Every size of the Tofino program, in one place (as p4/include/size.p4 for BMv2). Each one can
 * be set at build time, e.g.
 *
 *   bf-p4c --target tofino --arch tna -DTOFINO_SLOT_BITS=12 -DTOFINO_VALUES_PER_PACKET=8 ...
 *
 * The committed p4/out/tofino/ build uses these defaults (tests/test_tofino_program.py compiles
 * them, and holds them to the resource budget of docs/tofino.md: more slots or lanes may not
 * fit the 12 stages). The controller reads every size from the P4Info (slot pool = size of
 * slot_tag, K = job_table's @inagg_values_per_packet, the drop row = job_drops / job_packets).
 * Const tables (worker_mask, checks, round_action, the BY_ROUND tables, decision,
 * pair_update) are sized by their entries, not here.
 */
#ifndef _INAGG_TOFINO_SIZE_P4_
#define _INAGG_TOFINO_SIZE_P4_

#include "../include/unroll.p4"

/* Aggregator slots per shadow set: 2^TOFINO_SLOT_BITS. A slot's register index is
 * set ++ slot[TOFINO_SLOT_BITS - 1:0], so the pool is a power of two. */
#ifndef TOFINO_SLOT_BITS
#define TOFINO_SLOT_BITS 13
#endif
#define TOFINO_SLOTS (1 << TOFINO_SLOT_BITS)

/* Jobs at once: job_table's size and the rows of the per-job counters (8-bit job index). */
#ifndef TOFINO_MAX_JOBS
#define TOFINO_MAX_JOBS 64
#endif

/* A job's row of drop counters: 2^TOFINO_DROP_ROW_BITS >= DROP_REASONS (tests check). */
#ifndef TOFINO_DROP_ROW_BITS
#define TOFINO_DROP_ROW_BITS 3
#endif

/* int32 values per packet (K), even: value_lanes.p4 keeps them in K / 2 paired lanes, one
 * 64-bit register and one stateful ALU (four per stage) for two values. The number is a property
 * of the target: the controller reads it from the @inagg_values_per_packet annotation of
 * job_table in the P4Info and hands it to the workers in their grant. */
#ifndef TOFINO_VALUES_PER_PACKET
#define TOFINO_VALUES_PER_PACKET 64
#endif

/* worker_table: one (job, rank) binding per worker of every job. */
#ifndef TOFINO_WORKER_TABLE_SIZE
#define TOFINO_WORKER_TABLE_SIZE 2048
#endif

/* replica_table: one (job, replica) address per worker of every job. */
#ifndef TOFINO_REPLICA_TABLE_SIZE
#define TOFINO_REPLICA_TABLE_SIZE 2048
#endif

/* host_port_table: up to four rows per host-facing port (SourceGuard). */
#ifndef TOFINO_HOST_PORT_TABLE_SIZE
#define TOFINO_HOST_PORT_TABLE_SIZE 1024
#endif

/* Recirculation spread (recirc_spread.p4): a slot's passes recirculate through the port its
 * low TOFINO_RECIRC_SPREAD_BITS slot bits pick in its pipe (2^bits rows in each of the 4 pipes). */
#ifndef TOFINO_RECIRC_SPREAD_BITS
#define TOFINO_RECIRC_SPREAD_BITS 3
#endif
#define TOFINO_RECIRC_SPREAD_ROWS (4 << TOFINO_RECIRC_SPREAD_BITS)

/* l2_table: destination MACs of ordinary traffic. */
#ifndef TOFINO_L2_TABLE_SIZE
#define TOFINO_L2_TABLE_SIZE 1024
#endif

#if TOFINO_SLOT_BITS < 1 || TOFINO_SLOT_BITS > 15
#error "TOFINO_SLOT_BITS must be in 1..15 (the header's 15-bit slot field)"
#endif
#if TOFINO_MAX_JOBS < 1 || TOFINO_MAX_JOBS > 256
#error "TOFINO_MAX_JOBS must be in 1..256 (the counters' 8-bit job index)"
#endif
#if TOFINO_DROP_ROW_BITS < 3 || TOFINO_DROP_ROW_BITS > 8
#error "TOFINO_DROP_ROW_BITS must be in 3..8 (2^3 >= DROP_REASONS; drop_reason is 8 bits)"
#endif
#if TOFINO_RECIRC_SPREAD_BITS < 1 || TOFINO_RECIRC_SPREAD_BITS > 8
#error "TOFINO_RECIRC_SPREAD_BITS must be in 1..8 (at most 256 rows per pipe)"
#endif
#if TOFINO_VALUES_PER_PACKET < 2 || TOFINO_VALUES_PER_PACKET > INAGG_UNROLL_MAX || TOFINO_VALUES_PER_PACKET % 2
#error "TOFINO_VALUES_PER_PACKET must be an even decimal literal in 2..INAGG_UNROLL_MAX (unroll.p4)"
#endif

/* Lane pairs: K / 2. Pair i holds values i and TOFINO_PAIRS + i, the i-th of the two halves of
 * the payload (types.p4: two header stacks, as one stack's validity bits must fit one PHV
 * container). */
#define TOFINO_PAIRS INAGG_HALF(TOFINO_VALUES_PER_PACKET)
/* Apply M to every pair 0 .. TOFINO_PAIRS - 1. */
#define FOR_EACH_PAIR(M) INAGG_UNROLL(TOFINO_PAIRS, M)

#endif /* _INAGG_TOFINO_SIZE_P4_ */

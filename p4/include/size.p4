/* Every size of the v1model program, in one place (as ONOS fabric's size.p4). Each one can be
 * set at build time, e.g.
 *
 *   p4c-bm2-ss --arch v1model -DINAGG_SLOTS=4096 -DSWITCH_VALUES_PER_PACKET=32 ... p4/inagg.p4
 *
 * The committed p4/out/bmv2/ build uses these defaults (tests/test_p4_program.py compiles
 * them). The controller never keeps its own copy of a size: it reads each one from the P4Info
 * (slot pool = size of register slot_tag, K = job_table's @inagg_values_per_packet, jobs = size
 * of job_table), so a program built with other sizes needs no controller change.
 * Const tables (slot_state.p4's slot_decision) are sized by their entries, not here.
 */
#ifndef _INAGG_SIZE_P4_
#define _INAGG_SIZE_P4_

#include "unroll.p4"

/* Aggregator slots in the switch's pool (per shadow set): every slot register has INAGG_SLOTS
 * cells per set. At most 2^15 (the header's slot field). */
#ifndef INAGG_SLOTS
#define INAGG_SLOTS 1024
#endif

/* Jobs the switch can hold at once: job_table's size and the rows of the per-job counters.
 * At most 256 (meta.job_index is 8 bits). */
#ifndef INAGG_MAX_JOBS
#define INAGG_MAX_JOBS 64
#endif

/* K: int32 values per packet on the switch (the payload stack, the parser's loop, the value
 * registers, job_table's @inagg_values_per_packet). inagg.hostlib.wire.protocol.SWITCH_VALUES_PER_PACKET
 * is the default's Python twin; host aggregators accept any per-job value count. */
#ifndef SWITCH_VALUES_PER_PACKET
#define SWITCH_VALUES_PER_PACKET 64
#endif

/* worker_table: one (job, rank) binding per worker of every job (64 jobs x 32 ranks). */
#ifndef INAGG_WORKER_TABLE_SIZE
#define INAGG_WORKER_TABLE_SIZE 2048
#endif

/* replica_table: one (job, replica) address per worker of every job. */
#ifndef INAGG_REPLICA_TABLE_SIZE
#define INAGG_REPLICA_TABLE_SIZE 2048
#endif

/* atp_table: ATP's pool, one per switch (docs/atp.md). */
#ifndef INAGG_ATP_POOLS
#define INAGG_ATP_POOLS 1
#endif

/* host_port_table: one entry per host-facing port (SourceGuard). */
#ifndef INAGG_HOST_PORT_TABLE_SIZE
#define INAGG_HOST_PORT_TABLE_SIZE 512
#endif

/* CongestionMark: an inagg packet that found at least this many packets queued at its egress
 * port (standard_metadata.enq_qdepth) leaves with FLAG_CONGESTION. BMv2's queues hold 64 by
 * default: a quarter of that marks well before one overflows. */
#ifndef INAGG_CONGESTION_QDEPTH
#define INAGG_CONGESTION_QDEPTH 16
#endif

/* l2_table: destination MACs of ordinary traffic. */
#ifndef INAGG_L2_TABLE_SIZE
#define INAGG_L2_TABLE_SIZE 1024
#endif

#if INAGG_SLOTS < 1 || INAGG_SLOTS > 32768
#error "INAGG_SLOTS must be in 1..32768 (the header's 15-bit slot field)"
#endif
#if INAGG_MAX_JOBS < 1 || INAGG_MAX_JOBS > 256
#error "INAGG_MAX_JOBS must be in 1..256 (meta.job_index is 8 bits)"
#endif
#if SWITCH_VALUES_PER_PACKET < 1 || SWITCH_VALUES_PER_PACKET > INAGG_UNROLL_MAX
#error "SWITCH_VALUES_PER_PACKET must be a decimal literal in 1..INAGG_UNROLL_MAX (unroll.p4)"
#endif

/* Apply M to every value index 0 .. SWITCH_VALUES_PER_PACKET - 1 (P4 has no loops in
 * controls). */
#define FOR_EACH_VALUE(M) INAGG_UNROLL(SWITCH_VALUES_PER_PACKET, M)

#endif /* _INAGG_SIZE_P4_ */

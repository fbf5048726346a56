/* JobCounters (Tofino): every per-job and global counter, counted from the verdicts of the
 * other controls; the same counters and indexes as p4/include/job_counters.p4:
 *
 *   counter           | index                              | counts
 *   ------------------+------------------------------------+--------------------------------
 *   job_packets       | job_index                          | admitted-job inagg packets
 *   job_aggregated    | job_index                          | SLOT_FIRST and SLOT_ADD
 *   job_duplicates    | job_index                          | SLOT_DUP_PENDING and DUP_DONE
 *   job_results       | job_index                          | completed rounds (multicasts)
 *   job_drops         | job_index * 2^TOFINO_DROP_ROW_BITS | drops of the job, by DROP_*
 *                     | + reason                           |
 *   global_drops      | reason                             | drops of no job, by GLOBAL_DROP_*
 *
 * A result's harvest pass (result_replication.p4) counts nothing: its first pass counted it.
 * Tofino cannot multiply, so a job's drop row is a power of two (BMv2's is DROP_REASONS); the
 * controller takes the row length from the P4Info (job_drops size / job_packets size).
 */
#ifndef _INAGG_TOFINO_JOB_COUNTERS_P4_
#define _INAGG_TOFINO_JOB_COUNTERS_P4_

#include "types.p4"

control JobCounters(in tofino_ingress_md_t meta) {

    Counter<bit<32>, bit<8>>(TOFINO_MAX_JOBS, CounterType_t.PACKETS) job_packets;
    Counter<bit<32>, bit<8>>(TOFINO_MAX_JOBS, CounterType_t.PACKETS) job_aggregated;
    Counter<bit<32>, bit<8>>(TOFINO_MAX_JOBS, CounterType_t.PACKETS) job_duplicates;
    Counter<bit<32>, bit<8>>(TOFINO_MAX_JOBS, CounterType_t.PACKETS) job_results;
    Counter<bit<32>, bit<(8 + TOFINO_DROP_ROW_BITS)>>(TOFINO_MAX_JOBS << TOFINO_DROP_ROW_BITS, CounterType_t.PACKETS) job_drops;
    Counter<bit<32>, bit<8>>((bit<32>) GLOBAL_DROP_REASONS, CounterType_t.PACKETS) global_drops;

    /* Independent conditions, not a chain: each counter is its own gateway, all in one stage. */
    apply {
        if (meta.encap != 0 && meta.admitted == 0 && meta.verdict == VERDICT_DROP) {
            global_drops.count(meta.drop_reason);
        }
        if (meta.encap != 0 && meta.admitted == 1 && meta.verdict != VERDICT_HARVEST) {
            job_packets.count(meta.job_index);
        }
        if (meta.encap != 0 && meta.admitted == 1
            && (meta.verdict == VERDICT_DROP || meta.slot_drop == 1)) {
            job_drops.count(meta.job_index ++ meta.drop_reason[TOFINO_DROP_ROW_BITS - 1:0]);
        }
        if (meta.outcome == SLOT_FIRST || meta.outcome == SLOT_ADD) {
            job_aggregated.count(meta.job_index);
        }
        if (meta.harvest == HARVEST_RESULT) {
            job_results.count(meta.job_index);
        }
        if (meta.outcome == SLOT_DUP_PENDING || meta.outcome == SLOT_DUP_DONE) {
            job_duplicates.count(meta.job_index);
        }
    }
}

#endif /* _INAGG_TOFINO_JOB_COUNTERS_P4_ */

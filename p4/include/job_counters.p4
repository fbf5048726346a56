/* JobCounters: every per-job and global counter, counted from the verdicts of the other
 * controls (so each packet is counted exactly once, in one place).
 *
 *   counter           | index                              | counts
 *   ------------------+------------------------------------+--------------------------------
 *   job_packets       | job_index                          | admitted-job inagg packets
 *   job_aggregated    | job_index                          | SLOT_FIRST and SLOT_ADD
 *   job_duplicates    | job_index                          | SLOT_DUP_PENDING, DUP_DONE and
 *                     |                                    | DUP_UPSTREAM, a parent's result again
 *   job_results       | job_index                          | rounds complete at this switch
 *                     |                                    | (multicast, or sent up in a tree)
 *
 * In an aggregation tree a parent's result counts in job_packets only (docs/trees.md).
 *   job_drops         | job_index * DROP_REASONS + reason  | drops of the job, by DROP_*
 *   global_drops      | reason                             | drops of no job, by GLOBAL_DROP_*
 *   job_collisions    | job_index                          | ATP: contributions whose pool
 *                     |                                    | aggregator another round held
 *
 * job_collisions is the software switch's (it runs the ATP pool, docs/atp.md); this program
 * forwards an admit_atp job's packets and never counts it.
 */
#ifndef _INAGG_JOB_COUNTERS_P4_
#define _INAGG_JOB_COUNTERS_P4_

#include <core.p4>
#include <v1model.p4>
#include "types.p4"

control JobCounters(inout headers_t hdr, inout metadata_t meta) {
    counter(INAGG_MAX_JOBS, CounterType.packets) job_packets;
    counter(INAGG_MAX_JOBS, CounterType.packets) job_aggregated;
    counter(INAGG_MAX_JOBS, CounterType.packets) job_duplicates;
    counter(INAGG_MAX_JOBS, CounterType.packets) job_results;
    counter(INAGG_MAX_JOBS * (bit<32>) DROP_REASONS, CounterType.packets) job_drops;
    counter((bit<32>) GLOBAL_DROP_REASONS, CounterType.packets) global_drops;
    counter(INAGG_MAX_JOBS, CounterType.packets) job_collisions;

    apply {
        bit<32> job = (bit<32>) meta.job_index;
        if (meta.admitted == 0) {
            if (meta.verdict == VERDICT_DROP) {
                global_drops.count((bit<32>) meta.drop_reason);
            }
            return;
        }
        job_packets.count(job);
        if (meta.verdict == VERDICT_DROP) {
            job_drops.count(job * (bit<32>) DROP_REASONS + (bit<32>) meta.drop_reason);
        } else if (meta.outcome == SLOT_FIRST || meta.outcome == SLOT_ADD) {
            job_aggregated.count(job);
            if (meta.send_result == 1) {
                job_results.count(job);
            }
        } else if (meta.outcome == SLOT_DUP_PENDING || meta.outcome == SLOT_DUP_DONE
                   || meta.outcome == SLOT_DUP_UPSTREAM || meta.dup_result == 1) {
            job_duplicates.count(job);
        }
    }
}

#endif /* _INAGG_JOB_COUNTERS_P4_ */

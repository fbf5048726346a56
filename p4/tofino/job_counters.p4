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
 *   recirc_sent       | pipe (ingress_port[8:7])           | first passes sent to the pipe's
 *                     |                                    | recirculation port (result_replication.p4)
 *   recirc_arrived    | pipe                               | second passes that came back from it
 *
 * A result's harvest pass (result_replication.p4) counts nothing else: its first pass counted
 * it. recirc_sent - recirc_arrived is what the pipe's recirculation port lost (a full queue:
 * each lost harvest pass costs the workers a retransmit timeout, each lost undo pass a stalled
 * set): a pass recirculates through its own pipe's port, so both counts of a pipe are one
 * port's, and passes in flight when they are read count as sent only.
 * Tofino cannot multiply, so a job's drop row is a power of two (BMv2's is DROP_REASONS); the
 * controller takes the row length from the P4Info (job_drops size / job_packets size).
 */
#ifndef _INAGG_TOFINO_JOB_COUNTERS_P4_
#define _INAGG_TOFINO_JOB_COUNTERS_P4_

#include "types.p4"

control JobCounters(in tofino_ingress_md_t meta, in ingress_intrinsic_metadata_t ig_intr_md) {

    Counter<bit<32>, bit<8>>(TOFINO_MAX_JOBS, CounterType_t.PACKETS) job_packets;
    Counter<bit<32>, bit<8>>(TOFINO_MAX_JOBS, CounterType_t.PACKETS) job_aggregated;
    Counter<bit<32>, bit<8>>(TOFINO_MAX_JOBS, CounterType_t.PACKETS) job_duplicates;
    Counter<bit<32>, bit<8>>(TOFINO_MAX_JOBS, CounterType_t.PACKETS) job_results;
    Counter<bit<32>, bit<(8 + TOFINO_DROP_ROW_BITS)>>(TOFINO_MAX_JOBS << TOFINO_DROP_ROW_BITS, CounterType_t.PACKETS) job_drops;
    Counter<bit<32>, bit<8>>((bit<32>) GLOBAL_DROP_REASONS, CounterType_t.PACKETS) global_drops;
    Counter<bit<32>, bit<2>>(TOFINO_PIPES, CounterType_t.PACKETS) recirc_sent;
    Counter<bit<32>, bit<2>>(TOFINO_PIPES, CounterType_t.PACKETS) recirc_arrived;

    /* Independent conditions, not a chain: each counter is its own gateway, placed where its
     * condition is known (recirc_arrived's, the verdict, in stage 2; the others in stage 5). */
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
        /* what ResultReplication recirculates: a first pass with a harvest code (on Tofino 2
           but an ANSWER, answered at once) */
        if (meta.verdict == VERDICT_AGGREGATE && meta.harvest != HARVEST_NONE
#if __TARGET_TOFINO__ == 2
            && meta.harvest != HARVEST_ANSWER
#endif
        ) {
            recirc_sent.count(ig_intr_md.ingress_port[8:7]);
        }
        if (meta.verdict == VERDICT_HARVEST) {
            recirc_arrived.count(ig_intr_md.ingress_port[8:7]);
        }
    }
}

#endif /* _INAGG_TOFINO_JOB_COUNTERS_P4_ */

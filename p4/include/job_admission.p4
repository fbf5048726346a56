/* JobAdmission: which inagg packets the switch aggregates, forwards or drops.
 *
 * job_table (job_id -> the job's grant) holds the jobs the controller admitted to the switch;
 * a job that misses it is forwarded untouched (toward its host aggregator). worker_table binds
 * each (job, rank) to the one sender allowed to claim that rank: its ingress port, IPv4 source,
 * Ethernet source and UDP source port, so no packet can touch a slot of a job it does not belong
 * to, and several ranks on one host (one IP and MAC, a UDP port each: a multi-GPU host) are told
 * apart. udp_port 0 binds no port: RoCEv2 senders pick their UDP source port from the flow label,
 * so a RoCEv2 rank is bound by port, IP and MAC only (the controller gives each its own IP).
 * None of this is authentication: a host on the same port can forge all four (docs/security.md).
 *
 * Checks, in order (the aggregation engine in hostlib/aggregator/engine_reference.py applies the same order from
 * msg_type on):
 *   not inagg (parser's encap is 0)   -> forward
 *   not a full inagg header          -> drop GLOBAL_DROP_TRUNCATED
 *   version != INAGG_VERSION          -> drop GLOBAL_DROP_BAD_VERSION
 *   job not in job_table              -> forward
 *   encapsulation is not the job's    -> drop DROP_BAD_ENCAP (results are sent in the
 *                                        trigger's encapsulation: one per job)
 *   msg_type != MSG_CONTRIBUTION      -> drop DROP_BAD_TYPE
 *     (a RESULT on a job with an uplink is the parent's: see below)
 *   rank not bound to this sender     -> drop DROP_BAD_WORKER (port, IPv4, MAC, UDP port; a
 *                                        bound rank is below MAX_WORKERS, the bitmap's width:
 *                                        n_workers counts the ranks that complete a round, a
 *                                        tree's switch knows its children by sparse ids)
 *   epoch != the job's epoch          -> drop DROP_STALE_EPOCH
 *   slot outside [base, base + count) -> drop DROP_BAD_SLOT
 *   payload not 0 or K values (UDP    -> drop DROP_BAD_LENGTH
 *   length; RoCE: + RETH DMA length)
 *   otherwise                         -> aggregate
 *
 * In an aggregation tree (docs/trees.md; TreeUplink ran first) a RESULT of a job with an uplink
 * is the parent's: its sender must be the uplink's parent address (ingress port = up_port, IPv4,
 * MAC and UDP source = the parent's), else DROP_BAD_WORKER; its slot must lie in the parent's
 * range [up_slot_base, up_slot_base + count), and is then moved into this switch's numbering
 * (meta.from_parent = 1). The other checks are the same.
 */
#ifndef _INAGG_JOB_ADMISSION_P4_
#define _INAGG_JOB_ADMISSION_P4_

#include <core.p4>
#include <v1model.p4>
#include "types.p4"

control JobAdmission(inout headers_t hdr, inout metadata_t meta,
                     inout standard_metadata_t sm) {
    bit<9>  bound_port = 0;
    bit<32> bound_addr = 0;
    bit<48> bound_mac = 0;
    bit<16> bound_udp_port = 0;

    action admit(bit<8> job_index, bit<16> slot_base, bit<16> slot_count, bit<8> n_workers,
                 bit<16> epoch, bit<16> mcast_grp, bit<2> encap) {
        meta.admitted = 1;
        meta.job_index = job_index;
        meta.slot_base = slot_base;
        meta.slot_count = slot_count;
        meta.n_workers = n_workers;
        meta.epoch = epoch;
        meta.mcast_grp = mcast_grp;
        meta.job_encap = encap;
    }

    /* ATP's aggregator sharing (docs/atp.md): a job whose rounds take the switch's shared pool
     * of aggregators by hash, its workers addressing the host aggregator. This program runs no
     * ATP pool: an admit_atp job's packets are forwarded untouched, so the host aggregator sums
     * every round (a pool of none). The software switch runs the pool: its parser also takes
     * UDP to or from atp_table's host_port as inagg (bmv2_env/softswitch/pipeline_reference.py). */
    action admit_atp(bit<8> job_index, bit<16> slot_base, bit<16> slot_count, bit<8> n_workers,
                     bit<16> epoch) {
        meta.job_index = job_index;
    }

    /* K for the controller (controller/p4info.py values_per_packet): a property of the target,
     * handed to the workers in their grants; the preprocessor writes size.p4's number here. */
    @inagg_values_per_packet(SWITCH_VALUES_PER_PACKET)
    table job_table {
        key = { hdr.inagg.job_id: exact @name("job_id"); }
        actions = { admit; admit_atp; NoAction; }
        default_action = NoAction();
        size = INAGG_MAX_JOBS;
    }

    /* The ATP pool (slots [pool_base, pool_base + pool_count); count 0: none) for the jobs of
     * the host aggregator at host_addr, UDP host_port, and this switch's aggregator address, the
     * source of the sums it sends up. One host aggregator per switch; see admit_atp. */
    action set_atp_pool(bit<16> pool_base, bit<16> pool_count, bit<16> host_port,
                        bit<48> switch_mac, bit<32> switch_addr, bit<16> switch_udp_port) {
    }

    table atp_table {
        key = { hdr.ipv4.dst_addr: exact @name("host_addr"); }
        actions = { set_atp_pool; NoAction; }
        default_action = NoAction();
        size = INAGG_ATP_POOLS;
    }

    action bind_worker(bit<9> port, bit<32> addr, bit<48> mac, bit<16> udp_port) {
        bound_port = port;
        bound_addr = addr;
        bound_mac = mac;
        bound_udp_port = udp_port;
    }

    table worker_table {
        key = {
            hdr.inagg.job_id: exact @name("job_id");
            hdr.inagg.worker_id: exact @name("worker_id");
        }
        actions = { bind_worker; NoAction; }
        default_action = NoAction();
        size = INAGG_WORKER_TABLE_SIZE;
    }

    /* A GLOBAL_DROP_* reason when meta.admitted is 0, the job's DROP_* reason when 1. */
    action drop(bit<8> reason) {
        meta.verdict = VERDICT_DROP;
        meta.drop_reason = reason;
    }

    apply {
        meta.verdict = VERDICT_FORWARD;
        meta.drop_reason = NO_DROP;
        if (hdr.ipv4.isValid()) {
            atp_table.apply();
        }
        if (meta.encap == 0) {
            return;
        }
        if (!hdr.inagg.isValid()) {
            drop(GLOBAL_DROP_TRUNCATED);
        } else if (hdr.inagg.version != INAGG_VERSION) {
            drop(GLOBAL_DROP_BAD_VERSION);
        } else if (job_table.apply().hit && meta.admitted == 1) {  /* admit_atp: forward */
            bit<16> inagg_len = (bit<16>) INAGG_HEADER_BYTES;
            if (hdr.inagg.count != 0) {
                inagg_len = inagg_len + 4 * SWITCH_VALUES_PER_PACKET;
            }
            bit<16> expected_udp_len = 8 + inagg_len;
            bool bad_dma_len = false;
            if (meta.encap == ENCAP_ROCE) {
                expected_udp_len = expected_udp_len + ROCE_HEADER_BYTES + ROCE_ICRC_BYTES;
                bad_dma_len = hdr.reth.dma_len != (bit<32>) inagg_len;
            }
            bool bound = worker_table.apply().hit;
            bool from_parent = hdr.inagg.msg_type == MSG_RESULT && meta.has_uplink == 1;
            bool sender_ok = bound && hdr.inagg.worker_id < MAX_WORKERS
                             && bound_port == sm.ingress_port && bound_addr == hdr.ipv4.src_addr
                             && bound_mac == hdr.ethernet.src_addr
                             && (bound_udp_port == 0 || bound_udp_port == hdr.udp.src_port);
            bit<16> base = meta.slot_base;
            if (from_parent) {
                sender_ok = meta.up_port == sm.ingress_port && meta.up_addr == hdr.ipv4.src_addr
                            && meta.up_mac == hdr.ethernet.src_addr
                            && meta.up_udp_port == hdr.udp.src_port;
                base = meta.up_slot_base;
            }
            if (meta.encap != meta.job_encap) {
                drop(DROP_BAD_ENCAP);
            } else if (hdr.inagg.msg_type != MSG_CONTRIBUTION && !from_parent) {
                drop(DROP_BAD_TYPE);
            } else if (!sender_ok) {
                drop(DROP_BAD_WORKER);
            } else if (hdr.inagg.epoch != meta.epoch) {
                drop(DROP_STALE_EPOCH);
            } else if ((bit<16>) hdr.inagg.slot < base
                       || (bit<16>) hdr.inagg.slot >= base + meta.slot_count) {
                drop(DROP_BAD_SLOT);
            } else if (sm.parser_error != error.NoError
                       || hdr.inagg.count > SWITCH_VALUES_PER_PACKET
                       || hdr.udp.length != expected_udp_len || bad_dma_len) {
                drop(DROP_BAD_LENGTH);
            } else {
                meta.verdict = VERDICT_AGGREGATE;
                if (from_parent) {
                    meta.from_parent = 1;
                    hdr.inagg.slot = (bit<15>) ((bit<16>) hdr.inagg.slot - base + meta.slot_base);
                }
            }
        }
    }
}

#endif /* _INAGG_JOB_ADMISSION_P4_ */

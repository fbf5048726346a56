/* JobAdmission (Tofino): the job's and the sender's entries, looked up for every packet in the
 * first stage, and the differences the checks of SlotClaim (slot_claim.p4) test in the next.
 *
 * The same tables, keys and actions as p4/include/job_admission.p4, so the controller programs
 * both targets alike; admit takes one more parameter, slot_end = slot_base + slot_count (a
 * bound precomputed by the controller: Tofino's action adds or subtracts two operands, and
 * the range check must be ready one stage after the lookup). job_table carries K for the
 * controller: @inagg_values_per_packet is this target's value count.
 */
#ifndef _INAGG_TOFINO_JOB_ADMISSION_P4_
#define _INAGG_TOFINO_JOB_ADMISSION_P4_

#include "types.p4"

control JobAdmission(in tofino_headers_t hdr, inout tofino_ingress_md_t meta,
                     in ingress_intrinsic_metadata_t ig_intr_md) {
    /* Every action computes its differences at once (Tofino gateways and ternary keys compare
     * with constants, so equality and range checks become differences and borrow bits):
     * slot_base <= slot < slot_end is slot_lead = slot_base - slot zero or negative and
     * slot_room = slot_end - slot positive (slots < 2^15, so bit 15 is the sign); likewise
     * rank < n_workers is rank_room = n_workers - rank positive (both < 64). An operand from
     * action data must come first in a subtraction. */
    action admit(bit<8> job_index, bit<16> slot_base, bit<16> slot_count, bit<16> slot_end,
                 bit<8> n_workers, bit<16> epoch, bit<16> mcast_grp, bit<2> encap) {
        meta.admitted = 1;
        meta.job_index = job_index;
        meta.slot_lead = slot_base - meta.slot_abs;
        meta.slot_room = slot_end - meta.slot_abs;
        meta.n_workers = n_workers;
        meta.rank_room = n_workers - hdr.inagg.worker_id;
        meta.epoch_diff = hdr.inagg.epoch ^ epoch;
        meta.mcast_grp = mcast_grp;
        meta.encap_diff = meta.encap ^ encap;
    }

    @inagg_values_per_packet(TOFINO_VALUES_PER_PACKET)
    table job_table {
        key = { hdr.inagg.job_id: exact @name("job_id"); }
        actions = { admit; NoAction; }
        default_action = NoAction();
        size = TOFINO_MAX_JOBS;
    }

    /* The sender a rank is bound to: ingress port, IPv4 source, MAC source and UDP source port
     * (BMv2 skips the UDP port when it is 0, for RoCE jobs; Tofino carries UDP jobs only). */
    action bind_worker(PortId_t port, bit<32> addr, bit<48> mac, bit<16> udp_port) {
        meta.bound = 1;
        meta.port_diff = ig_intr_md.ingress_port ^ port;
        meta.addr_diff = hdr.ipv4.src_addr ^ addr;
        meta.mac_diff = hdr.ethernet.src_addr ^ mac;
        meta.udp_port_diff = hdr.udp.src_port ^ udp_port;
    }

    table worker_table {
        key = {
            hdr.inagg.job_id: exact @name("job_id");
            hdr.inagg.worker_id: exact @name("worker_id");
        }
        actions = { bind_worker; NoAction; }
        default_action = NoAction();
        size = TOFINO_WORKER_TABLE_SIZE;
    }

    /* (Their results only count for inagg packets: the checks and the counters look at
     * meta.encap; slot_claim.p4 tells a harvest pass apart.) */
    apply {
        job_table.apply();
        worker_table.apply();
    }
}

#endif /* _INAGG_TOFINO_JOB_ADMISSION_P4_ */

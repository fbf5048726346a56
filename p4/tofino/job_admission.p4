/* JobAdmission (Tofino): which inagg packets the switch aggregates, forwards or drops.
 *
 * The same tables, keys, actions and parameters as p4/include/job_admission.p4, so the
 * controller programs both targets alike. Checks, in the same order:
 *   not inagg (parser's encap is 0)   -> forward
 *   parser error before the header   -> drop GLOBAL_DROP_TRUNCATED
 *   version != INAGG_VERSION          -> drop GLOBAL_DROP_BAD_VERSION
 *   job not in job_table              -> forward
 *   encapsulation is not the job's    -> drop DROP_BAD_ENCAP (only UDP is parsed here)
 *   msg_type != MSG_CONTRIBUTION      -> drop DROP_BAD_TYPE
 *   rank not bound to this sender     -> drop DROP_BAD_WORKER (port, IPv4, MAC, UDP port)
 *   epoch != the job's epoch          -> drop DROP_STALE_EPOCH
 *   slot outside [base, base + count) -> drop DROP_BAD_SLOT
 *   payload not 0 or K values         -> drop DROP_BAD_LENGTH
 *   otherwise                         -> aggregate
 *
 * job_table carries K for the controller: @inagg_values_per_packet is this target's value count.
 */
#ifndef _INAGG_TOFINO_JOB_ADMISSION_P4_
#define _INAGG_TOFINO_JOB_ADMISSION_P4_

#include "types.p4"


/* The UDP length of a header-only packet and of one with K values. */
const bit<16> UDP_LENGTH_PRIMING = 8 + (bit<16>) INAGG_HEADER_BYTES;
const bit<16> UDP_LENGTH_VALUES  = UDP_LENGTH_PRIMING + 4 * TOFINO_VALUES_PER_PACKET;

/* The checks as ternary patterns over the keys of table checks (0 = equal): PASS_n matches
 * when the first n keys' checks pass; the entries pad them with wildcards. */
#define WORKER_OK  1, 0 &&& 0xE0, 0 &&& 0xC0, 1, 0, 0, 0, 0
#define PASS_1     true
#define PASS_2     PASS_1, INAGG_VERSION
#define PASS_3     PASS_2, 1
#define PASS_4     PASS_3, 0
#define PASS_5     PASS_4, MSG_CONTRIBUTION
#define PASS_13    PASS_5, WORKER_OK
#define PASS_14    PASS_13, 0
/* slot_lead == 0 or negative, slot_room not negative (the entries before "aggregate" catch
 * slot_room == 0) */
#define PASS_16    PASS_14, 0, 0 &&& 0x8000
#define PASS_16N   PASS_14, 0x8000 &&& 0x8000, 0 &&& 0x8000
#define PASS_18    PASS_16, 0, 0
#define PASS_18N   PASS_16N, 0, 0

control JobAdmission(in tofino_headers_t hdr, inout tofino_ingress_md_t meta,
                     in ingress_intrinsic_metadata_t ig_intr_md,
                     in ingress_intrinsic_metadata_from_parser_t ig_prsr_md) {
    /* Every action computes its differences at once (Tofino gateways and ternary keys compare
     * with constants, so equality and range checks become differences and borrow bits). */
    action admit(bit<8> job_index, bit<16> slot_base, bit<16> slot_count, bit<8> n_workers,
                 bit<16> epoch, bit<16> mcast_grp, bit<2> encap) {
        meta.admitted = 1;
        meta.job_index = job_index;
        meta.slot_lead = slot_base - meta.slot_abs;
        meta.slot_count = slot_count;
        meta.n_workers = n_workers;
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

    /* slot_base <= slot < slot_base + slot_count: slot_lead = slot_base - slot is 0 or
     * negative, slot_room = slot_lead + slot_count is positive (slots < 2^15, so bit 15 is the
     * sign); count <= K. (No "- 1" on action data: that costs the first stage.) Keyed on the
     * job's worker count for SlotState's maps: others = full ^ me, full = (1 << n_workers) - 1
     * the action datum (Tofino cannot shift by a variable). */
    action subtract(bit<32> full) {
        meta.slot_room = meta.slot_lead + meta.slot_count;
        meta.rank_gap = hdr.inagg.worker_id - meta.n_workers;
        meta.n_last = meta.n_workers - 1;
        meta.count_gap = TOFINO_VALUES_PER_PACKET - hdr.inagg.count;
        meta.others = full ^ meta.me;
    }
#define SPAN(n) n: subtract((bit<32>) ((1 << n) - 1));
    table differences {
        key = { meta.n_workers: exact; }
        actions = { subtract; }
        const default_action = subtract(0);
        size = 33;
        const entries = {
            SPAN(1) SPAN(2) SPAN(3) SPAN(4) SPAN(5) SPAN(6) SPAN(7) SPAN(8) SPAN(9) SPAN(10)
            SPAN(11) SPAN(12) SPAN(13) SPAN(14) SPAN(15) SPAN(16) SPAN(17) SPAN(18) SPAN(19)
            SPAN(20) SPAN(21) SPAN(22) SPAN(23) SPAN(24) SPAN(25) SPAN(26) SPAN(27) SPAN(28)
            SPAN(29) SPAN(30) SPAN(31) 32: subtract(0xFFFFFFFF);
        }
    }
#undef SPAN

    action aggregate() {
        meta.verdict = VERDICT_AGGREGATE;
    }
    /* (Named apart from Forwarding's forward/drop: the controller finds actions by short name.) */
    action pass_on() {
        meta.verdict = VERDICT_FORWARD;
    }
    /* A GLOBAL_DROP_* reason when meta.admitted is 0, the job's DROP_* reason when 1. */
    action refuse(bit<8> reason) {
        meta.verdict = VERDICT_DROP;
        meta.drop_reason = reason;
    }

    /* The checks of the table above, first failing one wins: "aggregate" when all pass, then
     * one entry per check, latest first, each matching when every earlier check passes (so
     * the check it names is the first that fails). */
    table checks {
        key = {
            hdr.inagg.isValid(): exact @name("has_header");
            hdr.inagg.version: ternary;
            meta.admitted: ternary;
            meta.encap_diff: ternary;
            hdr.inagg.msg_type: ternary;
            meta.bound: ternary;
            hdr.inagg.worker_id: ternary;
            meta.n_workers: ternary;
            meta.rank_gap[7:7]: ternary @name("rank_below");   /* both < 64: the borrow */
            meta.port_diff: ternary;
            meta.addr_diff: ternary;
            meta.mac_diff: ternary;
            meta.udp_port_diff: ternary;
            meta.epoch_diff: ternary;
            meta.slot_lead: ternary;
            meta.slot_room: ternary;
            ig_prsr_md.parser_err: ternary;
            meta.count_gap[15:15]: ternary @name("count_above");
            hdr.inagg.count: ternary;
            hdr.udp.length: ternary;
        }
        actions = { aggregate; pass_on; refuse; }
        const default_action = pass_on();
        size = 32;
        const entries = {
            (PASS_14, 0, 0, _, _, _, _): refuse(DROP_BAD_SLOT);             /* slot_room == 0 */
            (PASS_14, 0x8000 &&& 0x8000, 0, _, _, _, _): refuse(DROP_BAD_SLOT);
            (PASS_18, 0, UDP_LENGTH_PRIMING): aggregate();
            (PASS_18N, 0, UDP_LENGTH_PRIMING): aggregate();
            (PASS_18, 0, _): refuse(DROP_BAD_LENGTH);
            (PASS_18N, 0, _): refuse(DROP_BAD_LENGTH);
            (PASS_18, _, UDP_LENGTH_VALUES): aggregate();
            (PASS_18N, _, UDP_LENGTH_VALUES): aggregate();
            (PASS_16, _, _, _, _): refuse(DROP_BAD_LENGTH);
            (PASS_16N, _, _, _, _): refuse(DROP_BAD_LENGTH);
            (PASS_14, _, _, _, _, _, _): refuse(DROP_BAD_SLOT);
            (PASS_13, _, _, _, _, _, _, _): refuse(DROP_STALE_EPOCH);
            (PASS_5, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _): refuse(DROP_BAD_WORKER);
            (PASS_4, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _): refuse(DROP_BAD_TYPE);
            (PASS_3, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _): refuse(DROP_BAD_ENCAP);
            (PASS_2, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _): pass_on();  /* not admitted */
            (PASS_1, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _): refuse(GLOBAL_DROP_BAD_VERSION);
            (false, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _): refuse(GLOBAL_DROP_TRUNCATED);
        }
    }

    /* The lookups run for every packet, in the first stage (their results only count for
     * inagg packets: checks and the counters look at meta.encap); metadata starts zeroed
     * (@pa_auto_init_metadata), so the verdict is VERDICT_FORWARD unless checks says otherwise. */
    apply {
        job_table.apply();
        worker_table.apply();
        differences.apply();
        if (meta.encap != 0) {
            checks.apply();
        }
    }
}

#endif /* _INAGG_TOFINO_JOB_ADMISSION_P4_ */

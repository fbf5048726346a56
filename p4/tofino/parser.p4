/* Parsers and deparsers of the Tofino program.
 *
 *   UDP destination port | then                          | meta.encap
 *   ---------------------+-------------------------------+-----------
 *   INAGG_UDP_PORT       | inagg header; K values when   | ENCAP_UDP
 *                        | count != 0                    |
 *   other (RoCEv2 too)   | -                             | 0 (forwarded)
 *
 * A packet on the pipe's recirculation port (RECIRC_PORT_LOCAL), or on one of the pipe's ports
 * reserved for loopback (LOOPBACK_BASE &&& LOOPBACK_MASK, types.p4: recirc_spread.p4 sends a
 * slot's passes through one of them), is on its second pass: it
 * starts with the bridged header its first pass wrote (slot_claim.p4). Its first pass made it a
 * result (make_result, result_replication.p4: addresses and UDP ports swapped, so its UDP
 * destination port is the worker's, not INAGG_UDP_PORT) and set bridged.harvest to its second
 * pass's code: the second pass takes Ethernet, IPv4, UDP and the inagg header on that code,
 * never on the port (parse_result); egress on the result's UDP source port (below).
 *
 * RoCEv2 is not parsed: a RoCE result needs its ICRC recomputed over the whole packet, which
 * Tofino's hash units cannot do (docs/tofino.md); RoCE jobs aggregate on the host aggregator.
 * Egress parses a result down to its inagg header only: it rewrites addresses, never values.
 */
#ifndef _INAGG_TOFINO_PARSER_P4_
#define _INAGG_TOFINO_PARSER_P4_

#include "types.p4"

#define EXTRACT_LO(i) pkt.extract(hdr.values_lo[i]);
#define EXTRACT_HI(i) pkt.extract(hdr.values_hi[i]);

parser InaggIngressParser(packet_in pkt, out tofino_headers_t hdr, out tofino_ingress_md_t meta,
                          out ingress_intrinsic_metadata_t ig_intr_md) {
    /* Tofino 2: start also reads the bridged header where a second pass has it (the packet's
     * first 4 bytes), and a first pass's parse_frame drops it again. Without a read of the
     * packet in start, this bf-p4c puts start's port select in a stall state of its own
     * ($oob_stall: the select's bytes were loaded in the 32 bytes of intrinsic and port
     * metadata) and compiles it to its first case, every packet taken for a second pass; with
     * one, it splits start after those 32 bytes and keeps every case (docs/tofino.md, "A
     * result's headers"). Tofino 1 needs neither. */
    state start {
        pkt.extract(ig_intr_md);
        pkt.advance(PORT_METADATA_SIZE);
        meta.encap = 0;
#if __TARGET_TOFINO__ == 2
        hdr.bridged = pkt.lookahead<bridged_h>();
#endif
        transition select(ig_intr_md.ingress_port[6:0]) {
            RECIRC_PORT_LOCAL: parse_harvest;
            LOOPBACK_BASE &&& LOOPBACK_MASK: parse_harvest;
#if __TARGET_TOFINO__ == 2
            default: parse_frame;
#else
            default: parse_ethernet;
#endif
        }
    }
#if __TARGET_TOFINO__ == 2
    /* A first pass: what start read as a bridged header is the frame's Ethernet header. */
    state parse_frame {
        hdr.bridged.setInvalid();
        transition parse_ethernet;
    }
#endif
    /* Every packet on these ports is a second pass (its first bypassed egress: the bridged
     * header is in front), a result or an undo, whose headers parse_result takes; the select on
     * its harvest code is how each chip's bf-p4c keeps both paths (docs/tofino.md, "A result's
     * headers"). Tofino 1: it merges this state into start and compiles the select to its
     * first case (its match register dropped) once the round check filled the PHV, so the
     * second passes' codes come first (with HARVEST_NONE first, no result left; written as
     * "transition parse_result", start's port select was lost instead). Tofino 2 keeps
     * this select, and compiled the reordered one to its first cases all the way down (start's
     * port select and parse_inagg's too), so it keeps the order it had. */
    state parse_harvest {
        pkt.extract(hdr.bridged);
#if __TARGET_TOFINO__ == 2
        transition select(hdr.bridged.harvest) {
            HARVEST_NONE: parse_ethernet;
            default: parse_result;
        }
#else
        transition select(hdr.bridged.harvest) {
            HARVEST_RESULT: parse_result;
            HARVEST_ANSWER: parse_result;
            HARVEST_ANSWER_RETIRE: parse_result;
            HARVEST_UNDO: parse_result;
            default: parse_ethernet;
        }
#endif
    }
    /* A result (or an undo) its first pass built: the headers that pass parsed, in order. */
    state parse_result {
        pkt.extract(hdr.ethernet);
        pkt.extract(hdr.ipv4);
        pkt.extract(hdr.udp);
        transition parse_inagg;
    }
    state parse_ethernet {
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.ether_type) {
            0x0800: parse_ipv4;
            default: accept;
        }
    }
    state parse_ipv4 {
        pkt.extract(hdr.ipv4);
        transition select(hdr.ipv4.ihl, hdr.ipv4.frag_offset, hdr.ipv4.protocol) {
            (5, 0, 17): parse_udp;
            default: accept;
        }
    }
    state parse_udp {
        pkt.extract(hdr.udp);
        transition select(hdr.udp.dst_port) {
            INAGG_UDP_PORT: parse_inagg;
            default: accept;
        }
    }
    state parse_inagg {
        meta.encap = ENCAP_UDP;
        pkt.extract(hdr.inagg);
        meta.slot_abs = (bit<16>) hdr.inagg.slot;
        transition select(hdr.inagg.count) {
            0: accept;                 /* header-only: exponent priming */
            default: parse_values;
        }
    }
    state parse_values {
        FOR_EACH_PAIR(EXTRACT_LO)
        FOR_EACH_PAIR(EXTRACT_HI)
        transition accept;
    }
}

control InaggIngressDeparser(packet_out pkt, inout tofino_headers_t hdr,
                             in tofino_ingress_md_t meta,
                             in ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md) {
    apply {
        pkt.emit(hdr);
    }
}

/* Egress rewrites results only (ReplicaRewrite). A result's UDP source port is the
 * aggregator's INAGG_UDP_PORT (make_result swapped it there), so egress takes the inagg header
 * on the source port. Not on bridged.harvest, as the second pass does: this bf-p4c drops an
 * egress parser's branch on a bridged field (both chips: the compiled egress parser ends after
 * the bridged header, so no result would be addressed; tests/test_tna_slot_model.py runs the
 * compiled parsers and catches it). */
parser InaggEgressParser(packet_in pkt, out tofino_headers_t hdr, out tofino_egress_md_t meta,
                         out egress_intrinsic_metadata_t eg_intr_md) {
    state start {
        pkt.extract(eg_intr_md);
        pkt.extract(hdr.bridged);
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.ether_type) {
            0x0800: parse_ipv4;
            default: accept;
        }
    }
    state parse_ipv4 {
        pkt.extract(hdr.ipv4);
        transition select(hdr.ipv4.ihl, hdr.ipv4.frag_offset, hdr.ipv4.protocol) {
            (5, 0, 17): parse_udp;
            default: accept;
        }
    }
    state parse_udp {
        pkt.extract(hdr.udp);
        transition select(hdr.udp.src_port) {
            INAGG_UDP_PORT: parse_inagg;
            default: accept;
        }
    }
    state parse_inagg {
        pkt.extract(hdr.inagg);
        transition accept;
    }
}

/* Results change the IPv4 destination: recompute the header checksum (UDP checksum is 0). */
control InaggEgressDeparser(packet_out pkt, inout tofino_headers_t hdr,
                            in tofino_egress_md_t meta,
                            in egress_intrinsic_metadata_for_deparser_t eg_dprsr_md) {
    Checksum() ipv4_checksum;

    apply {
        if (hdr.ipv4.isValid()) {
            hdr.ipv4.hdr_checksum = ipv4_checksum.update({
                hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.diffserv, hdr.ipv4.total_len,
                hdr.ipv4.identification, hdr.ipv4.flags, hdr.ipv4.frag_offset, hdr.ipv4.ttl,
                hdr.ipv4.protocol, hdr.ipv4.src_addr, hdr.ipv4.dst_addr });
        }
        pkt.emit(hdr.ethernet);
        pkt.emit(hdr.ipv4);
        pkt.emit(hdr.udp);
        pkt.emit(hdr.inagg);
    }
}

#endif /* _INAGG_TOFINO_PARSER_P4_ */

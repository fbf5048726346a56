/* Parser and deparser (checksums: checksum.p4): Ethernet / IPv4 / UDP, then the inagg header with its K values in either
 * encapsulation (meta.encap says which):
 *
 *   UDP destination port | then                                         | encap
 *   ---------------------+----------------------------------------------+-----------
 *   INAGG_UDP_PORT       | inagg header, values                         | ENCAP_UDP
 *   ROCE_UDP_PORT        | BTH (UC WRITE ONLY IMM), RETH, ImmDt == magic |
 *                        | -> inagg header, values, ICRC                | ENCAP_ROCE
 *   ROCE_UDP_PORT        | any other RoCE packet                        | 0 (forwarded)
 *   other                | -                                            | 0 (forwarded)
 */
#ifndef _INAGG_PARSER_P4_
#define _INAGG_PARSER_P4_

#include <core.p4>
#include <v1model.p4>
#include "types.p4"

parser InaggParser(packet_in pkt, out headers_t hdr, inout metadata_t meta,
                   inout standard_metadata_t sm) {
    state start {
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
            INAGG_UDP_PORT: parse_inagg_udp;
            ROCE_UDP_PORT: parse_bth;
            default: accept;
        }
    }
    state parse_inagg_udp {
        meta.encap = ENCAP_UDP;
        transition parse_inagg;
    }
    state parse_bth {
        pkt.extract(hdr.bth);
        transition select(hdr.bth.opcode) {
            ROCE_OPCODE_UC_WRITE_ONLY_IMM: parse_reth;
            default: accept;
        }
    }
    state parse_reth {
        pkt.extract(hdr.reth);
        pkt.extract(hdr.immdt);
        transition select(hdr.immdt.imm) {
            ROCE_INAGG_IMMEDIATE: parse_inagg_roce;
            default: accept;
        }
    }
    state parse_inagg_roce {
        meta.encap = ENCAP_ROCE;
        transition parse_inagg;
    }
    state parse_inagg {
        pkt.extract(hdr.inagg);
        meta.values_left = SWITCH_VALUES_PER_PACKET;
        transition select(hdr.inagg.count) {
            0: parse_trailer;          /* header-only: exponent priming */
            default: parse_values;
        }
    }
    /* K values (a counter, not lastIndex: BMv2 cannot select on a stack index) */
    state parse_values {
        pkt.extract(hdr.values.next);
        meta.values_left = meta.values_left - 1;
        transition select(meta.values_left) {
            0: parse_trailer;
            default: parse_values;
        }
    }
    state parse_trailer {
        transition select(meta.encap) {
            ENCAP_ROCE: parse_icrc;
            default: accept;
        }
    }
    state parse_icrc {
        pkt.extract(hdr.icrc);
        transition accept;
    }
}

control InaggDeparser(packet_out pkt, in headers_t hdr) {
    apply {
        pkt.emit(hdr.ethernet);
        pkt.emit(hdr.ipv4);
        pkt.emit(hdr.udp);
        pkt.emit(hdr.bth);
        pkt.emit(hdr.reth);
        pkt.emit(hdr.immdt);
        pkt.emit(hdr.inagg);
        pkt.emit(hdr.values);
        pkt.emit(hdr.icrc);
    }
}

#endif /* _INAGG_PARSER_P4_ */

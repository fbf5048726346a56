/* RoceIcrc (egress): the ICRC of a RoCE result, recomputed after ReplicaRewrite changed its
 * addresses, QP, rkey and the inagg header and values.
 *
 *   packet                                  | ICRC
 *   ----------------------------------------+-------------------------------------------
 *   RoCE result made here (verdict AGGREGATE)| recomputed over the final headers
 *   anything else (forwarded RoCE traffic)  | untouched: the sender's stays valid
 *
 * The ICRC (InfiniBand annex A17) is CRC-32 over 8 bytes of ones standing in for the LRH, the
 * IPv4 header with TOS, TTL and checksum as ones, the UDP header with its checksum as ones, the
 * BTH with its FECN/BECN/reserved byte as ones, and the rest up to the ICRC (no values in a
 * priming round). BMv2's crc32 is the Ethernet CRC-32 (as zlib.crc32); the wire carries it least
 * significant byte first, hence the byte swap.
 * ICRCs of incoming packets are not checked, as no switch checks a UDP checksum here: the
 * receiving NIC (or inagg.hostlib.wire.roce.decapsulate) does.
 */
#ifndef _INAGG_ROCE_ICRC_P4_
#define _INAGG_ROCE_ICRC_P4_

#include <core.p4>
#include <v1model.p4>
#include "types.p4"

/* The covered fields in wire order, masked ones as constants ones. */
#define ICRC_HEADERS \
    64w0xFFFFFFFFFFFFFFFF, \
    hdr.ipv4.version, hdr.ipv4.ihl, 8w0xFF, hdr.ipv4.total_len, \
    hdr.ipv4.identification, hdr.ipv4.flags, hdr.ipv4.frag_offset, 8w0xFF, \
    hdr.ipv4.protocol, 16w0xFFFF, hdr.ipv4.src_addr, hdr.ipv4.dst_addr, \
    hdr.udp.src_port, hdr.udp.dst_port, hdr.udp.length, 16w0xFFFF, \
    hdr.bth.opcode, hdr.bth.solicited, hdr.bth.mig_req, hdr.bth.pad_count, \
    hdr.bth.transport_version, hdr.bth.pkey, 8w0xFF, hdr.bth.dst_qp, \
    hdr.bth.ack_req, hdr.bth.resv7, hdr.bth.psn, \
    hdr.reth.va, hdr.reth.rkey, hdr.reth.dma_len, \
    hdr.immdt.imm, \
    hdr.inagg.version, hdr.inagg.msg_type, hdr.inagg.flags, hdr.inagg.job_id, \
    hdr.inagg.worker_id, hdr.inagg.exp, hdr.inagg.epoch, hdr.inagg.slot_set, \
    hdr.inagg.slot, hdr.inagg.count, hdr.inagg.offset
#define ICRC_VALUE(i) , hdr.values[i].v

control RoceIcrc(inout headers_t hdr, inout metadata_t meta) {
    apply {
        if (!hdr.icrc.isValid() || meta.verdict != VERDICT_AGGREGATE) {
            return;
        }
        bit<32> crc;
        if (!hdr.values[0].isValid()) {
            hash(crc, HashAlgorithm.crc32, 32w0, { ICRC_HEADERS }, 64w0x100000000);
        } else {
            hash(crc, HashAlgorithm.crc32, 32w0, { ICRC_HEADERS FOR_EACH_VALUE(ICRC_VALUE) },
                 64w0x100000000);
        }
        hdr.icrc.crc = crc[7:0] ++ crc[15:8] ++ crc[23:16] ++ crc[31:24];
    }
}

#endif /* _INAGG_ROCE_ICRC_P4_ */

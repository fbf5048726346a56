/* inagg header declarations (standard headers + the inagg header and payload): the wire format
 * both targets share. Field order and widths are mirrored by hostlib/wire/protocol.py (HEADER_FIELDS).
 * Each program's header struct is in its types.p4.
 */
#ifndef _INAGG_HEADERS_P4_
#define _INAGG_HEADERS_P4_

#include "constants.p4"

header ethernet_h {
    bit<48> dst_addr;
    bit<48> src_addr;
    bit<16> ether_type;
}

header ipv4_h {
    bit<4>  version;
    bit<4>  ihl;
    bit<8>  diffserv;
    bit<16> total_len;
    bit<16> identification;
    bit<3>  flags;
    bit<13> frag_offset;
    bit<8>  ttl;
    bit<8>  protocol;
    bit<16> hdr_checksum;
    bit<32> src_addr;
    bit<32> dst_addr;
}

header udp_h {
    bit<16> src_port;
    bit<16> dst_port;
    bit<16> length;
    bit<16> checksum;
}

/* RoCEv2 (InfiniBand transport over UDP): the Base Transport Header... */
header bth_h {
    bit<8>  opcode;
    bit<1>  solicited;
    bit<1>  mig_req;
    bit<2>  pad_count;
    bit<4>  transport_version;
    bit<16> pkey;
    bit<1>  fecn;
    bit<1>  becn;
    bit<6>  resv6;
    bit<24> dst_qp;
    bit<1>  ack_req;
    bit<7>  resv7;
    bit<24> psn;
}

/* ...the RDMA Extended Transport Header of a WRITE (va = inagg offset * 4)... */
header reth_h {
    bit<64> va;
    bit<32> rkey;
    bit<32> dma_len;
}

/* ...the immediate data (ROCE_INAGG_IMMEDIATE marks an inagg packet)... */
header immdt_h {
    bit<32> imm;
}

/* ...and the invariant CRC that ends the packet, after the inagg payload (its bytes are the
 * little-endian CRC-32; see roce_icrc.p4). */
header icrc_h {
    bit<32> crc;
}

/* The inagg header: 16 bytes, network byte order.
 *   version   protocol version (INAGG_VERSION)
 *   msg_type  MSG_CONTRIBUTION or MSG_RESULT
 *   flags     FLAG_* bits
 *   job_id    the job (tenant); 0 is never a valid job
 *   worker_id rank of the sender (contribution) or of the worker whose packet triggered the result
 *   exp       block exponent of the slot's NEXT block (contribution: the sender's own,
 *             result: the maximum over the job's workers); EXP_NONE = none
 *   epoch     allocation epoch of the job's grant; guards slots against a previous owner
 *   slot_set  which of the slot's two shadow copies this round uses
 *   slot      absolute aggregator slot index
 *   count     meaningful values in the payload; 0 = header only (exponent-priming round)
 *   offset    element offset of the payload's first value in the tensor
 */
header inagg_h {
    bit<4>  version;
    bit<4>  msg_type;
    bit<8>  flags;
    bit<16> job_id;
    bit<8>  worker_id;
    int<8>  exp;
    bit<16> epoch;
    bit<1>  slot_set;
    bit<15> slot;
    bit<16> count;
    bit<32> offset;
}

/* One int32 value of the payload (network byte order); the payload is a stack of K of them
 * (the target's values per packet), or absent when count == 0. */
header inagg_value_h {
    bit<32> v;
}

#endif /* _INAGG_HEADERS_P4_ */

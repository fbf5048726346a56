/* Checksums, v1model's verify and compute controls: nothing is verified (incoming ICRCs are not
 * either: roce_icrc.p4); the IPv4 header checksum is recomputed.
 */
#ifndef _INAGG_CHECKSUM_P4_
#define _INAGG_CHECKSUM_P4_

#include <core.p4>
#include <v1model.p4>
#include "types.p4"

control InaggVerifyChecksum(inout headers_t hdr, inout metadata_t meta) {
    apply { }
}

/* Results change IPv4 addresses: recompute the header checksum (UDP checksum is zeroed). */
control InaggComputeChecksum(inout headers_t hdr, inout metadata_t meta) {
    apply {
        update_checksum(
            hdr.ipv4.isValid(),
            { hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.diffserv, hdr.ipv4.total_len,
              hdr.ipv4.identification, hdr.ipv4.flags, hdr.ipv4.frag_offset, hdr.ipv4.ttl,
              hdr.ipv4.protocol, hdr.ipv4.src_addr, hdr.ipv4.dst_addr },
            hdr.ipv4.hdr_checksum, HashAlgorithm.csum16);
    }
}

#endif /* _INAGG_CHECKSUM_P4_ */

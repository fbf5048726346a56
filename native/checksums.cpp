// IPv4 header checksum and RoCEv2 ICRC (see checksums.hpp). The CRC is slice-by-8: a result
// frame's ICRC covers about 300 bytes, which a bytewise table walk would make the costliest step
// of a RoCE result.
#include "checksums.hpp"

#include <array>
#include <cstring>

namespace inagg {
namespace {

using CrcTables = std::array<std::array<uint32_t, 256>, 8>;

CrcTables make_crc_tables() {
    CrcTables t{};
    for (uint32_t i = 0; i < 256; ++i) {
        uint32_t c = i;
        for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i)
        for (size_t s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
    return t;
}

const CrcTables& crc_tables() {
    static const CrcTables tables = make_crc_tables();
    return tables;
}

uint32_t load_le32(const uint8_t* p) {
    return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

constexpr size_t kIpv4Bytes = 20, kUdpBytes = 8, kBthBytes = 12, kIcrcBytes = 4;

}  // namespace

uint32_t crc32(const uint8_t* data, size_t len, uint32_t crc) {
    const CrcTables& t = crc_tables();
    uint32_t c = ~crc;
    for (; len >= 8; data += 8, len -= 8) {
        uint32_t lo = load_le32(data) ^ c, hi = load_le32(data + 4);
        c = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^
            t[3][hi & 0xFF] ^ t[2][(hi >> 8) & 0xFF] ^ t[1][(hi >> 16) & 0xFF] ^ t[0][hi >> 24];
    }
    while (len--) c = t[0][(c ^ *data++) & 0xFF] ^ (c >> 8);
    return ~c;
}

uint16_t ipv4_checksum(const uint8_t* header) {
    uint32_t sum = 0;
    for (size_t i = 0; i < kIpv4Bytes; i += 2) sum += uint32_t(header[i]) << 8 | header[i + 1];
    while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
    return uint16_t(~sum & 0xFFFF);
}

void roce_icrc(const uint8_t* packet, size_t len, uint8_t out[4]) {
    // Fields a router may rewrite are masked to all-ones: TOS, TTL, the IPv4 checksum, the UDP
    // checksum and BTH's resv8a byte; 8 bytes of 0xFF stand in for InfiniBand's LRH.
    static const uint8_t lrh[8] = {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};
    static const uint32_t lrh_crc = crc32(lrh, sizeof lrh);
    constexpr size_t bth = kIpv4Bytes + kUdpBytes, masked_len = bth + kBthBytes;
    uint8_t masked[masked_len];
    std::memcpy(masked, packet, masked_len);
    masked[1] = masked[8] = masked[10] = masked[11] = 0xFF;
    masked[kIpv4Bytes + 6] = masked[kIpv4Bytes + 7] = 0xFF;
    masked[bth + 4] = 0xFF;
    uint32_t c = crc32(masked, masked_len, lrh_crc);
    c = crc32(packet + masked_len, len - masked_len - kIcrcBytes, c);
    for (int i = 0; i < 4; ++i) out[i] = uint8_t(c >> (8 * i));
}

}  // namespace inagg

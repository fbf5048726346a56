// Frame layout the software switch reads and writes: Ethernet / IPv4 (no options) / UDP, then the
// inagg header directly (UDP encapsulation) or after BTH|RETH|ImmDt (RoCEv2), with big-endian
// field access. The twin of the offsets in bmv2_env/pipeline.py and hostlib/roce.py.
#pragma once

#include <cstddef>
#include <cstdint>

namespace inagg::frame {

constexpr size_t kEth = 14, kIp = 20, kUdp = 8;
constexpr size_t kInaggAt = kEth + kIp + kUdp;          // inagg header, UDP encapsulation
constexpr size_t kRoceHeaderBytes = 32;                 // BTH 12 + RETH 16 + ImmDt 4
constexpr size_t kRoceInaggAt = kInaggAt + kRoceHeaderBytes;
constexpr size_t kRoceIcrcBytes = 4;
constexpr size_t kRoceQp = 5;                           // in BTH|RETH|ImmDt
constexpr size_t kRoceRkey = 12 + 8;
constexpr size_t kRoceDmaLen = 12 + 12;
constexpr size_t kInaggHeaderBytes = 16;

constexpr uint16_t kInaggUdpPort = 0xA66A;
constexpr uint16_t kRoceUdpPort = 4791;
constexpr uint8_t kRoceOpcodeUcWriteOnlyImm = 0x2B;
constexpr uint32_t kRoceInaggImmediate = 0x494E4147;     // "INAG"

// protocol.ENCAP_CODE: job_table's encap parameter; 0 = not an inagg frame.
constexpr uint8_t kEncapNone = 0, kEncapUdp = 1, kEncapRoce = 2;

inline uint16_t be16(const uint8_t* p) { return uint16_t(p[0] << 8 | p[1]); }
inline uint32_t be32(const uint8_t* p) {
    return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | p[3];
}
inline uint64_t be48(const uint8_t* p) { return uint64_t(be16(p)) << 32 | be32(p + 2); }
inline void put16(uint8_t* p, uint16_t v) {
    p[0] = uint8_t(v >> 8);
    p[1] = uint8_t(v);
}
inline void put32(uint8_t* p, uint32_t v) {
    put16(p, uint16_t(v >> 16));
    put16(p + 2, uint16_t(v));
}
inline void put48(uint8_t* p, uint64_t v) {
    put16(p, uint16_t(v >> 32));
    put32(p + 2, uint32_t(v));
}

// InaggParser: the encapsulation code when the inagg header follows, else kEncapNone.
inline uint8_t parse_encap(const uint8_t* f, size_t len) {
    if (len < kInaggAt || be16(f + 12) != 0x0800 || f[kEth] != 0x45 ||
        (be16(f + kEth + 6) & 0x1FFF) != 0 || f[kEth + 9] != 17)
        return kEncapNone;
    uint16_t dport = be16(f + kEth + kIp + 2);
    if (dport == kInaggUdpPort) return kEncapUdp;
    if (dport == kRoceUdpPort && len >= kRoceInaggAt && f[kInaggAt] == kRoceOpcodeUcWriteOnlyImm &&
        be32(f + kRoceInaggAt - 4) == kRoceInaggImmediate)
        return kEncapRoce;
    return kEncapNone;
}

}  // namespace inagg::frame

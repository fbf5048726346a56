// Frame layout the software switch reads and writes: Ethernet / IPv4 (no options) / UDP, then the
// inagg header directly (UDP encapsulation) or after BTH|RETH|ImmDt (RoCEv2). The twin of the
// offsets in bmv2_env/softswitch/pipeline_reference.py and hostlib/wire/roce.py; the inagg header's
// own fields and the big-endian loads and stores are protocol.hpp's.
#pragma once

#include <cstddef>
#include <cstdint>

#include "protocol.hpp"

namespace inagg::frame {

constexpr size_t kEth = 14, kIp = 20, kUdp = 8;
// Field offsets in the Ethernet, IPv4 (from the IPv4 header) and UDP (from the UDP header) headers.
constexpr size_t kEthDst = 0, kEthSrc = 6, kEthType = 12;
constexpr size_t kIpTotalLength = 2, kIpFragment = 6, kIpProtocol = 9, kIpChecksum = 10,
                 kIpSrc = 12, kIpDst = 16;
constexpr size_t kUdpSrcPort = 0, kUdpDstPort = 2, kUdpLength = 4, kUdpChecksum = 6;
constexpr size_t kIpAt = kEth, kUdpAt = kEth + kIp;  // where the IPv4 and UDP headers start
constexpr size_t kInaggAt = kEth + kIp + kUdp;       // inagg header, UDP encapsulation
constexpr size_t kRoceHeaderBytes = 32;              // BTH 12 + RETH 16 + ImmDt 4
constexpr size_t kRoceInaggAt = kInaggAt + kRoceHeaderBytes;
constexpr size_t kRoceIcrcBytes = 4;
constexpr size_t kRoceQp = 5;  // in BTH|RETH|ImmDt
constexpr size_t kRoceRkey = 12 + 8;
constexpr size_t kRoceDmaLen = 12 + 12;

constexpr uint16_t kInaggUdpPort = 0xA66A;
constexpr uint16_t kRoceUdpPort = 4791;
constexpr uint8_t kRoceOpcodeUcWriteOnlyImm = 0x2B;
constexpr uint32_t kRoceInaggImmediate = 0x494E4147;  // "INAG"

// protocol.ENCAP_CODE: job_table's encap parameter; 0 = not an inagg frame.
constexpr uint8_t kEncapNone = 0, kEncapUdp = 1, kEncapRoce = 2;

// Where the frame's UDP datagram ends, as its UDP length says.
inline size_t udp_end(const uint8_t* f) { return kUdpAt + load_be16(f + kUdpAt + kUdpLength); }

// The parser reaches UDP: IPv4 without options, not a later fragment, protocol UDP.
inline bool parses_udp(const uint8_t* f, size_t len) {
    return len >= kInaggAt && load_be16(f + kEthType) == 0x0800 && f[kIpAt] == 0x45 &&
           (load_be16(f + kIpAt + kIpFragment) & 0x1FFF) == 0 && f[kIpAt + kIpProtocol] == 17;
}

// InaggParser: the encapsulation code when the inagg header follows, else kEncapNone.
inline uint8_t parse_encap(const uint8_t* f, size_t len) {
    if (!parses_udp(f, len)) return kEncapNone;
    uint16_t dport = load_be16(f + kUdpAt + kUdpDstPort);
    if (dport == kInaggUdpPort) return kEncapUdp;
    if (dport == kRoceUdpPort && len >= kRoceInaggAt && f[kInaggAt] == kRoceOpcodeUcWriteOnlyImm &&
        load_be32(f + kRoceInaggAt - 4) == kRoceInaggImmediate)
        return kEncapRoce;
    return kEncapNone;
}

// A UDP frame to or from `atp_port` (the host aggregator's, AtpPool; 0: none), which the parser
// takes as inagg (UDP) unless parse_encap takes it as RoCE.
inline bool atp_frame(const uint8_t* f, size_t len, uint16_t atp_port) {
    return atp_port && parses_udp(f, len) &&
           (load_be16(f + kUdpAt + kUdpDstPort) == atp_port ||
            load_be16(f + kUdpAt + kUdpSrcPort) == atp_port);
}

}  // namespace inagg::frame

// The checksums a data plane recomputes when it rewrites a frame: the IPv4 header checksum and
// RoCEv2's invariant CRC (ICRC). Twins of hostlib/wire/protocol.py::ipv4_checksum and
// hostlib/wire/roce.py::icrc, byte for byte (CRC-32 as zlib.crc32 computes it).
#pragma once

#include <cstddef>
#include <cstdint>

namespace inagg {

// zlib.crc32(data, crc): chainable, `crc` is the value of the previous call (0 to start).
uint32_t crc32(const uint8_t* data, size_t len, uint32_t crc = 0);

// The checksum field value of a 20-byte IPv4 header, its checksum field counted as it is.
uint16_t ipv4_checksum(const uint8_t* header);

// The 4 ICRC bytes (little-endian, as they go on the wire) of a RoCEv2 packet that starts at its
// 20-byte IPv4 header and is `len` bytes long including the 4-byte ICRC slot at its end.
void roce_icrc(const uint8_t* packet, size_t len, uint8_t out[4]);

}  // namespace inagg

// The wire protocol for the C++ data path: its constants, big-endian loads and stores, and the
// one codec of the 16-byte inagg header. Every file that reads or writes the header (the engine,
// the worker's stream, the switch's pipeline) goes through here, so a field's offset is written
// once. p4/include/headers.p4, constants.p4 and hostlib/wire/protocol.py are the definitions.
// Header-only: native/engine.hpp is a plain C++ API built from engine.cpp alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace inagg {

constexpr uint8_t kVersion = 1;
constexpr uint8_t kMsgContribution = 1;
constexpr uint8_t kMsgResult = 2;
constexpr uint8_t kFlagRetransmit = 0x01;
constexpr uint8_t kFlagFromHost = 0x02;
constexpr uint8_t kFlagCongestion = 0x04;
constexpr uint8_t kFlagOverflow = 0x08;
constexpr uint8_t kFlagFromSwitch = 0x80;  // a switch's partial sum to its parent (docs/trees.md)
// On a contribution (FROM_HOST's bit, which only results carry): the block is wholly in the
// sender's reduce-scatter shard; the aggregator sends the round's values to that owner only and
// the header alone (count kept, no payload: "values elided") to the others
// (inagg.hostlib.wire.protocol.FLAG_MINE; not in the P4 programs yet).
constexpr uint8_t kFlagMine = 0x02;
// The round tag: flags bits 4..6 are no flags but the round's identity beyond its set. Round k
// of a slot (counted from 0 at each grant) goes on set k % 2 with tag (k / 2) % kRoundTags; a
// slot keeps each set's tag, so a copy of another round of the set is stale (docs/protocol.md).
constexpr uint8_t kRoundTagMask = 0x70;
constexpr uint8_t kRoundTagShift = 4;
constexpr uint8_t kRoundTags = 8;
// Rounds of a slot before its (set, tag) pair repeats: the worker's round counter wraps here.
constexpr uint8_t kRoundCycle = 2 * kRoundTags;
inline uint8_t round_tag(uint8_t flags) { return (flags & kRoundTagMask) >> kRoundTagShift; }
// The flags a result can carry (a switch's or the host aggregator's, with its round's tag):
// anything else is forged.
constexpr uint8_t kResultFlags =
    kFlagRetransmit | kFlagFromHost | kFlagCongestion | kFlagOverflow | kRoundTagMask;
// SourceGuard's drop reasons (GUARD_DROP_* of p4/include/constants.p4): its counter's cells.
constexpr size_t kGuardDropAggregatorAddr = 0;
constexpr size_t kGuardDropResult = 1;
constexpr int8_t kExpNone = -128;
constexpr size_t kMaxWorkers = 32;
constexpr size_t kHeaderBytes = 16;
constexpr uint32_t kMaxSlot = (1u << 15) - 1;

// -- big-endian fields ------------------------------------------------------------------------
// Through memcpy and a byte swap: the engine's and the codec's value loops vectorize them. The
// data path runs on little-endian hosts (x86-64, AArch64), as the codec's swaps assume too.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the data path assumes a little-endian host");

inline uint16_t load_be16(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, sizeof v);
    return __builtin_bswap16(v);
}
inline uint32_t load_be32(const uint8_t* p) {
    uint32_t v;
    std::memcpy(&v, p, sizeof v);
    return __builtin_bswap32(v);
}
inline uint64_t load_be48(const uint8_t* p) {
    return uint64_t(load_be16(p)) << 32 | load_be32(p + 2);
}

inline void store_be16(uint8_t* p, uint16_t v) {
    v = __builtin_bswap16(v);
    std::memcpy(p, &v, sizeof v);
}
inline void store_be32(uint8_t* p, uint32_t v) {
    v = __builtin_bswap32(v);
    std::memcpy(p, &v, sizeof v);
}
inline void store_be48(uint8_t* p, uint64_t v) {
    store_be16(p, uint16_t(v >> 32));
    store_be32(p + 2, uint32_t(v));
}

// -- the inagg header (inagg.hostlib.wire.protocol.HEADER_FIELDS)
// ----------------------------------------

// Byte offsets of the header's fields.
namespace field {
constexpr size_t kVersionType = 0;  // version << 4 | msg_type
constexpr size_t kFlags = 1;
constexpr size_t kJob = 2;
constexpr size_t kWorker = 4;
constexpr size_t kExp = 5;
constexpr size_t kEpoch = 6;
constexpr size_t kSlotSet = 8;  // set << 15 | slot
constexpr size_t kCount = 10;
constexpr size_t kOffset = 12;
}  // namespace field

struct Header {
    uint8_t version = kVersion, msg_type = 0, flags = 0;
    uint16_t job = 0;
    uint8_t worker = 0;
    int8_t exp = kExpNone;
    uint16_t epoch = 0;
    uint8_t set = 0;    // the slot's shadow set, 0 or 1
    uint32_t slot = 0;  // 0..kMaxSlot
    uint16_t count = 0;
    uint32_t offset = 0;
};

// The fields of a header that needs no other field: single reads for the checks that come first.
inline uint8_t header_version(const uint8_t* p) { return p[field::kVersionType] >> 4; }
inline uint16_t header_job(const uint8_t* p) { return load_be16(p + field::kJob); }
inline uint8_t header_worker(const uint8_t* p) { return p[field::kWorker]; }

// `p`: at least kHeaderBytes.
inline Header read_header(const uint8_t* p) {
    Header h;
    h.version = header_version(p);
    h.msg_type = p[field::kVersionType] & 0xF;
    h.flags = p[field::kFlags];
    h.job = header_job(p);
    h.worker = header_worker(p);
    h.exp = static_cast<int8_t>(p[field::kExp]);
    h.epoch = load_be16(p + field::kEpoch);
    uint16_t slot_set = load_be16(p + field::kSlotSet);
    h.set = static_cast<uint8_t>(slot_set >> 15);
    h.slot = slot_set & kMaxSlot;
    h.count = load_be16(p + field::kCount);
    h.offset = load_be32(p + field::kOffset);
    return h;
}

inline void write_header(uint8_t* p, const Header& h) {
    p[field::kVersionType] = static_cast<uint8_t>(h.version << 4 | h.msg_type);
    p[field::kFlags] = h.flags;
    store_be16(p + field::kJob, h.job);
    p[field::kWorker] = h.worker;
    p[field::kExp] = static_cast<uint8_t>(h.exp);
    store_be16(p + field::kEpoch, h.epoch);
    store_be16(p + field::kSlotSet, static_cast<uint16_t>(h.set << 15 | (h.slot & kMaxSlot)));
    store_be16(p + field::kCount, h.count);
    store_be32(p + field::kOffset, h.offset);
}

}  // namespace inagg

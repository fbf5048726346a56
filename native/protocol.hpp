// The wire protocol's constants for the C++ data path: the worker's stream and codec need them
// without the slot engine, the engine and the switch with it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace inagg {

// Wire protocol (p4/include/constants.p4 and hostlib/protocol.py are the definitions).
constexpr uint8_t kVersion = 1;
constexpr uint8_t kMsgContribution = 1;
constexpr uint8_t kMsgResult = 2;
constexpr uint8_t kFlagRetransmit = 0x01;
constexpr uint8_t kFlagFromHost = 0x02;
constexpr uint8_t kFlagCongestion = 0x04;
constexpr uint8_t kFlagOverflow = 0x08;
constexpr int8_t kExpNone = -128;
constexpr size_t kMaxWorkers = 32;
constexpr size_t kHeaderBytes = 16;
constexpr uint32_t kMaxSlot = (1u << 15) - 1;

}  // namespace inagg

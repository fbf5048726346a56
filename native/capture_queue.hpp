// The frames the software switch's packet loop captures (--pcap), on their way to Python: the
// loop copies each captured frame here and bmv2_env/softswitch/switch.py drains the queue every few
// tens of milliseconds into pcap files with scapy's writer, the one pcap writer of both packet
// loops. The queue is bounded (bytes of frames waiting): when the writer falls behind, a frame
// that does not fit is counted as dropped from the capture rather than holding the data path.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace inagg {

// Captured frames in the order the loop saw them; their bytes back to back in `bytes`.
struct CaptureBatch {
    struct Record {
        uint16_t port;
        bool sent;      // false: the frame entered `port`; true: it left by it
        int64_t usec;   // when the loop handled it, microseconds since the Unix epoch
        size_t offset;  // into `bytes`
        size_t len;
    };
    std::vector<Record> records;
    std::vector<uint8_t> bytes;

    void clear() {
        records.clear();
        bytes.clear();
    }
};

class CaptureQueue {
public:
    explicit CaptureQueue(size_t capacity_bytes) : capacity_bytes_(capacity_bytes) {}

    // The packet loop's side: copy one frame in, or count it dropped if it does not fit.
    void push(uint16_t port, bool sent, int64_t usec, const uint8_t* frame, size_t len);
    // The drainer's side: everything pushed since the last take, moved into `into` (whose
    // previous content is discarded); the queue is empty again.
    void take(CaptureBatch& into);
    uint64_t dropped() const { return dropped_; }

private:
    const size_t capacity_bytes_;
    std::mutex mutex_;  // guards pending_; held for a copy (push) or a swap (take), no file I/O
    CaptureBatch pending_;
    std::atomic<uint64_t> dropped_{0};
};

}  // namespace inagg

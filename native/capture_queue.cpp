// The packet loop's capture queue (see capture_queue.hpp).
#include "capture_queue.hpp"

#include <utility>

namespace inagg {

void CaptureQueue::push(uint16_t port, bool sent, int64_t usec, const uint8_t* frame, size_t len) {
    std::lock_guard<std::mutex> lock(mutex_);
    size_t offset = pending_.bytes.size();
    if (len > capacity_bytes_ - offset) {  // offset <= capacity_bytes_ always
        dropped_ += 1;
        return;
    }
    pending_.bytes.insert(pending_.bytes.end(), frame, frame + len);
    pending_.records.push_back(CaptureBatch::Record{port, sent, usec, offset, len});
}

void CaptureQueue::take(CaptureBatch& into) {
    into.clear();
    std::lock_guard<std::mutex> lock(mutex_);
    std::swap(pending_, into);  // `into`'s buffers, emptied, take the next frames
}

}  // namespace inagg

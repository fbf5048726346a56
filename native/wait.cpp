// Waiting on the data path's descriptors under net.hpp's error policy (see wait.hpp for why).
#include "wait.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>

#include "net.hpp"

namespace inagg {
namespace {

// ppoll on fds[0..n) (fds[i] called names[i] in errors), at most `seconds`: whether one is
// ready. The one place the data path blocks on a descriptor.
bool poll_ready(pollfd* fds, size_t n, double seconds, const std::string* names) {
    timespec limit{};
    if (seconds > 0 && seconds != kNoLimit) {
        limit.tv_sec = static_cast<time_t>(seconds);
        double fraction = seconds - static_cast<double>(limit.tv_sec);
        limit.tv_nsec = std::min(static_cast<long>(fraction * 1e9), 999999999L);
    }
    int ready = ppoll(fds, n, seconds == kNoLimit ? nullptr : &limit, nullptr);
    if (ready < 0) {
        if (errno == EINTR) return false;
        std::string all;
        for (size_t i = 0; i < n; ++i) all += (i ? ", " : "") + names[i];
        throw os_error("ppoll on " + all);
    }
    for (size_t i = 0; i < n; ++i)
        if (fds[i].revents & POLLNVAL) throw os_error("ppoll on " + names[i], EBADF);
    return ready > 0;
}

}  // namespace

Wakeup::Wakeup() : fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
    if (fd_ < 0) throw os_error("eventfd");
    name_ = "wake-up eventfd (fd " + std::to_string(fd_) + ")";
}

// close() of our own eventfd fails only for a descriptor that is not open (EBADF), which the
// destructor of the object that opened it cannot mend; Linux frees the descriptor on EINTR too.
Wakeup::~Wakeup() { close(fd_); }

void Wakeup::signal() const {
    uint64_t one = 1;
    while (write(fd_, &one, sizeof one) < 0) {
        if (errno == EAGAIN) return;  // the count is full: a wake-up is pending
        if (errno != EINTR) throw os_error("write on " + name_);
    }
}

void Wakeup::clear() const {
    uint64_t count;
    while (read(fd_, &count, sizeof count) < 0) {
        if (errno == EAGAIN) return;  // none was pending
        if (errno != EINTR) throw os_error("read on " + name_);
    }
}

size_t WaitSet::add(int fd, short events, std::string name) {
    fds_.push_back(pollfd{fd, events, 0});
    names_.push_back(std::move(name));
    return fds_.size() - 1;
}

bool WaitSet::wait(double seconds) {
    return poll_ready(fds_.data(), fds_.size(), seconds, names_.data());
}

bool wait_ready(int fd, short events, double seconds, const std::string& name) {
    pollfd p{fd, events, 0};
    return poll_ready(&p, 1, seconds, &name);
}

}  // namespace inagg

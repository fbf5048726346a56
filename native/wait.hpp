// Waiting on the data path's descriptors, written once: the host aggregator's loop
// (host_loop.cpp), the software switch's loop (switch_loop.cpp) and every Socket::wait (net.cpp:
// the worker's stream when its socket does not block, a sender waiting for room) block in ppoll
// here, and a loop's stop() wakes it through a Wakeup.
//
// Why a file of its own: waiting and waking are one concern beside net.hpp's socket I/O, used by
// it and by both loops, so there is one mechanism and one place where its results are checked,
// under net.hpp's error policy:
// - EINTR: the wait returns with nothing ready; callers wait again (their state may have changed).
// - A descriptor that is not open (POLLNVAL): std::system_error(EBADF), "ppoll on <its name>":
//   a socket closed under a loop is an error at its next wait, not silence.
// - A wake-up already pending (EAGAIN writing the eventfd: its count is full) is a wake-up; none
//   to take (EAGAIN reading it) is none.
// - Any other error: std::system_error with its errno, naming the call and the descriptors.
// ppoll rather than epoll: a loop waits on a handful of descriptors (the switch: one per port
// socket, all added before it starts), the stream on one, with timeouts finer than a millisecond.
#pragma once

#include <poll.h>

#include <limits>
#include <string>
#include <vector>

namespace inagg {

// A wait's `seconds` with no limit: until a descriptor is ready (0 or less: do not block).
constexpr double kNoLimit = std::numeric_limits<double>::infinity();

// An eventfd that makes a wait on it return: stop() of a loop waiting in another thread.
class Wakeup {
public:
    Wakeup();  // throws std::system_error when the eventfd cannot be made
    ~Wakeup();
    Wakeup(const Wakeup&) = delete;
    Wakeup& operator=(const Wakeup&) = delete;

    int fd() const { return fd_; }
    const std::string& name() const { return name_; }  // "wake-up eventfd (fd 9)"
    // Make a wait on fd() return (from any thread); it stays readable until clear().
    void signal() const;
    // Take the pending wake-up, if any, so that the next wait blocks again.
    void clear() const;

private:
    int fd_;
    std::string name_;
};

// The descriptors one thread waits on, each for its events (POLLIN, POLLOUT), each with its name
// for errors.
class WaitSet {
public:
    // Its index in ready(). Not while another thread waits.
    size_t add(int fd, short events, std::string name);
    // Block until a descriptor is ready or `seconds` pass. False: none is (the time passed, or
    // a signal came first). Throws std::system_error as above.
    bool wait(double seconds = kNoLimit);
    // Whether descriptor i was ready (or has an error or hang-up to read) at the last wait.
    bool ready(size_t i) const { return fds_[i].revents != 0; }

private:
    std::vector<pollfd> fds_;
    std::vector<std::string> names_;
};

// Wait until `fd` (called `name` in errors) is ready for `events`, at most `seconds`: whether
// it is. The one-descriptor WaitSet, without building one.
bool wait_ready(int fd, short events, double seconds, const std::string& name);

}  // namespace inagg

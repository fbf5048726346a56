// The data path's socket I/O, written once: the worker's stream (stream.cpp), the host
// aggregator's loop (host_loop.cpp) and the software switch's loop (switch_loop.cpp) all receive
// and send through a Socket, in recvmmsg/sendmmsg batches (sends as UDP GSO runs where the kernel
// takes them, send_batch.hpp), under one error policy:
//
// - EINTR: the call is made again.
// - EAGAIN/EWOULDBLOCK on a receive: nothing is waiting (0 datagrams).
// - EAGAIN/EWOULDBLOCK/ENOBUFS on a send: the send queue (ENOBUFS: a device's queue) is full.
//   The sender waits for room (poll for writability) for at most kSendWait without progress,
//   then gives up on the datagrams the kernel did not take: send() returns how many it took and
//   the caller counts the rest as lost (the stream's loss detection resends them, the loops count
//   them in send_errors). A full queue holds a loop back for a while, never for good.
// - An error about one datagram's destination (EMSGSIZE, EHOSTUNREACH, ENETUNREACH,
//   ECONNREFUSED, EPERM, EACCES, EADDRNOTAVAIL): that datagram is skipped and reported in
//   SendResult, the rest of the batch still goes. The caller decides: the worker's stream has one
//   destination, the aggregator, and raises; the loops serve many tenants, so one tenant's bad
//   destination is counted in send_errors and never stops the others.
// - Any other error: std::system_error with its errno, naming the call and the socket, e.g.
//   "recvmmsg on socket 127.0.0.1:5000 (fd 7)": a broken socket is an error at once, not
//   silence until a timeout or a datagram quietly counted. Python sees an OSError with that
//   errno (bindings.cpp translates it); the switch's loop thread hands it to stop().
// Waiting on a socket (Socket::wait, the loops' waits for datagrams and for stop()) is wait.hpp's,
// under this same policy.
#pragma once

#include <linux/if_packet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "send_batch.hpp"

namespace inagg {

// How long a full send queue may hold a sender without the kernel taking a datagram.
constexpr std::chrono::milliseconds kSendWait{200};

// An operating system call failed: std::system_error of `err`, its what() "<what>: <strerror>".
std::system_error os_error(const std::string& what, int err = errno);

// Room for `count` received datagrams or frames: slot i holds `headroom` bytes (for the caller
// to write in front of the datagram: the switch puts the frame's headers there), then up to
// `capacity` received bytes.
class RecvBatch {
public:
    RecvBatch(size_t count = 0, size_t capacity = 0, size_t headroom = 0);

    size_t size() const { return received_; }  // how many the last receive took
    uint8_t* slot(size_t i) { return buffer_.get() + i * (headroom_ + capacity_); }
    const uint8_t* data(size_t i) const {
        return buffer_.get() + i * (headroom_ + capacity_) + headroom_;
    }
    size_t len(size_t i) const { return msgs_[i].msg_len; }
    bool truncated(size_t i) const { return msgs_[i].msg_hdr.msg_flags & MSG_TRUNC; }
    // The sender of datagram i on an IPv4 socket (sin_family AF_UNSPEC when none came).
    const sockaddr_in& from(size_t i) const { return addrs_[i].in; }
    // Where frame i of a packet socket came from (sll_pkttype: PACKET_OUTGOING for our own).
    const sockaddr_ll& link(size_t i) const { return addrs_[i].ll; }

private:
    friend class Socket;
    mmsghdr* prepare();
    void received(size_t n);

    union Address {
        sockaddr_in in;
        sockaddr_ll ll;
    };
    size_t count_, capacity_, headroom_, received_ = 0;
    std::unique_ptr<uint8_t[]> buffer_;  // not zero-filled
    std::vector<iovec> iov_;
    std::vector<mmsghdr> msgs_;
    std::vector<Address> addrs_;
};

// What Socket::send did with a batch: datagrams the kernel took, datagrams it refused for their
// destination (the errno of the last refusal in `refusal`); the rest were lost to a full queue.
struct SendResult {
    size_t sent = 0;
    size_t refused = 0;
    int refusal = 0;
};

// A datagram or packet socket the caller opened and owns (open while this lives; not closed
// here), with its name for errors and its send batch.
class Socket {
public:
    explicit Socket(int fd);
    int fd() const { return fd_; }
    const std::string& name() const { return name_; }  // "socket 127.0.0.1:5000 (fd 7)"

    // recvmmsg into `batch` with `flags` (MSG_DONTWAIT, MSG_WAITFORONE): how many came, 0 when
    // none was waiting (EAGAIN) or a signal came first (EINTR). Throws std::system_error else.
    size_t receive(RecvBatch& batch, int flags);
    // Send `dgs` (reordered as SendBatch::prepare groups them) under the policy above. Throws
    // std::system_error on an error of the socket itself.
    SendResult send(std::vector<Datagram>& dgs);
    // Wait until the socket is ready for `events` (POLLIN, POLLOUT), at most `seconds` (0 or
    // less: do not block): whether it is (wait.hpp: the one way the data path waits).
    bool wait(short events, double seconds) const;

private:
    bool wait_for_room(int err, std::chrono::steady_clock::time_point deadline) const;

    int fd_;
    std::string name_;
    SendBatch batch_;
};

}  // namespace inagg

// The data path's socket I/O and its error policy (see net.hpp).
#include "net.hpp"

#include <arpa/inet.h>
#include <net/if.h>

#include <algorithm>
#include <cerrno>
#include <thread>

#include "wait.hpp"

namespace inagg {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMaxMessages = 1024;  // UIO_MAXIOV: messages per sendmmsg call

// "socket 127.0.0.1:5000 (fd 7)", "packet socket on veth1 (fd 9)", "socket (fd 7)".
std::string socket_name(int fd) {
    std::string name = "socket";
    sockaddr_storage a{};
    socklen_t size = sizeof a;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&a), &size) == 0 && a.ss_family == AF_INET) {
        const auto& in = reinterpret_cast<const sockaddr_in&>(a);
        char ip[INET_ADDRSTRLEN] = "?";
        inet_ntop(AF_INET, &in.sin_addr, ip, sizeof ip);
        name += " " + std::string(ip) + ":" + std::to_string(ntohs(in.sin_port));
    } else if (a.ss_family == AF_PACKET) {
        char ifname[IF_NAMESIZE] = "?";
        if_indextoname(reinterpret_cast<const sockaddr_ll&>(a).sll_ifindex, ifname);
        name = "packet socket on " + std::string(ifname);
    }
    return name + " (fd " + std::to_string(fd) + ")";
}

bool queue_full(int err) { return err == EAGAIN || err == EWOULDBLOCK || err == ENOBUFS; }

// The kernel refused one datagram for where it goes (too large for the path, no route, a firewall
// rule, an ICMP error on a connected socket), not for the socket: the next one may well go.
bool destination_refused(int err) {
    switch (err) {
        case EMSGSIZE:
        case EHOSTUNREACH:
        case ENETUNREACH:
        case ECONNREFUSED:
        case EPERM:
        case EACCES:
        case EADDRNOTAVAIL: return true;
        default: return false;
    }
}

}  // namespace

std::system_error os_error(const std::string& what, int err) {
    return std::system_error(err, std::generic_category(), what);
}

RecvBatch::RecvBatch(size_t count, size_t capacity, size_t headroom)
    : count_(count), capacity_(capacity), headroom_(headroom),
      buffer_(new uint8_t[count * (headroom + capacity)]), iov_(count), msgs_(count),
      addrs_(count) {}

mmsghdr* RecvBatch::prepare() {
    for (size_t i = 0; i < count_; ++i) {
        iov_[i] = iovec{slot(i) + headroom_, capacity_};
        msgs_[i] = mmsghdr{};
        msgs_[i].msg_hdr.msg_iov = &iov_[i];
        msgs_[i].msg_hdr.msg_iovlen = 1;
        msgs_[i].msg_hdr.msg_name = &addrs_[i];
        msgs_[i].msg_hdr.msg_namelen = sizeof addrs_[i];
    }
    received_ = 0;
    return msgs_.data();
}

void RecvBatch::received(size_t n) {
    received_ = n;
    for (size_t i = 0; i < n; ++i)
        if (msgs_[i].msg_hdr.msg_namelen == 0) addrs_[i] = Address{};  // no sender address came
}

Socket::Socket(int fd) : fd_(fd), name_(socket_name(fd)), batch_(udp_gso_supported(fd)) {}

size_t Socket::receive(RecvBatch& batch, int flags) {
    int n = recvmmsg(fd_, batch.prepare(), static_cast<unsigned>(batch.count_), flags, nullptr);
    if (n < 0) {
        int err = errno;
        if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR) return 0;
        throw os_error("recvmmsg on " + name_, err);
    }
    batch.received(static_cast<size_t>(n));
    return static_cast<size_t>(n);
}

SendResult Socket::send(std::vector<Datagram>& dgs) {
    size_t n = batch_.prepare(dgs), done = 0;
    SendResult result;
    Clock::time_point deadline{};  // set while the queue is full
    while (done < n) {
        auto chunk = static_cast<unsigned>(std::min(n - done, kMaxMessages));
        int took = sendmmsg(fd_, batch_.messages() + done, chunk, MSG_DONTWAIT);
        if (took > 0) {
            for (size_t m = done; m < done + size_t(took); ++m)
                result.sent += batch_.datagram_counts()[m];
            done += size_t(took);
            deadline = {};
            continue;
        }
        int err = errno;
        if (err == EINTR) continue;
        if (destination_refused(err)) {  // message `done` alone: skip it, send the rest
            result.refused += batch_.datagram_counts()[done++];
            result.refusal = err;
            continue;
        }
        if (!queue_full(err)) throw os_error("sendmmsg on " + name_, err);
        if (deadline == Clock::time_point{}) deadline = Clock::now() + kSendWait;
        if (!wait_for_room(err, deadline)) break;
    }
    return result;
}

// The send queue is full: wait for room, until `deadline` at the latest (false: it passed).
// ENOBUFS is a device's queue, which poll cannot wait for: a short sleep instead.
bool Socket::wait_for_room(int err, Clock::time_point deadline) const {
    Clock::time_point now = Clock::now();
    if (now >= deadline) return false;
    if (err == ENOBUFS) {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    } else {
        wait(POLLOUT, std::chrono::duration<double>(deadline - now).count());
    }
    return true;
}

bool Socket::wait(short events, double seconds) const {
    return wait_ready(fd_, events, seconds, name_);
}

}  // namespace inagg

// The host aggregator's packet loop (see host_loop.hpp for why). Linux only: recvmmsg,
// sendmmsg, poll and an eventfd to wake the loop for stop().
#include "host_loop.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <stdexcept>
#include <system_error>
#include <vector>

#include "udp_batch.hpp"

namespace inagg {
namespace {

constexpr size_t kBatch = 64;               // datagrams per recvmmsg
constexpr size_t kMaxDatagram = 65536;      // the largest UDP payload fits
constexpr unsigned kSendChunk = 1024;       // UIO_MAXIOV: messages per sendmmsg

std::system_error os_error(const char* what) {
    return std::system_error(errno, std::generic_category(), what);
}

SenderId sender_of(const sockaddr_in& addr) {
    if (addr.sin_family != AF_INET) {
        return 0;  // matches no member: members are IPv4:port
    }
    return sender_id_ipv4(ntohl(addr.sin_addr.s_addr), ntohs(addr.sin_port));
}

sockaddr_in address_of(SenderId member) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(static_cast<uint32_t>(member >> 16));
    addr.sin_port = htons(static_cast<uint16_t>(member & 0xFFFF));
    return addr;
}

}  // namespace

struct HostLoop::Buffers {
    std::vector<uint8_t> rx = std::vector<uint8_t>(kBatch * kMaxDatagram);
    std::vector<sockaddr_in> sources = std::vector<sockaddr_in>(kBatch);
    std::vector<iovec> rx_iov = std::vector<iovec>(kBatch);
    std::vector<mmsghdr> rx_msgs = std::vector<mmsghdr>(kBatch);
    std::vector<uint8_t> results;      // this batch's results: one max-size place per datagram
    struct Outgoing {
        size_t at, length;
        sockaddr_in to;
    };
    std::vector<Outgoing> out;
    std::vector<Datagram> datagrams;   // out, as the datagrams to send
    UdpBatch tx;                       // their messages: GSO sends where the socket takes them

    void prepare_receive() {
        for (size_t i = 0; i < kBatch; ++i) {
            rx_iov[i] = iovec{rx.data() + i * kMaxDatagram, kMaxDatagram};
            rx_msgs[i] = mmsghdr{};
            rx_msgs[i].msg_hdr.msg_iov = &rx_iov[i];
            rx_msgs[i].msg_hdr.msg_iovlen = 1;
            rx_msgs[i].msg_hdr.msg_name = &sources[i];
            rx_msgs[i].msg_hdr.msg_namelen = sizeof(sockaddr_in);
        }
    }
};

HostLoop::HostLoop(Engine& engine, int fd, double drop_rate, uint64_t seed)
    : engine_(engine), fd_(fd), wake_fd_(-1), drop_rate_(drop_rate), rng_(seed),
      buffers_(std::make_unique<Buffers>()) {
    if (!(drop_rate >= 0.0 && drop_rate < 1.0)) {
        throw std::invalid_argument("drop rate must be in [0, 1), got " + std::to_string(drop_rate));
    }
    buffers_->tx = UdpBatch(udp_gso_supported(fd));
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) {
        throw os_error("eventfd");
    }
}

HostLoop::~HostLoop() { close(wake_fd_); }

void HostLoop::stop() {
    running_.store(false);
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof one);
}

bool HostLoop::lost() {
    if (drop_rate_ > 0.0 && uniform_(rng_) < drop_rate_) {
        injected_drops_ += 1;
        return true;
    }
    return false;
}

void HostLoop::run() {
    Buffers& b = *buffers_;
    pollfd fds[2] = {{fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    while (running_.load()) {
        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR) {
                continue;
            }
            throw os_error("poll");
        }
        if (!running_.load()) {
            break;
        }
        b.prepare_receive();
        int n = recvmmsg(fd_, b.rx_msgs.data(), kBatch, MSG_DONTWAIT, nullptr);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
                continue;
            }
            throw os_error("recvmmsg");
        }
        serve_batch(n);
        send_all();
    }
}

// The engine's answer to each received datagram, queued for sending.
void HostLoop::serve_batch(int received) {
    Buffers& b = *buffers_;
    b.results.resize(kBatch * engine_.max_result_bytes());  // allocated once: K never changes
    b.out.clear();
    std::lock_guard<std::mutex> lock(engine_.mutex());
    for (int i = 0; i < received; ++i) {
        if (lost()) {
            continue;
        }
        size_t at = static_cast<size_t>(i) * engine_.max_result_bytes();
        Emit emit = engine_.process(b.rx.data() + i * kMaxDatagram, b.rx_msgs[i].msg_len,
                                    sender_of(b.sources[i]), true, b.results.data() + at);
        if (!emit.length) {
            continue;
        }
        const std::vector<SenderId>& members = engine_.job(emit.job)->members;
        size_t first = emit.rank < 0 ? 0 : static_cast<size_t>(emit.rank);
        size_t end = emit.rank < 0 ? members.size() : first + 1;
        for (size_t r = first; r < end; ++r) {
            if (!lost()) {
                b.out.push_back(Buffers::Outgoing{at, emit.length, address_of(members[r])});
            }
        }
    }
}

// A batch's results, each destination's in order and, where the kernel takes UDP_SEGMENT, its
// runs as one GSO send (native/udp_batch.hpp): a slot's results to a worker walk the stack once.
void HostLoop::send_all() {
    Buffers& b = *buffers_;
    b.datagrams.clear();
    for (const Buffers::Outgoing& o : b.out)
        b.datagrams.push_back(Datagram{o.to, b.results.data() + o.at, o.length});
    size_t n = b.tx.prepare(b.datagrams), done = 0;
    while (done < n) {
        unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - done, kSendChunk));
        int sent = sendmmsg(fd_, b.tx.messages() + done, chunk, 0);
        if (sent > 0) {
            done += static_cast<size_t>(sent);
        } else if (sent < 0 && errno == EINTR) {
            continue;
        } else {  // these datagrams cannot go (too large, no route, ...): count them, send the rest
            send_errors_ += b.tx.datagram_counts()[done];
            done += 1;
        }
    }
}

}  // namespace inagg

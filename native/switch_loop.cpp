// The software switch's packet loop (see switch_loop.hpp).
#include "switch_loop.hpp"

#include <arpa/inet.h>
#include <linux/if_packet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <system_error>

#include "checksums.hpp"
#include "switch_frame.hpp"
#include "udp_batch.hpp"

namespace inagg {

using namespace frame;

namespace {

constexpr size_t kFrameBytes = 65536;          // the largest datagram or frame a port takes
constexpr size_t kSlotBytes = kInaggAt + kFrameBytes;  // + room for the headers a UDP port adds
constexpr int kSendWaitMs = 200;               // how long a full send queue may block the loop
constexpr uint8_t kUdpSwitchMac[6] = {0, 0, 0, 0, 0, 0xFE};

std::system_error os_error(const char* what) {
    return std::system_error(errno, std::generic_category(), what);
}

// The frame host `src` would have sent for a datagram of `len` bytes from src:sport to the
// switch at dst (UdpPorts.recv in bmv2_env/soft_switch.py): written into the kInaggAt bytes
// before the datagram.
void write_udp_headers(uint8_t* f, uint32_t src, uint16_t sport, uint32_t dst, size_t len) {
    std::memcpy(f, kUdpSwitchMac, 6);
    f[6] = 0x02;
    f[7] = 0x00;
    store_be32(f + 8, src);
    store_be16(f + 12, 0x0800);
    uint8_t* ip = f + kEth;
    const uint8_t fixed[12] = {0x45, 0, 0, 0, 0, 0, 0, 0, 64, 17, 0, 0};
    std::memcpy(ip, fixed, sizeof fixed);
    store_be16(ip + 2, uint16_t(kIp + kUdp + len));
    store_be32(ip + 12, src);
    store_be32(ip + 16, dst);
    store_be16(ip + 10, ipv4_checksum(ip));
    uint8_t* udp = ip + kIp;
    store_be16(udp, sport);
    store_be16(udp + 2, kInaggUdpPort);
    store_be16(udp + 4, uint16_t(kUdp + len));
    store_be16(udp + 6, 0);
}

}  // namespace

struct SwitchLoop::Socket {
    enum class Kind { udp, raw };

    Socket(Kind kind, int fd) : kind(kind), fd(fd), buffers(new uint8_t[kBatch * kSlotBytes]) {
        for (size_t i = 0; i < kBatch; ++i) {
            iov[i].iov_base = slot(i) + (kind == Kind::udp ? kInaggAt : 0);
            iov[i].iov_len = kFrameBytes;
        }
    }
    uint8_t* slot(size_t i) { return buffers.get() + i * kSlotBytes; }

    Kind kind;
    int fd;
    uint16_t port = 0;                                // raw: its switch port
    uint32_t bind_addr = 0;                           // udp: the switch's address
    std::unordered_map<uint32_t, uint16_t> port_of;   // udp: host IPv4 -> switch port
    std::unique_ptr<uint8_t[]> buffers;               // kBatch receive slots (not zero-filled)
    iovec iov[kBatch];
    mmsghdr msgs[kBatch];
    union {
        sockaddr_in in;
        sockaddr_ll ll;
    } addrs[kBatch];
    std::vector<size_t> pending;                      // out_ frames leaving by this socket
    std::vector<Datagram> datagrams;                  // udp: the frames leaving, as datagrams
    UdpBatch udp_batch;                               // udp: their messages (GSO where it can)
    std::vector<mmsghdr> send_msgs;                   // raw: one message per frame
    std::vector<iovec> send_iov;
};

SwitchLoop::SwitchLoop(size_t capture_bytes) : captures_(capture_bytes) {
    if (capture_bytes == 0) throw std::invalid_argument("switch loop: capture_bytes must be > 0");
    epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
    wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (epoll_fd_ < 0 || wake_fd_ < 0) throw os_error("switch loop: epoll/eventfd");
    watch(wake_fd_, nullptr);
}

void SwitchLoop::watch(int fd, Socket* sock) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = sock;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) throw os_error("epoll_ctl");
}

SwitchLoop::~SwitchLoop() {
    stop();
    close(epoll_fd_);
    close(wake_fd_);
}

void SwitchLoop::add_udp_ports(int fd, uint32_t bind_addr,
                               const std::vector<std::pair<uint32_t, uint16_t>>& peers) {
    auto sock = std::make_unique<Socket>(Socket::Kind::udp, fd);
    sock->bind_addr = bind_addr;
    sock->udp_batch = UdpBatch(udp_gso_supported(fd));
    for (const auto& [addr, port] : peers) {
        sock->port_of[addr] = port;
        by_port_[port] = sock.get();
    }
    watch(fd, sock.get());
    sockets_.push_back(std::move(sock));
}

void SwitchLoop::add_raw_port(int fd, uint16_t port) {
    auto sock = std::make_unique<Socket>(Socket::Kind::raw, fd);
    sock->port = port;
    by_port_[port] = sock.get();
    watch(fd, sock.get());
    sockets_.push_back(std::move(sock));
}

void SwitchLoop::capture(uint16_t port) {
    if (running_) throw std::logic_error("capture() while the switch loop runs");
    captured_ports_.insert(port);
}

void SwitchLoop::record(uint16_t port, bool sent, const uint8_t* frame, size_t len) {
    if (captured_ports_.empty() || captured_ports_.count(port) == 0) return;  // off: one branch
    int64_t usec = std::chrono::duration_cast<std::chrono::microseconds>(
                       std::chrono::system_clock::now().time_since_epoch()).count();
    captures_.push(port, sent, usec, frame, len);
}

void SwitchLoop::set_pipeline(std::shared_ptr<SwitchPipeline> pipeline) {
    std::lock_guard<std::mutex> lock(pipeline_mutex_);
    pipeline_ = std::move(pipeline);
}

void SwitchLoop::start() {
    if (running_.exchange(true)) throw std::logic_error("the switch loop is already running");
    if (thread_.joinable()) thread_.join();  // a loop that stopped by itself
    thread_ = std::thread([this] { run(); });
}

void SwitchLoop::stop() {
    running_ = false;
    uint64_t one = 1;
    if (write(wake_fd_, &one, sizeof one) < 0 && errno != EAGAIN) perror("switch loop: wake");
    if (thread_.joinable()) thread_.join();
}

void SwitchLoop::run() {
    epoll_event events[16];
    try {
        while (running_) {
            int n = epoll_wait(epoll_fd_, events, 16, -1);
            if (n < 0 && errno != EINTR) throw os_error("epoll_wait");
            for (int i = 0; i < n && running_; ++i) {
                if (events[i].data.ptr) {
                    receive_batch(*static_cast<Socket*>(events[i].data.ptr));
                } else {  // stop(): consume the wake-up, so a later start() waits again
                    uint64_t count;
                    if (read(wake_fd_, &count, sizeof count) < 0 && errno != EAGAIN)
                        throw os_error("switch loop: wake");
                }
            }
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "inagg-soft-switch: packet loop stopped: %s\n", e.what());
        running_ = false;
    }
}

void SwitchLoop::receive_batch(Socket& sock) {
    for (size_t i = 0; i < kBatch; ++i) {
        sock.msgs[i] = mmsghdr{};
        sock.msgs[i].msg_hdr.msg_iov = &sock.iov[i];
        sock.msgs[i].msg_hdr.msg_iovlen = 1;
        sock.msgs[i].msg_hdr.msg_name = &sock.addrs[i];
        sock.msgs[i].msg_hdr.msg_namelen = sizeof sock.addrs[i];
    }
    int n = recvmmsg(sock.fd, sock.msgs, kBatch, MSG_DONTWAIT, nullptr);
    if (n <= 0) {
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            throw os_error("recvmmsg");
        return;
    }
    stats_.wakeups += 1;
    stats_.received += uint64_t(n);
    std::shared_ptr<SwitchPipeline> pipeline;
    {
        std::lock_guard<std::mutex> lock(pipeline_mutex_);
        pipeline = pipeline_;
    }
    if (!pipeline) return;
    {
        std::lock_guard<std::recursive_mutex> lock(pipeline->mutex());
        for (int i = 0; i < n; ++i) {
            const msghdr& h = sock.msgs[i].msg_hdr;
            size_t len = sock.msgs[i].msg_len;
            if (h.msg_flags & MSG_TRUNC) continue;
            uint8_t* f = sock.slot(size_t(i));
            if (sock.kind == Socket::Kind::raw) {
                if (sock.addrs[i].ll.sll_pkttype == PACKET_OUTGOING) continue;  // our own sends
                record(sock.port, false, f, len);
                pipeline->process(sock.port, f, len, out_);
                continue;
            }
            uint32_t src = ntohl(sock.addrs[i].in.sin_addr.s_addr);
            auto port = sock.port_of.find(src);
            if (port == sock.port_of.end()) {
                stats_.unknown_peer += 1;
                continue;
            }
            write_udp_headers(f, src, ntohs(sock.addrs[i].in.sin_port), sock.bind_addr, len);
            record(port->second, false, f, kInaggAt + len);
            pipeline->process(port->second, f, kInaggAt + len, out_);
        }
    }
    send_outputs();
}

void SwitchLoop::send_outputs() {
    for (size_t i = 0; i < out_.size(); ++i) {
        auto sock = by_port_.find(out_.port(i));
        if (sock == by_port_.end()) continue;
        sock->second->pending.push_back(i);
        record(out_.port(i), true, out_.data(i), out_.len(i));
    }
    for (auto& sock : sockets_) {
        if (sock->pending.empty()) continue;
        if (sock->kind == Socket::Kind::udp) {
            send_udp(*sock, sock->pending);
        } else {
            send_raw(*sock, sock->pending);
        }
        sock->pending.clear();
    }
    out_.clear();
}

// A frame leaving a UDP port is sent as a datagram to its IPv4/UDP destination (UdpPorts.send).
// Where the kernel can, datagrams to one destination go as one UDP GSO send (UDP_SEGMENT): a
// round's results to a worker walk the stack once instead of once each; the receiver still gets
// them one datagram at a time. Datagrams are grouped by destination, each destination's order
// kept.
void SwitchLoop::send_udp(Socket& sock, const std::vector<size_t>& frames) {
    std::vector<Datagram>& dgs = sock.datagrams;
    dgs.clear();
    for (size_t i : frames) {
        const uint8_t* f = out_.data(i);
        size_t len = out_.len(i);
        if (len < kInaggAt) continue;
        size_t end = std::min(len, kEth + kIp + load_be16(f + kEth + kIp + 4));
        Datagram d{sockaddr_in{}, f + kInaggAt, end > kInaggAt ? end - kInaggAt : 0};
        d.to.sin_family = AF_INET;
        std::memcpy(&d.to.sin_addr.s_addr, f + kEth + 16, 4);
        std::memcpy(&d.to.sin_port, f + kEth + kIp + 2, 2);
        dgs.push_back(d);
    }
    size_t n = sock.udp_batch.prepare(dgs);
    sendmmsg_all(sock.fd, sock.udp_batch.messages(), n, sock.udp_batch.datagram_counts());
}

void SwitchLoop::send_raw(Socket& sock, const std::vector<size_t>& frames) {
    sock.send_msgs.assign(frames.size(), mmsghdr{});
    sock.send_iov.resize(frames.size());
    for (size_t n = 0; n < frames.size(); ++n) {
        size_t i = frames[n];
        sock.send_iov[n] = iovec{const_cast<uint8_t*>(out_.data(i)), out_.len(i)};
        sock.send_msgs[n].msg_hdr.msg_iov = &sock.send_iov[n];
        sock.send_msgs[n].msg_hdr.msg_iovlen = 1;
    }
    sendmmsg_all(sock.fd, sock.send_msgs.data(), frames.size(), nullptr);
}

// Send every message; a full send queue holds the loop (back-pressure rather than loss) for
// up to kSendWaitMs, and a message the kernel refuses is counted and skipped.
void SwitchLoop::sendmmsg_all(int fd, mmsghdr* msgs, size_t n, const uint32_t* datagrams) {
    auto count = [datagrams](size_t from, size_t to) {
        uint64_t c = 0;
        for (size_t i = from; i < to; ++i) c += datagrams ? datagrams[i] : 1;
        return c;
    };
    using Clock = std::chrono::steady_clock;
    size_t done = 0;
    Clock::time_point give_up{};
    while (done < n) {
        int sent = sendmmsg(fd, msgs + done, unsigned(n - done), 0);
        if (sent > 0) {
            stats_.sent += count(done, done + size_t(sent));
            done += size_t(sent);
            give_up = {};
            continue;
        }
        int err = errno;
        if (err == EINTR) continue;
        bool full = err == EAGAIN || err == EWOULDBLOCK || err == ENOBUFS;
        if (full && give_up == Clock::time_point{})
            give_up = Clock::now() + std::chrono::milliseconds(kSendWaitMs);
        if (full && Clock::now() < give_up) {
            pollfd p{fd, POLLOUT, 0};
            if (poll(&p, 1, 1) > 0 && err == ENOBUFS) usleep(50);  // poll cannot wait for it
            continue;
        }
        stats_.send_errors += count(done, done + 1);
        done += 1;
        give_up = {};
    }
}

}  // namespace inagg

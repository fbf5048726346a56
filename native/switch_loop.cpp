// The software switch's packet loop (see switch_loop.hpp).
#include "switch_loop.hpp"

#include <arpa/inet.h>
#include <linux/if_packet.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "checksums.hpp"
#include "net.hpp"
#include "switch_frame.hpp"

namespace inagg {

using namespace frame;

namespace {

constexpr size_t kFrameBytes = 65536;                  // the largest datagram or frame a port takes
constexpr size_t kSlotBytes = kInaggAt + kFrameBytes;  // + room for the headers a UDP port adds
constexpr uint8_t kUdpSwitchMac[6] = {0, 0, 0, 0, 0, 0xFE};

// The frame host `src` would have sent for a datagram of `len` bytes from src:sport to the
// switch at dst (UdpPorts.recv in bmv2_env/softswitch/switch.py): written into the kInaggAt bytes
// before the datagram.
void write_udp_headers(uint8_t* f, uint32_t src, uint16_t sport, uint32_t dst, size_t len) {
    std::memcpy(f + kEthDst, kUdpSwitchMac, 6);
    uint8_t* mac = f + kEthSrc;  // the host's: 02:00 and its IPv4 address (udp_host_mac)
    mac[0] = 0x02;
    mac[1] = 0x00;
    store_be32(mac + 2, src);
    store_be16(f + kEthType, 0x0800);
    uint8_t* ip = f + kIpAt;
    const uint8_t fixed[12] = {0x45, 0, 0, 0, 0, 0, 0, 0, 64, 17, 0, 0};
    std::memcpy(ip, fixed, sizeof fixed);
    store_be16(ip + kIpTotalLength, uint16_t(kIp + kUdp + len));
    store_be32(ip + kIpSrc, src);
    store_be32(ip + kIpDst, dst);
    store_be16(ip + kIpChecksum, ipv4_checksum(ip));
    uint8_t* udp = f + kUdpAt;
    store_be16(udp + kUdpSrcPort, sport);
    store_be16(udp + kUdpDstPort, kInaggUdpPort);
    store_be16(udp + kUdpLength, uint16_t(kUdp + len));
    store_be16(udp + kUdpChecksum, 0);
}

}  // namespace

struct SwitchLoop::PortSocket {
    enum class Kind { Udp, Raw };

    PortSocket(Kind k, int fd)
        : kind(k), socket(fd), rx(kBatch, kFrameBytes, k == Kind::Udp ? kInaggAt : 0) {}

    Kind kind;
    Socket socket;
    uint16_t port = 0;                               // raw: its switch port
    uint32_t bind_addr = 0;                          // udp: the switch's address
    std::unordered_map<uint32_t, uint16_t> port_of;  // udp: host IPv4 -> switch port
    RecvBatch rx;                                    // udp: room for the frame's headers
    std::vector<size_t> pending;                     // out_ frames leaving by this socket
    bool deep = false;                               // its queue, asked at its first pending frame
    std::vector<Datagram> datagrams;                 // them, as the datagrams or frames to send
};

SwitchLoop::SwitchLoop(size_t capture_bytes) : captures_(capture_bytes) {
    if (capture_bytes == 0) throw std::invalid_argument("switch loop: capture_bytes must be > 0");
    waits_.add(wake_.fd(), POLLIN, wake_.name());
}

SwitchLoop::~SwitchLoop() {
    running_ = false;
    // join() throws only when the wake-up cannot be written (its eventfd was closed under us):
    // here that ends the process (std::terminate) rather than hanging in the thread's join.
    join();
}

void SwitchLoop::add_udp_ports(int fd, uint32_t bind_addr,
                               const std::vector<std::pair<uint32_t, uint16_t>>& peers) {
    auto sock = std::make_unique<PortSocket>(PortSocket::Kind::Udp, fd);
    sock->bind_addr = bind_addr;
    for (const auto& [addr, port] : peers) sock->port_of[addr] = port;
    add(std::move(sock));
}

void SwitchLoop::add_raw_port(int fd, uint16_t port) {
    auto sock = std::make_unique<PortSocket>(PortSocket::Kind::Raw, fd);
    sock->port = port;
    add(std::move(sock));
}

// A port socket into the loop: its egress ports, its place in the wait (after the wake-up).
void SwitchLoop::add(std::unique_ptr<PortSocket> sock) {
    if (running_) throw std::logic_error("a port added while the switch loop runs");
    if (sock->kind == PortSocket::Kind::Raw) by_port_[sock->port] = sock.get();
    for (const auto& [addr, port] : sock->port_of) by_port_[port] = sock.get();
    waits_.add(sock->socket.fd(), POLLIN, sock->socket.name());
    sockets_.push_back(std::move(sock));
}

void SwitchLoop::capture(uint16_t port) {
    if (running_) throw std::logic_error("capture() while the switch loop runs");
    captured_ports_.insert(port);
}

void SwitchLoop::record(uint16_t port, bool sent, const uint8_t* frame, size_t len) {
    if (captured_ports_.empty() || captured_ports_.count(port) == 0) return;  // off: one branch
    int64_t usec = std::chrono::duration_cast<std::chrono::microseconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
    captures_.push(port, sent, usec, frame, len);
}

void SwitchLoop::set_impairment(uint16_t port, bool egress, double loss, int64_t delay_us,
                                int64_t jitter_us, double duplicate, double reorder) {
    if (running_) throw std::logic_error("set_impairment() while the switch loop runs");
    impair_.set_loss(port, egress, loss);
    impair_.set_delay(port, egress, delay_us);
    impair_.set_jitter(port, egress, jitter_us);
    impair_.set_duplicate(port, egress, duplicate);
    impair_.set_reorder(port, egress, reorder);
}

void SwitchLoop::set_impairment_seed(uint64_t seed) {
    if (running_) throw std::logic_error("set_impairment_seed() while the switch loop runs");
    impair_.set_seed(seed);
}

void SwitchLoop::set_pipeline(std::shared_ptr<SwitchPipeline> pipeline) {
    std::lock_guard<std::mutex> lock(pipeline_mutex_);
    pipeline_ = std::move(pipeline);
}

void SwitchLoop::start() {
    if (running_.exchange(true)) throw std::logic_error("the switch loop is already running");
    if (thread_.joinable()) thread_.join();  // a loop that stopped by itself
    error_ = nullptr;
    thread_ = std::thread([this] { run(); });
}

void SwitchLoop::stop() {
    running_ = false;
    join();
    if (std::exception_ptr error = std::exchange(error_, nullptr)) std::rethrow_exception(error);
}

// Wake the loop thread and wait for it to end (it ends on its own after an error).
void SwitchLoop::join() {
    if (!thread_.joinable()) return;
    wake_.signal();
    thread_.join();
}

// The loop thread: until stop(), or until an error, which it keeps for stop() to throw.
void SwitchLoop::run() {
    try {
        while (running_) wait_and_receive();
    } catch (...) {
        error_ = std::current_exception();
        running_ = false;
    }
}

namespace {
int64_t now_us() {
    return std::chrono::duration_cast<std::chrono::microseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}
}  // namespace

// Wait for frames (and, while frames are held, at most until the earliest is due), take them,
// then let go of the held frames that are due.
void SwitchLoop::wait_and_receive() {
    double limit =
        held_.empty() ? kNoLimit : std::max<int64_t>(0, held_.next_release() - now_us()) / 1e6;
    if (waits_.wait(limit)) {
        if (waits_.ready(0)) wake_.clear();  // stop(): taken, so that a later start() waits again
        for (size_t i = 0; i < sockets_.size() && running_; ++i)
            if (waits_.ready(i + 1)) receive_batch(*sockets_[i]);
    }
    if (!held_.empty()) release_held();
}

std::shared_ptr<SwitchPipeline> SwitchLoop::current_pipeline() {
    std::lock_guard<std::mutex> lock(pipeline_mutex_);
    return pipeline_;
}

// The held frames that are due: egress ones sent as they are, then ingress ones through the
// pipeline (their outputs impaired as any).
void SwitchLoop::release_held() {
    std::vector<DelayLine::Frame> due = held_.take_due(now_us());
    if (due.empty()) return;
    for (const auto& f : due)
        if (f.egress) {
            impair_.left(f.port, true, f.n);
            std::copy(f.bytes.begin(), f.bytes.end(), out_.reserve(f.port, f.bytes.size()));
        }
    releasing_ = true;
    send_outputs();
    releasing_ = false;
    std::shared_ptr<SwitchPipeline> pipeline = current_pipeline();
    if (!pipeline) return;
    {
        std::lock_guard<std::recursive_mutex> lock(pipeline->mutex());
        for (const auto& f : due)
            if (!f.egress) enter(f.port, f.n, f.bytes.data(), f.bytes.size(), *pipeline);
    }
    send_outputs();
}

void SwitchLoop::receive_batch(PortSocket& sock) {
    size_t n = sock.socket.receive(sock.rx, MSG_DONTWAIT);
    if (!n) return;
    stats_.wakeups += 1;
    stats_.received += n;
    std::shared_ptr<SwitchPipeline> pipeline = current_pipeline();
    if (!pipeline) return;
    {
        std::lock_guard<std::recursive_mutex> lock(pipeline->mutex());
        for (size_t i = 0; i < n; ++i) {
            if (sock.rx.truncated(i)) continue;
            if (sock.kind == PortSocket::Kind::Udp) {
                receive_udp(sock, i, *pipeline);
            } else if (sock.rx.link(i).sll_pkttype != PACKET_OUTGOING) {  // not our own sends
                ingress(sock.port, sock.rx.slot(i), sock.rx.len(i), *pipeline);
            }
        }
    }
    send_outputs();
}

// Datagram i of a UDP port group, as the frame its host would have sent, into the pipeline.
void SwitchLoop::receive_udp(PortSocket& sock, size_t i, SwitchPipeline& pipeline) {
    uint32_t src = ntohl(sock.rx.from(i).sin_addr.s_addr);
    auto port = sock.port_of.find(src);
    if (port == sock.port_of.end()) {
        stats_.unknown_peer += 1;
        return;
    }
    uint8_t* f = sock.rx.slot(i);
    size_t len = sock.rx.len(i);
    write_udp_headers(f, src, ntohs(sock.rx.from(i).sin_port), sock.bind_addr, len);
    ingress(port->second, f, kInaggAt + len, pipeline);
}

// A frame that came in by `port`: lost on its link, or it (and its copy, when duplicated) held
// back for its delay or through the pipeline now.
void SwitchLoop::ingress(uint16_t port, const uint8_t* f, size_t len, SwitchPipeline& pipeline) {
    PortImpairments::Fate fate = impair_.next(port, false);
    if (fate.dropped) return;
    const int64_t delays[2] = {fate.delay_us, fate.copy_delay_us};
    for (size_t c = 0; c < (fate.duplicated ? 2u : 1u); ++c) {
        if (delays[c])
            held_.hold(now_us() + delays[c], port, false, fate.n, f, len);
        else
            enter(port, fate.n, f, len, pipeline);
    }
}

// Frame `n` of `port`'s ingress through the pipeline now: captured, its order counted.
void SwitchLoop::enter(uint16_t port, uint64_t n, const uint8_t* f, size_t len,
                       SwitchPipeline& pipeline) {
    impair_.left(port, false, n);
    record(port, false, f, len);
    pipeline.process(port, f, len, out_);
}

// How many copies of output frame i leave now: 1 while releasing held frames (impaired
// already), else those its port's egress neither dropped nor held back (0, 1 or, duplicated, 2).
size_t SwitchLoop::leaving_now(size_t i) {
    if (releasing_) return 1;
    uint16_t port = out_.port(i);
    PortImpairments::Fate fate = impair_.next(port, true);
    if (fate.dropped) return 0;
    const int64_t delays[2] = {fate.delay_us, fate.copy_delay_us};
    size_t now = 0;
    for (size_t c = 0; c < (fate.duplicated ? 2u : 1u); ++c) {
        if (delays[c]) {
            held_.hold(now_us() + delays[c], port, true, fate.n, out_.data(i), out_.len(i));
        } else {
            impair_.left(port, true, fate.n);
            ++now;
        }
    }
    return now;
}

// Whether frames leaving by `sock` find its queue deep (set_congestion_threshold): raw ports
// only, one per socket (a UDP port group's socket is shared by its ports).
bool SwitchLoop::congested(const PortSocket& sock) const {
    int queued = 0;
    return congestion_bytes_ && sock.kind == PortSocket::Kind::Raw &&
           ioctl(sock.socket.fd(), SIOCOUTQ, &queued) == 0 && size_t(queued) >= congestion_bytes_;
}

// The batch's output frames, each by the socket of its egress port, results marked where it
// is congested; what a full send queue kept (net.hpp) counts as send_errors.
void SwitchLoop::send_outputs() {
    for (size_t i = 0; i < out_.size(); ++i) {
        auto sock = by_port_.find(out_.port(i));
        if (sock == by_port_.end()) continue;
        size_t copies = leaving_now(i);  // lost on the link, or held back for its delay
        if (!copies) continue;
        PortSocket& s = *sock->second;
        if (s.pending.empty()) s.deep = congested(s);  // once per socket and batch
        if (s.deep && out_.mark(i, kFlagCongestion)) stats_.marked += 1;
        for (size_t c = 0; c < copies; ++c) {  // a duplicated frame: sent twice
            s.pending.push_back(i);
            record(out_.port(i), true, out_.data(i), out_.len(i));
        }
    }
    for (auto& sock : sockets_) {
        if (sock->pending.empty()) continue;
        sock->datagrams.clear();
        if (sock->kind == PortSocket::Kind::Udp) {
            queue_udp(*sock);
        } else {
            queue_raw(*sock);
        }
        size_t sent = sock->socket.send(sock->datagrams).sent;  // refused or kept by a full queue
        stats_.sent += sent;
        stats_.send_errors += sock->datagrams.size() - sent;
        sock->pending.clear();
    }
    out_.clear();
}

// A frame leaving a UDP port is sent as a datagram to its IPv4/UDP destination (UdpPorts.send).
// Where the kernel can, datagrams to one destination go as one UDP GSO send (UDP_SEGMENT): a
// round's results to a worker walk the stack once instead of once each; the receiver still gets
// them one datagram at a time (send_batch.hpp).
void SwitchLoop::queue_udp(PortSocket& sock) {
    for (size_t i : sock.pending) {
        const uint8_t* f = out_.data(i);
        size_t len = out_.len(i);
        if (len < kInaggAt) continue;
        size_t end = std::min(len, udp_end(f));
        Datagram d{sockaddr_in{}, f + kInaggAt, end > kInaggAt ? end - kInaggAt : 0};
        d.to.sin_family = AF_INET;
        std::memcpy(&d.to.sin_addr.s_addr, f + kIpAt + kIpDst, 4);
        std::memcpy(&d.to.sin_port, f + kUdpAt + kUdpDstPort, 2);
        sock.datagrams.push_back(d);
    }
}

// A frame leaving a raw port is sent whole, one message each.
void SwitchLoop::queue_raw(PortSocket& sock) {
    for (size_t i : sock.pending)
        sock.datagrams.push_back(Datagram{sockaddr_in{}, out_.data(i), out_.len(i)});
}

}  // namespace inagg

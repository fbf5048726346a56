// The software switch's packet loop: its ports and the thread that moves frames between them and
// the pipeline (switch_pipeline.hpp), with batched system calls and no Python on the way.
//
// Ports come from Python as open sockets (bmv2_env/softswitch/switch.py opens and owns them, so the
// same sockets serve the Python reference loop):
//  - a UDP port group: one datagram socket at the switch's inagg address on loopback; a datagram
//    from host H enters H's port as the Ethernet/IPv4/UDP frame H would have sent, and a frame
//    leaving any of the group's ports goes out as a datagram to its IPv4/UDP destination;
//  - raw ports: one AF_PACKET socket per Linux interface (veth, Mininet), whole frames.
// Each wakeup (wait.hpp) takes up to kBatch frames per ready socket with one recvmmsg, runs them
// through the pipeline under its lock, and sends what they caused with one sendmmsg per socket
// (net.hpp: its error policy; a socket error stops the loop and stop() throws it).
// Ports may drop a seeded share of their frames on the way in and out, hold the others back for
// a delay with jitter, send a share twice and let a share overtake the held ones
// (port_impairment.hpp): impairments for links where the kernel has no netem; a dropped frame is
// neither captured nor seen, a held one is captured when it is let go (the wait then ends at the
// earliest release), a duplicated one twice.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "capture_queue.hpp"
#include "port_impairment.hpp"
#include "switch_pipeline.hpp"
#include "wait.hpp"

namespace inagg {

// What the loop has done since it started (all counts of frames or datagrams).
struct LoopStats {
    std::atomic<uint64_t> received{0};
    std::atomic<uint64_t> sent{0};
    std::atomic<uint64_t> unknown_peer{0};  // datagrams from no host of a UDP port
    std::atomic<uint64_t> send_errors{0};   // frames not sent: the send queue stayed full
    std::atomic<uint64_t> wakeups{0};       // batches received
    std::atomic<uint64_t> marked{0};        // results sent with FLAG_CONGESTION (a deep queue)
};

class SwitchLoop {
public:
    static constexpr size_t kBatch = 64;
    // The default bound of the frames captured and not yet taken (--pcap): 64 MiB, a drain
    // interval's worth (50 ms, bmv2_env/softswitch/switch.py) at over 1 GB/s of captured frames.
    static constexpr size_t kCaptureBytes = size_t(64) << 20;

    explicit SwitchLoop(size_t capture_bytes = kCaptureBytes);
    ~SwitchLoop();
    SwitchLoop(const SwitchLoop&) = delete;
    SwitchLoop& operator=(const SwitchLoop&) = delete;

    // `peers`: (host IPv4, switch port) of each host attached through this socket; `bind_addr`
    // is the socket's own IPv4 address (host order), the destination of the frames it makes.
    // Ports are added before start() only (std::logic_error while the loop runs).
    void add_udp_ports(int fd, uint32_t bind_addr,
                       const std::vector<std::pair<uint32_t, uint16_t>>& peers);
    void add_raw_port(int fd, uint16_t port);
    // Copy the frames `port` receives and sends into the capture queue (--pcap), for
    // take_captures(). Before start() only.
    void capture(uint16_t port);
    // The frames captured since the last call, in the order the loop handled them.
    void take_captures(CaptureBatch& into) { captures_.take(into); }
    // Captured frames that found the queue full (the writer fell behind), not in any batch.
    uint64_t capture_dropped() const { return captures_.dropped(); }
    // The pipeline frames go through; null drops every frame (no program pushed yet).
    void set_pipeline(std::shared_ptr<SwitchPipeline> pipeline);
    // Results leaving by a raw port whose socket holds `bytes` or more not yet sent (the
    // kernel's count, SIOCOUTQ: the frames in the interface's queue, each at its buffer's
    // size) carry FLAG_CONGESTION, as BMv2's egress marks on enq_qdepth; 0: never. Before start().
    void set_congestion_threshold(size_t bytes) { congestion_bytes_ = bytes; }
    // Impair the frames `port` receives (or, `egress`, sends): drop `loss` (0..1) of them, hold
    // the others `delay_us` +- `jitter_us` back, send `duplicate` of them twice, let `reorder`
    // of them leave at once (port_impairment.hpp). Before start() only.
    void set_impairment(uint16_t port, bool egress, double loss, int64_t delay_us,
                        int64_t jitter_us, double duplicate, double reorder);
    // The seed of every port's draws. Before start() only.
    void set_impairment_seed(uint64_t seed);
    // What each impaired port direction was asked and did.
    std::vector<PortImpairments::Stat> impairment_stats() const { return impair_.stats(); }

    void start();
    // Joins the thread; the sockets stay open (their owner closes them). Throws the error that
    // stopped the loop, if one did (std::system_error naming the socket and errno).
    void stop();
    bool running() const { return running_; }  // false once stopped, or if the loop failed
    const LoopStats& stats() const { return stats_; }

private:
    struct PortSocket;
    void add(std::unique_ptr<PortSocket> sock);
    void join();
    void run();
    void wait_and_receive();
    void record(uint16_t port, bool sent, const uint8_t* frame, size_t len);
    void receive_batch(PortSocket& sock);
    void receive_udp(PortSocket& sock, size_t i, SwitchPipeline& pipeline);
    void ingress(uint16_t port, const uint8_t* frame, size_t len, SwitchPipeline& pipeline);
    void enter(uint16_t port, uint64_t n, const uint8_t* frame, size_t len,
               SwitchPipeline& pipeline);
    size_t leaving_now(size_t i);
    std::shared_ptr<SwitchPipeline> current_pipeline();
    void release_held();
    void send_outputs();
    bool congested(const PortSocket& sock) const;
    void queue_udp(PortSocket& sock);
    void queue_raw(PortSocket& sock);

    std::vector<std::unique_ptr<PortSocket>> sockets_;
    std::unordered_map<uint16_t, PortSocket*> by_port_;  // egress port -> the socket it leaves by
    std::unordered_set<uint16_t> captured_ports_;        // empty: capture off
    CaptureQueue captures_;
    std::shared_ptr<SwitchPipeline> pipeline_;
    std::mutex pipeline_mutex_;  // guards pipeline_ (swap vs. use)
    OutputBatch out_;
    LoopStats stats_;
    size_t congestion_bytes_ = 0;
    PortImpairments impair_;
    DelayLine held_;          // frames held back for their port's delay
    bool releasing_ = false;  // send_outputs() sends held egress frames: not impaired again
    Wakeup wake_;             // stop()
    WaitSet waits_;           // wake_, then sockets_ in their order
    std::atomic<bool> running_{false};
    std::exception_ptr error_;  // what stopped the loop thread, for stop() to throw
    std::thread thread_;
};

}  // namespace inagg

// The host aggregator's packet loop: UDP datagrams in, the slot engine, results out.
//
// Why it exists: inagg-aggregator's Python loop cost a syscall and tens of microseconds of
// Python per datagram and overflowed its socket under a window of contributions. This loop runs
// on the caller's thread without the GIL: recvmmsg/sendmmsg batches of datagrams, the engine
// locked once per batch (so the controller feed can change jobs between batches), and results
// sent only to the member address of each rank (the engine's sender id of a member is its
// IPv4:port, see sender_id_ipv4, so the address comes from the id).
//
// Loss injection (tests): each datagram received and each result sent is dropped with
// probability drop_rate, from a seeded generator, and counted.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <random>

#include "engine.hpp"
#include "net.hpp"
#include "wait.hpp"

namespace inagg {

class HostLoop {
public:
    // `fd`: a bound UDP/IPv4 socket, owned by the caller and open until run() returns.
    // Throws std::invalid_argument for a drop rate outside [0, 1), std::system_error when the
    // wake-up descriptor cannot be made.
    HostLoop(Engine& engine, int fd, double drop_rate, uint64_t seed);
    ~HostLoop();
    HostLoop(const HostLoop&) = delete;
    HostLoop& operator=(const HostLoop&) = delete;

    // Serve until stop(); throws std::system_error when the socket fails (net.hpp's policy).
    void run();
    // Make run() return (from any thread, at any time, also before run()). Throws
    // std::system_error when the wake-up cannot be written (wait.hpp).
    void stop();

    uint64_t injected_drops() const { return injected_drops_.load(); }
    // Results the kernel did not take: the send queue stayed full for net.hpp's kSendWait.
    uint64_t send_errors() const { return send_errors_.load(); }

private:
    struct Buffers;  // receive slots, result arena, send list (host_loop.cpp)
    bool lost();
    void serve_batch(size_t received);
    void send_all();

    Engine& engine_;
    Socket socket_;
    Wakeup wake_;
    WaitSet waits_;  // the socket and wake_
    double drop_rate_;
    std::mt19937_64 rng_;
    std::uniform_real_distribution<double> uniform_{0.0, 1.0};
    std::atomic<bool> running_{true};
    std::atomic<uint64_t> injected_drops_{0};
    std::atomic<uint64_t> send_errors_{0};
    std::unique_ptr<Buffers> buffers_;
};

}  // namespace inagg

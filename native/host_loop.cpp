// The host aggregator's packet loop (see host_loop.hpp for why). Linux only: the socket's
// batches (net.hpp), a wait on the socket and on a wake-up for stop() (wait.hpp).
#include "host_loop.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <stdexcept>
#include <vector>

namespace inagg {
namespace {

constexpr size_t kBatch = 64;           // datagrams per recvmmsg
constexpr size_t kMaxDatagram = 65536;  // the largest UDP payload fits

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
    RecvBatch rx{kBatch, kMaxDatagram};
    std::vector<uint8_t> results;  // this batch's results: one max-size place per datagram
    struct Outgoing {
        size_t at, length;
        sockaddr_in to;
    };
    std::vector<Outgoing> out;
    std::vector<Datagram> datagrams;  // out, as the datagrams to send
};

HostLoop::HostLoop(Engine& engine, int fd, double drop_rate, uint64_t seed)
    : engine_(engine), socket_(fd), drop_rate_(drop_rate), rng_(seed),
      buffers_(std::make_unique<Buffers>()) {
    if (!(drop_rate >= 0.0 && drop_rate < 1.0)) {
        throw std::invalid_argument("drop rate must be in [0, 1), got " +
                                    std::to_string(drop_rate));
    }
    waits_.add(socket_.fd(), POLLIN, socket_.name());
    waits_.add(wake_.fd(), POLLIN, wake_.name());
}

HostLoop::~HostLoop() = default;  // here, where Buffers is complete

void HostLoop::stop() {
    running_.store(false);
    wake_.signal();
}

bool HostLoop::lost() {
    if (drop_rate_ > 0.0 && uniform_(rng_) < drop_rate_) {
        injected_drops_ += 1;
        return true;
    }
    return false;
}

void HostLoop::run() {
    while (running_.load()) {
        if (!waits_.wait() || !running_.load()) continue;  // a signal came, or stop()
        if (size_t n = socket_.receive(buffers_->rx, MSG_DONTWAIT)) {
            serve_batch(n);
            send_all();
        }
    }
}

// The engine's answer to each received datagram, queued for sending.
void HostLoop::serve_batch(size_t received) {
    Buffers& b = *buffers_;
    b.results.resize(kBatch * engine_.max_result_bytes());  // allocated once: K never changes
    b.out.clear();
    std::lock_guard<std::mutex> lock(engine_.mutex());
    for (size_t i = 0; i < received; ++i) {
        if (lost()) {
            continue;
        }
        size_t at = i * engine_.max_result_bytes();
        Emit emit = engine_.process(b.rx.data(i), b.rx.len(i), sender_of(b.rx.from(i)), true,
                                    b.results.data() + at);
        if (!emit.length) {
            continue;
        }
        const JobConfig& job = *engine_.job(emit.job);
        if (emit.rank == kUpstream) {  // an ATP job's release: to its switch alone
            if (job.has_atp_peer && !lost()) {
                b.out.push_back(Buffers::Outgoing{at, emit.length, address_of(job.atp_peer)});
            }
            continue;
        }
        const std::vector<SenderId>& members = job.members;
        size_t first = emit.rank < 0 ? 0 : static_cast<size_t>(emit.rank);
        size_t end = emit.rank < 0 ? members.size() : first + 1;
        for (size_t r = first; r < end; ++r) {
            if (!lost()) {
                b.out.push_back(
                    Buffers::Outgoing{at, emit.length_for(int32_t(r)), address_of(members[r])});
            }
        }
    }
}

// A batch's results, each destination's in order and, where the kernel takes UDP_SEGMENT, its
// runs as one GSO send (native/send_batch.hpp): a slot's results to a worker walk the stack once.
void HostLoop::send_all() {
    Buffers& b = *buffers_;
    b.datagrams.clear();
    for (const Buffers::Outgoing& o : b.out)
        b.datagrams.push_back(Datagram{o.to, b.results.data() + o.at, o.length});
    send_errors_ +=
        b.datagrams.size() - socket_.send(b.datagrams).sent;  // refused or kept by a full queue
}

}  // namespace inagg

// The sendmmsg messages of one batch of datagrams (or raw frames), with UDP GSO: the message
// assembly behind net.hpp's Socket::send, which the switch's packet loop (results to workers,
// frames out of its ports), the host aggregator's loop and the worker's stream all send through.
//
// Why: on loopback the cost of a datagram is the walk through the stack, not its bytes. A run of
// datagrams to one destination, all of one size but the last (no larger), goes as one UDP GSO
// send (UDP_SEGMENT): the stack is walked once for the run, and the receiver still gets them one
// datagram at a time. Where the kernel has no UDP_SEGMENT each datagram is a message of its own.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace inagg {

struct Datagram {    // one datagram to send; its bytes stay the caller's until the send is done
    sockaddr_in to;  // sin_family AF_UNSPEC: no destination (a frame for a packet socket)
    const uint8_t* data;
    size_t len;
};

// Whether the kernel takes UDP_SEGMENT on this socket (false for any but a UDP socket).
bool udp_gso_supported(int fd);

class SendBatch {
public:
    explicit SendBatch(bool gso = false) : gso_(gso) {}

    // The sendmmsg messages for `dgs`; where the socket takes GSO, `dgs` is first grouped by
    // destination (each destination's order kept) and each destination's runs become GSO
    // sends. `dgs` must outlive the send. Returns how many messages.
    size_t prepare(std::vector<Datagram>& dgs);
    mmsghdr* messages() { return msgs_.data(); }
    // How many datagrams message i carries.
    const uint32_t* datagram_counts() const { return counts_.data(); }

private:
    union GsoControl {  // the UDP_SEGMENT control message of one GSO send
        cmsghdr hdr;
        char space[CMSG_SPACE(sizeof(uint16_t))];
    };
    size_t gso_run(const std::vector<Datagram>& dgs, size_t first) const;
    void set_gso_segment(mmsghdr& msg, size_t n, uint16_t segment);

    bool gso_;
    std::vector<mmsghdr> msgs_;
    std::vector<iovec> iov_;
    std::vector<GsoControl> gso_control_;
    std::vector<uint32_t> counts_;
};

}  // namespace inagg

// The sendmmsg messages of a batch, with UDP GSO (see send_batch.hpp).
#include "send_batch.hpp"

#include <netinet/udp.h>

#include <algorithm>
#include <cstring>
#include <utility>

namespace inagg {
namespace {

constexpr size_t kGsoSegments = 64;  // datagrams per GSO send (kernel: at most 64+)
constexpr size_t kGsoBytes = 60000;  // their bytes (one IPv4 datagram's worth)

bool same_destination(const sockaddr_in& a, const sockaddr_in& b) {
    return a.sin_addr.s_addr == b.sin_addr.s_addr && a.sin_port == b.sin_port;
}

}  // namespace

bool udp_gso_supported(int fd) {
    int segment = 0;
    socklen_t size = sizeof segment;
    return getsockopt(fd, SOL_UDP, UDP_SEGMENT, &segment, &size) == 0;
}

size_t SendBatch::prepare(std::vector<Datagram>& dgs) {
    if (gso_)
        std::stable_sort(dgs.begin(), dgs.end(), [](const Datagram& a, const Datagram& b) {
            return std::make_pair(a.to.sin_addr.s_addr, a.to.sin_port) <
                   std::make_pair(b.to.sin_addr.s_addr, b.to.sin_port);
        });
    msgs_.assign(dgs.size(), mmsghdr{});
    iov_.resize(dgs.size());
    gso_control_.resize(dgs.size());
    counts_.resize(dgs.size());
    size_t n = 0;
    for (size_t first = 0, last; first < dgs.size(); first = last) {
        last = first + (gso_ ? gso_run(dgs, first) : 1);
        for (size_t i = first; i < last; ++i)
            iov_[i] = iovec{const_cast<uint8_t*>(dgs[i].data), dgs[i].len};
        msghdr& h = msgs_[n].msg_hdr;
        if (dgs[first].to.sin_family != AF_UNSPEC) {
            h.msg_name = const_cast<sockaddr_in*>(&dgs[first].to);
            h.msg_namelen = sizeof dgs[first].to;
        }
        h.msg_iov = &iov_[first];
        h.msg_iovlen = last - first;
        if (last - first > 1) set_gso_segment(msgs_[n], n, uint16_t(dgs[first].len));
        counts_[n++] = uint32_t(last - first);
    }
    return n;
}

// Message n is a GSO send of `segment`-byte datagrams (its control message is the n-th).
void SendBatch::set_gso_segment(mmsghdr& msg, size_t n, uint16_t segment) {
    GsoControl& c = gso_control_[n];
    c.hdr.cmsg_level = SOL_UDP;
    c.hdr.cmsg_type = UDP_SEGMENT;
    c.hdr.cmsg_len = CMSG_LEN(sizeof(uint16_t));
    std::memcpy(CMSG_DATA(&c.hdr), &segment, sizeof segment);
    msg.msg_hdr.msg_control = &c;
    msg.msg_hdr.msg_controllen = CMSG_SPACE(sizeof(uint16_t));
}

// How many datagrams from `first` on can go as one GSO send: same destination, all but the last
// of the first one's size and the last no larger, within the kernel's segment and size limits.
size_t SendBatch::gso_run(const std::vector<Datagram>& dgs, size_t first) const {
    const Datagram& d = dgs[first];
    size_t last = first + 1, bytes = d.len;
    while (d.len && last < dgs.size() && last - first < kGsoSegments &&
           same_destination(dgs[last].to, d.to) && dgs[last - 1].len == d.len &&
           dgs[last].len <= d.len && bytes + dgs[last].len <= kGsoBytes)
        bytes += dgs[last++].len;
    return last - first;
}

}  // namespace inagg

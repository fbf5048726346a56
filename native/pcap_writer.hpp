// Per-port capture files of the software switch's packet loop (--pcap): the classic pcap format
// (Ethernet link type), one file per port and direction as BMv2 writes them, the same format as
// bmv2_env/soft_switch.py::PcapWriter. Records are buffered and flushed once per batch.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace inagg {

class PcapWriter {
public:
    explicit PcapWriter(const std::string& path);  // throws std::system_error
    ~PcapWriter();
    PcapWriter(const PcapWriter&) = delete;
    PcapWriter& operator=(const PcapWriter&) = delete;

    void write(const uint8_t* frame, size_t len, int64_t usec_since_epoch);
    void flush();

private:
    std::FILE* file_;
};

}  // namespace inagg

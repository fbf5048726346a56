// pcap files of the software switch (see pcap_writer.hpp).
#include "pcap_writer.hpp"

#include <cerrno>
#include <system_error>

namespace inagg {
namespace {

void put_le32(uint8_t* p, uint32_t v) {
    for (int i = 0; i < 4; ++i) p[i] = uint8_t(v >> (8 * i));
}

}  // namespace

PcapWriter::PcapWriter(const std::string& path) : file_(std::fopen(path.c_str(), "wb")) {
    if (!file_) throw std::system_error(errno, std::generic_category(), path);
    // magic, version 2.4, GMT offset 0, accuracy 0, snap length 65535, link type 1 (Ethernet)
    uint8_t header[24] = {0xD4, 0xC3, 0xB2, 0xA1, 2, 0, 4, 0};
    put_le32(header + 16, 65535);
    put_le32(header + 20, 1);
    std::fwrite(header, 1, sizeof header, file_);
    std::fflush(file_);
}

PcapWriter::~PcapWriter() { std::fclose(file_); }

void PcapWriter::write(const uint8_t* frame, size_t len, int64_t usec_since_epoch) {
    uint8_t record[16];
    put_le32(record, uint32_t(usec_since_epoch / 1000000));
    put_le32(record + 4, uint32_t(usec_since_epoch % 1000000));
    put_le32(record + 8, uint32_t(len));
    put_le32(record + 12, uint32_t(len));
    std::fwrite(record, 1, sizeof record, file_);
    std::fwrite(frame, 1, len, file_);
}

void PcapWriter::flush() { std::fflush(file_); }

}  // namespace inagg

"""native/engine.hpp is a plain C++17 API (the packet loops use it without Python): a small C++
program built against the engine's sources alone (engine.cpp, engine_atp.cpp and the CRC-32 of
checksums.cpp) completes a round and reads the result and counters."""

import shutil
import subprocess
from pathlib import Path

import pytest

NATIVE = Path(__file__).resolve().parents[1] / "native"
ENGINE_SOURCES = ("engine.cpp", "engine_atp.cpp", "checksums.cpp")

PROGRAM = r"""
#include <cstdio>
#include "engine.hpp"

int main() {
    inagg::Engine engine(8, 2, /*host_mode=*/true);
    inagg::JobConfig job;
    job.job_id = 7; job.epoch = 1; job.slot_base = 0; job.slot_count = 4;
    job.members = {inagg::sender_id_ipv4(0x0A000001, 5000), inagg::sender_id_ipv4(0x0A000002, 5000)};
    engine.set_job(job);
    // header: v1|contribution, flags, job 7, worker w, exp -128, epoch 1, set 0 slot 3, count 2, offset 0
    unsigned char pkt[24] = {0x11, 0, 0, 7, 0, 0x80, 0, 1, 0, 3, 0, 2, 0, 0, 0, 0,
                             0, 0, 0, 5, 0xFF, 0xFF, 0xFF, 0xFF};
    unsigned char out[24];
    inagg::Emit first = engine.process(pkt, sizeof pkt, job.members[0], true, out);
    std::printf("%s %zu\n", inagg::outcome_name(engine.last_outcome()), first.length);
    pkt[4] = 1;
    inagg::Emit done = engine.process(pkt, sizeof pkt, job.members[1], true, out);
    std::printf("%s %zu %d %d %d\n", inagg::outcome_name(engine.last_outcome()), done.length,
                done.rank, out[19], out[23]);
    std::printf("%llu %d\n", (unsigned long long)engine.counters().at(7).results,
                inagg::p4_drop_code(inagg::Outcome::BadRound));
    return 0;
}
"""


def test_engine_header_is_a_plain_cpp_api(tmp_path):
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    (tmp_path / "main.cpp").write_text(PROGRAM)
    subprocess.run([cxx, "-std=c++17", "-Wall", "-Wextra", "-Werror", f"-I{NATIVE}",
                    str(tmp_path / "main.cpp"), *(str(NATIVE / f) for f in ENGINE_SOURCES), "-o", str(tmp_path / "t")],
                   check=True, capture_output=True)
    out = subprocess.run([tmp_path / "t"], check=True, capture_output=True, text=True).stdout
    # 5 + 5 = 10, -1 + -1 = -2 (0xFE low byte); multicast (-1) to both ranks
    assert out.split("\n")[:3] == ["first 0", "add 24 -1 10 254", "1 7"]


def test_a_build_from_other_sources_is_refused(tmp_path):
    """The extension carries the digest of the sources it was built from; a checkout whose
    native/ changed since (a pull without `make setup`) is refused with the fix, not run."""
    from inagg.hostlib import native_build

    assert native_build._native.SOURCE_DIGEST == native_build.source_digest(native_build.SOURCES)
    native_build.check_build(native_build._native)               # this checkout: accepted
    changed = tmp_path / "native"
    shutil.copytree(native_build.SOURCES, changed)
    (changed / "stream.cpp").write_text((changed / "stream.cpp").read_text() + "\n// edited\n")
    with pytest.raises(ImportError, match=r"stale build.*make setup"):
        native_build.check_build(native_build._native, changed)
    native_build.check_build(native_build._native, tmp_path / "absent")   # a wheel: nothing to compare

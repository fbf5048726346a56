"""A reduce-scatter in the network on BMv2, end to end in Mininet (root, Mininet and BMv2;
skipped without them): two jobs of two workers on one switch replay the same synthetic profile,
job ``ar`` allreducing each bucket, job ``rs`` reduce-scattering it (the profile's
``collective``). BMv2's captures of the workers' ports show each ``rs`` worker marking its own
shard's blocks FLAG_MINE (no ``ar`` worker marks any), getting the values of those only and the
header alone of the other's, and about half the bytes an ``ar`` worker gets (docs/protocol.md, "Reduce-scatter"; the soft switch's twin of this test is
tests/test_reduce_scatter.py's); the same with 2 ranks per host, for the hosts' leaders, whose
ranks are consecutive or not (0, 2 + 1, 3)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from scapy.utils import RawPcapReader

from inagg.bmv2_env.emulation.testbed import bmv2_missing
from inagg.hostlib.wire.protocol import FLAG_MINE, FLAG_RETRANSMIT, HEADER_BYTES, MSG_RESULT, UDP_PORT, unpack_header
from tests.test_emulation import mininet_missing, run_topology
from tests.test_emulation_config import topo

K = 64                      # BMv2's values per packet
BUCKET = 4 * 2 * 64 * K     # two shards of 64 blocks each: no block across the shards' edge
ITERATIONS = 4
RESULT_HEADER = 42 + HEADER_BYTES   # Ethernet, IPv4, UDP and the inagg header


def write_topology(tmp_path: Path) -> Path:
    """Jobs ar (h1, h2) and rs (h3, h4) on switch s1, the same profile, one collective each."""
    links = [["h1", "s1-p1"], ["h2", "s1-p2"], ["h3", "s1-p3"], ["h4", "s1-p4"], ["agg", "s1-p5"]]
    jobs = [{"name": name, "workers": workers, "iterations": ITERATIONS,
             "profile": {"bucket_bytes": [BUCKET], "collective": collective}}
            for name, workers, collective in (("ar", ["h1", "h2"], "allreduce"), ("rs", ["h3", "h4"], "reduce_scatter"))]
    data = topo(links, jobs)
    del data["switches"]["s2"]
    path = tmp_path / "reduce_scatter.json"
    path.write_text(json.dumps(data))
    return path


def capture(run, port: int, way: str) -> Path:
    """BMv2's capture of switch port ``port``, ``way`` "in" or "out"."""
    return run.path / "pcaps" / f"{run.run_id}s1-eth{port}_{way}.pcap"


def results(pcap: Path) -> tuple[set[int], set[int], int]:
    """Of the switch's first answers (not resends) in one port's outgoing capture: the offsets of
    the data rounds that came with values, of those that came as the header alone, and the
    bytes of the results with a count (data rounds, and control rounds that carry values)."""
    whole, elided, nbytes = set(), set(), 0
    for frame, _ in RawPcapReader(str(pcap)):
        frame = bytes(frame)
        if len(frame) < RESULT_HEADER or frame[12:14] != b"\x08\x00" or frame[23] != 17:
            continue
        if int.from_bytes(frame[34:36], "big") != UDP_PORT or frame[42] & 0x0F != MSG_RESULT:
            continue
        h = unpack_header(frame[42:])
        if h.flags & FLAG_RETRANSMIT:
            continue
        nbytes += len(frame) if h.count else 0
        if h.count and h.offset:   # block 0 shares offset 0 with the call's control round: left out
            (whole if len(frame) > RESULT_HEADER else elided).add(h.offset)
    return whole, elided, nbytes


def marked(pcap: Path) -> set[int]:
    """Offsets of the contributions in one port's incoming capture that carry FLAG_MINE."""
    out = set()
    for frame, _ in RawPcapReader(str(pcap)):
        frame = bytes(frame)
        if len(frame) >= RESULT_HEADER and frame[12:14] == b"\x08\x00" and frame[23] == 17 \
                and int.from_bytes(frame[36:38], "big") == UDP_PORT and frame[43] & FLAG_MINE:
            out.add(unpack_header(frame[42:]).offset)
    return out


def test_bmv2_sends_each_reduce_scatter_worker_its_shard_alone(tmp_path):
    if reason := mininet_missing() or bmv2_missing():
        pytest.skip(reason)
    rows, stdout, run = run_topology(tmp_path, str(write_topology(tmp_path)), "bmv2")
    assert all(rows[j]["ok"] and rows[j]["mode"] == "switch" for j in ("ar", "rs")), stdout
    got = {port: results(capture(run, port, "out")) for port in range(1, 5)}
    blocks = set(range(K, BUCKET // 4, K))                     # every block but block 0
    shards = [{o for o in blocks if o < BUCKET // 8}, {o for o in blocks if o >= BUCKET // 8}]
    for port in (1, 2):                                        # ar: every block with its values
        assert got[port][:2] == (blocks, set())
    mine = [next(s for s in shards if got[port][0] == s) for port in (3, 4)]   # each rs worker: one shard
    assert mine[0] != mine[1]
    assert marked(capture(run, 1, "in")) == marked(capture(run, 2, "in")) == set()
    for port, shard in zip((3, 4), mine):
        assert marked(capture(run, port, "in")) - {0} == shard   # the worker marks its own blocks
        assert got[port][1] == blocks - shard                  # the other's blocks: the header alone
        # half the allreduce's, plus a header per block of the other's (block 0 too), plus each
        # call's control round (its values go to every rank whole)
        bound = got[1][2] / 2 + ITERATIONS * (RESULT_HEADER * (BUCKET // 8 // K) + (RESULT_HEADER + 4 * K) / 2)
        assert got[port][2] <= bound


@pytest.mark.parametrize("placement", ["consecutive", "cyclic"])
def test_each_hosts_leader_receives_its_hosts_shards_alone(tmp_path, placement):
    """Two jobs of 2 hosts x 2 ranks on BMv2 (each host a Mininet host, its ranks reducing in
    shared memory first, its leader the switch's worker): job ``ar`` (h1, h2) allreducing the
    profile's bucket, ``rs`` (h3, h4) reduce-scattering it; ranks 0, 1 on the first host and 2, 3
    on the second (``consecutive``), or 0, 2 and 1, 3 (``cyclic``: each leader's part two
    ranges). Each ``rs`` leader gets the values of its host's shards of the sums (the blocks
    wholly in one of its ranges) and the other host's blocks as the header alone; the ``ar``
    leaders get every block whole (docs/protocol.md, "Between hosts' leaders")."""
    if reason := mininet_missing() or bmv2_missing():
        pytest.skip(reason)
    ranks = {"consecutive": ((0, 1), (2, 3)), "cyclic": ((0, 2), (1, 3))}[placement]
    links = [["h1", "s1-p1"], ["h2", "s1-p2"], ["h3", "s1-p3"], ["h4", "s1-p4"], ["agg", "s1-p5"]]
    jobs = [{"name": name, "workers": [hosts[0] if r in ranks[0] else hosts[1] for r in range(4)],
             "iterations": ITERATIONS, "host_reduce": True,
             "profile": {"bucket_bytes": [BUCKET], "collective": collective}}
            for name, hosts, collective in (("ar", ("h1", "h2"), "allreduce"), ("rs", ("h3", "h4"), "reduce_scatter"))]
    data = topo(links, jobs)
    del data["switches"]["s2"]
    path = tmp_path / "hosts_reduce_scatter.json"
    path.write_text(json.dumps(data))
    rows, stdout, run = run_topology(tmp_path, str(path), "bmv2")
    assert all(rows[j]["ok"] and rows[j]["mode"] == "switch" for j in ("ar", "rs")), stdout
    got = {port: results(capture(run, port, "out")) for port in range(1, 5)}
    n, head = BUCKET // 4, 4          # the sums call between the leaders: 2 hosts' 2 words, then n

    def inside(host: int) -> set[int]:
        """Offsets of the sums call's blocks whose values all lie in host ``host``'s ranks' shards
        (h3's: 0), one or two of them (consecutive ranks' shards are one range)."""
        per, end = n // 4, head + n
        touched = {o: set(range((o - head) // per, (min(o + K, end) - 1 - head) // per + 1))
                   for o in range(0, end, K) if o >= head}    # the ranks' shards block o touches
        return {o for o, shards in touched.items() if shards <= set(ranks[host])}

    for port in (1, 2):                                        # ar: every block with its values
        assert got[port][1] == set() and marked(capture(run, port, "in")) == set()
    for port, host in ((3, 0), (4, 1)):
        assert marked(capture(run, port, "in")) == inside(host)   # the leader marks its host's blocks
        assert got[port][1] == inside(1 - host)                # the other host's: the header alone
        # half the allreduce's, plus a header per block of the other's (18 % of one at K = 64),
        # the block exponents and the control rounds
        assert 0.5 < got[port][2] / got[1][2] < 0.66, (port, got[port][2], got[1][2])

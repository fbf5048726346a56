"""Reduce-scatter in the network: each block's values go only to the rank whose shard holds it.

A worker marks its contributions to the blocks wholly in its shard with FLAG_MINE; the
aggregator (the engine of the soft switch and of the host aggregator, C++ and its Python twin)
records that rank as the round's owner and sends the values to it alone, the header alone
(count kept) to every other rank, which still frees its slot. Here: the owner rule row by row on
both engines, the worker streams' checks against a scripted aggregator (both streams, a part of
one range or several, bad ranges refused; the C++ check of a part against its Python twin), and
reduce-scatters of 4 ranks over the soft switch (results exact, bytes counted in the switch's
pcaps) and over the host aggregator."""

from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.utils import RawPcapReader

from inagg.bmv2_env.emulation.loopback import LoopbackDeployment
from inagg.hostlib.aggregator.engine import NativeEngine
from inagg.hostlib.aggregator.engine_reference import AggregationEngine, JobConfig, Uplink
from inagg.hostlib.native_build import _native
from inagg.hostlib.wire.grant import Grant
from inagg.hostlib.wire.protocol import (
    FLAG_FROM_SWITCH, FLAG_MINE, FLAG_RETRANSMIT, HEADER_BYTES, HEADER_STRUCT, build_contribution, round_fields,
    unpack_header,
)
from inagg.hostlib.wire.transport import UdpTransport
from inagg.hostlib.worker.call_protocol import BadPart, CallRefused, check_part
from inagg.hostlib.worker.communicator import Communicator
from inagg.hostlib.worker.stream import NativeSlotStream
from inagg.hostlib.worker.stream_reference import SlotStream
from scripted_udp import as_result, bound_socket, datagrams
from test_training import on_ranks

K = 4
MEMBERS = (("10.0.0.1", 5), ("10.0.0.2", 5), ("10.0.0.3", 5))
FULL, HEADER = HEADER_BYTES + 4 * K, HEADER_BYTES


def contribution(worker: int, flags: int = 0, round_no: int = 0, count: int = K) -> bytes:
    """Worker ``worker``'s contribution to round ``round_no`` of slot 1 (job 1, epoch 1)."""
    slot_set, tag = round_fields(round_no)
    values = np.full(count, worker + 1, np.int32) if count else None
    return build_contribution(1, worker, 1, 1, slot_set, 0, values, K, flags=flags | tag)


def round_of(*flags: int, round_no: int = 0, count: int = K) -> list[bytes]:
    """One round: worker w's contribution with ``flags[w]``."""
    return [contribution(w, f, round_no, count) for w, f in enumerate(flags)]


# rows of the owner rule: (packets, then the bytes each rank gets from the last one's result)
ROWS = {
    "no rank marks the block: every rank gets the values": (round_of(0, 0, 0), [FULL, FULL, FULL]),
    "the owner alone gets the values": (round_of(0, FLAG_MINE, 0), [HEADER, FULL, HEADER]),
    "the owner's mark may come last": (round_of(0, 0, FLAG_MINE), [HEADER, HEADER, FULL]),
    "two ranks claim the block: every rank gets the values": (round_of(FLAG_MINE, 0, FLAG_MINE), [FULL, FULL, FULL]),
    "a child switch's sum is in: every member gets the values": (round_of(FLAG_FROM_SWITCH, FLAG_MINE, 0),
                                                                  [FULL, FULL, FULL]),
    "a priming round has no values to elide": (round_of(0, FLAG_MINE, 0, count=0), [HEADER, HEADER, HEADER]),
    "a non-owner's resend gets the header (DUP_DONE)": (round_of(0, FLAG_MINE, 0) + [contribution(0, FLAG_RETRANSMIT)],
                                                        [HEADER]),
    "the owner's resend gets the values (DUP_DONE)": (round_of(0, FLAG_MINE, 0) + [contribution(1, FLAG_MINE | FLAG_RETRANSMIT)],
                                                      [FULL]),
    "the set's next round starts without an owner": (round_of(0, FLAG_MINE, 0) + round_of(0, 0, 0, round_no=1)
                                                     + round_of(0, 0, 0, round_no=2), [FULL, FULL, FULL]),
}


@pytest.mark.parametrize("engine", [AggregationEngine, NativeEngine], ids=["python", "native"])
@pytest.mark.parametrize("row", list(ROWS))
def test_owner_rule_row(engine, row):
    packets, sizes = ROWS[row]
    eng = engine(4, K)
    eng.replace_jobs({1: JobConfig(1, 1, 0, 2, MEMBERS)})
    for data in packets[:-1]:
        eng.process(data, MEMBERS[data[4]])
    (emit,) = eng.process(packets[-1], MEMBERS[packets[-1][4]])
    got = [emit.data_for(r) for r in emit.ranks]
    assert [len(d) for d in got] == sizes
    assert all(d[:HEADER_BYTES] == emit.data[:HEADER_BYTES] for d in got)   # count and all kept


@pytest.mark.parametrize("engine", [AggregationEngine, NativeEngine], ids=["python", "native"])
def test_a_switch_below_the_root_gives_its_owner_alone_the_parents_values(engine):
    """A ToR of an aggregation tree: its sum goes up without FLAG_MINE (the parent sends every
    child switch the values), and the parent's result comes down to the ToR's owner alone."""
    parent = ("10.0.9.9", 5)
    eng = engine(4, K, host_mode=False)
    eng.replace_jobs({1: JobConfig(1, 1, 0, 2, MEMBERS[:2], Uplink(parent, 0, 2))})
    eng.process(contribution(0), MEMBERS[0])
    (up,) = eng.process(contribution(1, FLAG_MINE), MEMBERS[1])
    assert up.upstream and not up.data[1] & FLAG_MINE
    (down,) = eng.process(as_result(up.data), parent)
    assert [len(down.data_for(r)) for r in down.ranks] == [HEADER, FULL]


class ElidingAggregator:
    """A one-rank job's aggregator that plays the other ranks' part of a reduce-scatter: each
    data round is answered first by its header alone (values elided, as for a block another
    rank owns), then whole with the values doubled (a sum the rank can tell from its input);
    the control round is echoed. Records the flags of every contribution."""

    def __init__(self) -> None:
        self.sock = bound_socket()
        self.flags: dict[int, int] = {}   # offset -> the data round's flags
        self.stopped = False

    def stop(self) -> None:
        """End ``serve`` now: an empty datagram wakes its receive."""
        self.stopped = True
        self.sock.sendto(b"", self.sock.getsockname())

    def serve(self) -> None:
        control = True
        for data, sender in datagrams(self.sock):
            if self.stopped:
                return
            result = as_result(data)
            count = HEADER_STRUCT.unpack_from(data)[7]
            if not control and count:
                self.flags[HEADER_STRUCT.unpack_from(data)[8]] = data[1]
                values = np.frombuffer(data, ">i4", offset=HEADER_BYTES) * 2
                self.sock.sendto(result[:HEADER_BYTES], sender)
                result = result[:HEADER_BYTES] + values.astype(">i4").tobytes()
            control = False
            self.sock.sendto(result, sender)


def eliding_call(kind: type, size: int, part) -> tuple[np.ndarray, ElidingAggregator, object]:
    """A one-rank job's int32 call of ``size`` values keeping ``part`` (ranges) on stream
    ``kind`` against an ``ElidingAggregator``: (the result, the aggregator, the stream's stats)."""
    agg = ElidingAggregator()
    thread = threading.Thread(target=agg.serve, daemon=True)
    thread.start()
    transport = UdpTransport(agg.sock.getsockname(), bind=("127.0.0.1", 0))
    try:
        stream = kind(Grant(3, 2, 0, 4, K, agg.sock.getsockname()), 0, 1, transport,
                      rto_min=3.0, rto_max=3.0, stall_timeout=5.0)   # no resends on a loaded machine
        x = np.arange(size, dtype=np.int32)
        stream.allreduce(x, part=part)
        return x, agg, stream.stats
    finally:
        agg.stop()
        thread.join(5)
        agg.sock.close()
        transport.close()


STREAMS = pytest.mark.parametrize("kind", [SlotStream, NativeSlotStream], ids=["python", "native"])


@STREAMS
def test_a_stream_takes_values_elided_only_outside_its_shard(kind):
    """Shard [10, 30) of 40 values in blocks of 4: blocks 3..6 are the rank's (FLAG_MINE), 2
    and 7 straddle its edges, the rest are other ranks'. A header-only answer is taken for the
    others' blocks only (nothing written: they keep the input) and dropped as missing_values
    for the rank's own and the straddling ones, whose whole answers follow."""
    x, agg, s = eliding_call(kind, 40, [(10, 30)])
    touched = np.zeros(40, bool)
    touched[8:32] = True                               # blocks 2..7 touch [10, 30)
    assert x.tolist() == np.where(touched, 2 * np.arange(40), np.arange(40)).tolist()
    assert {o for o, f in agg.flags.items() if f & FLAG_MINE} == {12, 16, 20, 24}
    assert s.elided_results == 4                       # blocks 0, 1, 8, 9
    assert s.result_drops["missing_values"] == 6       # blocks 2..7
    assert 6 + 3 <= s.ignored_results <= 6 + 4         # the whole answers after elided ones (the
                                                       # last may come after the call)


@STREAMS
def test_a_stream_marks_and_elides_by_each_of_several_ranges(kind):
    """Part [0, 8), [14, 22), [22, 26), [36, 40) of 40 values in blocks of 4 (a host's leader of
    ranks not consecutive): the touching ranges are one, [14, 26); blocks 0, 1, 4, 5 and 9 lie
    wholly in a range (FLAG_MINE), 3 and 6 straddle an edge, 2, 7 and 8 meet no range: only
    theirs are taken as headers alone."""
    x, agg, s = eliding_call(kind, 40, [(0, 8), (14, 22), (22, 26), (36, 40)])
    elided = np.zeros(40, bool)
    elided[8:12] = elided[28:36] = True                # blocks 2, 7, 8
    assert x.tolist() == np.where(elided, np.arange(40), 2 * np.arange(40)).tolist()
    assert {o for o, f in agg.flags.items() if f & FLAG_MINE} == {0, 4, 16, 20, 36}
    assert s.elided_results == 3
    assert s.result_drops["missing_values"] == 7       # the header-only answers of the other 7


BAD_PARTS = {
    "ranges that overlap": [(0, 8), (6, 12)],
    "ranges not sorted by their first value": [(20, 24), (0, 8)],
    "a range outside the tensor": [(36, 44)],
    "a range whose end lies before its first value": [(8, 4)],
}


@STREAMS
@pytest.mark.parametrize("problem", list(BAD_PARTS))
def test_bad_ranges_refuse_the_call_naming_the_problem(kind, problem):
    """Ranges that are no part of the tensor refuse the call in its control round (on every
    rank alike: ``CallRefused``, naming the rank and the problem), before any block moves."""
    with pytest.raises(CallRefused, match=rf"rank 0 passed values to keep with {problem} \(pass sorted, disjoint"):
        eliding_call(kind, 40, BAD_PARTS[problem])


def native_verdict(ranges, size):
    """``_native.check_part``'s part of ``ranges``, or the words of its error."""
    try:
        return tuple(_native.check_part(ranges, size))
    except ValueError as e:
        return str(e).split(": ")[1].split(";")[0]


@settings(max_examples=300, deadline=None)
@given(size=st.integers(0, 40), ranges=st.lists(st.tuples(st.integers(-2, 42), st.integers(-2, 42)), max_size=6))
def test_both_checks_of_a_part_give_the_same_verdict(size, ranges):
    """C++ ``check_part`` against its Python twin on any ranges, good or bad: the same part
    (touching ranges joined, empty ones left out) or the same problem named."""
    try:
        want = check_part(ranges, size)
    except BadPart as e:
        want = str(e).split(": ")[1].split(";")[0]
    assert native_verdict(ranges, size) == want


def part_of(size: int, edges: list[int]) -> list[tuple[int, int]]:
    """Ranges of ``size`` values from sorted ``edges`` taken in pairs (some empty, some touching)."""
    edges = sorted(min(e, size) for e in edges)
    return list(zip(edges[::2], edges[1::2]))


@settings(max_examples=15, deadline=None)
@given(size=st.integers(1, 48), edges=st.lists(st.integers(0, 48), max_size=8))
def test_both_streams_mark_take_and_write_the_same_blocks(size, edges):
    """The C++ stream against its Python twin on any part of any call, of up to 4 ranges (none
    or only empty ones: an allreduce, every header-only answer missing_values): the same blocks
    marked FLAG_MINE, the same elided answers taken, the same result."""
    part = part_of(size, edges)
    runs = []
    for kind in (SlotStream, NativeSlotStream):
        x, agg, stats = eliding_call(kind, size, part)
        runs.append((x.tolist(), sorted(o for o, f in agg.flags.items() if f & FLAG_MINE), stats.elided_results,
                     stats.result_drops.get("missing_values", 0)))
    assert runs[0] == runs[1]


def start_ranks(dep: LoopbackDeployment, n: int) -> list[Communicator]:
    """``n`` ranks of one job on ``dep``, even ranks on the C++ stream, odd ones on the Python
    one (both speak the same protocol)."""
    store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), n)
    return on_ranks(lambda r: Communicator(store, r, n, dep.controller, bind_ip=dep.worker_ip(r),
                                           native=r % 2 == 0), n)


def inputs(n: int, size: int) -> list[np.ndarray]:
    rng = np.random.default_rng(5)
    return [rng.standard_normal(size).astype(np.float32) for _ in range(n)]


def scatter_and_reduce(comms: list[Communicator], size: int, between=lambda: None) -> tuple[list, list]:
    """Every rank's allreduce of its input, then (after ``between()``) its reduce-scatter of
    the same input: (the allreduced arrays, the outputs)."""
    n = len(comms)
    xs = inputs(n, size)
    summed = [x.copy() for x in xs]
    on_ranks(lambda r: comms[r].allreduce(summed[r]), n)
    between()
    outs = [np.zeros(size // n, np.float32) for _ in range(n)]
    on_ranks(lambda r: comms[r].reduce_scatter_async(xs[r], outs[r]).wait(), n)
    assert all(np.array_equal(x, y) for x, y in zip(xs, inputs(n, size)))   # inputs only read
    return summed, outs


def settled_frames(path: Path) -> list[bytes]:
    """The frames of a pcap the soft switch is writing, once its writer has caught up (the
    file stops growing)."""
    size, deadline = -1, time.monotonic() + 20
    while time.monotonic() < deadline and (path.stat().st_size if path.exists() else -2) != size:
        size = path.stat().st_size if path.exists() else -2
        time.sleep(0.3)
    return [bytes(frame) for frame, _ in RawPcapReader(str(path))]


def result_blocks(frames: list[bytes]) -> tuple[set[int], set[int], int]:
    """Of the inagg results among ``frames`` (first answers, not resends): the offsets of data
    rounds that came with values, of those that came without, and the bytes of all of them."""
    whole, elided, nbytes = set(), set(), 0
    for f in frames:
        h = unpack_header(f[42:])
        if h.flags & FLAG_RETRANSMIT:
            continue
        nbytes += len(f)
        if h.count and h.offset:   # block 0 shares offset 0 and slot 0 with the control round: left out
            (whole if len(f) > 42 + HEADER_BYTES else elided).add(h.offset)
    return whole, elided, nbytes


def marked(frames: list[bytes]) -> set[int]:
    """Offsets of the contributions among ``frames`` that carry FLAG_MINE."""
    return {h.offset for h in (unpack_header(f[42:]) for f in frames) if h.flags & FLAG_MINE}


def own(rank: int, n: int, size: int, k: int) -> set[int]:
    """Offsets of the blocks of ``k`` values wholly in rank ``rank``'s shard."""
    shard = size // n
    return {o for o in range(0, size, k) if o // shard == (min(o + k, size) - 1) // shard == rank}


def others(rank: int, n: int, size: int, k: int) -> set[int]:
    """Offsets of the blocks of ``k`` values wholly in another rank's shard: the only ones whose
    values rank ``rank`` does not get (a block across two shards has no owner: every rank's)."""
    shard = size // n
    return {o for o in range(0, size, k) if o // shard == (min(o + k, size) - 1) // shard != rank}


SIZE = 4 * 100_000   # 4 shards of 100,000 values: at K = 4096 (loopback) three blocks straddle two shards


def test_a_reduce_scatter_on_the_switch_sends_each_rank_its_shard_alone(tmp_path):
    """4 ranks on the soft switch: every output is the allreduce's shard, bit for bit; in the
    pcaps of each rank's switch port, the allreduce's contributions carry no FLAG_MINE and the
    reduce-scatter's carry it on the blocks wholly in the rank's shard, whose results carry
    values only for the blocks that hold some of its shard (the others' come as headers), its
    bytes about a quarter of the allreduce's."""
    n = 4
    with LoopbackDeployment(n, pcap=tmp_path) as dep:
        comms = start_ranks(dep, n)
        try:
            k = comms[0].grant.values_per_packet
            before = {}
            summed, outs = scatter_and_reduce(comms, SIZE, lambda: before.update(
                {(r, d): settled_frames(dep.port_pcap(r, d)) for r in range(n) for d in ("in", "out")}))
            after = {(r, d): settled_frames(dep.port_pcap(r, d)) for r in range(n) for d in ("in", "out")}
            stats = [c.stats() for c in comms]
        finally:
            for c in comms:
                c.close()
    assert stats[0]["mode"] == "switch"
    for r in range(n):
        assert np.array_equal(outs[r], summed[r][r * SIZE // n:(r + 1) * SIZE // n])
        assert marked(before[r, "in"]) == set()
        assert marked(after[r, "in"][len(before[r, "in"]):]) == own(r, n, SIZE, k)
        elsewhere, all_blocks = others(r, n, SIZE, k), set(range(0, SIZE, k))
        whole, elided, scatter_bytes = result_blocks(after[r, "out"][len(before[r, "out"]):])
        assert whole == all_blocks - elsewhere - {0} and elided == elsewhere - {0}
        assert stats[r]["elided_results"] == len(elsewhere)
        reduce_bytes = result_blocks(before[r, "out"])[2]
        headers = (42 + HEADER_BYTES) * (len(all_blocks) + 16)   # every block's header, the priming
        assert scatter_bytes <= reduce_bytes / n + headers + 4 * (42 + HEADER_BYTES + 4 * k)


def test_a_reduce_scatter_on_the_host_aggregator_sends_each_rank_its_shard_alone():
    """The same job on the host aggregator (no switch): exact shards, and each rank takes the
    blocks outside its shard as headers alone."""
    n = 4
    with LoopbackDeployment(n, with_switch=False) as dep:
        comms = start_ranks(dep, n)
        try:
            summed, outs = scatter_and_reduce(comms, SIZE)
            stats = [c.stats() for c in comms]
        finally:
            for c in comms:
                c.close()
    assert stats[0]["mode"] == "host"
    k = comms[0].grant.values_per_packet
    for r in range(n):
        assert np.array_equal(outs[r], summed[r][r * SIZE // n:(r + 1) * SIZE // n])
        assert stats[r]["elided_results"] == len(others(r, n, SIZE, k))


def test_ranks_keeping_several_ranges_get_them_and_bad_ranges_fail_the_call_on_every_rank():
    """Two ranks on the host aggregator, each keeping two ranges of the sum (``Communicator.allreduce``'s
    ``keep``, as a host's leader of ranks not consecutive does), the other's complement: each
    gets its ranges' sums, and takes exactly the blocks wholly in the other's ranges as headers
    alone (two blocks straddle an edge and come whole to both). Then rank 1 passes ranges that
    overlap: both ranks' call fails naming rank 1 and the problem, and the next call is exact."""
    with LoopbackDeployment(2, with_switch=False) as dep:
        comms = start_ranks(dep, 2)
        try:
            k = comms[0].grant.values_per_packet
            size = 12 * k
            keeps = [[(0, 3 * k + 5), (6 * k + 5, 9 * k)], [(3 * k + 5, 6 * k + 5), (9 * k, size)]]
            xs = [np.arange(size, dtype=np.int32) * (r + 1) for r in range(2)]
            on_ranks(lambda r: comms[r].allreduce(xs[r], keep=keeps[r]), 2)
            elided = [c.stats()["elided_results"] for c in comms]
            bad = [[(0, 8)], [(0, 10), (5, 20)]]
            errors = on_ranks(lambda r: comms[r].allreduce(np.ones(size, np.int32), keep=bad[r]), 2,
                              return_errors=True)
            after = on_ranks(lambda r: comms[r].allreduce(np.ones(size, np.int32), keep=keeps[r]), 2)
        finally:
            for c in comms:
                c.close()
    for r in range(2):
        for first, end in keeps[r]:
            assert np.array_equal(xs[r][first:end], 3 * np.arange(first, end, dtype=np.int32))
        assert isinstance(errors[r], CallRefused)
        assert "rank 1 passed values to keep with ranges that overlap" in str(errors[r])
        assert all((after[r][first:end] == 2).all() for first, end in keeps[r])
    assert elided == [5, 5]      # blocks 4, 5, 9, 10, 11 / 0, 1, 2, 7, 8; blocks 3 and 6 straddle

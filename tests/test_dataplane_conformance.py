"""One conformance suite for both data planes: the software twin (always) and BMv2 (when
simple_switch_grpc and p4c-bm2-ss are installed). Same packets in, same packets expected out.

Topology: ports 1-3 are worker hosts h1-h3, port 4 is the host aggregator h4; the switch's
aggregator address is 10.0.0.254. Jobs 1 and 2 use the UDP encapsulation, job 3 RoCEv2. Job 5
is a job of an aggregation tree (docs/trees.md) in which this switch is a ToR: its parent (a
spine's aggregator address) is behind port 4, and the test plays the parent."""

import numpy as np
import pytest
from scapy.contrib.roce import BTH
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import ARP, Ether

from inagg.bmv2_env.emulation.testbed import TOFINO_TARGETS, Dataplane, bmv2_missing, have_netns, program_testbed
from inagg.controller.p4info import P4Type
from inagg.controller.switch import (
    MODIFY, JobAdmission, JobCounters, ResultReplication, SourceGuard, SwitchConnection, SwitchJob,
    UplinkBinding, WorkerBinding,
)
from inagg.hostlib.wire.protocol import (
    EXP_NONE, FLAG_CONGESTION, FLAG_FROM_HOST, FLAG_FROM_SWITCH, FLAG_MINE, FLAG_OVERFLOW, FLAG_RETRANSMIT,
    MSG_CONTRIBUTION,
    MSG_RESULT, SWITCH_VALUES_PER_PACKET as K, UDP_PORT, build_contribution, pack_header, round_fields,
    round_tag, unpack_header,
)
from inagg.hostlib.wire.roce import INAGG_IMMEDIATE, IPV4_BYTES, ROCE_UDP_PORT, decapsulate, frame

SWITCH_IP, SWITCH_MAC = "10.0.0.254", "00:00:00:00:00:fe"


def host(port):
    return f"00:00:00:00:00:0{port}", f"10.0.0.{port}"


def worker(rank, port, udp_port):
    m, ip = host(port)
    return WorkerBinding(rank, port, ip, m, udp_port)


JOB1 = SwitchJob(1, 0, 1, 0, 8, (worker(0, 1, 50000), worker(1, 2, 50001), worker(2, 3, 50002)))
JOB2 = SwitchJob(2, 1, 1, 8, 8, (worker(0, 2, 51000), worker(1, 3, 51001)))
# RoCEv2 workers: results go to their QP (0x100 + rank) with their rkey
JOB3 = SwitchJob(3, 2, 1, 16, 8, tuple(
    WorkerBinding(r, p, host(p)[1], host(p)[0], 0, qp=0x100 + r, rkey=0xA000 + r)
    for r, p in ((0, 1), (1, 3))), encap="roce")
# Two ranks on one host (h1: one IP, one MAC, a UDP port each), as on a multi-GPU host
JOB4 = SwitchJob(4, 3, 1, 24, 8, (worker(0, 1, 52000), worker(1, 1, 52001), worker(2, 2, 52002)))
# A ToR of a tree: id 1 at its parent (behind port 4), whose slots for the job start at 100; its
# workers are the job's ranks 2 and 3 (ranks 0 and 1 hang off another ToR): two children
PARENT_IP, PARENT_MAC = "10.0.1.254", "00:00:00:00:01:fe"
JOB5 = SwitchJob(5, 4, 1, 32, 8, (worker(2, 1, 53000), worker(3, 2, 53001)), uplink=UplinkBinding(
    4, 1, 100, PARENT_MAC, PARENT_IP, UDP_PORT, SWITCH_MAC, SWITCH_IP, UDP_PORT))
JOBS = (JOB1, JOB2, JOB3, JOB4, JOB5)
# The jobs the TNA program carries: UDP, no uplink (docs/tofino.md); its model (targets
# "tofino-model", "tofino2-model": as built for each chip) runs the suite with these, at the
# Tofino program's K (64 on both chips, BMv2's too).
UDP_JOBS = tuple(j for j in JOBS if j.encap == "udp" and j.uplink is None)


@pytest.fixture(scope="module", params=["soft", "soft-python", "bmv2", *TOFINO_TARGETS])
def dp(request):
    reason = have_netns() or (bmv2_missing() if request.param == "bmv2" else None)
    if reason:
        pytest.skip(reason)
    plane = Dataplane(request.param).start()
    plane.jobs = UDP_JOBS if request.param in TOFINO_TARGETS else JOBS
    sw = None
    try:
        sw = SwitchConnection(plane.grpc_addr, program=plane.program)
        sw.push_pipeline()
        assert sw.p4info.values_per_packet == K
        # SourceGuard on the workers' ports 1-3 where the program has it; port 4 (the host
        # aggregator's, and the tree parent's) stays open
        plane.guarded = sw.p4info.has(P4Type.table, "host_port_table")
        program_testbed(sw, plane.jobs, 4, (SWITCH_IP, host(4)[1]) if plane.guarded else None)
        plane.sw = sw
        yield plane
    finally:
        if sw is not None:
            sw.close()
        plane.stop()


def needs(dp, job):
    """Skip where the data plane's program does not carry ``job`` (RoCE, a tree's uplink)."""
    if job not in dp.jobs:
        pytest.skip(f"{dp.target}: job {job.job_id} ({job.encap}"
                    f"{', tree uplink' if job.uplink else ''}) is not in its program")


def contribution(job, rank, values, *, slot, slot_set=0, round_no=None, epoch=1, offset=0, exp=EXP_NONE,
                 flags=0, src_port=None, raw=None, eth_src=None, udp_sport=None):
    """A worker's contribution frame as it leaves the worker's host (``rank``: the worker's
    index in ``job.workers``, its rank in the packet is the binding's; ``round_no``: the slot's
    round it belongs to, its set and round tag, else the first round of ``slot_set``;
    ``src_port``: the switch port it enters by; ``eth_src``, ``udp_sport``: forged sources)."""
    w = job.workers[rank]
    slot_set, tag_flags = round_fields(slot_set if round_no is None else round_no)
    payload = raw if raw is not None else build_contribution(
        job.job_id, w.rank, epoch, slot, slot_set, offset,
        None if values is None else np.asarray(values, np.int32), K, exp=exp, flags=flags | tag_flags)
    return bytes(Ether(src=eth_src or w.mac, dst=SWITCH_MAC) / IP(src=w.ip, dst=SWITCH_IP)
                 / UDP(sport=udp_sport or w.udp_port, dport=UDP_PORT, chksum=0) / payload), (src_port or w.port)


def send(dp, frame_port):
    frame, port = frame_port
    dp.send(port, frame)


def parse_result(frame):
    pkt = Ether(frame)
    data = bytes(pkt[UDP].payload)
    h = unpack_header(data)
    values = np.frombuffer(data, ">i4", h.count and K, 16)[: h.count].tolist() if h.count else []
    return pkt, h, values


def expect_results(dp, job, ranks, timeout=1.0):
    got = dp.recv_all(timeout)
    ports = {job.workers[r].port for r in ranks}
    out = {}
    for port, frames in got.items():
        frames = [f for f in frames if UDP in Ether(f)]
        if port not in ports:
            assert frames == [], f"unexpected frames on port {port}"
            continue
        assert len(frames) == sum(job.workers[r].port == port for r in ranks), (port, frames)
        for f in frames:
            pkt, h, values = parse_result(f)
            rank = next(r for r in ranks if job.workers[r].udp_port == pkt[UDP].dport)
            w = job.workers[rank]
            assert (pkt[Ether].dst, pkt[IP].dst, pkt[IP].src, pkt[UDP].sport) == (w.mac, w.ip, SWITCH_IP, UDP_PORT)
            assert h.msg_type == MSG_RESULT and not h.flags & FLAG_FROM_HOST
            out[rank] = (h, values)
    assert sorted(out) == sorted(ranks)
    return out


def test_ordinary_traffic_is_forwarded(dp):
    dp.drain()
    unicast = bytes(Ether(src=host(1)[0], dst=host(2)[0]) / IP(src=host(1)[1], dst=host(2)[1]) / UDP(sport=1, dport=2) / b"hi")
    dp.send(1, unicast)
    got = dp.recv_all()
    assert got[2] == [unicast] and got[1] == got[3] == got[4] == []
    arp = bytes(Ether(src=host(1)[0], dst="ff:ff:ff:ff:ff:ff") / ARP(psrc=host(1)[1], pdst=host(2)[1]))
    dp.send(1, arp)
    got = dp.recv_all()
    assert got[1] == [] and all(got[p] == [arp] for p in (2, 3, 4))


def test_three_workers_complete_with_multicast(dp):
    dp.drain()
    send(dp, contribution(JOB1, 0, range(K), slot=1, exp=-2))
    send(dp, contribution(JOB1, 1, [10] * K, slot=1, exp=4, flags=FLAG_OVERFLOW))
    assert all(v == [] for v in dp.recv_all(0.3).values())
    send(dp, contribution(JOB1, 2, [-1] * K, slot=1, exp=3, offset=0))
    results = expect_results(dp, JOB1, [0, 1, 2])
    for h, values in results.values():
        assert values == [i + 9 for i in range(K)]
        assert (h.exp, h.slot, h.slot_set, h.count, h.job_id) == (4, 1, 0, K, 1)
        assert h.flags & FLAG_OVERFLOW


def test_two_workers_complete(dp):
    dp.drain()
    send(dp, contribution(JOB2, 0, [7] * K, slot=8, offset=640))
    send(dp, contribution(JOB2, 1, [5] * K, slot=8, offset=640))
    for h, values in expect_results(dp, JOB2, [0, 1]).values():
        assert values == [12] * K and h.offset == 640


def test_duplicates_before_and_after_completion(dp):
    dp.drain()
    send(dp, contribution(JOB2, 0, [1] * K, slot=9))
    send(dp, contribution(JOB2, 0, [1] * K, slot=9, flags=FLAG_RETRANSMIT))
    assert all(v == [] for v in dp.recv_all(0.3).values())
    send(dp, contribution(JOB2, 1, [2] * K, slot=9))
    for _, values in expect_results(dp, JOB2, [0, 1]).values():
        assert values == [3] * K                      # the duplicate was not added
    send(dp, contribution(JOB2, 1, [2] * K, slot=9, flags=FLAG_RETRANSMIT))
    (h, values), = expect_results(dp, JOB2, [1]).values()   # unicast to the asker only
    assert values == [3] * K and h.flags & FLAG_RETRANSMIT


def test_shadow_sets_alternate(dp):
    dp.drain()
    for rnd, s in enumerate([0, 1, 0]):
        send(dp, contribution(JOB2, 0, [rnd] * K, slot=10, round_no=rnd, offset=rnd * K))
        send(dp, contribution(JOB2, 1, [100] * K, slot=10, round_no=rnd, offset=rnd * K))
        for h, values in expect_results(dp, JOB2, [0, 1]).values():
            assert values == [100 + rnd] * K and h.slot_set == s and h.offset == rnd * K
            assert round_tag(h.flags) == rnd // 2           # every result carries its round's tag


def test_priming_round_is_header_only(dp):
    dp.drain()
    send(dp, contribution(JOB2, 0, None, slot=11, exp=-7))
    send(dp, contribution(JOB2, 1, None, slot=11, exp=12))
    for h, values in expect_results(dp, JOB2, [0, 1]).values():
        assert h.count == 0 and values == [] and h.exp == 12


def test_epoch_change_resets_slot(dp):
    dp.drain()
    counters = JobCounters(dp.sw)
    before = counters.job(JOB2.job_index)["drops"].get("stale_epoch", 0)
    send(dp, contribution(JOB2, 0, [50] * K, slot=12))           # half a round, epoch 1
    dp.recv_all(0.2)
    new = SwitchJob(**{**JOB2.__dict__, "epoch": 2})
    dp.sw.write(JobAdmission(dp.sw).updates(MODIFY, new)[:1])
    try:
        send(dp, contribution(JOB2, 1, [1] * K, slot=12))        # old epoch: refused
        assert all(v == [] for v in dp.recv_all(0.3).values())
        assert counters.job(JOB2.job_index)["drops"]["stale_epoch"] == before + 1
        send(dp, contribution(JOB2, 0, [2] * K, slot=12, epoch=2))
        send(dp, contribution(JOB2, 1, [3] * K, slot=12, epoch=2))
        for h, values in expect_results(dp, JOB2, [0, 1]).values():
            assert values == [5] * K and h.epoch == 2              # the epoch-1 50s are gone
    finally:
        dp.sw.write(JobAdmission(dp.sw).updates(MODIFY, JOB2)[:1])


def test_unadmitted_job_goes_to_the_host_aggregator(dp):
    dp.drain()
    agg_mac, agg_ip = host(4)
    payload = build_contribution(9, 0, 1, 3, 0, 0, np.ones(K, np.int32), K)
    frame = bytes(Ether(src=host(1)[0], dst=agg_mac) / IP(src=host(1)[1], dst=agg_ip)
                  / UDP(sport=50000, dport=UDP_PORT, chksum=0) / payload)
    dp.send(1, frame)
    got = dp.recv_all()
    assert got[4] == [frame] and got[1] == got[2] == got[3] == []


def test_forged_packets_are_dropped_and_counted_while_other_job_is_exact(dp):
    dp.drain()
    counters = JobCounters(dp.sw)
    before = counters.job(JOB1.job_index)
    send(dp, contribution(JOB2, 0, [1] * K, slot=13))
    send(dp, contribution(JOB1, 0, [99] * K, slot=2, src_port=2))      # rank 0 of job 1 from h2's port
    send(dp, contribution(JOB1, 1, [99] * K, slot=13))                 # job 2's slot
    send(dp, contribution(JOB1, 1, [99] * K, slot=2, epoch=7))         # wrong epoch
    forged_rank = build_contribution(1, 5, 1, 2, 0, 0, np.ones(K, np.int32), K)
    send(dp, contribution(JOB1, 1, None, slot=2, raw=forged_rank))      # rank 5 of a 3-worker job
    send(dp, contribution(JOB2, 1, [2] * K, slot=13))
    for _, values in expect_results(dp, JOB2, [0, 1]).values():
        assert values == [3] * K
    after = counters.job(JOB1.job_index)
    drops = {r: after["drops"].get(r, 0) - before["drops"].get(r, 0) for r in after["drops"]}
    assert drops == {"bad_worker": 2, "bad_slot": 1, "stale_epoch": 1}
    assert after["packets"] - before["packets"] == 4
    assert after["aggregated"] == before["aggregated"]


def test_two_ranks_on_one_host_are_told_apart_by_udp_port_and_mac(dp):
    """Ranks 0 and 1 of job 4 share h1's port, IP and MAC: each is bound to its UDP source port,
    so one cannot contribute as the other; a forged MAC is refused too; the round completes and
    both get their result."""
    dp.drain()
    counters = JobCounters(dp.sw)
    before = counters.job(JOB4.job_index)
    send(dp, contribution(JOB4, 0, [1] * K, slot=24, offset=0))
    send(dp, contribution(JOB4, 1, [9] * K, slot=24, udp_sport=52000))      # rank 1 from rank 0's port
    send(dp, contribution(JOB4, 1, [9] * K, slot=24, eth_src="00:00:00:00:00:09"))  # forged MAC
    send(dp, contribution(JOB4, 2, [9] * K, slot=24, udp_sport=52001))      # h2 claiming h1's port
    assert not [f for fs in dp.recv_all(0.3).values() for f in fs if UDP in Ether(f)]   # no result
    send(dp, contribution(JOB4, 1, [2] * K, slot=24))
    send(dp, contribution(JOB4, 2, [3] * K, slot=24))
    for _, values in expect_results(dp, JOB4, [0, 1, 2]).values():
        assert values == [6] * K
    after = counters.job(JOB4.job_index)
    assert after["drops"].get("bad_worker", 0) - before["drops"].get("bad_worker", 0) == 3
    assert after["aggregated"] - before["aggregated"] == 3


def test_malformed_and_truncated_packets(dp):
    dp.drain()
    counters = JobCounters(dp.sw)
    g0, j0 = counters.global_drops(), counters.job(JOB2.job_index)
    good = build_contribution(2, 0, 1, 14, 0, 0, np.ones(K, np.int32), K)
    send(dp, contribution(JOB2, 0, None, slot=14, raw=good[:10]))               # short header
    send(dp, contribution(JOB2, 0, None, slot=14, raw=b"\x21" + good[1:]))      # version 2
    send(dp, contribution(JOB2, 0, None, slot=14, raw=good[:16 + 40]))          # 10 of 64 values
    too_many = pack_header(1, 1, 0, 2, 0, EXP_NONE, 1, 0, 14, K + 1, 0) + bytes(4 * K)
    send(dp, contribution(JOB2, 0, None, slot=14, raw=too_many))                # count > K
    result = bytes([0x12]) + good[1:]
    send(dp, contribution(JOB2, 0, None, slot=14, raw=result, src_port=4))      # a RESULT sent in
    assert all(v == [] for v in dp.recv_all(0.4).values())
    g1, j1 = counters.global_drops(), counters.job(JOB2.job_index)
    assert {r: g1[r] - g0.get(r, 0) for r in g1} == {"truncated": 1, "bad_version": 1}
    assert {r: j1["drops"][r] - j0["drops"].get(r, 0) for r in ("bad_length", "bad_type")} == \
        {"bad_length": 2, "bad_type": 1}
    # the slot is untouched: a clean round still sums exactly
    send(dp, contribution(JOB2, 0, [4] * K, slot=14))
    send(dp, contribution(JOB2, 1, [4] * K, slot=14))
    for _, values in expect_results(dp, JOB2, [0, 1]).values():
        assert values == [8] * K


def test_contribution_of_another_round_is_dropped_as_bad_round(dp):
    """A packet whose offset or count differ from its round's (stored by the round's first
    contribution) neither joins the round nor gets its result, on either data plane."""
    dp.drain()
    counters = JobCounters(dp.sw)
    before = counters.job(JOB1.job_index)
    send(dp, contribution(JOB1, 0, [1] * K, slot=4, offset=256))
    send(dp, contribution(JOB1, 1, [2] * K, slot=4, offset=320))       # another offset
    send(dp, contribution(JOB1, 1, None, slot=4, offset=256))          # count 0, not K
    send(dp, contribution(JOB1, 0, None, slot=4, offset=256))          # a "duplicate", count 0
    assert all(v == [] for v in dp.recv_all(0.3).values())
    send(dp, contribution(JOB1, 1, [2] * K, slot=4, offset=256))
    send(dp, contribution(JOB1, 2, [3] * K, slot=4, offset=256))
    for h, values in expect_results(dp, JOB1, [0, 1, 2]).values():
        assert values == [6] * K and (h.offset, h.count) == (256, K)
    send(dp, contribution(JOB1, 2, [3] * K, slot=4, offset=320))       # done round, other offset
    assert all(v == [] for v in dp.recv_all(0.3).values())
    after = counters.job(JOB1.job_index)
    assert after["drops"].get("bad_round", 0) - before["drops"].get("bad_round", 0) == 4
    assert after["aggregated"] - before["aggregated"] == 3
    assert after["duplicates"] == before["duplicates"]


def late_copy_rounds(dp, slot, next_offset):
    """Rounds 0 and 1 of JOB1's ``slot`` complete; a copy of rank 2's round 0 arrives late; then
    round 2 at ``next_offset``. The results of round 2 (or {} when none came)."""
    dp.drain()
    for round_no, offset in ((0, 0), (1, K)):
        for rank in range(3):
            send(dp, contribution(JOB1, rank, [10 ** (2 - rank)] * K, slot=slot, round_no=round_no,
                                  offset=offset))
        expect_results(dp, JOB1, [0, 1, 2])
    send(dp, contribution(JOB1, 2, [1] * K, slot=slot, round_no=0, offset=0))   # late: round 0
    assert all(v == [] for v in dp.recv_all(0.3).values())
    for rank in range(3):
        send(dp, contribution(JOB1, rank, [3 * 10 ** (2 - rank)] * K, slot=slot, round_no=2,
                              offset=next_offset))
    got = [f for frames in dp.recv_all(1.0).values() for f in frames if UDP in Ether(f)]
    return [parse_result(f)[1:] for f in got]


def test_a_late_copy_cannot_change_the_next_rounds_sum(dp):
    """Issue 38, S1: a copy of round 0 late past round 1, then round 2 with round 0's offset and
    count: the copy is stale (without the round tag it opened set 0: 331 for 333)."""
    counters = JobCounters(dp.sw)
    before = counters.job(JOB1.job_index)["drops"].get("stale_round", 0)
    results = late_copy_rounds(dp, 3, 0)
    assert len(results) == 3 and all(v == [333] * K and round_tag(h.flags) == 1 for h, v in results)
    assert counters.job(JOB1.job_index)["drops"]["stale_round"] == before + 1


def test_a_late_copy_cannot_stall_the_next_round(dp):
    """Issue 38, S4: the same late copy with round 2 at another offset made every round-2 packet
    BAD_ROUND (a stalled job): round 2 completes."""
    results = late_copy_rounds(dp, 7, 2 * K)
    assert len(results) == 3 and all(v == [333] * K and h.offset == 2 * K for h, v in results)


def test_bytes_after_the_udp_payload_follow_the_result(dp):
    """Bytes after the UDP payload (Ethernet padding, a trailer) are what the P4 parser leaves
    unparsed: BMv2 sends them on after the deparsed headers, in every copy of the result, and
    the lengths in the IPv4/UDP headers stay the trigger's."""
    dp.drain()
    f0, p0 = contribution(JOB1, 0, [1] * K, slot=5)
    f1, p1 = contribution(JOB1, 1, [1] * K, slot=5)
    f2, p2 = contribution(JOB1, 2, [1] * K, slot=5)
    dp.send(p0, f0 + b"\0\0")
    dp.send(p1, f1)
    dp.send(p2, f2 + b"TRAILER")
    got = dp.recv_all(1.0)
    frames = [f for port in (1, 2, 3) for f in got[port]]
    assert len(frames) == 3
    for f in frames:
        assert f.endswith(b"TRAILER") and len(f) == len(f2) + 7
        pkt, h, values = parse_result(f)
        assert values == [3] * K and pkt[IP].len == len(f2) - 14 and pkt[UDP].len == len(f2) - 34
    dp.send(p1, f1 + b"!")                                             # DUP_DONE, unicast
    (f,) = dp.recv_all(1.0)[p1]
    assert f.endswith(b"!") and parse_result(f[:-1])[2] == [3] * K


def test_recirculation_is_counted_by_pipe(dp):
    """The controller reads the TNA program's recirculation counters where the P4Info has them
    (JobCounters.recirculation): a completed round's result is one pass sent to its pipe's
    recirculation port (ports 1-4 are pipe 0) and one back, none lost; the other programs
    recirculate nothing and have no such counters."""
    dp.drain()
    counters = JobCounters(dp.sw)
    before = counters.recirculation().get(0, {"sent": 0, "arrived": 0, "lost": 0})
    send(dp, contribution(JOB2, 0, [3] * K, slot=15))
    send(dp, contribution(JOB2, 1, [4] * K, slot=15))
    assert all(values == [7] * K for _, values in expect_results(dp, JOB2, [0, 1]).values())
    if dp.target not in TOFINO_TARGETS:
        assert counters.recirculation() == {}
        return
    after = counters.recirculation()
    assert after[0] == {"sent": before["sent"] + 1, "arrived": before["arrived"] + 1, "lost": before["lost"]}


def test_counters_and_state_read_back(dp):
    counters = JobCounters(dp.sw)
    c = counters.job(JOB2.job_index)
    assert c["results"] >= 1 and c["aggregated"] >= 2 * c["results"] and c["packets"] >= c["aggregated"]
    entries = dp.sw.table_entries("job_table")
    admit = {"job_index": 0, "slot_base": 0, "slot_count": 8, "n_workers": 3, "epoch": 1,
             "mcast_grp": JOB1.mcast_grp, "encap": 1}
    if dp.target in TOFINO_TARGETS:
        admit["slot_end"] = 8                                  # the bound the TNA action takes
    assert ({"job_id": 1}, "admit", admit) in entries
    groups = ResultReplication(dp.sw).groups()
    assert sorted(groups[JOB1.mcast_grp]) == [(1, 1), (2, 2), (3, 3)]


# -- RoCEv2 encapsulation ---------------------------------------------------------------------

def roce_contribution(job, rank, values, *, slot, exp=EXP_NONE, flags=0, psn=7, imm=INAGG_IMMEDIATE,
                      raw=None, dma_len=None, udp_len=None):
    """A RoCEv2 worker's contribution frame (inagg.hostlib.wire.roce framing, ICRC included); ``imm``,
    ``dma_len`` and ``udp_len`` overwrite those fields afterwards (the ICRC is then stale)."""
    w = job.workers[rank]
    inagg = raw if raw is not None else build_contribution(
        job.job_id, rank, job.epoch, slot, 0, 64 * slot,
        None if values is None else np.asarray(values, np.int32), K, exp=exp, flags=flags)
    pkt = bytearray(frame(inagg, dst_mac=SWITCH_MAC, src_mac=w.mac, src_ip=w.ip, dst_ip=SWITCH_IP,
                          src_port=0xC000 | rank, dst_qp=0x11, psn=psn, rkey=0x5555))
    at = 14 + IPV4_BYTES  # the UDP header; BTH at +8, RETH at +20, ImmDt at +36
    if imm != INAGG_IMMEDIATE:
        pkt[at + 36:at + 40] = imm.to_bytes(4, "big")
    if dma_len is not None:
        pkt[at + 32:at + 36] = dma_len.to_bytes(4, "big")
    if udp_len is not None:
        pkt[at + 4:at + 6] = udp_len.to_bytes(2, "big")
    return bytes(pkt), w.port


def expect_roce_results(dp, job, ranks, timeout=1.0):
    """The RoCE results on the ranks' ports: each addressed to its worker's QP and rkey, with an
    ICRC that both inagg.hostlib.wire.roce and scapy's independent BTH.compute_icrc accept."""
    got = dp.recv_all(timeout)
    out = {}
    for port, frames in got.items():
        frames = [f for f in frames if UDP in Ether(f)]
        want = [r for r in ranks if job.workers[r].port == port]
        assert len(frames) == len(want), (port, frames)
        for f in frames:
            inagg, meta = decapsulate(f[14:])                 # raises on a bad ICRC
            pkt = Ether(f)
            assert f[-4:] == pkt[BTH].compute_icrc(None)
            rank = next(r for r in want if job.workers[r].qp == meta.dst_qp)
            w = job.workers[rank]
            assert (pkt[Ether].dst, meta.dst_ip, meta.src_ip, pkt[UDP].dport, meta.rkey) == \
                (w.mac, w.ip, SWITCH_IP, ROCE_UDP_PORT, w.rkey)
            h = unpack_header(inagg)
            assert h.msg_type == MSG_RESULT and meta.va == 4 * h.offset
            values = np.frombuffer(inagg, ">i4", K, 16)[: h.count].tolist() if h.count else []
            out[rank] = (h, values)
    assert sorted(out) == sorted(ranks)
    return out


def test_roce_job_completes_with_per_worker_qp_and_icrc(dp):
    needs(dp, JOB3)
    dp.drain()
    send(dp, roce_contribution(JOB3, 0, None, slot=16, exp=3))          # priming: header only
    send(dp, roce_contribution(JOB3, 1, None, slot=16, exp=5))
    for h, values in expect_roce_results(dp, JOB3, [0, 1]).values():
        assert h.count == 0 and h.exp == 5
    send(dp, roce_contribution(JOB3, 0, range(K), slot=17, psn=0xFFFFFF))
    send(dp, roce_contribution(JOB3, 1, [-1] * K, slot=17))
    for h, values in expect_roce_results(dp, JOB3, [0, 1]).values():
        assert values == [i - 1 for i in range(K)] and h.slot == 17


def test_roce_duplicate_after_completion_is_answered_to_the_senders_qp(dp):
    needs(dp, JOB3)
    dp.drain()
    send(dp, roce_contribution(JOB3, 0, [1] * K, slot=18))
    send(dp, roce_contribution(JOB3, 1, [2] * K, slot=18))
    expect_roce_results(dp, JOB3, [0, 1])
    send(dp, roce_contribution(JOB3, 1, [2] * K, slot=18, flags=FLAG_RETRANSMIT))
    (h, values), = expect_roce_results(dp, JOB3, [1]).values()
    assert values == [3] * K and h.flags & FLAG_RETRANSMIT


def owner_rule_only(dp):
    """Skip where the program ignores FLAG_MINE (the TNA program on Tofino 1: every rank gets
    the values there; docs/tofino.md, "Reduce-scatter results")."""
    if TOFINO_TARGETS.get(dp.target) == "tofino":
        pytest.skip(f"{dp.target} ignores FLAG_MINE: every rank gets a reduce-scatter's values")


def udp_results(dp, job, timeout=1.0) -> dict[int, tuple[int, bytes]]:
    """Each worker's one UDP result frame: rank -> (frame length, its inagg bytes), the IPv4
    total length agreeing with UDP's and the IPv4 checksum right (what a host's kernel checks)."""
    out = {}
    for frames in dp.recv_all(timeout).values():
        for f in frames:
            pkt = Ether(f)
            if UDP not in pkt:
                continue
            assert pkt[IP].len == IPV4_BYTES + pkt[UDP].len
            header = pkt[IP].copy()
            header.chksum = None                          # recomputed when built
            assert IP(bytes(header)).chksum == pkt[IP].chksum
            rank = next(r for r, w in enumerate(job.workers) if w.udp_port == pkt[UDP].dport)
            out[rank] = (len(f), bytes(pkt[UDP].payload))
    return out


def test_a_reduce_scatter_round_gives_its_values_to_its_owner_alone(dp):
    """Rank 1 marks its block (FLAG_MINE): it alone gets the values, ranks 0 and 2 the header
    (count kept) in a frame whose IPv4 length is the shorter one; a resend is answered the same
    way (the owner's with the values, another rank's with the header)."""
    owner_rule_only(dp)
    dp.drain()
    for rank, flags in ((0, 0), (1, FLAG_MINE), (2, 0)):   # slot 2: other cases' packets there are refused
        send(dp, contribution(JOB1, rank, [rank + 1] * K, slot=2, flags=flags))
    got = udp_results(dp, JOB1)
    assert sorted(got) == [0, 1, 2]
    assert [len(got[r][1]) for r in range(3)] == [16, 16 + 4 * K, 16]
    assert all(unpack_header(got[r][1]).count == K for r in range(3))
    assert np.frombuffer(got[1][1], ">i4", K, 16).tolist() == [6] * K
    send(dp, contribution(JOB1, 0, [1] * K, slot=2, flags=FLAG_RETRANSMIT))
    assert {r: len(d) for r, (_, d) in udp_results(dp, JOB1).items()} == {0: 16}
    send(dp, contribution(JOB1, 1, [2] * K, slot=2, flags=FLAG_MINE | FLAG_RETRANSMIT))
    assert {r: len(d) for r, (_, d) in udp_results(dp, JOB1).items()} == {1: 16 + 4 * K}


def test_a_roce_reduce_scatter_header_has_the_shorter_dma_length_and_its_icrc(dp):
    needs(dp, JOB3)
    owner_rule_only(dp)
    dp.drain()
    send(dp, roce_contribution(JOB3, 0, [1] * K, slot=20))             # a slot no other case uses
    send(dp, roce_contribution(JOB3, 1, [2] * K, slot=20, flags=FLAG_MINE))
    frames = [f for fs in dp.recv_all(1.0).values() for f in fs if UDP in Ether(f)]
    lengths = sorted(len(decapsulate(f[14:])[0]) for f in frames)   # raises on a bad length or ICRC
    assert lengths == [16, 16 + 4 * K]


def test_encapsulation_must_be_the_jobs(dp):
    """A job's results go out in the trigger's encapsulation, so the other one is refused;
    RoCE traffic that is not inagg's (another immediate) is ordinary traffic."""
    needs(dp, JOB3)
    dp.drain()
    counters = JobCounters(dp.sw)
    c1, c3 = counters.job(JOB1.job_index), counters.job(JOB3.job_index)
    send(dp, contribution(JOB3, 0, [1] * K, slot=19, src_port=1, raw=build_contribution(
        3, 0, 1, 19, 0, 0, np.ones(K, np.int32), K)))                     # UDP to the RoCE job
    roce_to_udp_job = roce_contribution(JOB3, 0, None, slot=3, raw=build_contribution(
        1, 0, 1, 3, 0, 0, np.ones(K, np.int32), K))                       # RoCE to a UDP job
    send(dp, roce_to_udp_job)
    send(dp, roce_contribution(JOB3, 1, [1] * K, slot=19, dma_len=20))  # RETH length wrong
    send(dp, roce_contribution(JOB3, 1, [1] * K, slot=19, udp_len=40))  # UDP length < headers
    assert all(v == [] for v in dp.recv_all(0.4).values())
    d1, d3 = counters.job(JOB1.job_index)["drops"], counters.job(JOB3.job_index)["drops"]
    assert d1.get("bad_encap", 0) - c1["drops"].get("bad_encap", 0) == 1
    assert {r: d3.get(r, 0) - c3["drops"].get(r, 0) for r in ("bad_encap", "bad_length")} == \
        {"bad_encap": 1, "bad_length": 2}
    other, port = roce_contribution(JOB3, 0, [1] * K, slot=19, imm=0x1234)
    other = bytes.fromhex("00000000000" + "3") + other[6:]              # to h3, not the switch
    dp.send(port, other)
    got = dp.recv_all()
    assert got[3] == [other] and got[1] == got[2] == got[4] == []
    send(dp, roce_contribution(JOB3, 0, [6] * K, slot=19))             # the slot is clean
    send(dp, roce_contribution(JOB3, 1, [1] * K, slot=19))
    for _, values in expect_roce_results(dp, JOB3, [0, 1]).values():
        assert values == [7] * K


def test_results_leaving_by_a_deep_queue_are_marked(dp):
    """JOB2's results toward rank 1's port queue up behind a slow egress (BMv2's queue rate, the
    software switch's shaped interface): the later ones carry FLAG_CONGESTION; rank 0's, on a
    port at full speed, none. 96 rounds on 8 slots, alternating sets."""
    if dp.target == "soft-python" or dp.target in TOFINO_TARGETS:
        pytest.skip("the Python loop does not mark (inagg.bmv2_env.softswitch.switch)")
    dp.drain()
    slow = JOB2.workers[1].port
    try:
        dp.slow_port(slow, 200)
    except RuntimeError as e:   # a BMv2 built without its Thrift runtime server, or no thrift package
        pytest.skip(str(e))
    try:
        for rnd in range(96):
            for rank in (0, 1):
                send(dp, contribution(JOB2, rank, [rnd] * K, slot=8 + rnd % 8, round_no=rnd // 8, offset=rnd * K))
        got = dp.recv_all(timeout=3.0)
    finally:
        dp.slow_port(slow, None)
    marked = {port: [bool(parse_result(f)[1].flags & FLAG_CONGESTION) for f in frames if UDP in Ether(f)]
              for port, frames in got.items()}
    fast = marked[JOB2.workers[0].port]   # (our receive sockets also see our 192 sends: a few may overflow)
    assert len(fast) >= 64 and not any(fast)
    assert any(marked[slow]) and not marked[slow][0]   # the first found an empty queue


# -- an aggregation tree: this switch as a ToR, the test as its parent (docs/trees.md) ---------

def parent_result(values, *, slot, slot_set=0, offset=0, exp=3, flags=0, src_port=4,
                  src_mac=PARENT_MAC):
    """The parent's result for JOB5 (its slot numbering: 100 + ours - 32), entering by port 4."""
    payload = pack_header(1, MSG_RESULT, flags, JOB5.job_id, 0, exp, 1, slot_set, slot - 32 + 100,
                          K if values is not None else 0, offset)
    if values is not None:
        payload += np.asarray(values, ">i4").tobytes()
    return bytes(Ether(src=src_mac, dst=SWITCH_MAC) / IP(src=PARENT_IP, dst=SWITCH_IP)
                 / UDP(sport=UDP_PORT, dport=UDP_PORT, chksum=0) / payload), src_port


def expect_upstream(dp):
    """The one frame the switch sends its parent: a contribution from its aggregator address."""
    got = dp.recv_all(1.0)
    assert all(got[p] == [] for p in (1, 2, 3)), got
    (f,) = got[4]
    pkt, h, values = parse_result(f)
    assert (pkt[Ether].src, pkt[Ether].dst, pkt[IP].src, pkt[IP].dst) == (SWITCH_MAC, PARENT_MAC, SWITCH_IP, PARENT_IP)
    assert (pkt[UDP].sport, pkt[UDP].dport) == (UDP_PORT, UDP_PORT)
    assert (h.msg_type, h.worker_id, h.job_id, h.epoch) == (MSG_CONTRIBUTION, 1, JOB5.job_id, 1)
    return h, values


def test_tree_the_last_child_sends_the_partial_sum_up(dp):
    needs(dp, JOB5)
    dp.drain()
    send(dp, contribution(JOB5, 0, range(K), slot=33, exp=-2, flags=FLAG_OVERFLOW, offset=K))
    assert all(v == [] for v in dp.recv_all(0.3).values())
    send(dp, contribution(JOB5, 1, [5] * K, slot=33, exp=4, offset=K))
    h, values = expect_upstream(dp)
    assert values == [i + 5 for i in range(K)]
    assert (h.slot, h.slot_set, h.offset, h.count, h.exp) == (101, 0, K, K, 4)
    assert h.flags == FLAG_FROM_SWITCH | FLAG_OVERFLOW


def test_tree_the_parents_result_goes_down_and_answers_resends(dp):
    needs(dp, JOB5)
    dp.drain()
    counters = JobCounters(dp.sw)
    before = counters.job(JOB5.job_index)
    send(dp, contribution(JOB5, 0, [1] * K, slot=34))
    send(dp, contribution(JOB5, 1, [2] * K, slot=34))
    expect_upstream(dp)
    send(dp, parent_result([40] * K, slot=34, flags=FLAG_RETRANSMIT | FLAG_OVERFLOW))
    for h, values in expect_results(dp, JOB5, [0, 1]).values():
        assert values == [40] * K and (h.slot, h.exp, h.flags) == (34, 3, FLAG_OVERFLOW)
    send(dp, parent_result([40] * K, slot=34))                          # again: a duplicate
    assert all(v == [] for v in dp.recv_all(0.3).values())
    send(dp, contribution(JOB5, 1, [2] * K, slot=34, flags=FLAG_RETRANSMIT))   # lost below
    (h, values), = expect_results(dp, JOB5, [1]).values()
    assert values == [40] * K and h.flags & FLAG_RETRANSMIT
    after = counters.job(JOB5.job_index)
    assert after["duplicates"] - before["duplicates"] == 2
    assert (after["aggregated"] - before["aggregated"], after["results"] - before["results"]) == (2, 1)
    assert after["packets"] - before["packets"] == 5


def test_tree_a_resend_before_the_result_goes_up_again(dp):
    """The partial sum or the parent's result was lost: a child's resend brings the stored sum
    up again, marked a retransmission; the parent's answer then goes down."""
    needs(dp, JOB5)
    dp.drain()
    send(dp, contribution(JOB5, 0, [3] * K, slot=35))
    send(dp, contribution(JOB5, 1, [4] * K, slot=35))
    expect_upstream(dp)
    send(dp, contribution(JOB5, 0, [3] * K, slot=35, flags=FLAG_RETRANSMIT))
    h, values = expect_upstream(dp)
    assert values == [7] * K and h.flags == FLAG_FROM_SWITCH | FLAG_RETRANSMIT and h.slot == 103
    send(dp, parent_result([70] * K, slot=35, flags=FLAG_RETRANSMIT))
    for _, values in expect_results(dp, JOB5, [0, 1]).values():
        assert values == [70] * K


def test_tree_the_parents_result_goes_down_to_the_owner_alone(dp):
    """A ToR elides to its own ranks: its partial sum goes up without FLAG_MINE (the parent
    sends every child switch the values), and the parent's result comes down with its values
    to the round's owner alone, the header to the other child."""
    needs(dp, JOB5)
    owner_rule_only(dp)
    dp.drain()
    send(dp, contribution(JOB5, 0, [1] * K, slot=37))
    send(dp, contribution(JOB5, 1, [2] * K, slot=37, flags=FLAG_MINE))
    h, values = expect_upstream(dp)
    assert values == [3] * K and not h.flags & FLAG_MINE
    send(dp, parent_result([30] * K, slot=37))
    assert {r: len(d) for r, (_, d) in udp_results(dp, JOB5).items()} == {0: 16, 1: 16 + 4 * K}


def test_tree_results_only_from_the_parent_in_its_slots(dp):
    needs(dp, JOB5)
    dp.drain()
    counters = JobCounters(dp.sw)
    before = counters.job(JOB5.job_index)["drops"]
    send(dp, contribution(JOB5, 0, [1] * K, slot=36))
    send(dp, contribution(JOB5, 1, [1] * K, slot=36))
    expect_upstream(dp)
    guard_before = SourceGuard(dp.sw).drops().get("result", 0) if dp.guarded else 0
    send(dp, parent_result([9] * K, slot=36, src_port=3))               # not the uplink port
    send(dp, parent_result([9] * K, slot=36, src_mac=host(4)[0]))       # not the parent's MAC
    frame, port = parent_result([9] * K, slot=36)
    send(dp, (frame[:50] + (36).to_bytes(2, "big") + frame[52:], port))  # our slot, not the parent's
    send(dp, parent_result([9] * K, slot=36, offset=K))                 # another round
    assert all(v == [] for v in dp.recv_all(0.4).values())
    after = counters.job(JOB5.job_index)["drops"]
    # a guarded host port drops the result off the uplink port before admission sees it
    assert {r: after.get(r, 0) - before.get(r, 0) for r in ("bad_worker", "bad_slot", "bad_round")} == \
        {"bad_worker": 1 if dp.guarded else 2, "bad_slot": 1, "bad_round": 1}
    if dp.guarded:
        assert SourceGuard(dp.sw).drops()["result"] == guard_before + 1
    send(dp, parent_result([9] * K, slot=36))
    for _, values in expect_results(dp, JOB5, [0, 1]).values():
        assert values == [9] * K


# -- SourceGuard: no host can pass itself off as an aggregator (docs/security.md) -------------

def needs_guard(dp):
    if not dp.guarded:
        pytest.skip(f"{dp.target}: its program has no SourceGuard (docs/tofino.md)")


def forged_result(job, rank, values, *, slot, src_ip=SWITCH_IP, src_mac=SWITCH_MAC, offset=0):
    """A result for ``job``'s rank ``rank`` as a host forges it: from ``src_ip`` (the switch's
    aggregator address by default) and the inagg port to the worker's own address and port,
    a frame a switch would forward to the worker by its MAC."""
    w = job.workers[rank]
    payload = pack_header(1, MSG_RESULT, 0, job.job_id, w.rank, EXP_NONE, 1, 0, slot, K, offset) \
        + np.asarray(values, ">i4").tobytes()
    return bytes(Ether(src=src_mac, dst=w.mac) / IP(src=src_ip, dst=w.ip)
                 / UDP(sport=UDP_PORT, dport=w.udp_port, chksum=0) / payload)


def test_source_guard_drops_and_counts_frames_claiming_an_aggregator(dp):
    """Issue 37: a raw frame from another host with the aggregator's source address reached
    the workers. On a host port the switch now drops (and counts) every frame from the
    switch's or the host aggregator's address, every RESULT and every switch's partial sum it
    would forward;
    the same forged result on the open port 4 is forwarded (the guard is per port), and a
    real round stays exact."""
    needs_guard(dp)
    dp.drain()
    guard, counters = SourceGuard(dp.sw), JobCounters(dp.sw)
    g0, j0 = guard.drops(), counters.job(JOB1.job_index)
    dp.send(2, forged_result(JOB1, 0, [666] * K, slot=6))                   # h2 as the switch
    dp.send(3, forged_result(JOB1, 0, [666] * K, slot=6, src_ip=host(4)[1], src_mac=host(4)[0]))
    dp.send(1, bytes(Ether(src=host(1)[0], dst=host(2)[0]) / IP(src=SWITCH_IP, dst=host(2)[1])
                     / UDP(sport=7, dport=7) / b"not inagg"))               # any frame from it
    # a RESULT and a "partial sum" from workers' own addresses, of a job the switch forwards
    # (an admitted job's are admission's on Tofino: bad_type, and no tree to forge for)
    agg_mac, agg_ip = host(4)
    for port, flags, vt in ((2, 0, 0x12), (3, FLAG_FROM_SWITCH, 0x11)):
        inagg = bytes([vt]) + build_contribution(9, 0, 1, 3, 0, 0, np.ones(K, np.int32), K, flags=flags)[1:]
        dp.send(port, bytes(Ether(src=host(port)[0], dst=agg_mac) / IP(src=host(port)[1], dst=agg_ip)
                            / UDP(sport=50000, dport=UDP_PORT, chksum=0) / inagg))
    assert all(v == [] for v in dp.recv_all(0.4).values())
    g1 = guard.drops()
    assert {r: g1.get(r, 0) - g0.get(r, 0) for r in ("aggregator_addr", "result")} == \
        {"aggregator_addr": 3, "result": 2}
    assert counters.job(JOB1.job_index)["packets"] == j0["packets"]         # admission saw none
    dp.send(4, forged_result(JOB1, 0, [1] * K, slot=6))                     # port 4: no guard
    assert dp.recv_all()[1] == [forged_result(JOB1, 0, [1] * K, slot=6)]
    for rank, v in enumerate((1, 2, 3)):
        send(dp, contribution(JOB1, rank, [v] * K, slot=6))
    for _, values in expect_results(dp, JOB1, [0, 1, 2]).values():
        assert values == [6] * K
    assert guard.drops() == g1


def test_source_guard_entries_are_per_port_and_removable(dp):
    """Without its entry a port is open again (a link to another switch): the forged frame is
    forwarded; the entry back, it is dropped."""
    needs_guard(dp)
    from inagg.controller.switch import DELETE, INSERT
    dp.drain()
    guard = SourceGuard(dp.sw)
    forged = forged_result(JOB2, 0, [5] * K, slot=8)
    dp.sw.write(guard.port_updates(DELETE, 3, SWITCH_IP, host(4)[1], False))
    try:
        dp.send(3, forged)
        assert dp.recv_all()[JOB2.workers[0].port] == [forged]
    finally:
        dp.sw.write(guard.port_updates(INSERT, 3, SWITCH_IP, host(4)[1], False))
    before = guard.drops().get("aggregator_addr", 0)
    dp.send(3, forged)
    assert all(v == [] for v in dp.recv_all(0.3).values())
    assert guard.drops()["aggregator_addr"] == before + 1

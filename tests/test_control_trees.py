"""Aggregation trees in the control plane (controller/trees.py, docs/trees.md): links in the
config, the job's tree over them, what each switch of it holds, and a leaf-spine job through
three software switches programmed with exactly that, frames between the switches included."""

import numpy as np
import pytest

from inagg.controller.allocator import SWITCH, Demand, Placement
from inagg.controller.config import default_program, parse_config
from inagg.controller.jobs import Job, Member
from inagg.controller.switch import (
    INSERT, JobAdmission, ReplicaRewrite, ResultReplication, SwitchConnection, TreeUplink,
)
from inagg.controller.trees import job_tree, tree_switch_job
from inagg.bmv2_env.softswitch.p4runtime_server import SoftSwitchState, serve
from inagg.bmv2_env.softswitch.pipeline import NativePipeline
from inagg.bmv2_env.softswitch.pipeline_reference import SoftPipeline
from inagg.hostlib.wire.protocol import UDP_PORT, build_contribution

import tree_frames
from tree_frames import run, udp_frame

K = default_program("soft").p4info.values_per_packet
UPLINK_PORT = 5


def tor(n, hosts, **extra):
    return {"name": f"tor{n}", "grpc": f"unix:/nowhere/tor{n}", "aggregator": f"10.0.{n}.254:{UDP_PORT}",
            "aggregator_mac": f"00:00:00:00:0{n}:fe", "links": {"spine": UPLINK_PORT},
            "hosts": {f"10.0.{n}.{h}": {"port": h, "mac": f"00:00:00:00:0{n}:0{h}"} for h in hosts}, **extra}


SPINE = {"name": "spine", "grpc": "unix:/nowhere/spine", "aggregator": f"10.0.0.254:{UDP_PORT}",
         "aggregator_mac": "00:00:00:00:00:fe", "links": {"tor1": 1, "tor2": 2, "tor3": 3},
         "hosts": {"10.0.0.9": {"port": 9, "mac": "00:00:00:00:00:09"}}}


def config(*switches):
    return parse_config({"host_aggregator": "10.0.0.100:42666", "admin_token": "x",
                         "switches": list(switches) or [tor(1, (1, 2)), tor(2, (1, 2)), tor(3, (1,)), SPINE]})


def job_on(hosts):
    """A job whose rank r is at IPv4 hosts[r] (all joined)."""
    job = Job(1, "j", "t", Demand(len(hosts)))
    job.workers = {r: Member(f"{ip}:{47000 + r}", f"00:00:00:00:aa:{r:02x}") for r, ip in enumerate(hosts)}
    return job


def rank_switches(cfg, job):
    where = {ip: s.name for s in cfg.switches for ip in s.hosts}
    return {r: where[m.address.split(":")[0]] for r, m in job.workers.items()}


@pytest.mark.parametrize("change, error", [
    (lambda s: s[0]["links"].update(nowhere=7), "links to 'nowhere', which is not another configured switch"),
    (lambda s: s[3]["links"].pop("tor2"), "tor2 links to spine, but spine names no link to tor2"),
    (lambda s: (s[0]["links"].update(tor2=6), s[1]["links"].update(tor1=6)), "form a cycle"),
    (lambda s: s[0]["links"].update(spine=1), "port 1 is a host's port"),
])
def test_bad_links_are_named(change, error):
    switches = [tor(1, (1, 2)), tor(2, (1, 2)), tor(3, (1,)), {**SPINE, "links": dict(SPINE["links"])}]
    change(switches)
    with pytest.raises(ValueError, match=error):
        config(*switches)


def test_a_leaf_spine_job_is_rooted_at_the_spine_and_unused_tors_are_left_out():
    cfg = config()
    job = job_on(["10.0.1.1", "10.0.1.2", "10.0.2.1", "10.0.2.2"])
    tree = job_tree(cfg, rank_switches(cfg, job))
    assert tree.root == "spine" and tree.parent == {"spine": None, "tor1": "spine", "tor2": "spine"}
    assert tree.ranks == {"spine": (), "tor1": (0, 1), "tor2": (2, 3)}
    assert tree.child_ids("spine") == {"tor1": 0, "tor2": 1} and tree.n_children("spine") == 2


def test_one_switch_is_a_tree_of_one_and_ranks_on_the_spine_keep_their_ids():
    cfg = config()
    one = job_tree(cfg, rank_switches(cfg, job_on(["10.0.1.1", "10.0.1.2"])))
    assert (one.root, one.parent) == ("tor1", {"tor1": None})
    mixed = job_on(["10.0.1.1", "10.0.0.9", "10.0.3.1"])          # rank 1 on the spine itself
    tree = job_tree(cfg, rank_switches(cfg, mixed))
    assert tree.root == "spine" and tree.child_ids("spine") == {"tor1": 0, "tor3": 2}
    assert tree.n_children("spine") == 3


def test_a_chain_is_rooted_at_its_middle():
    a, b, c = ({"name": n, "grpc": f"unix:/nowhere/{n}", "aggregator": f"10.0.{i}.254:1",
                "hosts": {f"10.0.{i}.1": {"port": 1, "mac": f"00:00:00:00:0{i}:01"}}, "links": links}
               for i, n, links in ((1, "a", {"b": 9}), (2, "b", {"a": 8, "c": 9}), (3, "c", {"b": 8})))
    cfg = config(a, b, c)
    tree = job_tree(cfg, {0: "a", 1: "c"})
    assert tree.root == "b" and tree.parent == {"b": None, "a": "b", "c": "b"}


def test_switches_without_links_give_no_tree():
    cfg = config(tor(1, (1,), links={}), tor(2, (1,), links={}))
    with pytest.raises(ValueError, match="switches tor2 are not linked to tor1"):
        job_tree(cfg, {0: "tor1", 1: "tor2"})


def places(cfg, bases):
    return {name: Placement(SWITCH, base, 8, 3) for name, base in bases.items()}


def test_each_switch_holds_its_children_and_below_the_root_its_uplink():
    cfg = config()
    job = job_on(["10.0.1.1", "10.0.1.2", "10.0.2.1", "10.0.2.2"])
    tree = job_tree(cfg, rank_switches(cfg, job))
    grants = places(cfg, {"spine": 16, "tor1": 0, "tor2": 8})
    spine = tree_switch_job(cfg, tree, "spine", job, 0, grants)
    assert [(w.rank, w.port, w.ip, w.mac, w.udp_port) for w in spine.workers] == [
        (0, 1, "10.0.1.254", "00:00:00:00:01:fe", UDP_PORT), (1, 2, "10.0.2.254", "00:00:00:00:02:fe", UDP_PORT)]
    assert spine.uplink is None and (spine.slot_base, spine.epoch) == (16, 3)
    tor2 = tree_switch_job(cfg, tree, "tor2", job, 5, grants)
    assert [(w.rank, w.port, w.ip) for w in tor2.workers] == [(2, 1, "10.0.2.1"), (3, 2, "10.0.2.2")]
    up = tor2.uplink
    assert (up.port, up.rank, up.slot_base, up.ip, up.mac, up.src_ip, up.src_mac) == (
        UPLINK_PORT, 1, 16, "10.0.0.254", "00:00:00:00:00:fe", "10.0.2.254", "00:00:00:00:02:fe")
    assert (tor2.job_index, tor2.slot_base) == (5, 8)


def test_a_tree_switch_needs_an_aggregator_mac():
    cfg = config(tor(1, (1,)), tor(2, (1,)), {**SPINE, "aggregator_mac": "", "links": {"tor1": 1, "tor2": 2}})
    job = job_on(["10.0.1.1", "10.0.2.1"])
    tree = job_tree(cfg, rank_switches(cfg, job))
    with pytest.raises(ValueError, match="switch spine has no aggregator_mac"):
        tree_switch_job(cfg, tree, "tor1", job, 0, places(cfg, {"spine": 0, "tor1": 0, "tor2": 0}))


# -- a leaf-spine job through three software switches -------------------------------------------

@pytest.fixture(params=[SoftPipeline, NativePipeline], ids=["python", "native"])
def fabric(request, tmp_path):
    """{switch name: pipeline} of three software switches programmed with the tree's entries
    for a job of 2 + 2 ranks (tor1, tor2) rooted at the spine."""
    cfg = config()
    job = job_on(["10.0.1.1", "10.0.1.2", "10.0.2.1", "10.0.2.2"])
    tree = job_tree(cfg, rank_switches(cfg, job))
    grants = places(cfg, {"spine": 16, "tor1": 0, "tor2": 8})
    made = {}
    try:
        for i, name in enumerate(tree.switches):
            state = SoftSwitchState(0, default_program("soft").p4info, request.param)
            addr = f"unix:{tmp_path}/{name}.sock"
            server, sw = serve(state, addr), None
            made[name] = (state, server)
            sw = SwitchConnection(addr, program=default_program("soft"))
            sw.push_pipeline()
            j = tree_switch_job(cfg, tree, name, job, i, grants)
            sw.write(TreeUplink(sw).updates(INSERT, j) + JobAdmission(sw).updates(INSERT, j)
                     + ReplicaRewrite(sw).updates(INSERT, j) + [ResultReplication(sw).job_update(INSERT, j)])
            sw.close()
        yield cfg, job, {name: state.pipeline for name, (state, _) in made.items()}
    finally:
        for _, server in made.values():
            server.stop(grace=0)


def worker_frame(cfg, job, rank, values, slot, flags=0):
    """(switch, port, frame) of rank ``rank``'s contribution to its switch's aggregator."""
    ip, port = job.workers[rank].address.split(":")
    tor_cfg = next(s for s in cfg.switches if ip in s.hosts)
    inagg = build_contribution(1, rank, 3, slot, 0, 0, np.asarray(values, np.int32), K, flags=flags)
    agg_ip, agg_port = tor_cfg.aggregator.split(":")
    frame = udp_frame((tor_cfg.hosts[ip].mac, ip, int(port)), (tor_cfg.aggregator_mac, agg_ip, int(agg_port)), inagg)
    return tor_cfg.name, tor_cfg.hosts[ip].port, frame


def results(delivered):
    return {where: by_offset[0] for where, by_offset in tree_frames.results(delivered, K).items()}


def test_a_leaf_spine_job_sums_exactly_across_three_switches(fabric):
    cfg, job, pipelines = fabric
    values = {r: np.arange(K) * (r + 1) for r in range(4)}
    frames = [worker_frame(cfg, job, r, values[r], slot=0 if r < 2 else 8) for r in range(4)]
    got = results(run(cfg, pipelines, frames))
    want = (np.arange(K) * 10).tolist()
    assert got == {("tor1", 1): want, ("tor1", 2): want, ("tor2", 1): want, ("tor2", 2): want}


def test_a_result_lost_between_the_spine_and_a_tor_is_recovered_by_a_resend(fabric):
    cfg, job, pipelines = fabric
    frames = [worker_frame(cfg, job, r, [r + 1] * K, slot=1 if r < 2 else 9) for r in range(4)]
    down_to_tor2 = lambda name, port, frame: name == "spine" and port == 2      # noqa: E731
    got = results(run(cfg, pipelines, frames, lose=down_to_tor2))
    assert set(got) == {("tor1", 1), ("tor1", 2)}
    resend = worker_frame(cfg, job, 3, [4] * K, slot=9, flags=1)
    got = results(run(cfg, pipelines, [resend]))
    assert got == {("tor2", 1): [10] * K, ("tor2", 2): [10] * K}   # the spine's DUP_DONE, multicast by tor2

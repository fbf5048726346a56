"""The controller's ``sharing = "atp"`` (docs/atp.md) against the software switch in process:
every job is placed on the host aggregator, the switch gets its ATP pool (atp_table) and each
job's ``admit_atp`` row and bindings, the host aggregator's feed gives each job the switch as its
``atp_peer``, and the listing counts collisions. Then frames flow, worker by worker, through
the switch the controller programmed and the host aggregator's engine configured from that
feed: three jobs on a pool too small for all get every sum exact."""

import random
import sys
from pathlib import Path

import numpy as np
import pytest

from inagg.bmv2_env.softswitch.pipeline_reference import AtpPool
from inagg.controller.config import default_program, parse_config
from inagg.hostlib.aggregator.engine_reference import AggregationEngine
from inagg.hostlib.aggregator.server import apply_snapshot
from inagg.hostlib.wire.protocol import ipv4, mac

from test_controller import ADMIN, controller_env, new_job
from test_soft_atp import Network

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from atp_pool import Worker, check_exact  # noqa: E402

SWITCH_MAC, HOST_MAC = "00:00:00:00:00:fe", "00:00:00:00:00:64"
K = default_program("bmv2").p4info.values_per_packet   # what the controller pushes
HOSTS = {**{f"10.0.0.{i}": {"port": i, "mac": f"00:00:00:00:00:0{i}"} for i in range(1, 5)},
         "10.0.0.100": {"port": 5, "mac": HOST_MAC}}      # the host aggregator's, on port 5


@pytest.fixture
def env(tmp_path):
    yield from controller_env(tmp_path, {"aggregator_mac": SWITCH_MAC, "hosts": HOSTS}, sharing="atp",
                              host_values_per_packet=K, atp_pool=3)     # a pool too small for all


def test_atp_shares_the_switch_pool_and_every_sum_is_exact(env):
    client, state = env["client"], env["state"]
    jobs = [new_job(client, hosts, f"j{n}") for n, hosts in enumerate(([1, 2], [1, 2, 3], [1, 2, 3, 4]))]
    listed = {j.job_id: j for j in client.list_jobs(ADMIN).jobs}
    assert all(listed[job_id].active.mode == "host" for job_id, _ in jobs)
    pipeline = state.pipeline
    assert pipeline.atp_pool == AtpPool(0, 3, ipv4("10.0.0.100"), 42666, mac(SWITCH_MAC), ipv4("10.0.0.254"), 42602)
    assert sorted(pipeline.atp_jobs) == sorted(job_id for job_id, _ in jobs)
    feed = env["ctl"]().host_jobs().jobs
    assert {j.atp_peer for j in feed} == {"10.0.0.254:42602"}

    workers = run_jobs(env, feed, {job_id: 10 for job_id, _ in jobs}, random.Random(11), hold=0.25)
    check_exact(workers)
    counts = {j.job_id: j.counters for j in client.list_jobs(ADMIN).jobs}
    assert sum(c.get("collisions", 0) for c in counts.values()) > 0


def test_a_tenant_beside_a_flooding_neighbour_is_exact(env):
    """A 2-rank tenant beside a 4-rank neighbour sending 8 times its blocks, on the pool of 3
    the controller gave the switch: the tenant's every sum is exact, and the Prometheus scrape
    gives each job's collisions and aggregations on the ATP switch as the listing does."""
    client = env["client"]
    (tenant, _), (neighbour, _) = new_job(client, [1, 2], "tenant"), new_job(client, [1, 2, 3, 4], "flood")
    workers = run_jobs(env, env["ctl"]().host_jobs().jobs, {tenant: 6, neighbour: 48}, random.Random(13), hold=0.1)
    check_exact(workers)
    counts = {j.job_id: j.counters for j in client.list_jobs(ADMIN).jobs}
    assert counts[tenant]["collisions"] + counts[neighbour]["collisions"] > 0
    scraped = scrape(env["ctl"]())
    for job_id, name in ((tenant, "tenant"), (neighbour, "flood")):
        labels = frozenset({("job_id", str(job_id)), ("name", name), ("switch", "s1")})
        assert scraped[("inagg_switch_job_collisions_total", labels)] == counts[job_id]["collisions"]
        assert scraped[("inagg_switch_job_aggregated_total", labels)] == counts[job_id]["aggregated"]


def scrape(ctl) -> dict:
    """The Prometheus collector's samples now: {(name, labels): value}."""
    from inagg.controller.metrics import ControllerCollector

    return {(s.name, frozenset(s.labels.items())): s.value
            for family in ControllerCollector(ctl).collect() for s in family.samples}


def run_jobs(env, feed, blocks: dict[int, int], rng: random.Random, hold: float) -> list[Worker]:
    """The jobs of the host aggregator's ``feed``, each with ``blocks[job]`` random blocks,
    through the switch the controller programmed and a host engine serving the feed, until every
    worker has every result; the workers."""
    host = AggregationEngine(4096, K, host_mode=True)
    assert apply_snapshot(host, feed) == {}
    workers = [Worker(cfg, r, np.array([[rng.randrange(-2**20, 2**20) for _ in range(K)]
                                        for _ in range(blocks[cfg.job_id])], np.int32))
               for cfg in host.jobs.values() for r in range(cfg.n_workers)]
    Network([env["state"].pipeline], env["ctl"]().fabric.switches["s1"].applied, workers, host,
            {"host": (HOST_MAC, "10.0.0.100", 42666), "switch": (SWITCH_MAC, "10.0.0.254", 42602),
             "host_port": 5}).run(workers, rng, hold=hold)
    return workers


def test_atp_needs_the_switch_mac_and_the_switch_k(tmp_path):
    base = {"listen": "unix:x", "admin_token": ADMIN, "host_aggregator": "10.0.0.100:42666", "sharing": "atp",
            "switches": [{"name": "s1", "grpc": "unix:y", "aggregator": "10.0.0.254:42602", "hosts": HOSTS}]}
    with pytest.raises(ValueError, match="switch\\(es\\) s1 need aggregator_mac"):
        parse_config(base)
    with pytest.raises(ValueError, match="must be an IPv4 address"):
        parse_config({**base, "host_aggregator": "agg.local:42666",
                      "switches": [{**base["switches"][0], "aggregator_mac": SWITCH_MAC}]})

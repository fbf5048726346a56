"""The controller's Prometheus endpoint and ``inaggctl top``, scraped while a real job trains on a
loopback deployment (software data plane, controller, host aggregator, two worker processes)."""

import contextlib
import io
import os
import time
import urllib.request
from unittest import mock

import pytest
from prometheus_client.parser import text_string_to_metric_families

from inagg.bmv2_env.emulation.loopback import LoopbackDeployment
from inagg.controller.cli import ctl_main
from inagg.hostlib.jobservice.client import ControllerClient
from inagg.bmv2_env.demos.train_demo import TrainConfig, train


def scrape(url: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of the endpoint: {(name, labels): value}."""
    text = urllib.request.urlopen(url, timeout=30).read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def job_value(samples: dict, name: str, job: str, **labels) -> float:
    want = {("name", job), *labels.items()}
    found = [v for (n, ls), v in samples.items() if n == name and want <= ls]
    assert len(found) == 1, (name, job, labels, sorted(k for k in samples if k[0] == name))
    return found[0]


def inaggctl(dep: LoopbackDeployment, *args: str) -> str:
    """inaggctl's own entry point, in this process (a new interpreter would start too late for a
    short job), finding the controller and the admin token in the environment as at mininet>."""
    env = {"INAGG_CONTROLLER": dep.controller, "INAGG_ADMIN_TOKEN": dep.admin_token}
    out = io.StringIO()
    with mock.patch.dict(os.environ, env), contextlib.redirect_stdout(out):
        assert ctl_main(list(args)) == 0
    return out.getvalue()


def test_metrics_and_top_follow_a_training_job():
    """After epoch 1 (switch mode): mode, slots, epoch and the switch's counters for the job, by
    name. Then the test drains the job and scrapes until the workers have activated the host
    grant (they keep training meanwhile): host mode, one more grant change, and ``inaggctl top
    --once`` shows the job on the host aggregator."""
    seen = {}
    with LoopbackDeployment(2, metrics=True) as dep:
        def on_epoch(epoch, loss, acc):
            if epoch != 0:
                return
            seen["switch"] = scrape(dep.metrics_url)
            job_id = next(int(dict(ls)["job_id"]) for (n, ls) in seen["switch"]
                          if n == "inagg_job_workers" and ("name", "metrics-job") in ls)
            client = ControllerClient(dep.controller)
            client.drain(dep.admin_token, job_id)
            client.close()
            deadline = time.time() + 120          # a safety net, not a speed requirement
            while job_value(scrape(dep.metrics_url), "inagg_job_mode", "metrics-job", mode="host") != 1:
                assert time.time() < deadline, "the drained job never ran on the host aggregator"
                time.sleep(0.05)
            seen["host"] = scrape(dep.metrics_url)
            seen["top"] = inaggctl(dep, "top", "--once")

        run = train(TrainConfig(workers=2, epochs=6, job_name="metrics-job"), dep.controller,
                    on_epoch=on_epoch, bind_ips=dep.worker_ips)
        after = scrape(dep.metrics_url)

    on_switch = seen["switch"]
    assert job_value(on_switch, "inagg_job_mode", "metrics-job", mode="switch") == 1
    assert job_value(on_switch, "inagg_job_mode", "metrics-job", mode="host") == 0
    assert job_value(on_switch, "inagg_job_slots", "metrics-job") > 0
    assert job_value(on_switch, "inagg_job_epoch", "metrics-job") >= 1
    assert job_value(on_switch, "inagg_job_workers_joined", "metrics-job") == 2
    aggregated = job_value(on_switch, "inagg_switch_job_aggregated_total", "metrics-job", switch="s1")
    results = job_value(on_switch, "inagg_switch_job_results_total", "metrics-job", switch="s1")
    # two contributions per round; a retransmitted contribution of a finished round is answered again
    assert results > 0 and 1.9 * results <= aggregated <= 2 * results + 64

    on_host = seen["host"]
    assert job_value(on_host, "inagg_job_mode", "metrics-job", mode="host") == 1
    changes = job_value(on_switch, "inagg_job_grant_changes_total", "metrics-job")
    assert job_value(on_host, "inagg_job_grant_changes_total", "metrics-job") == changes + 1
    assert run.stats[0]["grant_changes"] == changes + 1     # as the workers counted them
    assert job_value(on_host, "inagg_job_epoch", "metrics-job") > job_value(on_switch, "inagg_job_epoch", "metrics-job")
    assert after[("inagg_jobs", frozenset())] == 0     # the job left when training ended

    top = seen["top"]
    assert "1 job(s)" in top and "metrics-job" in top and "host [" in top, top


@pytest.mark.parametrize("interval", ["0", "-1", "nan", "soon"])
def test_top_refuses_an_interval_that_is_not_positive(interval, capsys):
    with pytest.raises(SystemExit) as exit_:
        ctl_main(["top", "--interval", interval])
    assert exit_.value.code == 2 and f"expected seconds > 0, got {interval!r}" in capsys.readouterr().err


@pytest.mark.parametrize("target", ["soft", "tofino"])
def test_each_switchs_own_drops_and_recirculation_are_scraped(tmp_path, target):
    """Frames no job owns reach the scrape per switch: a frame from a host port claiming the
    switch's address (SourceGuard), a truncated inagg frame and one of another version (global
    drops); the TNA program's recirculation counters are there too, with nothing recirculated
    on the software switch (no sample), and a switch that is down leaves the scrape answering."""
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether

    from inagg.controller.metrics import ControllerCollector
    from inagg.hostlib.wire.protocol import UDP_PORT
    from test_controller import controller_env

    env = controller_env(tmp_path, {"target": target} if target != "soft" else None)
    e = next(env)
    try:
        def frame(src: str, payload: bytes) -> bytes:
            return bytes(Ether(src="00:00:00:00:00:01", dst="00:00:00:00:00:fe") / IP(src=src, dst="10.0.0.254")
                         / UDP(sport=5000, dport=UDP_PORT, chksum=0) / payload)

        pipeline = e["state"].pipeline
        pipeline.process(1, frame("10.0.0.254", bytes(24)))                  # the switch's own address
        pipeline.process(1, frame("10.0.0.1", b"\x12\x00"))                  # shorter than the header
        pipeline.process(1, frame("10.0.0.1", bytes([0x71]) + bytes(23)))    # version 7, a contribution
        collector = ControllerCollector(e["ctl"]())
        samples = {(s.name, frozenset(s.labels.items())): s.value
                   for family in collector.collect() for s in family.samples}
        assert samples[("inagg_switch_guard_drops_total",
                        frozenset({("switch", "s1"), ("reason", "aggregator_addr")}))] == 1
        assert samples[("inagg_switch_global_drops_total", frozenset({("switch", "s1"), ("reason", "truncated")}))] == 1
        assert samples[("inagg_switch_global_drops_total",
                        frozenset({("switch", "s1"), ("reason", "bad_version")}))] == 1
        assert not any(name == "inagg_switch_recirculation_passes_total" for name, _ in samples)
        e["stop_switch"]()
        names = {s.name for family in collector.collect() for s in family.samples}
        assert "inagg_jobs" in names and "inagg_switch_guard_drops_total" not in names
    finally:
        next(env, None)

"""Control-plane speed: job admission latency through the controller (gRPC job service +
P4Runtime programming of the software data plane), a running job's Heartbeat and ListJobs
latency during a storm of concurrent CreateJob + JoinJob, and allocator events per second.
``--storm`` runs the storm only."""

from __future__ import annotations

import contextlib
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from inagg.bmv2_env.softswitch.p4runtime_server import SoftSwitchState, serve as serve_switch  # noqa: E402
from inagg.controller.allocator import Demand, SlotAllocator  # noqa: E402
from inagg.hostlib.jobservice.client import ControllerClient, ControllerError  # noqa: E402
from inagg.controller.config import default_program, parse_config  # noqa: E402
from inagg.controller.controller import Controller  # noqa: E402
from inagg.controller.service import serve as serve_controller  # noqa: E402


@contextlib.contextmanager
def running_controller(n_hosts: int, **config) -> Iterator[tuple[ControllerClient, list[str]]]:
    """A soft switch with ``n_hosts`` hosts and a controller on it, in this process; yields a
    client and the hosts' IPs. ``config``: controller config keys over the defaults."""
    with tempfile.TemporaryDirectory() as d:
        switch = serve_switch(SoftSwitchState(0, default_program("soft").p4info), f"unix:{d}/sw.sock")
        hosts = {f"10.0.{i // 250}.{i % 250 + 1}": {"port": i % 500 + 1, "mac": f"02:00:00:00:{i // 256:02x}:{i % 256:02x}"}
                 for i in range(n_hosts)}
        config = parse_config({"listen": f"unix:{d}/ctl.sock", "admin_token": "t", "database": f"{d}/db",
                               "min_window": 8, "host_aggregator": "10.9.9.9:42666",
                               "rank_lease_seconds": 3600,  # the bench sends few heartbeats
                               "switches": [{"name": "s1", "grpc": f"unix:{d}/sw.sock",
                                             "aggregator": "10.0.9.254:42602", "hosts": hosts}], **config})
        ctl = Controller(config)
        server = serve_controller(ctl, config.listen)
        client = ControllerClient(config.listen)
        try:
            yield client, list(hosts)
        finally:
            client.close()
            server.stop(grace=0)
            ctl.close()
            switch.stop(grace=0)


def admission(jobs: int = 20, workers: int = 4) -> list[float]:
    """Seconds from CreateJob to the first grant of a job whose workers all joined."""
    with running_controller(jobs * workers) as (client, ips):
        times = []
        for j in range(jobs):
            t0 = time.perf_counter()
            job_id, token = client.create_job(workers, 1 << 20, 0.1)
            for r in range(workers):
                client.join(job_id, token, r, f"{ips[j * workers + r]}:5000")
            stream = client.watch(job_id, token)
            next(stream)
            stream.cancel()
            times.append(time.perf_counter() - t0)
    return times


def _create_and_join(client: ControllerClient, ips: list[str], j: int, outcomes: list[str]) -> None:
    """One job of the storm: create, then both ranks join; its outcome ("placed" or the error)."""
    try:
        job_id, token = client.create_job(2, 1 << 20, 0.1)
        for r in range(2):
            client.join(job_id, token, r, f"{ips[(2 * j + r) % len(ips)]}:{5000 + j}")
        outcomes.append("placed")
    except ControllerError as e:
        outcomes.append(str(e).split(": ")[-1] if "refused" in str(e) else "unreachable (10 s deadline)")


def _probe(call, times: list[float], failed: list[float], storm: list[threading.Thread]) -> None:
    """Time ``call()`` every 50 ms while any thread of ``storm`` runs."""
    while any(t.is_alive() for t in storm):
        t0 = time.perf_counter()
        try:
            call()
        except ControllerError:   # past its 10 s deadline: counted at what it took
            failed.append(1.0)
        times.append(time.perf_counter() - t0)
        time.sleep(0.05)


def storm(jobs: int = 200) -> dict[str, list]:
    """Heartbeat and ListJobs latencies (seconds) of a running job, each probed on its own
    thread, while ``jobs`` clients create and join 2-rank jobs at once; also the storm's
    outcomes by kind."""
    with running_controller(64) as (client, ips):
        job_id, token = client.create_job(2, 1 << 20, 0.1)
        for r in range(2):
            client.join(job_id, token, r, f"{ips[r]}:4999")
        outcomes: list[str] = []
        threads = [threading.Thread(target=_create_and_join, args=(client, ips, j, outcomes)) for j in range(jobs)]
        lat: dict[str, list] = {k: [] for k in ("heartbeat", "heartbeat failed", "list_jobs", "list_jobs failed")}
        probes = [threading.Thread(target=_probe, args=(call, lat[name], lat[f"{name} failed"], threads))
                  for name, call in (("heartbeat", lambda: client.heartbeat(job_id, token, 0)),
                                     ("list_jobs", lambda: client.list_jobs("t")))]
        for t in threads + probes:
            t.start()
        for t in threads + probes:
            t.join()
        lat["outcomes"] = [f"{outcomes.count(k)} {k}" for k in sorted(set(outcomes))]
    return lat


def allocator_events(seconds: float = 2.0) -> tuple[int, float]:
    rng = random.Random(0)
    alloc = SlotAllocator(switch_slots=1024, min_window=8)
    events, next_id, t0 = 0, 1, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        if len(alloc.jobs) < 64 and rng.random() < 0.5:
            alloc.add_job(next_id, Demand(4, rng.randint(1, 1 << 24), 0.1))
            next_id += 1
        elif alloc.jobs:
            job = rng.choice(list(alloc.jobs.values()))
            if job.pending and rng.random() < 0.7:
                alloc.activate(job.job_id, job.pending.epoch)
            else:
                alloc.remove_job(job.job_id)
        events += 1
    return events, time.perf_counter() - t0


def print_storm(jobs: int = 200) -> None:
    lat = storm(jobs)
    for name in ("heartbeat", "list_jobs"):
        v = lat[name]
        print(f"{name} during {jobs} concurrent CreateJob + 2 JoinJob: median {statistics.median(v) * 1e3:.1f} ms, "
              f"max {max(v) * 1e3:.1f} ms over {len(v)} calls, {len(lat[f'{name} failed'])} failed")
    print(f"storm outcomes: {', '.join(lat['outcomes'])}")


def main() -> int:
    if "--storm" in sys.argv:
        print_storm()
        return 0
    print_storm()
    t = admission()
    print(f"job admission (create + 4 joins + first grant, switch programmed over P4Runtime): "
          f"median {statistics.median(t) * 1e3:.1f} ms, max {max(t) * 1e3:.1f} ms over {len(t)} jobs")
    events, secs = allocator_events()
    print(f"allocator: {events / secs:.0f} events/s (arrivals, activations, departures; "
          f"pool 1024 slots, up to 64 jobs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

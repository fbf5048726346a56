"""Control-plane speed: job admission latency through the controller (gRPC job service +
P4Runtime programming of the software data plane), and allocator events per second."""

from __future__ import annotations

import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from inagg.softswitch.p4runtime_server import SoftSwitchState, serve as serve_switch  # noqa: E402
from inagg.control.allocator import Demand, SlotAllocator  # noqa: E402
from inagg.jobservice.client import ControllerClient  # noqa: E402
from inagg.control.config import default_program, parse_config  # noqa: E402
from inagg.control.controller import Controller  # noqa: E402
from inagg.control.service import serve as serve_controller  # noqa: E402


def admission(jobs: int = 20, workers: int = 4) -> list[float]:
    """Seconds from CreateJob to the first grant of a job whose workers all joined."""
    with tempfile.TemporaryDirectory() as d:
        switch = serve_switch(SoftSwitchState(0, default_program("soft").p4info), f"unix:{d}/sw.sock")
        hosts = {f"10.0.{i // 250}.{i % 250 + 1}": {"port": i % 500 + 1, "mac": f"02:00:00:00:{i // 256:02x}:{i % 256:02x}"}
                 for i in range(jobs * workers)}
        config = parse_config({"listen": f"unix:{d}/ctl.sock", "admin_token": "t", "database": f"{d}/db",
                               "min_window": 8, "host_aggregator": "10.9.9.9:42666",
                               "rank_lease_seconds": 3600,  # the bench sends no heartbeats
                               "switches": [{"name": "s1", "grpc": f"unix:{d}/sw.sock",
                                             "aggregator": "10.0.9.254:42602", "hosts": hosts}]})
        ctl = Controller(config)
        server = serve_controller(ctl, config.listen)
        client = ControllerClient(config.listen)
        ips = list(hosts)
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
        client.close()
        server.stop(grace=0)
        ctl.close()
        switch.stop(grace=0)
    return times


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


def main() -> int:
    t = admission()
    print(f"job admission (create + 4 joins + first grant, switch programmed over P4Runtime): "
          f"median {statistics.median(t) * 1e3:.1f} ms, max {max(t) * 1e3:.1f} ms over {len(t)} jobs")
    events, secs = allocator_events()
    print(f"allocator: {events / secs:.0f} events/s (arrivals, activations, departures; "
          f"pool 1024 slots, up to 64 jobs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

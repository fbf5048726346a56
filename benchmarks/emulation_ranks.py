"""What the benchmarks that run torch.distributed ranks in the Mininet emulation share
(``bandwidth_flip.py``, ``wire_bench.py``): whether the emulation can run here, shaping a link
with ``tc tbf`` (netem is not needed, so kernels without sch_netem work), starting one rank
process per worker host against the run's controller, waiting for rank 0's first line, and
writing the results' CSV.

A rank finds its inagg address in ``deployment.json`` beside the run's controller socket
(``inagg.worker.local``): each worker host's switch-side IP, in rank order."""

from __future__ import annotations

import csv
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STORE_PORT = 29500        # in the ranks' own namespaces: no other process can hold it
READY_SECONDS = 180.0     # bring-up and the process group's start on a loaded 2-core machine
# A small token bucket: a large one lets an isolated call (an exploration on a link that sat idle)
# through at line rate. It must hold a whole frame (jumbo ones too) and a timer tick's worth of
# the rate (1 ms: tbf's hrtimer), or tbf cannot reach its rate.
TBF_BURST_BYTES = 16 << 10
_RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit)$")
_UNIT = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
_DROPPED = re.compile(r"\(dropped (\d+),")


def emulation_missing() -> str | None:
    """None when the emulation can run here (root, Mininet's mnexec), else why not."""
    if os.geteuid() != 0 or shutil.which("mnexec") is None:
        return "the emulation needs root and Mininet (make setup-emulation)"
    return None


def launcher_can_run(name: str) -> bool:
    """Whether a benchmark's launcher can bring up the emulation here (else it says why on
    stderr); from here on SIGTERM exits through the caller's ``finally`` (the run's teardown)."""
    missing = emulation_missing()
    if missing:
        print(f"{name}: {missing}", file=sys.stderr)
        return False
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(f"{name}: stopped (SIGTERM)"))
    return True


def rate_bits(rate: str) -> float:
    """A tc rate (``100mbit``, ``1gbit``) in bits per second."""
    m = _RATE.match(rate.strip().lower())
    if not m:
        raise ValueError(f"rate {rate!r}: write it as tc does, e.g. 100mbit or 1gbit")
    return float(m.group(1)) * _UNIT[m.group(2)]


def node_sh(node, command: str) -> None:
    """Run ``command`` in a Mininet node's shell; ip and tc print nothing unless they fail."""
    out = node.cmd(command).strip()
    if out:
        raise RuntimeError(f"{node.name}: {command}: {out}")


def shape(intf, rate: str | None) -> None:
    """Limit ``intf``'s egress (one direction of its link) to ``rate`` with tc tbf, or remove
    the limit (None)."""
    if rate is None:
        node_sh(intf.node, f"tc qdisc del dev {intf.name} root")
        return
    burst = max(TBF_BURST_BYTES, int(rate_bits(rate) / 8 / 1000))
    node_sh(intf.node, f"tc qdisc replace dev {intf.name} root tbf rate {rate} burst {burst} latency 100ms")


def link_drops(links) -> int:
    """The frames every end of ``links`` has dropped so far (tc's count: a full tbf queue)."""
    total = 0
    for link in links:
        for intf in (link.intf1, link.intf2):
            total += sum(int(n) for n in _DROPPED.findall(intf.node.cmd(f"tc -s qdisc show dev {intf.name}")))
    return total


def shape_link(link, rate: str | None) -> None:
    """Both directions of a Mininet link at ``rate`` (each end's egress), or unlimited (None)."""
    for intf in (link.intf1, link.intf2):
        shape(intf, rate)


def write_deployment(run, worker_ips: list[str]) -> None:
    """Tell the ranks their inagg addresses (rank order) and the run's controller."""
    from inagg.worker.local import DEPLOYMENT_FILE

    (run.run.path / DEPLOYMENT_FILE).write_text(json.dumps(
        {"controller": run.controller_addr, "worker_ips": worker_ips}))


def start_rank(run, host_name: str, argv: list[str], env: dict[str, str], label: str) -> subprocess.Popen:
    """One rank process (this Python, ``argv``) in ``host_name``'s namespace, its stdout piped
    to the launcher, its stderr in the run's logs (``<label>.log``); recorded in the run
    directory and stopped by the run's teardown."""
    host = run.net.get(host_name)
    env = {**os.environ, "INAGG_CONTROLLER": run.controller_addr, **env}
    with run.log(f"{label}.log") as log:
        proc = host.popen([sys.executable, *argv], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=log, text=True)
    run.run.add_process(proc.pid, label)
    run.procs.append(proc)
    return proc


def wait_line(rank0, procs: list, timeout: float, logs: Path) -> dict:
    """Rank 0's next stdout line (JSON); fails fast when a rank exits first."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if select.select([rank0.stdout], [], [], 0.5)[0]:
            line = rank0.stdout.readline()
            if line:
                return json.loads(line)
        dead = [p.returncode for p in procs if p.poll() is not None]
        if dead:
            raise RuntimeError(f"a rank exited (status {dead}) first; see {logs}/*.log")
    raise RuntimeError(f"no word from rank 0 within {timeout:.0f}s; see {logs}/*.log")


def write_csv(path: Path, fields: tuple[str, ...], rows: list[dict]) -> None:
    """The results' rows as CSV, one column per field."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)

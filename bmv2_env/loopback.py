"""The embedded default deployment on loopback, no root needed: the software data plane
(attached over UDP), the controller and a host aggregator, each a real process.

Worker r uses address 127.0.1.(r+1), attached to switch port r+1; the switch's inagg address is
127.0.0.254, the host aggregator's 127.0.0.100. ``make demo``, the training tests and the
benchmarks run on it."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .testbed import stop_processes

ROOT = Path(__file__).resolve().parents[1]
SWITCH_IP = "127.0.0.254"
HOST_AGGREGATOR = "127.0.0.100:42666"


def worker_ip(rank: int) -> str:
    return f"127.0.1.{rank + 1}"


class LoopbackDeployment:
    """Context manager: start everything, yield, stop everything (and remove its files)."""

    def __init__(self, n_hosts: int = 4, *, with_switch: bool = True, min_window: int = 8,
                 lease_seconds: float = 30.0, aggregator_drop_rate: float = 0.0) -> None:
        self.n_hosts = n_hosts
        self.with_switch = with_switch
        self.min_window = min_window
        self.lease_seconds = lease_seconds
        self.drop_rate = aggregator_drop_rate
        self.admin_token = secrets.token_hex(8)
        self.procs: list[subprocess.Popen] = []

    def _start(self, name: str, cmd: list[str], ready: str) -> subprocess.Popen:
        log = open(self.dir / f"{name}.log", "w")
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True)
        self.procs.append(proc)
        line = proc.stdout.readline()
        if ready not in line:
            raise RuntimeError(f"{name} did not start: {line!r}\n{(self.dir / f'{name}.log').read_text()}")
        return proc

    def __enter__(self) -> "LoopbackDeployment":
        self.dir = Path(tempfile.mkdtemp(prefix="inagg-lo-"))
        self.controller = f"unix:{self.dir}/controller.sock"
        py = sys.executable
        try:
            switches = []
            if self.with_switch:
                ports = [a for r in range(self.n_hosts) for a in ("-i", f"{r + 1}@udp:{worker_ip(r)}")]
                self._start("switch", [py, "-m", "bmv2_env.soft_switch", *ports, "--udp-bind", SWITCH_IP,
                                       "--device-id", "0", "--no-p4", "--",
                                       "--grpc-server-addr", f"unix:{self.dir}/switch.sock"], "inagg-soft-switch")
                switches.append({
                    "name": "s1", "grpc": f"unix:{self.dir}/switch.sock", "aggregator": f"{SWITCH_IP}:42602",
                    "hosts": {worker_ip(r): {"port": r + 1, "mac": f"02:00:7f:00:01:{r + 1:02x}"}
                              for r in range(self.n_hosts)}})
            config = {"listen": self.controller, "admin_token": self.admin_token,
                      "database": str(self.dir / "controller.sqlite"), "lease_seconds": self.lease_seconds,
                      "min_window": self.min_window, "host_aggregator": HOST_AGGREGATOR,
                      "switches": switches}
            (self.dir / "controller.json").write_text(json.dumps(config, indent=2))
            self.start_controller()
            self.aggregator = self._start(
                "aggregator", [py, "-m", "hostlib.aggregator", "--bind", HOST_AGGREGATOR, "--controller",
                               self.controller, "--admin-token", self.admin_token,
                               "--drop-rate", str(self.drop_rate)], "inagg-aggregator listening")
        except BaseException:
            self.__exit__()
            raise
        return self

    def start_controller(self) -> None:
        self.controller_proc = self._start(
            "controller", [sys.executable, "-m", "controller", "--config", str(self.dir / "controller.json")],
            "inagg-controller serving")

    def restart_controller(self) -> None:
        """Stop the controller process and start it again on the same state (SQLite)."""
        stop_processes([self.controller_proc])
        self.procs.remove(self.controller_proc)
        self.start_controller()

    def __exit__(self, *exc) -> None:
        stop_processes(reversed(self.procs))
        if not os.environ.get("INAGG_KEEP_TESTBED"):
            shutil.rmtree(self.dir, ignore_errors=True)

    def log(self, name: str) -> str:
        return (self.dir / f"{name}.log").read_text()

"""The local deployment takes free ports: a job starts, and its calls go through the switch,
while another program holds inagg's well-known UDP ports (42602, the switch's; 42666, the host
aggregator's) on 0.0.0.0, which holds them on every loopback address.

The ports are held in a network namespace of the test's own (``unshare``), so no other job on
this machine ever sees them taken."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from inagg.hostlib.wire.grant import HOST_AGGREGATOR_PORT
from inagg.hostlib.wire.protocol import UDP_PORT

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

# binds UDP 0.0.0.0 on each port of argv[1] (comma-separated), then runs the rest of argv
HOLD_PORTS_AND_RUN = (
    "import socket, subprocess, sys\n"
    "held = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in sys.argv[1].split(',')]\n"
    "for s, port in zip(held, sys.argv[1].split(',')):\n"
    "    s.bind(('0.0.0.0', int(port)))\n"
    "sys.exit(subprocess.call(sys.argv[2:]))\n"
)


def _in_own_network(cmd: list[str]) -> list[str]:
    """``cmd`` in a new network namespace whose loopback is up."""
    return ["unshare", "-rn", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *cmd]


def _namespaces_work() -> bool:
    if not (shutil.which("unshare") and shutil.which("ip")):
        return False
    return subprocess.run(_in_own_network(["true"]), capture_output=True, timeout=30).returncode == 0


@pytest.mark.skipif(not _namespaces_work(), reason="needs unshare -rn and ip (a network namespace of the test's own)")
def test_a_job_starts_while_inaggs_well_known_ports_are_held(tmp_path):
    out = tmp_path / "run.json"
    ports = f"{UDP_PORT},{HOST_AGGREGATOR_PORT}"
    train = [str(BIN / "torchrun"), "--standalone", "--nproc_per_node=2", str(ROOT / "examples" / "train_ddp.py"),
             "--steps", "3", "--out", str(out)]
    proc = subprocess.run(_in_own_network([sys.executable, "-c", HOLD_PORTS_AND_RUN, ports, *train]), cwd=ROOT,
                          env={"PATH": str(BIN) + ":/usr/bin:/bin", "INAGG_ALLREDUCE_PATH": "inagg",
                               "INAGG_HOST_REDUCE": "off"},
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    stats = json.loads(out.read_text())["stats"]
    assert stats["allreduce_paths"] == {"inagg": 6} and stats["inagg"]["mode"] == "switch"
    assert stats["inagg"]["packets_received"] > 0

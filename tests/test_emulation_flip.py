"""The path choice under a bandwidth change in the emulation (needs root and Debian's mininet;
docs/training.md, "The path choice under a bandwidth change"). A file apart from
tests/test_emulation.py so pytest-xdist's ``--dist loadfile`` can run the two on different
workers."""

import json
import subprocess
import sys

import pytest

from inagg.bmv2_env.emulation.run_dir import RunDir, root_interfaces
from test_emulation import ROOT, RUN_LINE, mininet_missing


def test_a_bandwidth_change_flips_the_backend_path_and_back(tmp_path):
    """benchmarks/bandwidth_flip.py, briefly: the ``inagg`` backend's workers run gloo over a
    management bridge and inagg through the switch; one worker's management link is throttled
    with tc tbf mid-run, then restored. The largest tensor's path leaves gloo while throttled
    and comes back after the restore (the workers check every allreduce's sum), and the run
    leaves nothing behind (no pcaps either, unless asked for). Phases of 5/20/30 s fit it in
    about a minute; the way back rests on an exploration of gloo, which its class's budget
    affords every 7-15 s at these steps (it came 6 s after the restore in one run, after more
    than 20 s in another). Every switch-side link runs at 100 Mbit/s and the throttle cuts gloo's link to
    20 Mbit/s, so each phase has one path several times faster than the other (about 3x either
    way for the 256 KiB tensor) whatever the machine's load: the flip tests the choice, not
    which of two bare veths is faster on a busy 2-core machine."""
    reason = mininet_missing()
    if reason:
        pytest.skip(reason)
    out = tmp_path / "flip.json"
    proc = subprocess.run([sys.executable, "benchmarks/bandwidth_flip.py", "--phases", "5", "20", "30",
                           "--rate", "20mbit", "--data-rate", "100mbit", "--results", str(tmp_path),
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=240)
    run = RunDir(RUN_LINE.search(proc.stdout).group(1))
    assert run.record["finished"] and run.live_processes() == [], proc.stdout
    assert [n for n in root_interfaces() if n.startswith(run.run_id)] == []
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not list(run.path.glob("pcaps/*.pcap"))   # only with --pcaps (2-7 GB a run)
    result = json.loads(out.read_text())
    assert result["verdict"] == "", proc.stdout
    assert (tmp_path / "bandwidth_flip.csv").read_text().count("\n") == len(result["rows"]) + 1

"""``inagg.bmv2_env.emulation.forked``: ``exit_now``, the way a forked service and a finished rank
end, and ``ForkedCommand``, the way the emulation starts its ranks, each in a process of its own."""

import os
import subprocess
import sys

import pytest

SCRIPT = """
import atexit, sys
from inagg.bmv2_env.emulation.forked import exit_now
atexit.register(lambda: print("exit handler ran", flush=True))
print("reported", end="")             # buffered: stdout is a pipe
print("on stderr", end="", file=sys.stderr)
exit_now(3)
print("after exit_now")
"""


def test_exit_now_writes_what_was_buffered_and_ends_with_its_status_running_no_exit_handler():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (3, "reported", "on stderr")


# A module for ForkedCommand to run (tests/forked_probe.py is not a file: the test writes it):
# where it ran, what it was given, then exit with the status its first argument names.
PROBE = """
import os, sys
print(os.readlink("/proc/self/ns/net"), os.readlink("/proc/self/ns/mnt"), os.getsid(0) == os.getpid(),
      os.getcwd(), os.environ["PROBE"], os.environ["KEPT"], *sys.argv[1:], flush=True)
print("on its log", file=sys.stderr, flush=True)
if sys.argv[1] == "wait":
    sys.stdin.read()   # /dev/null: returns at once; then wait to be ended
    import time
    time.sleep(300)
sys.exit(int(sys.argv[1]))
"""

# Forks the probe from a fork server that imported it, into the namespaces of a process that
# unshare(1) put in new ones; prints what the probe printed, its log and its exit statuses.
FORKING = """
import os, subprocess, sys, time
sys.path.insert(0, sys.argv[1])
from inagg.bmv2_env.emulation.forked import ForkedCommand, rank_context
rank_context("forked_probe")
os.environ["KEPT"] = "from the launcher"
holder = subprocess.Popen(["unshare", "--net", "--mount", "sleep", "120"])
while os.readlink(f"/proc/{holder.pid}/ns/net") == os.readlink("/proc/self/ns/net"):
    time.sleep(0.01)
print(os.readlink(f"/proc/{holder.pid}/ns/net"), os.readlink(f"/proc/{holder.pid}/ns/mnt"))
log = os.path.join(sys.argv[1], "probe.log")
for args, pid in ((["3", "x"], holder.pid), (["wait"], holder.pid), (["0"], 999999999)):
    with open(log, "a") as f:
        p = ForkedCommand([sys.executable, "-m", "forked_probe", *args], f.fileno(), sys.argv[2], {"PROBE": "set"},
                          namespaces_of=pid)
    print(p.stdout.readline().strip())
    if args == ["wait"]:
        assert p.poll() is None
        try:
            p.wait(0.2)
        except subprocess.TimeoutExpired:
            p.terminate()
    print(p.wait(60), p.returncode)
holder.kill()
print(open(log).read())
"""


def test_forked_command_runs_a_module_in_another_process_namespaces_as_mnexec_would(tmp_path):
    """What ``mininet_run`` starts its ranks with: ``python -m`` of a module the fork server
    imported, in a session of its own, in the network and mount namespaces of another process
    (a Mininet host's), with the launcher's environment and its own over it, in its directory;
    its stdout a pipe to the launcher, its stderr the file given, its exit status (a signal's
    as Popen gives it) seen by the launcher; a process it cannot enter is named in its log."""
    if os.geteuid() != 0:
        pytest.skip("setns needs root")
    (tmp_path / "forked_probe.py").write_text(PROBE)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    proc = subprocess.run([sys.executable, "-c", FORKING, str(tmp_path), str(cwd)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    net, mnt = lines[0].split()
    assert lines[1:3] == [f"{net} {mnt} True {cwd} set from the launcher 3 x", "3 3"]
    assert lines[3:5] == [f"{net} {mnt} True {cwd} set from the launcher wait", "-15 -15"]
    assert lines[5:7] == ["", "1 1"]   # no such process: no namespaces to enter, nothing run
    log = "\n".join(lines[7:])
    assert log.count("on its log") == 2
    assert "cannot enter process 999999999's net namespace" in log and "No such file" in log
    assert "RuntimeWarning" not in log and "RuntimeWarning" not in proc.stderr   # runpy's, of a preloaded module

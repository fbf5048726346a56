"""tests/rank_fork.py's ``RankProcess`` answers as ``subprocess.Popen`` does for the rank tests'
uses: argv, environment, directory and pipes per rank, exit statuses, signals (SIGKILL, SIGSTOP
and SIGCONT, SIGINT as a KeyboardInterrupt), ``communicate``'s timeout; its ranks start from the
server's imports."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rank_fork import PRELOAD, RankProcess

SCRIPT = """
import os, sys, time
print(" ".join(sys.argv[1:]), os.environ.get("RANK_FORK_TEST"), os.getcwd(), sys.path[0], flush=True)
print(",".join(m for m in {preload!r} if m not in sys.modules), flush=True)
mode = sys.argv[1]
if mode == "echo":
    print("read", sys.stdin.readline().strip(), flush=True)
    print("to stderr", file=sys.stderr)
    sys.exit(3)
if mode == "sleep":
    try:
        time.sleep(120)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        raise
if mode == "raise":
    raise ValueError("the rank's own error")
"""


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "rank.py"
    path.write_text(SCRIPT.format(preload=PRELOAD))
    return path


def _rank(script: Path, mode: str, **kwargs) -> RankProcess:
    env = dict(os.environ, RANK_FORK_TEST=mode)
    return RankProcess([sys.executable, str(script), mode], env=env, stdout=subprocess.PIPE, text=True, **kwargs)


def test_a_rank_has_its_argv_environment_directory_pipes_and_exit_status_and_the_servers_imports(script, tmp_path):
    proc = _rank(script, "echo", cwd=tmp_path, stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.pid > 0 and proc.pid != os.getpid()
    assert proc.stdout.readline().split() == ["echo", "echo", str(tmp_path), str(script.parent)]
    assert proc.stdout.readline().strip() == ""   # every PRELOAD module was imported already
    proc.stdin.write("hello\n")
    proc.stdin.flush()
    assert proc.communicate(timeout=60) == ("read hello\n", "to stderr\n")
    assert proc.returncode == 3 and proc.poll() == 3


def test_stderr_into_stdout_and_an_uncaught_error_ends_it_with_status_1_and_its_traceback(script):
    proc = _rank(script, "raise", stderr=subprocess.STDOUT)
    out, err = proc.communicate(timeout=60)
    assert err is None and "ValueError: the rank's own error" in out and proc.returncode == 1


def test_sigkill_sigstop_and_sigcont_reach_the_rank_and_a_killed_rank_ends_with_minus_the_signal(script):
    proc = _rank(script, "sleep")
    proc.stdout.readline()
    proc.send_signal(signal.SIGSTOP)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(0.2)
    assert Path(f"/proc/{proc.pid}/stat").read_text().split()[2] == "T"   # stopped, not ended
    proc.send_signal(signal.SIGCONT)
    proc.kill()
    assert proc.wait(60) == -signal.SIGKILL
    proc.kill()   # an ended rank is not signalled again, as Popen's is not


def test_sigint_is_a_keyboard_interrupt_in_the_rank_and_communicate_times_out_as_popens_does(script):
    proc = _rank(script, "sleep")
    proc.stdout.readline()
    proc.stdout.readline()
    with pytest.raises(subprocess.TimeoutExpired):
        proc.communicate(timeout=0.2)
    time.sleep(0.2)   # in its sleep
    proc.send_signal(signal.SIGINT)
    assert proc.communicate(timeout=60) == ("interrupted\n", None)
    assert proc.returncode == -signal.SIGINT   # an uncaught KeyboardInterrupt, as in an interpreter


def test_anything_but_a_python_script_is_refused_naming_what_to_use():
    with pytest.raises(ValueError, match="start anything else with subprocess"):
        RankProcess(["torchrun", "x.py"])


def test_a_rank_dropped_before_it_ended_leaves_the_server_serving_the_next(script):
    proc = _rank(script, "sleep")
    proc.stdout.readline()
    pid = proc.pid
    del proc   # its socket to the server closes: the server's word of its end finds no reader
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:   # until the server reaped it
        time.sleep(0.05)
    nxt = _rank(script, "raise", stderr=subprocess.DEVNULL)
    assert nxt.communicate(timeout=60)[0].startswith("raise") and nxt.returncode == 1

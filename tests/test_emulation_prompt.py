"""The emulation's mininet> prompt (needs root and Debian's mininet): two runs side by side, one
at its prompt; Ctrl-C at the prompt; a prompt while the jobs train. Each run checks for leftovers
only among what it started itself (tests/test_emulation.py's helpers). A file apart from
tests/test_emulation.py so pytest-xdist's ``--dist loadfile`` can run the two on different
workers."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from inagg.bmv2_env.emulation.run_dir import RunDir
from test_emulation import ROOT, RUN_LINE, Output, assert_left_nothing, launcher, mininet_missing


def test_two_runs_side_by_side_and_stop(tmp_path):
    """Two runs of one checkout at once: own run directories, interface names and sockets; both
    train. The second stays at its mininet> prompt, where inaggctl finds the controller and the
    admin token by itself; then ``--stop --run ID`` ends it and removes only what it started."""
    reason = mininet_missing()
    if reason:
        pytest.skip(reason)
    cmd_a, out_a = launcher(tmp_path, "single_switch.json", "soft", "--epochs", "1")
    cmd_b, out_b = launcher(tmp_path, "single_switch.json", "soft", "--epochs", "1", "--cli")
    a = subprocess.Popen(cmd_a, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    b = subprocess.Popen(cmd_b, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    try:
        # a node command reads ahead on a piped stdin: it goes last
        b.stdin.write("sh inaggctl top --once\nh1 inaggctl jobs\n")
        b.stdin.flush()
        stdout_a, _ = a.communicate(timeout=400)
        assert a.returncode == 0, stdout_a
        run_a = assert_left_nothing(stdout_a)
        rows_a = {r["name"]: r for r in json.loads(out_a.read_text())}
        assert rows_a["mlp"]["ok"] and rows_a["mlp"]["mode"] == "switch", stdout_a

        lines_b = []
        deadline = time.time() + 300
        while not any("active grant" in line for line in lines_b):    # h1's inaggctl jobs header
            assert time.time() < deadline and b.poll() is None, "".join(lines_b)
            lines_b.append(b.stdout.readline())
        run_b = RunDir(RUN_LINE.search("".join(lines_b)).group(1))
        assert run_b.run_id != run_a.run_id
        assert len(run_b.live_processes()) >= 8, "run b should be up at its mininet> prompt"
        assert "inagg: 0 job(s), 1024 switch slots" in "".join(lines_b)    # top, once the job left
        stop = subprocess.run([sys.executable, "-m", "inagg.bmv2_env.emulation.mininet_run", "--stop", "--run", run_b.run_id],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        stdout_b = "".join(lines_b) + b.communicate(timeout=60)[0]
    finally:
        for p in (a, b):
            if p.poll() is None:
                p.kill()
    assert "stopped (SIGTERM)" in stdout_b, stdout_b
    assert_left_nothing(stdout_b)
    rows_b = {r["name"]: r for r in json.loads(out_b.read_text())}
    assert rows_b["mlp"]["ok"], stdout_b
    # --stop --run acted on run b alone (run a's directory itself may be gone by now: the other
    # xdist worker's runs prune this user's finished runs beyond the newest 3)
    assert stop.stdout.startswith(f"run {run_b.run_id}: ") and run_a.run_id not in stop.stdout, stop.stdout


def from_a_terminal(cmd: list[str], **kwargs) -> subprocess.Popen:
    """``Popen`` with SIGINT at its default in the child, as a shell's foreground job has it. A
    suite started in the background (``nohup``, ``&``) runs with SIGINT ignored, an ignored
    signal is inherited through ``exec``, and a Python started so installs no
    KeyboardInterrupt handler: the prompt would never see a Ctrl-C. (A handled signal is reset
    to its default at ``exec``; this process's main thread sets one for the spawn.)"""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return subprocess.Popen(cmd, **kwargs)
    finally:
        signal.signal(signal.SIGINT, previous)


def interrupt_the_prompt(proc: subprocess.Popen, output: Output) -> None:
    """Ctrl-C as the terminal sends it (SIGINT to the launcher's process group); the prompt
    says ``Interrupt`` and takes the next command."""
    os.killpg(proc.pid, signal.SIGINT)
    output.until("Interrupt", 60)


def test_ctrl_c_at_the_prompt_reaches_no_service(tmp_path):
    """Ctrl-C at the mininet> prompt (SIGINT to the terminal's foreground process group, the
    launcher's) interrupts only the prompt: the data plane, the controller and the host
    aggregator live on in sessions of their own, and the controller and the switch's P4Runtime
    server answer; closing the prompt then tears everything down."""
    from inagg.controller.switch import SwitchConnection

    reason = mininet_missing()
    if reason:
        pytest.skip(reason)
    cmd, _ = launcher(tmp_path, "single_switch.json", "soft", "--epochs", "1", "--cli")
    proc = from_a_terminal(cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)
    output = Output(proc)
    try:
        proc.stdin.write("sh echo at-the-prompt\n")
        proc.stdin.flush()
        run = RunDir(RUN_LINE.search(output.until("at-the-prompt", 300)).group(1))
        services = [p for p in run.live_processes() if p["what"] in ("s1 data plane", "controller", "host aggregator")]
        assert len(services) == 3, run.record
        interrupt_the_prompt(proc, output)                  # then the next command is typed
        proc.stdin.write("sh inaggctl top --once\n")
        proc.stdin.flush()
        out = output.until("switch slots", 60)
        assert "inagg: 0 job(s), 1024 switch slots" in out, out
        assert {p["pid"] for p in run.live_processes()} >= {p["pid"] for p in services}, out
        switch = SwitchConnection(f"unix:{run.path / 's1-p4rt.sock'}", 0, election_id=(0, 0))
        try:
            assert sum(switch.counter("job_results").values()) > 0     # the job's, read now
        finally:
            switch.close()
        proc.stdin.close()                                  # end of input: the prompt exits
        proc.wait(120)
        out = output.rest(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert_left_nothing(out)


def test_a_prompt_during_the_jobs_sees_them(tmp_path):
    """``--cli during`` (make run CLI=during): the mininet> prompt is up while the jobs train,
    so inaggctl there lists the job running; leaving the prompt waits for the jobs, whose
    summary comes as with no prompt, and the run leaves nothing behind."""
    reason = mininet_missing()
    if reason:
        pytest.skip(reason)
    cmd, out = launcher(tmp_path, "single_switch.json", "soft", "--epochs", "12", "--cli", "during")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        # at the prompt: list the jobs until the controller shows all 4 ranks of mlp on the switch
        stdout, _ = proc.communicate("sh for i in $(seq 300); do out=$(inaggctl jobs); echo \"$out\" | "
                                     "grep -q ' mlp .* 4/4 .*switch' && { echo \"$out\"; break; }; sleep 0.2; done; "
                                     "echo listed-while-training\n", timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stdout
    during = stdout.index("listed-while-training")
    assert "network up, the jobs running" in stdout[:during], stdout
    listing = stdout[stdout.rindex("active grant", 0, during):during]
    assert re.search(r" mlp +4/4 +switch", listing), stdout
    assert stdout.index("per-job summary") > stdout.index("network up, the jobs running")
    rows = {r["name"]: r for r in json.loads(out.read_text())}
    assert rows["mlp"]["ok"] and rows["mlp"]["accuracy"] >= 0.9, stdout
    assert_left_nothing(stdout)

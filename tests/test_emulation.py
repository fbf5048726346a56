"""The Mininet emulation end to end (needs root and Debian's mininet): bring up, train, check,
tear down leaving nothing behind. Runs on the software data plane, and on BMv2 when installed.

Each run checks for leftovers only among what it started itself (the PIDs and interface names
its run directory recorded), so other checkouts' runs on the same machine do not disturb it, and
two runs go side by side. The prompt's tests are in tests/test_emulation_prompt.py and the
bandwidth flip in tests/test_emulation_flip.py, files of their own so pytest-xdist's
``--dist loadfile`` spreads them over its workers; their helpers stay here."""

import json
import os
import queue
import re
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from scapy.contrib.roce import BTH

from inagg.bmv2_env.emulation.mininet_run import DATA_PLANE_NICE
from inagg.bmv2_env.emulation.run_dir import RUNS_DIR, RunDir, root_interfaces
from inagg.bmv2_env.emulation.testbed import bmv2_missing
from inagg.hostlib.wire.grant import ETHERNET_MTU, switch_values_for_mtu, values_for_mtu
from inagg.hostlib.wire.protocol import MSG_RESULT, ROCE_OPCODE_UC_WRITE_ONLY_IMM, SWITCH_VALUES_PER_PACKET, UDP_PORT
from inagg.hostlib.wire.scapy_layer import Inagg, read_pcap

ROOT = Path(__file__).resolve().parents[1]
DISSECTOR = ROOT / "tools" / "wireshark" / "inagg.lua"
RUN_LINE = re.compile(r", run ([a-z0-9]{4}) in ")


def mininet_missing():
    if os.geteuid() != 0:
        return "Mininet needs root"
    if shutil.which("mnexec") is None or not os.path.isdir("/usr/lib/python3/dist-packages/mininet"):
        return "Mininet not installed (make setup-emulation)"
    return None


def launcher(tmp_path, topo, dataplane, *extra) -> tuple[list[str], Path]:
    """The launcher's command for ``topo`` (a shipped topology's file name, or a path) and the
    file its summary rows go to."""
    out = tmp_path / f"summary-{time.monotonic_ns()}.json"
    path = topo if os.path.isabs(topo) else f"bmv2_env/emulation/topologies/{topo}"
    return [sys.executable, "-m", "inagg.bmv2_env.emulation.mininet_run", "--topo", str(path),
            "--dataplane", dataplane, "--json", str(out), *extra], out


def assert_left_nothing(stdout: str, interfaces: int = 5, processes: int = 8) -> RunDir:
    """The run's record says it finished, and nothing it started (at least ``interfaces``
    interfaces and ``processes`` processes) is still running or present."""
    run = RunDir(RUN_LINE.search(stdout).group(1))
    assert run.record["finished"], stdout
    assert run.live_processes() == [], f"processes of run {run.run_id} left behind"
    leftover = [n for n in root_interfaces() if n.startswith(run.run_id)]
    assert leftover == [], f"interfaces of run {run.run_id} left behind: {leftover}"
    assert len(run.record["interfaces"]) >= interfaces and len(run.record["processes"]) >= processes
    return run


def run_topology(tmp_path, topo, dataplane, *extra):
    cmd, out = launcher(tmp_path, topo, dataplane, *extra)
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = assert_left_nothing(proc.stdout)
    return {r["name"]: r for r in json.loads(out.read_text())}, proc.stdout, run


def kill_when(output: "Output", said: str, seconds: float, what: str) -> RunDir:
    """Once a run's ``output`` says ``said`` (within ``seconds``): its process ``what``, still
    the one the run started, killed by SIGKILL; the run."""
    from inagg.bmv2_env.emulation.run_dir import process_start_time

    run = RunDir(RUN_LINE.search(output.until(said, seconds)).group(1))
    [rank] = [p for p in run.record["processes"] if p["what"] == what]
    assert process_start_time(rank["pid"]) == rank["start"], f"{what} is not running"
    os.kill(rank["pid"], signal.SIGKILL)
    return run


def machine_keeps_up() -> bool:
    """Whether the last 5 minutes' load stayed within twice the machine's cores (a run's data
    plane then got the CPU it needed, at nice -10)."""
    return os.getloadavg()[1] <= 2 * (os.cpu_count() or 1)


def assert_clean_logs(run: RunDir) -> None:
    for log in (run.path / "logs").glob("*.log"):
        text = log.read_text()
        assert "Traceback" not in text and "Error" not in text, f"{log}:\n{text}"


@pytest.mark.parametrize("dataplane", ["soft", "bmv2"])
def test_single_switch_training(tmp_path, dataplane):
    reason = mininet_missing() or (bmv2_missing() if dataplane == "bmv2" else None)
    if reason:
        pytest.skip(reason)
    rows, stdout, run = run_topology(tmp_path, "single_switch.json", dataplane, "--epochs", "3")
    job = rows["mlp"]
    assert job["ok"] and job["mode"] == "switch" and job["transport"] == "udp"
    assert job["accuracy"] >= 0.75, stdout            # 3 epochs of the demo reach 75.8 %
    assert job["switch_results"] > 0 and job["host_results"] == 0
    assert len(set(job["steps"])) == 1, job["steps"]
    # loss-free links: BMv2 saw every frame the workers sent (its capture rings hold their
    # windows), and at most 2 % of the packets were resent where no late answer came too (a
    # descheduled switch process makes answers late, not lost: those resends are spurious), on a
    # machine that keeps up: the bound catches a retransmission logic gone wrong. A data plane
    # starved of CPU (2 cores at load 27: BMv2 resent 8,480 frames a worker, every result exact)
    # drops frames in its queues and the kernel's backlog: the count then measures the machine,
    # and the run is held to its exact results and captures only
    if dataplane == "bmv2":
        captures = [run.path / "pcaps" / f"{run.run_id}s1-eth{port}_in.pcap" for port in range(1, 5)]
        assert sum(udp_frames_to(c, UDP_PORT) for c in captures) == job["packets_sent"]
    if machine_keeps_up():
        assert job["retransmissions"] - job["spurious"] <= job["packets_sent"] / 50, stdout
    assert "contributions aggregated" in stdout and "\nmlp " in stdout
    assert_clean_logs(run)
    assert any(p.stat().st_size > 24 for p in (run.path / "pcaps").glob("*_in.pcap"))
    if dataplane == "soft":   # the data plane runs ahead of the ranks (mininet_run.DATA_PLANE_NICE)
        assert f"nice {DATA_PLANE_NICE}" in (run.path / "logs" / "s1.log").read_text()
    else:
        assert_bmv2_reachable_and_logged(run, stdout)


def assert_bmv2_reachable_and_logged(run: RunDir, stdout: str) -> None:
    """BMv2's line says its Thrift port (for simple_switch_CLI) or, for a build without
    Thrift, that it has none; its log is kept in the run directory; switches.json agrees."""
    switch = json.loads((run.path / "switches.json").read_text())["s1"]
    log = run.path / "logs" / "s1-bmv2.txt"
    assert switch["log"] == str(log) and log.exists(), sorted(p.name for p in (run.path / "logs").iterdir())
    thrift = (f"Thrift port {switch['thrift_port']} (mininet> sh simple_switch_CLI --thrift-port "
              f"{switch['thrift_port']})" if switch["thrift_port"] else "no Thrift server (this simple_switch_grpc")
    assert f"switch s1: BMv2, {thrift}" in stdout and f"log {log} (info level" in stdout, stdout
    assert (switch["thrift_port"] is None) == ("compiled without Thrift support" in log.read_text())


@pytest.mark.parametrize("dataplane", ["soft", "bmv2"])
def test_single_switch_training_over_roce(tmp_path, dataplane):
    """The same job with its switch traffic carried as RoCEv2 (raw sockets in the hosts): the
    data plane parses it, aggregates, and sends results the workers' ICRC check accepts."""
    reason = mininet_missing() or (bmv2_missing() if dataplane == "bmv2" else None)
    if reason:
        pytest.skip(reason)
    rows, stdout, run = run_topology(tmp_path, "single_switch.json", dataplane, "--epochs", "1",
                                     "--transport", "roce")
    job = rows["mlp"]
    assert job["ok"] and job["mode"] == "switch" and job["transport"] == "roce", stdout
    assert job["accuracy"] >= 0.6, stdout             # 1 epoch: 64.2 %, as over UDP
    assert job["switch_results"] > 0 and job["host_results"] == 0
    # the switch's results to h1 as captured, at the program's K: BMv2's, or on the software
    # data plane as many values as RoCE frames carry on the 1500-byte links
    k = switch_values_for_mtu(ETHERNET_MTU) if dataplane == "soft" else SWITCH_VALUES_PER_PACKET
    assert_results_decode(run.path / "pcaps" / f"{run.run_id}s1-eth1_out.pcap", k, roce=True)


def test_two_jobs_fallback_and_upgrade(tmp_path):
    """--epochs sets the first job's epochs and scales the second's alike (8:24 -> 2:6), so the
    second still outlives the first and is upgraded from the host aggregator to the switch. The
    second joins once the first holds the switch, and both train once both hold grants."""
    reason = mininet_missing()
    if reason:
        pytest.skip(reason)
    rows, stdout, run = run_topology(tmp_path, "two_jobs.json", "soft", "--epochs", "2")
    first, second = rows["first"], rows["second"]
    assert first["ok"] and second["ok"], stdout
    assert (first["epochs"], second["epochs"]) == (2, 6)
    assert first["mode"] == "switch" and first["host_results"] == 0
    assert second["host_results"] > 0, "the second job should start on the host aggregator"
    assert second["mode"] == "switch" and second["grant_changes"] >= 1 and second["switch_results"] > 0
    assert first["accuracy"] > 0.85 and second["accuracy"] > 0.9, stdout
    assert_story_told(first, second, stdout)
    assert_clean_logs(run)
    # the summary as printed, and its figures, are kept with the run (and its records, to rebuild it)
    assert (run.path / "summary.txt").read_text().strip() in stdout
    assert json.loads((run.path / "summary.json").read_text())["jobs"] == list(rows.values())
    assert [r["spec"]["name"] for r in json.loads((run.path / "records.json").read_text())] == ["first", "second"]
    # the host aggregator's results, sized to the links' 1500-byte MTU, entering the switch
    assert_results_decode(run.path / "pcaps" / f"{run.run_id}s1-eth5_in.pcap", values_for_mtu(ETHERNET_MTU))


def assert_story_told(first: dict, second: dict, stdout: str) -> None:
    """The summary tells each job's story: every grant it used, from when (seconds, call) and
    why, with the median time of its calls; the second job's starts on the host aggregator,
    saying why, and is upgraded to the switch later."""
    for row in (first, second):
        story = row["grants"]
        assert [g["seconds"] for g in story] == sorted(g["seconds"] for g in story)
        assert sum(g["calls"] for g in story) >= row["steps"][0] and row["call_ms_median"] > 0
        assert all(g["median_ms"] > 0 for g in story if g["calls"])
    assert first["grants"][0]["mode"] == "switch"
    host, upgrade = second["grants"][0], next(g for g in second["grants"] if g["mode"] == "switch")
    assert host["mode"] == "host" and "switch s1 has no free slots" in host["reason"]
    assert upgrade["seconds"] > host["seconds"] and upgrade["from_call"] > 0
    assert re.search(r"story: \+0\.0s call 0: placed on the host aggregator \(10\.0\.0\.100:\d+\): "
                     r"switch s1 has no free slots", stdout), stdout
    assert re.search(rf"\+{upgrade['seconds']:.1f}s call {upgrade['from_call']}: upgraded to switch s1; "
                     rf"slots \[\d+,\d+\) epoch \d+; \d+ calls, median \d+\.\d\d ms", stdout), stdout


def udp_frames_to(pcap: Path, port: int) -> int:
    """The frames of a capture that carry an IPv4 UDP datagram to ``port``."""
    data, at, count = pcap.read_bytes(), 24, 0
    while at + 16 <= len(data):
        length = struct.unpack_from("<I", data, at + 8)[0]
        frame = data[at + 16: at + 16 + length]
        at += 16 + length
        if len(frame) >= 42 and frame[12:14] == b"\x08\x00" and frame[23] == 17:
            count += struct.unpack_from("!H", frame, 14 + 4 * (frame[14] & 15) + 2)[0] == port
    return count


def assert_results_decode(pcap: Path, k: int, roce: bool = False) -> None:
    """The results a switch port's capture holds (its first frames), decoded by the scapy layer
    and by tshark's dissector: header-only ones answer a call's control round, the others carry
    ``k`` values; over RoCEv2, each inside BTH/RETH/ImmDt (UC RDMA WRITE ONLY WITH IMMEDIATE)."""
    frames = 400
    results = [p for p in read_pcap(pcap, count=frames) if Inagg in p]
    assert {(p[Inagg].msg_type, len(p[Inagg].values)) for p in results} == {(MSG_RESULT, 0), (MSG_RESULT, k)}
    assert {p[BTH].opcode if BTH in p else None for p in results} == \
        {ROCE_OPCODE_UC_WRITE_ONLY_IMM if roce else None}
    if shutil.which("tshark") is None:
        return
    fields = ["inagg.msg_type", "inagg.n_values"] + (["infiniband.bth.opcode"] if roce else [])
    proc = subprocess.run(["tshark", "-r", str(pcap), "-c", str(frames), "-X", f"lua_script:{DISSECTOR}",
                           "-Y", "inagg", "-T", "fields", *(a for f in fields for a in ("-e", f))],
                          capture_output=True, text=True, timeout=120)
    rows = {tuple(line.split("\t")) for line in proc.stdout.splitlines()}
    expected = {(str(MSG_RESULT), "0"), (str(MSG_RESULT), str(k))}
    if roce:
        expected = {row + (str(ROCE_OPCODE_UC_WRITE_ONLY_IMM),) for row in expected}
    assert proc.returncode == 0 and rows == expected, proc.stderr


class Output:
    """``proc``'s output lines, read by a thread of their own so a wait for a line has a
    deadline (a blocked readline has none)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: list[str] = []
        self._queue: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=lambda: [self._queue.put(line) for line in proc.stdout],
                                        daemon=True)
        self._reader.start()

    def until(self, marker: str, timeout: float) -> str:
        """Every line so far, once one contains ``marker``."""
        deadline = time.time() + timeout
        while not any(marker in line for line in self.lines):
            try:
                self.lines.append(self._queue.get(timeout=max(deadline - time.time(), 0)))
            except queue.Empty:
                raise AssertionError(f"no {marker!r} within {timeout:.0f}s:\n" + "".join(self.lines)) from None
        return "".join(self.lines)

    def rest(self, timeout: float) -> str:
        """Every line, once the output ended (or ``timeout`` passed)."""
        self._reader.join(timeout)
        while not self._queue.empty():
            self.lines.append(self._queue.get())
        return "".join(self.lines)


def test_a_rank_killed_mid_run_ends_make_run_naming_it(tmp_path):
    """A rank that dies mid-run used to leave the other ranks waiting on gloo and the launcher
    waiting on them, forever. Killed here (SIGKILL, by the PID the run recorded) once training
    is under way, ``make run`` ends within 15 s with a non-zero status, naming the rank and
    showing its log's last lines, and leaves nothing behind."""

    reason = mininet_missing()
    if reason:
        pytest.skip(reason)
    if subprocess.run(["make", "-q", ".venv/.inagg-installed"], cwd=ROOT).returncode != 0:
        pytest.skip("the venv is older than pyproject.toml or native/ (make setup): make run would rebuild it first")
    proc = subprocess.Popen(["make", "run", "TOPO=bmv2_env/emulation/topologies/single_switch.json",
                             "DATAPLANE=soft", "EPOCHS=40"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    output = Output(proc)
    try:
        run = kill_when(output, "epoch 1/", 300, "job mlp rank 1")
        killed = time.monotonic()
        proc.wait(15)
        took = time.monotonic() - killed
        out = output.rest(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0, out
    assert f"run {run.run_id} failed, ending it: job mlp rank 1 on h2 was killed by SIGKILL; last lines of " in out, out
    assert took < 15, f"make run took {took:.1f} s to end"
    assert_left_nothing(out)
    saved = json.loads((run.path / "summary.json").read_text())     # the failure is kept with the run
    assert saved["failed"].startswith("job mlp rank 1 on h2 was killed by SIGKILL"), saved


def test_stop_without_runs_touches_nothing(tmp_path):
    """``--stop`` with no unfinished run of this checkout does nothing (and says so)."""
    proc = subprocess.run([sys.executable, "-m", "inagg.bmv2_env.emulation.mininet_run", "--stop", "--run", "zzzz"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and f"no run zzzz in {RUNS_DIR}" in proc.stderr

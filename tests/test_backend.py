"""The ``inagg`` torch.distributed backend, driven as users drive it: ``torchrun`` starting real
worker processes (env://) that call ``init_process_group("inagg")`` with no service started by
hand; ``inagg up/status/down``; the path choice agreeing across ranks."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import weakref
from datetime import timedelta
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch
import torch.distributed as dist

from inagg.hostlib.pytorch.backend import InaggProcessGroup
from inagg.hostlib.errors import InaggError, InaggSetupError
from inagg.hostlib.worker.local import find_endpoint
from inagg.hostlib.pytorch.path.choice import PathChoiceOptions, PathChooser, size_class
from test_path_calibration import calibrate
from test_training import on_ranks

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def torchrun(tmp_path: Path, name: str, *args: str, workers: int = 2, env: dict | None = None,
             script: Path = ROOT / "examples" / "train_ddp.py") -> dict:
    """Run ``script`` (examples/train_ddp.py: rank 0's parameters, losses and stats) under
    torchrun; what its rank 0 wrote to ``--out``."""
    out = tmp_path / f"{name}.json"
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("INAGG_")}
    full_env.update(env or {})
    proc = subprocess.run([str(BIN / "torchrun"), "--standalone", f"--nproc_per_node={workers}",
                           str(script), "--out", str(out), *args],
                          cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads(out.read_text())


def assert_same_training(a: dict, b: dict, atol: float) -> None:
    for x, y in zip(a["params"], b["params"]):
        np.testing.assert_allclose(x, y, rtol=0, atol=atol)
    np.testing.assert_allclose(a["losses"], b["losses"], rtol=0, atol=atol)


@pytest.fixture(scope="module")
def gloo_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gloo")
    return {hook: torchrun(tmp, f"gloo-{hook}", "--backend", "gloo", "--hook", hook) for hook in ("none", "powersgd")}


def test_ddp_trains_on_the_inagg_backend_with_nothing_started_by_hand(tmp_path, gloo_runs):
    # every rank a switch worker: the host-local reduce would leave the switch nothing to do
    # on one machine (tests/test_host_reduce.py)
    run = torchrun(tmp_path, "inagg", env={"INAGG_ALLREDUCE_PATH": "inagg", "INAGG_HOST_REDUCE": "off"})
    stats = run["stats"]
    # every eligible allreduce (DDP's buckets, the loss metric) went through the switch...
    assert stats["allreduce_paths"] == {"inagg": 40} and stats["inagg"]["mode"] == "switch"
    assert stats["inagg"]["packets_received"] > 0
    # ...DDP's own broadcasts/allgathers through gloo, counted
    assert stats["fallbacks"]["broadcast: inagg runs allreduce and reduce-scatter only"] > 0
    assert_same_training(run, gloo_runs["none"], atol=1e-5)
    # the job's own deployment is gone with it: its directory (sockets, logs) removed
    assert stats["controller"].startswith("unix:")
    assert not Path(stats["controller"][len("unix:"):]).parent.exists()


def test_calls_take_the_host_lane_beside_the_switch(tmp_path, gloo_runs):
    """A job on the switch also has the host aggregator (its host lane): every call pinned to
    it trains exactly as gloo does, while the job's grant stays on the switch. Its calibration
    timed every path from 64 B up, each size at least 4x the last (``CalibrationPlan``), and
    says so: 3 + 1 calls of each."""
    run = torchrun(tmp_path, "lane", env={"INAGG_ALLREDUCE_PATH": "host", "INAGG_HOST_REDUCE": "off"})
    stats = run["stats"]
    assert stats["allreduce_paths"] == {"host": 40}
    assert stats["path_model"]["paths"] == ["inagg", "host", "gloo"]
    calibration = stats["path_model"]["calibration"]
    sizes = calibration["sizes"]
    assert list(sizes) == ["inagg", "host", "gloo"] and all(s[0] == 64 for s in sizes.values())
    assert all(b >= 4 * a for s in sizes.values() for a, b in zip(s, s[1:]))
    assert calibration["calls"] == 4 * sum(map(len, sizes.values()))
    assert calibration["payload_bytes"] == 4 * sum(map(sum, sizes.values()))
    assert 1 <= calibration["rounds"] == max(map(len, sizes.values()))
    assert (stats["inagg"]["mode"], stats["host_lane"]["mode"]) == ("switch", "host")
    assert stats["host_lane"]["packets_received"] > 0
    assert_same_training(run, gloo_runs["none"], atol=1e-5)


@pytest.mark.parametrize("compiled", ["model", "ddp"])
def test_torch_compile_trains_as_gloo_around_ddp_and_inside_it(tmp_path, gloo_runs, compiled):
    """``DDP(torch.compile(model))`` and ``torch.compile(DDP(model))`` (inductor, as users run
    it) train as uncompiled DDP on gloo, every call on inagg's own path. Before: under
    ``torch.compile(DDP(model))`` Dynamo compiled the backend's Python ``broadcast``, which DDP
    calls from C++ in its first forward, and stopped at its first attribute."""
    run = torchrun(tmp_path, f"compile-{compiled}", "--compile", compiled, env={"INAGG_ALLREDUCE_PATH": "inagg"})
    assert run["stats"]["allreduce_paths"] == {"inagg": 40}   # DDP's bucket and the loss metric, 20 steps
    assert_same_training(run, gloo_runs["none"], atol=1e-5)


def test_a_job_that_never_compiles_never_loads_dynamo():
    """The backend keeps its Python out of Dynamo without importing it (~1 s of CPU at
    ``init_process_group``): ``inagg.hostlib.pytorch.outside_dynamo``."""
    code = ("import sys, torch, torch.distributed as dist; from datetime import timedelta;"
            "from inagg.hostlib.pytorch.backend import InaggProcessGroup;"
            "g = InaggProcessGroup(dist.HashStore(), 0, 1, timedelta(seconds=60)); t = torch.ones(4);"
            "g.allreduce([t]).wait(); g.broadcast([t]).wait(); g.shutdown();"
            "assert 'torch._dynamo' not in sys.modules and t.tolist() == [1.0] * 4")
    env = {k: v for k, v in os.environ.items() if not k.startswith("INAGG_")}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_pytorch_powersgd_hook_runs_on_the_inagg_backend(tmp_path, gloo_runs):
    run = torchrun(tmp_path, "powersgd", "--hook", "powersgd", env={"INAGG_ALLREDUCE_PATH": "inagg"})
    # PowerSGD's P and Q allreduces and its dense warm-up steps all went through inagg
    assert run["stats"]["allreduce_paths"]["inagg"] > 40
    assert_same_training(run, gloo_runs["powersgd"], atol=1e-4)


def test_auto_path_runs_the_fp16_hook_s_buckets_on_a_chosen_path(tmp_path, gloo_runs):
    run = torchrun(tmp_path, "fp16", "--hook", "fp16")
    stats = run["stats"]
    # the hook's float16 buckets and the float32 metrics alike chose a path: no allreduce fell back
    assert not [k for k in stats["fallbacks"] if k.startswith("allreduce")]
    assert sum(stats["allreduce_paths"].values()) == 40
    assert stats["path_model"]["agreements"] >= 1
    assert run["losses"][-1] < run["losses"][0]


@pytest.fixture(scope="module")
def path_runs(tmp_path_factory):
    """tests/allreduce_ranks.py's calls (float32, bfloat16, float16; SUM, AVG; a call riding in
    the control round and one of several packets), all pinned to each path in turn, every rank a
    worker of the switch (``INAGG_HOST_REDUCE=off``: on one host its ranks would reduce there)."""
    tmp = tmp_path_factory.mktemp("paths")
    return {path: torchrun(tmp, path, script=ROOT / "tests" / "allreduce_ranks.py", env={"INAGG_ALLREDUCE_PATH": path, "INAGG_HOST_REDUCE": "off"})
            for path in ("inagg", "host", "gloo")}


def test_bfloat16_and_float16_through_the_switch_are_the_float32_results_rounded_once(path_runs):
    """In real processes on the backend string: every 16-bit allreduce on the switch path gives
    the bits of the same values allreduced as float32 there, rounded once to the dtype; counted
    as the switch's calls, none as a fallback."""
    run = path_runs["inagg"]
    for case in run["cases"]:
        assert case["result"] == case["reference"], (case["dtype"], case["size"], case["op"])
    stats = run["stats"]
    assert stats["allreduce_paths"] == {"inagg": 2 * len(run["cases"])} and stats["inagg"]["mode"] == "switch"
    assert not [k for k in stats["fallbacks"] if k.startswith("allreduce")]


def test_every_path_gives_the_same_bits(path_runs):
    """The same tensors allreduced on the switch, the host lane and gloo: bit-identical results
    (gloo sums inagg's fixed point under the agreed exponents, not floats in ring order), and
    on each path a 16-bit result is the float32 one rounded once."""
    switch = path_runs["inagg"]["cases"]
    for path, run in path_runs.items():
        assert run["stats"]["allreduce_paths"] == {path: 2 * len(switch)}
        for case, on_switch in zip(run["cases"], switch):
            assert case["result"] == on_switch["result"], (path, case["dtype"], case["size"], case["op"])
            assert case["result"] == case["reference"], (path, case["dtype"], case["size"], case["op"])


def test_three_training_runs_end_with_bit_identical_parameters(tmp_path):
    """examples/train_ddp.py on the backend string three times, each call on whatever path the
    chooser's timings pick: the same parameters and losses to the bit."""
    runs = [torchrun(tmp_path, f"run{i}") for i in range(3)]
    paths = [run["stats"]["allreduce_paths"] for run in runs]
    for run in runs[1:]:
        assert run["params"] == runs[0]["params"] and run["losses"] == runs[0]["losses"], paths


def test_inagg_up_serves_jobs_named_by_inagg_controller(tmp_path):
    env = {**os.environ, "INAGG_STATE_DIR": str(tmp_path / "state")}
    cli = [str(BIN / "inagg")]
    up = subprocess.run(cli + ["up", "--workers", "2"], env=env, capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, up.stderr
    try:
        controller = up.stdout.split("INAGG_CONTROLLER=")[1].split()[0]
        again = subprocess.run(cli + ["up"], env=env, capture_output=True, text=True, timeout=60)
        assert again.returncode == 1 and "already running" in again.stderr
        run = torchrun(tmp_path, "up", env={"INAGG_CONTROLLER": controller, "INAGG_ALLREDUCE_PATH": "inagg"})
        assert run["stats"]["controller"] == controller
        deployment = json.loads((Path(controller[len("unix:"):]).parent / "deployment.json").read_text())
        assert run["stats"]["address"] == deployment["worker_ips"][0]   # found, not typed
        status = subprocess.run(cli + ["status"], env=env, capture_output=True, text=True, timeout=60)
        # the finished job left the controller (rank 0 ended it with the process group)
        assert status.returncode == 0 and "0 job(s)" in status.stdout, status.stdout + status.stderr
        assert f"controller {controller}" in status.stdout
    finally:
        down = subprocess.run(cli + ["down"], env=env, capture_output=True, text=True, timeout=60)
    assert down.returncode == 0, down.stderr
    assert not Path(controller[len("unix:"):]).exists()
    status = subprocess.run(cli + ["status"], env=env, capture_output=True, text=True, timeout=60)
    assert status.returncode == 1 and "no local deployment" in status.stdout


def _gloo_workers() -> set[int]:
    """This process's gloo worker threads (those that run a group's calls), by kernel thread id.
    (A device's TCP loop thread may outlive its group; it never takes the GIL.)"""
    return {int(t) for t in os.listdir("/proc/self/task") if _thread_name(t) == "pt_gloo_runloop"}


def _thread_name(tid: str) -> str:
    """A thread's kernel name; '' for one that ended since /proc/self/task was listed."""
    try:
        return Path(f"/proc/self/task/{tid}/comm").read_text().strip()
    except FileNotFoundError:
        return ""


def test_shutdown_ends_the_inner_gloo_group_and_the_communicators_threads(tmp_path, monkeypatch):
    """After shutdown (destroy_process_group) no thread of the group is left for interpreter exit:
    a gloo worker letting go of a Python tensor then, or a communicator thread returning from a
    native call, aborts the process (SIGABRT). Two ranks in this process (one host: the host-local
    reduce, no local deployment)."""
    for name in ("INAGG_CONTROLLER", "INAGG_ALLREDUCE_PATH", "LOCAL_WORLD_SIZE", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    gloo_before, before = _gloo_workers(), set(threading.enumerate())
    store = dist.FileStore(str(tmp_path / "store"), 2)
    groups = on_ranks(lambda r: InaggProcessGroup(store, r, 2, timedelta(seconds=60)), 2)

    def use(r):
        t = torch.full((1000,), r + 1.0)
        groups[r].allreduce([t]).wait()               # inagg, host or gloo: the chooser's pick
        groups[r].broadcast([t], dist.BroadcastOptions()).wait()   # gloo (its group made now)
        return t.tolist()

    assert on_ranks(use, 2) == [[3.0] * 1000] * 2
    assert _gloo_workers() - gloo_before
    on_ranks(lambda r: groups[r].shutdown(), 2)
    assert not _gloo_workers() - gloo_before
    assert not [t.name for t in set(threading.enumerate()) - before
                if t.name.startswith("inagg-") and t.name != "inagg-complete"]
    with pytest.raises(InaggError, match="shut down"):
        groups[0].broadcast([torch.ones(1)], dist.BroadcastOptions())


def _children(pid: int) -> list[int]:
    kids = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        kids += [int(c) for c in (task / "children").read_text().split()]
    return kids


def test_a_killed_job_leaves_no_services_behind():
    serve = subprocess.Popen([sys.executable, "-m", "inagg.bmv2_env.emulation.services", "serve", "--workers", "2",
                              "--until-stdin-closes"], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    info = json.loads(serve.stdout.readline())
    services = _children(serve.pid)
    assert len(services) == 3   # switch, controller, host aggregator
    serve.kill()                # as if rank 0 were killed -9 together with it
    serve.wait()
    for pid in services:        # the kernel tells them (PR_SET_PDEATHSIG)
        deadline = 100
        while Path(f"/proc/{pid}").exists() and deadline:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(")")[1].split()[0] == "Z":
                    break
            threading.Event().wait(0.1)
            deadline -= 1
        assert deadline, f"service {pid} outlived its supervisor"
    assert info["pid"] == serve.pid
    shutil.rmtree(info["dir"])  # a supervisor killed -9 leaves its directory (logs, SQLite) behind


def test_parent_closing_the_pipe_stops_the_deployment():
    serve = subprocess.Popen([sys.executable, "-m", "inagg.bmv2_env.emulation.services", "serve", "--workers", "1",
                              "--until-stdin-closes"], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    info = json.loads(serve.stdout.readline())
    assert Path(info["dir"], "deployment.json").stat().st_mode & 0o077 == 0   # holds the admin token
    serve.stdin.close()
    assert serve.wait(30) == 0
    assert not Path(info["dir"]).exists()


def test_multi_node_job_without_a_controller_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv("INAGG_CONTROLLER", raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    store = dist.FileStore(str(tmp_path / "store"), 1)
    with pytest.raises(InaggSetupError, match=r"spans several machines \(4 ranks, 2 on this one\).*INAGG_CONTROLLER"):
        find_endpoint(store, 0, 4)


def test_controller_address_gives_the_routed_source_address(tmp_path, monkeypatch):
    monkeypatch.setenv("INAGG_CONTROLLER", "127.0.0.1:50051")
    store = dist.FileStore(str(tmp_path / "store"), 1)
    assert find_endpoint(store, 0, 1).bind_ip == "127.0.0.1"
    monkeypatch.setenv("INAGG_CONTROLLER", "not an address")
    with pytest.raises(InaggSetupError, match="neither host:port nor unix:PATH"):
        find_endpoint(store, 0, 1)


def _agree_min_over(n: int):
    """Each rank's agree function of an n-rank job run as threads: the elementwise minimum."""
    barrier, shared = threading.Barrier(n), {}

    def agree_min(rank):
        def agree(values):
            shared[rank] = values
            barrier.wait()
            out = np.minimum.reduce([shared[r] for r in range(n)])
            barrier.wait()
            return out
        return agree

    return agree_min


def test_path_choice_is_identical_on_every_rank():
    """Two ranks whose own measurements differ take the same path for every call, probes and
    explorations included."""
    n = 2
    agree_min = _agree_min_over(n)
    choosers = [PathChooser(agree_min(r), agree_every=16) for r in range(n)]
    # rank 0 sees inagg fast and gloo slow for big calls, rank 1 the opposite; each feeds its own
    # chooser what its calls took, so their local figures keep differing
    def took(r, path, nbytes):
        if path == "inagg":
            return 1e-4 + (3e-9 if r == 0 else 1e-8) * nbytes
        return 5e-5 + (1e-8 if r == 0 else 2e-9) * nbytes

    for r, c in enumerate(choosers):
        for nbytes in (64, 1 << 20):
            for p in ("inagg", "gloo"):
                c.observe(p, nbytes, took(r, p, nbytes))
    sizes = [4, 1 << 10, 1 << 16, 1 << 20, 1 << 24] * 40
    picks = [[], []]

    def run(r):
        for s in sizes:
            path, measure = choosers[r].choose(s)
            picks[r].append(path)
            if measure:
                choosers[r].observe(path, s, took(r, path, s))

    threads = [threading.Thread(target=run, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert picks[0] == picks[1]
    assert [h["explored"] for h in choosers[0].history()] == [h["explored"] for h in choosers[1].history()]
    assert {"inagg", "gloo"} <= set(picks[0])       # small calls gloo (lower alpha), large inagg
    assert choosers[0].agreements == choosers[1].agreements >= 5
    assert choosers[0].probed > 0


def test_exploration_stays_within_its_budget():
    """A path predicted 10x slower is explored, but its extra time stays within the budget
    (2 % of the predicted time of all calls); with the paths close, it is explored at almost
    every agreement. The agreements' own work is timed on a clock that stands still: on the
    machine's clock, under load, it ate the budget (124 explorations of 146 at load 11)."""
    def run(inagg_seconds: float) -> PathChooser:
        c = PathChooser(lambda v: v, agree_every=128, explore_budget=0.02, clock=lambda: 0.0)
        for nbytes in (4, 1 << 20):
            c.observe("gloo", nbytes, 1e-3)
            c.observe("inagg", nbytes, inagg_seconds)
        for _ in range(20000):
            path, measure = c.choose(1 << 20)
            if measure:
                c.observe(path, 1 << 20, 1e-3 if path == "gloo" else inagg_seconds)
        return c

    far = run(10e-3)
    assert far.explorations >= 2
    extra = far.explorations * (10e-3 - 1e-3)
    assert extra <= 0.02 * 20000 * 1e-3 + 9e-3    # the budget, and at most one exploration ahead
    near = run(1.2e-3)
    assert near.explorations >= 20000 // 128 - 10         # (each also adds an agreement)


def _tiny_calls_on(calls: int, agreement_s: float, **budgets) -> PathChooser:
    """A chooser after ``calls`` 4 B calls, gloo's taking 0.2 ms and inagg's 0.25 ms, whose
    agreements' own work takes ``agreement_s`` (two readings of a fake clock)."""
    ticks = iter(range(10 ** 6))
    c = PathChooser(lambda v: v, ("inagg", "gloo"), agree_every=128, clock=lambda: next(ticks) * agreement_s / 2,
                    **budgets)
    took = {"gloo": 0.2e-3, "inagg": 0.25e-3}
    for _ in range(3):
        for path, seconds in took.items():
            c.observe(path, 4, seconds)
    c.agree()
    for _ in range(calls):
        path, measure = c.choose(4)
        if measure:
            c.observe(path, 4, took[path])
    return c


def test_agreements_and_the_explorations_they_bring_stay_within_their_budgets():
    """Calls of 0.2 ms and agreements whose own work (summaries and refit: each reading of
    this clock 0.75 ms apart) takes 1.5 ms, as at 2 workers / 4 B on the 2-core machine: the
    agreements take at most ``agree_budget`` of the calls' time, plus the explorations'
    ``explore_budget`` (each exploration brings one), where every 128 calls and once more
    after each exploration they took 12 %. The other path is still explored."""
    calls = 50000
    c = _tiny_calls_on(calls, 1.5e-3, agree_budget=0.01, explore_budget=0.02)
    assert c.agreement_s == pytest.approx(1.5e-3)
    spent = c.agreements * 1.5e-3 + c.explorations * 0.05e-3
    assert spent <= (0.01 + 0.02) * calls * 0.2e-3 + 2 * 1.5e-3
    assert c.explorations >= 10


def test_an_exploration_pays_for_the_agreement_it_brings():
    """Calls of 0.2 ms, agreements whose own work takes 3 ms: each exploration brings an
    agreement, so the explorations and their agreements together stay within
    ``explore_budget`` (where the exploration paid for its own extra 0.05 ms only, one came at
    every scheduled agreement: twice the budget)."""
    calls = 50000
    c = _tiny_calls_on(calls, 3e-3, agree_budget=0.01, explore_budget=0.005)
    each = c.agreement_s + 0.05e-3
    assert c.agreement_s == pytest.approx(3e-3)
    assert 5 <= c.explorations and c.explorations * each <= 0.005 * calls * 0.2e-3 + each


def test_a_new_size_is_probed_on_each_path_then_agreed():
    c = PathChooser(lambda v: v, agree_every=128)
    for nbytes in (64, 1 << 20):
        c.observe("gloo", nbytes, 1e-4 + 1e-9 * nbytes)
        c.observe("inagg", nbytes, 2e-4 + 1e-9 * nbytes)
    c.agree()
    calls = [c.choose(4096) for _ in range(8)]
    assert [p for p, _ in calls] == ["inagg"] * 4 + ["gloo"] * 4     # three each, the slower first ...
    assert [m for _, m in calls] == [False, True, True, True] * 2     # ... after an untimed warm-up
    for p, measure in calls:
        if measure:
            c.observe(p, 4096, 1e-4 if p == "gloo" else 5e-4)
    before = c.agreements
    assert c.choose(4096) == ("gloo", True)    # agreed on the probes at once; its ring still filling
    assert c.agreements == before + 1
    assert 4096 in c.as_dict()["agreed"]["gloo"]["measured_s"]


def _calibrated_chooser(faster: str, before: int,
                        per_byte: float = 1e-9) -> tuple[PathChooser, Callable[[str, int], float]]:
    """A job's chooser calibrated as the backend's (``CalibrationPlan``: on fast links 64 B,
    16 KiB and 1 MiB, three calls each path, the last on gloo: ``ran_last``), then 40 calls of
    ``before`` bytes (none: 0); with each path's time for a call (alpha-beta, ``faster``
    ``per_byte`` seconds per byte, the other twice that)."""
    def took(path: str, n: int) -> float:
        return 1e-4 + (per_byte if path == faster else 2 * per_byte) * n

    c = PathChooser(lambda v: v, ("inagg", "gloo"), agree_every=128)
    calibrate(c, took)
    c.ran_last("gloo")
    for _ in range(40 if before else 0):
        path, measure = c.choose(before)
        if measure:
            c.observe(path, before, took(path, before))
    return c, took


def _calls(c: PathChooser, took: Callable[[str, int], float], nbytes: int, count: int) -> list[tuple[str, str]]:
    """``count`` calls of ``nbytes`` on chooser ``c``, each path's time ``took``: each call's
    path and the size's choice (``best``) after it."""
    out = []
    for _ in range(count):
        path, measure = c.choose(nbytes)
        if measure:
            c.observe(path, nbytes, took(path, nbytes))
        out.append((path, c.best(nbytes)))
    return out


def _calls_to_settle(nbytes: int, faster: str, before: int, per_byte: float) -> tuple[int, str]:
    """``_calibrated_chooser``'s, then 300 calls of ``nbytes``: the number of the first of
    those after which the class's choice (``best``) never changes again, and that choice."""
    choices = [best for _, best in _calls(*_calibrated_chooser(faster, before, per_byte), nbytes, 300)]
    changed = [i for i, choice in enumerate(choices) if choice != choices[-1]]
    return (changed[-1] + 2) if changed else 1, choices[-1]


@pytest.mark.parametrize("per_byte", [1e-9, 8e-7])   # 1 GB/s; 10 Mbit/s, where no path is calibrated at 1 MiB
@pytest.mark.parametrize("before", [0, 64, 16 << 20])   # no calls before (the job's first size), on gloo, on inagg
@pytest.mark.parametrize("faster", ["inagg", "gloo"])
@pytest.mark.parametrize("nbytes", [4, 4 << 10, 64 << 10, 4 << 20, 64 << 20])
def test_a_size_classs_path_is_settled_within_its_first_8_calls(nbytes, faster, before, per_byte):
    """Issue 36: the choice of a new size class's path is final by its 8th call, counted in
    calls, not time: its probes take the path the calls are on first (no warm-up; for the
    job's first size, the path its calibration ended on), then the other after one warm-up
    (3 + 1 + 3 calls), and the ranks agree at the 8th. Later calls that
    take the other path (rechecks of gloo, explorations) measure it; the choice stays. On
    slow links too, where the calibration left the larger sizes to these probes; where the
    faster path is faster by more than the margin, it is the choice."""
    calls, path = _calls_to_settle(nbytes, faster, before, per_byte)
    assert calls <= 8
    if 1e-4 + per_byte * nbytes < (1 - PathChoiceOptions().margin) * (1e-4 + 2 * per_byte * nbytes):
        assert path == faster


@pytest.mark.parametrize("before", [0, 64, 16 << 20])   # no calls before (the job's first size), on gloo, on inagg
@pytest.mark.parametrize("faster", ["inagg", "gloo"])
@pytest.mark.parametrize("nbytes", [64 << 10, 4 << 20, 64 << 20])
def test_a_size_classs_calls_take_the_slower_path_only_in_its_probe_round(nbytes, faster, before):
    """Issue 36, counted in calls: of a new size class's first 20 calls (one path twice as fast
    per byte), at most 4 take the slower path (its probes and their warm-up), and none after
    the 8th. Where the class leaves ``prefer`` (gloo) on probes that agree with gloo's line
    through its other sizes, they stand for the recheck of gloo: it went back to gloo for four
    calls right after its confirmation (calls 13-16; 5 of the wire bench's 18 calls at 4 MiB)."""
    slower = "gloo" if faster == "inagg" else "inagg"
    paths = [path for path, _ in _calls(*_calibrated_chooser(faster, before), nbytes, 20)]
    assert paths.count(slower) <= 4 and slower not in paths[8:], "".join(p[0] for p in paths)


def test_probes_end_where_calls_of_another_size_on_another_path_come_between():
    """Each path's probes of a new size start with one untimed warm-up where the call before
    was another path's; with 64 B calls on the host lane between 4 KiB calls (as the bandwidth
    flip's steps interleave sizes), every 4 KiB call follows a host-lane call, and the probes
    still end after one warm-up each (warming up before each call, they never did: gloo's
    figure stayed throttled after the link was restored)."""
    c = PathChooser(lambda v: v, ("host", "gloo"), agree_every=128, prefer=None)   # no rechecks of gloo
    for nbytes in (64, 1 << 20):
        c.observe("gloo", nbytes, 0.8e-3 + 1e-9 * nbytes)
        c.observe("host", nbytes, 0.5e-3 + 1e-9 * nbytes)
    c.agree()
    before_4k = []
    for _ in range(20):
        before_4k.append(c.choose(64)[0])
        path, measure = c.choose(4096)
        if measure:
            c.observe(path, 4096, 1e-3)
    assert before_4k == ["host"] * 20           # every 4 KiB call came after a host-lane call
    assert all(4096 in m["measured_s"] for m in c.as_dict()["agreed"].values())


@pytest.mark.parametrize("host_line_ms, probed", [(4.0, True), (12.0, False)])
def test_a_dear_new_size_probes_a_path_its_line_says_is_faster(host_line_ms, probed):
    """8 workers / 1 KiB: gloo takes 14 ms (measured at 64 B and 16 KiB alike), the host lane's
    line says 4 ms. Above ``probe_seconds`` a new size is left to exploration, except for a
    path predicted faster than gloo by the margin: it is probed (and gloo beside it), the
    ranks agree, and the calls take it at once. A path predicted only a little faster (12 ms)
    is not probed: gloo keeps the calls."""
    c = PathChooser(lambda v: v, ("host", "gloo"), agree_every=128)
    for nbytes in (64, 16384):
        for _ in range(3):
            c.observe("gloo", nbytes, 14e-3)
            c.observe("host", nbytes, host_line_ms * 1e-3)
    c.agree()
    calls = [c.choose(1024) for _ in range(8)]
    if not probed:
        assert [p for p, _ in calls] == ["gloo"] * 8
        return
    assert sorted(p for p, _ in calls) == ["gloo"] * 4 + ["host"] * 4   # three probes each, after a warm-up
    assert [m for _, m in calls] == [False, True, True, True] * 2
    for _ in range(30):
        path, measure = calls[-1]
        if measure:
            c.observe(path, 1024, 14e-3 if path == "gloo" else 4e-3)
        calls.append(c.choose(1024))
    paths = [p for p, _ in calls[6:]]
    assert paths.count("host") >= 25 and paths[-10:] == ["host"] * 10   # gloo re-checked 3 times, no more


def test_a_size_new_to_its_path_is_agreed_once_its_ring_is_full():
    """gloo's line says 5 ms at 1 KiB (its 64 B and 16 KiB calls), the host lane's 4 ms: not
    faster by the margin, so 1 KiB starts on gloo unprobed. Its calls take 14 ms (as at 8
    workers): once gloo's ring there is full the ranks agree, the host lane is probed and takes
    the calls, within a few dozen calls, not at the next scheduled agreement."""
    ticks = iter(range(10 ** 6))
    c = PathChooser(lambda v: v, ("host", "gloo"), agree_every=128, clock=lambda: next(ticks) * 0.5e-3)
    took = {("gloo", 64): 5e-3, ("gloo", 16384): 5e-3, ("gloo", 1024): 14e-3,
            ("host", 64): 4e-3, ("host", 16384): 4e-3, ("host", 1024): 4e-3}
    for nbytes in (64, 16384):
        for path in ("gloo", "host"):
            for _ in range(5):
                c.observe(path, nbytes, took[(path, nbytes)])
    c.agree()
    for nbytes, calls in ((64, 300), (1024, 30)):
        paths = []
        for _ in range(calls):
            path, measure = c.choose(nbytes)
            paths.append(path)
            if measure:
                c.observe(path, nbytes, took[(path, nbytes)])
    assert paths[:5] == ["gloo"] * 5 and paths[-10:] == ["host"] * 10


@pytest.mark.parametrize("shared_clock, agreed_ms", [(True, 0.9), (False, 0.3)])
def test_a_call_is_timed_from_the_last_start_to_the_last_end_on_a_shared_clock(shared_clock, agreed_ms):
    """Rank 0 starts a call at 0 and is done at 0.3 ms, rank 1 starts at 0.1 ms and is done at
    1.0 ms: the job waited 0.9 ms from its last rank's start. Without a shared clock the ranks'
    own times are all there is, and their minimum (0.3 ms) is the figure."""
    n = 2
    agree_min = _agree_min_over(n)
    choosers = [PathChooser(agree_min(r), shared_clock=shared_clock) for r in range(n)]
    spans = [(10.0, 10.0003), (10.0001, 10.001)]      # (start, end) in seconds, per rank

    def run(r):
        for _ in range(3):
            choosers[r].observe("gloo", 64, spans[r][1] - spans[r][0], spans[r][0])
        choosers[r].agree()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for c in choosers:
        assert c.as_dict()["agreed"]["gloo"]["measured_s"][64] == pytest.approx(agreed_ms * 1e-3)


@pytest.mark.parametrize("sample_seconds", [0.05, 0.005])
def test_calls_taken_in_runs_are_chosen_as_if_each_was_asked(sample_seconds):
    """The backend's fast path: calls taken without ``choose`` as ``run_length`` allows, then
    reported by ``skip``, leave the chooser exactly where asking on every call leaves it (same
    paths, measurements, agreements, explorations, history); with samples due by call count
    and, at 5 ms, by the 4 B class's predicted time (50 of its calls)."""
    def took(path, nbytes):
        return (2e-4 if path == "inagg" else 1e-4) + 1e-9 * nbytes

    def chooser():
        ticks = iter(range(10 ** 6))   # each agreement takes 0.1 ms (two readings of this clock)
        c = PathChooser(lambda v: v, agree_every=64, sample_seconds=sample_seconds, clock=lambda: next(ticks) * 1e-4)
        for nbytes in (64, 1 << 20):
            for p in ("inagg", "gloo"):
                c.observe(p, nbytes, took(p, nbytes))
        c.agree()
        return c

    sizes = [4] * 300 + [4096] * 50 + [4] * 200 + [1 << 20] * 20 + [4] * 100
    asked, running = chooser(), chooser()
    every = []
    for s in sizes:
        path, measure = asked.choose(s)
        every.append((path, measure))
        if measure:
            asked.observe(path, s, took(path, s))
    ran, left, to_sample, period, taken, skipped, run_samples = [], 0, 0, 0, 0, 0, 0
    for s in sizes:
        if left and s == ran[-1][2]:
            left, taken, to_sample = left - 1, taken + 1, to_sample - 1
            sample = to_sample == 0   # the backend times it
            if sample:
                to_sample = period
            ran.append((ran[-1][0], sample, s))
            if sample:
                running.observe(ran[-1][0], s, took(ran[-1][0], s))
                run_samples += 1
            continue
        running.skip(taken)
        skipped += taken
        path, measure = running.choose(s)
        ran.append((path, measure, s))
        if measure:
            running.observe(path, s, took(path, s))
        (left, first, period), taken = running.run_length(s, path), 0
        to_sample = first or -1
    running.skip(taken)
    assert [(p, m) for p, m, _ in ran] == every
    assert skipped > len(sizes) // 2                      # most calls took the fast path ...
    assert run_samples >= 1                               # ... samples among them
    assert (running.calls, running.agreements, running.explorations) == (asked.calls, asked.agreements,
                                                                          asked.explorations)
    expand = lambda c: [(h["path"], h["bytes"]) for h in c.history() for _ in range(h["calls"])]
    assert expand(running) == expand(asked) == [(p, s) for (p, _), s in zip(every, sizes)]


def test_a_run_follows_a_sampled_call_and_only_on_its_path():
    """After a call the chooser samples (timed), the next calls may run untimed on the same
    path without asking (the backend's fast path; asking again after each sample doubled its
    slow calls), and a run is never granted for a path other than the one just answered. (A
    frozen clock: an agreement's own time, measured, moves the agreements and so the runs; a
    loaded machine put an agreement right after a sample.)"""
    c = PathChooser(lambda v: v, agree_every=1024, sample_every=32, clock=lambda: 0.0)
    for _ in range(5):
        c.observe("gloo", 4096, 1e-3)
        c.observe("inagg", 4096, 2e-3)
    c.agree()
    sampled = 0
    for _ in range(200):
        path, measure = c.choose(4096)
        if c.history()[-1]["explored"]:
            c.observe(path, 4096, 2e-3)
            continue
        assert path == "gloo"
        assert c.run_length(4096, "inagg") == (0, 0, 0)
        if measure:
            c.observe(path, 4096, 1e-3)
            sampled += 1
            assert c.run_length(4096, path)[0] > 0
    assert sampled >= 3


@pytest.mark.parametrize("call_ms, most_samples", [(0.25, 1000 * 0.25 / 50 + 1), (5.0, 1000 / 32 + 1)])
def test_samples_come_once_per_sample_seconds_of_calls_and_32_calls(call_ms, most_samples):
    """A steady class is sampled once 32 calls and 50 ms of their predicted time have passed:
    calls of 0.25 ms every 200 calls (timed, one cost 0.2-1.2 ms on the loaded machine), calls
    of 5 ms every 32; and often enough that its ring keeps up (more than half the bound)."""
    c = PathChooser(lambda v: v, agree_every=1 << 20, clock=lambda: 0.0)
    for _ in range(5):
        c.observe("gloo", 4096, call_ms * 1e-3)
        c.observe("inagg", 4096, 4 * call_ms * 1e-3)
    c.agree()
    sampled = 0
    for _ in range(1000):
        path, measure = c.choose(4096)
        if measure:
            c.observe(path, 4096, call_ms * 1e-3 * (4 if path == "inagg" else 1))
            sampled += path == "gloo"
    assert most_samples / 2 < sampled <= most_samples


@pytest.mark.parametrize("call_ms, every", [(24.0, 5), (150.0, 1)])
def test_a_dear_call_is_timed_once_per_100_ms_of_its_class(call_ms, every):
    """Calls from 10 ms up are timed once per 100 ms of their class's predicted time: at 8
    ranks on 2 cores each timed 4 MiB call (24 ms) cost every rank its Python, and timing every
    one made the backend 1.04-1.08x plain gloo there; a 150 ms call is still timed every time."""
    c = PathChooser(lambda v: v, agree_every=1 << 20, clock=lambda: 0.0)
    for _ in range(5):
        c.observe("gloo", 4 << 20, call_ms * 1e-3)
        c.observe("inagg", 4 << 20, 4 * call_ms * 1e-3)
    c.agree()
    timed = []
    for _ in range(100):
        path, measure = c.choose(4 << 20)
        if measure:
            c.observe(path, 4 << 20, call_ms * 1e-3 * (4 if path == "inagg" else 1))
        if path == "gloo" and not c.history()[-1]["explored"]:
            timed.append(measure)
    assert len(timed) // every - 2 <= sum(timed) <= len(timed) // every + 1


def test_a_class_beside_one_timed_on_every_call_is_still_sampled():
    """Each step: one 4 MiB call (12 ms: timed every time) and ten 256 KiB calls (1 ms). The
    256 KiB class is sampled by its own count, every ~50 of its calls (counted from every timed
    call, it never was: the 4 MiB call comes every 11 calls)."""
    c = PathChooser(lambda v: v, agree_every=1 << 20, clock=lambda: 0.0)
    took = {4 << 20: 12e-3, 256 << 10: 1e-3}
    for _ in range(5):
        for nbytes, seconds in took.items():
            c.observe("gloo", nbytes, seconds)
            c.observe("inagg", nbytes, 3 * seconds)
    c.agree()
    sampled = 0
    for _ in range(300):
        for nbytes in [4 << 20] + [256 << 10] * 10:
            path, measure = c.choose(nbytes)
            if measure:
                c.observe(path, nbytes, took[nbytes] * (3 if path == "inagg" else 1))
                sampled += nbytes == 256 << 10 and path == "gloo"
    assert 3000 / 60 <= sampled <= 3000 / 50 + 1


def test_an_agreement_refits_only_the_paths_whose_figures_changed():
    c = PathChooser(lambda v: v, paths=("inagg", "host", "gloo"), clock=lambda: 0.0)
    for p in c.paths:
        c.observe(p, 4096, 1e-3)
    c.agree()
    before = dict(c.models)
    c.observe("gloo", 4096, 2e-3)
    c.agree()
    assert c.models["inagg"] is before["inagg"] and c.models["host"] is before["host"]
    assert c.models["gloo"] is not before["gloo"] and c.models["gloo"].samples[size_class(4096)] == 2


def test_a_path_taken_on_one_lucky_exploration_is_dropped_after_a_few_calls():
    """The first exploration of inagg comes out 5x faster than gloo, so the next calls take
    inagg; its other calls take 3x gloo's time. The ranks agree again once inagg's ring is full of them,
    gloo is rechecked (inagg's recheck calls first: the calls are on it, no warm-up) and the
    calls go back to gloo within per_class + 3 calls, not at the next scheduled agreement up
    to 128 calls later."""
    c = PathChooser(lambda v: v, agree_every=128, per_class=5)
    for _ in range(3):
        c.observe("gloo", 4096, 1e-3)
        c.observe("inagg", 4096, 1.5e-3)
    c.agree()
    runs, lucky = [], False
    for _ in range(5000):
        path, measure = c.choose(4096)
        first = c.history()[-1]["explored"] and path == "inagg" and not lucky
        lucky |= first
        if measure:
            c.observe(path, 4096, 1e-3 if path == "gloo" else 0.2e-3 if first else 3e-3)
        if runs and runs[-1][0] == path:
            runs[-1][1] += 1
        else:
            runs.append([path, 1])
    assert lucky
    inagg_runs = [n for p, n in runs if p == "inagg"]
    assert max(inagg_runs) > 1                    # the lucky exploration did win calls ...
    assert max(inagg_runs) <= 5 + 3               # ... only until inagg's own calls were agreed on


def _paths_beside_host(c: PathChooser, calls: int, gloo_s: Callable[[int], float],
                       host_s: Callable[[int], float] = lambda k: 1e-3) -> list[str]:
    """``calls`` 256 KiB calls on a host-lane/gloo chooser: each call's path ("explored" for an
    exploration or probe); each path's k-th timed call takes ``gloo_s(k)``, ``host_s(k)``."""
    timed, paths = {"gloo": 0, "host": 0}, []
    for _ in range(calls):
        path, measure = c.choose(256 << 10)
        paths.append("explored" if c.history()[-1]["explored"] else path)
        if measure:
            timed[path] += 1
            c.observe(path, 256 << 10, (gloo_s if path == "gloo" else host_s)(timed[path]))
    return paths


def test_leaving_gloo_on_slow_probes_is_rechecked_at_once():
    """gloo's three probes at a new size come out 3 ms (its slow mode on a shared machine),
    its calls take 0.5 ms; the host lane takes 1 ms. The calls move to the host lane, and once
    its ring is full gloo is measured again in a run of its own and the calls go back to it:
    within 4 + 4 + 2 + 8 calls of the size (each path's three probes after an untimed warm-up
    call; the host lane's ring needs two calls beside its probes; the recheck times both paths
    afresh), not at an exploration hundreds of calls later."""
    c = PathChooser(lambda v: v, ("host", "gloo"), agree_every=128, per_class=5)
    paths = _paths_beside_host(c, 300, lambda k: 3e-3 if k <= 3 else 0.5e-3)
    assert "host" in paths[6:]                        # the slow probes did move the calls ...
    assert max(i for i, p in enumerate(paths) if p == "host") < 4 + 4 + 2 + 8   # ... until gloo's
    assert set(paths[18:]) <= {"gloo", "explored"}   # own run was agreed on; explorations aside


def test_gloo_rechecked_slow_is_rechecked_again_soon():
    """As above, but gloo's recheck comes out slow too (its first call after the host lane's
    is slow, and its times are bimodal): the calls stay on the host lane, and gloo is rechecked
    again after 10 more host-lane calls (the recheck's among them; gloo's new times joining the
    last recheck's), so the calls go back within 4 + 4 + 2 + 8 + 6 + 8 + 1 calls, not at the next exploration, priced at
    gloo's slow figure (62 calls here; hundreds at 2 workers / 16 KiB in the sweep)."""
    c = PathChooser(lambda v: v, ("host", "gloo"), agree_every=128, per_class=5, clock=lambda: 0.0)
    paths = _paths_beside_host(c, 300, lambda k: 1.8e-3 if k <= 6 else 0.5e-3)
    host = [i for i, p in enumerate(paths) if p == "host"]
    assert host and 4 + 4 + 2 + 8 < max(host) < 4 + 4 + 2 + 8 + 6 + 8 + 1   # rechecked twice
    assert set(paths[30:]) <= {"gloo", "explored"}


def test_a_recheck_times_the_path_left_for_afresh_too():
    """The host lane's probes come out 0.25 ms and its calls then take 1 ms; gloo takes 0.45
    ms. The calls move to the host lane on its probes; the recheck times both again, and the
    calls go back to gloo (compared with the host lane's first figure, gloo's recheck kept
    them there: 150-300 calls of 2 workers / 16 KiB on the host lane at 2-3x gloo's time)."""
    c = PathChooser(lambda v: v, ("host", "gloo"), agree_every=128, per_class=5, clock=lambda: 0.0)
    paths = _paths_beside_host(c, 200, lambda k: 0.45e-3, lambda k: 0.25e-3 if k <= 3 else 1e-3)
    assert "host" in paths[:10]                       # taken on its probes ...
    assert "host" not in paths[4 + 4 + 2 + 8:]       # ... until the recheck (explorations aside)


def test_back_on_gloo_on_a_fast_recheck_its_own_calls_confirm_it():
    """gloo's link is throttled (20 ms calls) but its token bucket, full after a while unused,
    lets its three recheck calls through at 0.5 ms: the calls go back to gloo, and its own
    next calls, timed until its ring is full, send them to the host lane (1 ms) again within a
    few calls, not at the next scheduled agreement (7 s of 180 ms steps in the emulation)."""
    c = PathChooser(lambda v: v, ("host", "gloo"), agree_every=128, per_class=5, clock=lambda: 0.0)
    for _ in range(300):   # another size first: the early scheduled agreements (calls 16, 32, 64) pass
        path, measure = c.choose(64)
        if measure:
            c.observe(path, 64, 1e-4)
    paths = _paths_beside_host(c, 200, lambda k: 0.5e-3 if 3 < k <= 6 else 20e-3)   # the recheck's three fast
    back = paths.index("gloo", 4 + 4 + 2)            # probes, the host lane's ring, the recheck
    assert back < 4 + 4 + 2 + 8 + 1                   # the fast recheck took the calls back ...
    assert max(i for i, p in enumerate(paths) if p == "gloo") < back + 2 + 5 + 2   # ... briefly
    assert set(paths[30:]) <= {"host", "explored"}


def test_a_path_retimed_after_one_slow_call_stays_eligible_through_another_agreement():
    """A 256 KiB class on inagg (20 ms; gloo's link throttled, 150 ms) has one 45 ms call: the
    agreement that sees it re-times the class on inagg. Another agreement before inagg's next
    calls come in (another class's exploration brings one) still finds inagg measured there and
    keeps the class on it; with all its times dropped, inagg was unmeasured there, so not
    eligible, and the class went back to gloo (14 s on the throttled link in the emulation)."""
    nbytes = 256 << 10
    c = PathChooser(lambda v: v, ("inagg", "gloo"), agree_every=128, per_class=5)
    for _ in range(5):
        c.observe("gloo", nbytes, 0.15)
        c.observe("inagg", nbytes, 0.02)
    c.agree()
    for _ in range(12):   # the class left gloo: inagg's calls, then gloo's re-check, agreed
        path, measure = c.choose(nbytes)
        if measure:
            c.observe(path, nbytes, 0.02 if path == "inagg" else 0.15)
    path, measure = c.choose(nbytes)
    for _ in range(5):   # one call per 100 ms of the class's calls is timed: one in five
        if measure:
            break
        assert path == "inagg"
        path, measure = c.choose(nbytes)
    assert (path, measure) == ("inagg", True)
    c.observe(path, nbytes, 0.045)
    c.agree()   # sees the slow call: inagg's older times go
    c.agree()   # another agreement before inagg's next call
    assert c.best(nbytes) == "inagg"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.one_of(st.floats(1e-6, 10.0), st.just(np.inf)), min_size=5, max_size=5),
                min_size=1, max_size=24))
def test_row_medians_are_each_rows_median_over_its_seen_calls(rows):
    from inagg.hostlib.pytorch.path.choice import row_medians

    ring = np.array(rows)
    expected = [np.median(r[np.isfinite(r)]) if np.isfinite(r).any() else np.inf for r in ring]
    assert row_medians(ring).tolist() == expected


def test_a_path_that_got_slower_is_left_within_one_agreement_period():
    """The bandwidth-flip run's steps: 256 KiB, 64 KiB and 4 B per step, gloo faster until its
    link is throttled (40x slower), inagg unchanged. The first slow sample of the 256 KiB class
    (once 32 calls have passed since the last sample and 50 ms of the class's predicted calls,
    10 of 5 ms, since its own: every 11 steps) is seen at the next scheduled agreement (every
    128 calls, 43 steps), the class's next 5 calls are all timed, then the ranks agree again:
    the calls leave gloo within 11 + 43 + 5 + 1 steps of the throttle, whenever it comes.
    Sampled 1 in 32 calls whatever their class, the 256 KiB class had every third sample: up to
    66 steps. Before that, the median waited for three slow samples: 102-153 steps."""
    def took(path: str, nbytes: int, throttled: bool) -> float:
        if path == "gloo":
            return (0.2 if throttled else 0.005) * nbytes / (256 << 10) + 1e-4
        return 0.03 * nbytes / (256 << 10) + 1e-3

    def steps_to_leave_gloo(throttle_at: int) -> int:
        # the agreements' own work on a clock that stands still: on the real one a loaded
        # machine's slow agreement spaces them out (agree_seconds), which is not this test's topic
        c = PathChooser(lambda v: v, ("inagg", "gloo"), agree_every=128, clock=lambda: 0.0)
        for step in range(throttle_at + 1000):
            for nbytes in (256 << 10, 64 << 10, 4):
                path, measure = c.choose(nbytes)
                if measure:
                    c.observe(path, nbytes, took(path, nbytes, step >= throttle_at))
                chosen = path == "inagg" and not c.history()[-1]["explored"]
                if nbytes == 256 << 10 and step >= throttle_at and chosen:
                    return step - throttle_at
        raise AssertionError("the calls never left the throttled path")

    steps = [steps_to_leave_gloo(t) for t in range(1000, 1100, 7)]
    assert max(steps) <= 11 + 43 + 5 + 1, steps


def test_hook_failure_reaches_ddp_as_the_library_error_not_a_cast_error():
    """A failed AR-Topk step completes every bucket's future with InaggHookError (before: the
    exception object was the future's value and DDP's reducer said 'Unable to cast ... to Tensor')."""
    import torch

    from inagg.hostlib.pytorch.hooks import ARTopkHookState, _failing_as

    raw = torch.futures.Future()
    fut = _failing_as("artopk_hook", ARTopkHookState(), raw)
    raw.set_result(ValueError("allreduce tensors differ across ranks"))
    with pytest.raises(RuntimeError, match="InaggHookError: artopk_hook \\(no inagg job\\): ValueError: allreduce tensors differ"):
        fut.wait()


NAN_STEP = """
import json, sys, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from inagg.hostlib.pytorch.hooks import InaggHookState, inagg_hook
dist.init_process_group("inagg")
ddp = DDP(torch.nn.Linear(8, 2))
ddp.register_comm_hook(InaggHookState(process_group=None), inagg_hook)
x = torch.ones(4, 8)
if dist.get_rank() == 1:
    x[0, 0] = float("nan")
try:
    ddp(x).sum().backward()
    outcome = ["no error", ""]
except Exception as e:
    outcome = [type(e).__name__, str(e)]
with open(f"{sys.argv[1]}.{dist.get_rank()}", "w") as f:
    json.dump(outcome, f)
dist.destroy_process_group()
"""


def test_a_failed_hook_step_reaches_every_rank_as_the_library_error(tmp_path):
    """Through DDP's reducer, for real: one rank's NaN gradient fails the inagg hook's allreduce,
    and every rank's backward raises with InaggHookError naming the hook, the job and the rank
    (before: "Unable to cast ... to Tensor")."""
    script = tmp_path / "nan_step.py"
    script.write_text(NAN_STEP)
    env = {k: v for k, v in os.environ.items() if not k.startswith("INAGG_")}
    proc = subprocess.run([str(BIN / "torchrun"), "--standalone", "--nproc_per_node=2", str(script),
                           str(tmp_path / "outcome")], cwd=ROOT, env={**env, "INAGG_ALLREDUCE_PATH": "inagg"},
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-6000:]
    for rank in (0, 1):
        kind, message = json.loads((tmp_path / f"outcome.{rank}").read_text())
        assert kind == "RuntimeError" and "InaggHookError: inagg_hook (job " in message, message
        assert f" rank {rank}): " in message and "FloatingPointError" in message, message


def test_artopk_state_checkpoints_residual_and_settings():
    """torch.save/torch.load of the hook state, as with PowerSGD's: the restored state goes on
    exactly as the original (same residual, same updates)."""
    import io

    import torch

    from inagg.hostlib.worker.artopk import ARTopk
    from inagg.hostlib.pytorch.hooks import ARTopkHookState

    rng = np.random.default_rng(0)
    grads = [rng.standard_normal(1000).astype(np.float32) for _ in range(4)]
    state = ARTopkHookState(cr=0.05, selection="star", dense_iterations=3, iteration=7,
                            _layout=((0, 1000),))
    state.artopk = ARTopk(0, 1, lambda x: x, cr=0.05)       # one rank: the sum is the input
    for g in grads[:2]:
        state.artopk.step(g)
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert (loaded.cr, loaded.selection, loaded.dense_iterations, loaded.iteration, loaded._layout) == \
        (0.05, "star", 3, 7, ((0, 1000),))
    assert loaded.artopk is None and loaded.process_group is None and loaded.comm is None
    restored = loaded.restore_into(ARTopk(0, 1, lambda x: x, cr=0.05))
    np.testing.assert_array_equal(restored.residual, state.artopk.residual)
    assert restored.steps == 2
    for g in grads[2:]:
        np.testing.assert_array_equal(restored.step(g), state.artopk.step(g))


def test_adaptive_artopk_prices_dense_and_sparse_on_the_faster_paths(tmp_path):
    run = torchrun(tmp_path, "adaptive", "--hook", "artopk-adaptive", "--steps", "30")
    assert run["hook_choice"] in ("dense", "artopk")
    assert run["stats"]["path_model"]["agreements"] >= 1
    assert np.mean(run["losses"][-5:]) < np.mean(run["losses"][:5])


def test_artopk_hook_takes_the_inagg_process_group(tmp_path):
    run = torchrun(tmp_path, "artopk", "--hook", "artopk", "--steps", "30", env={"INAGG_ALLREDUCE_PATH": "inagg"})
    # 2 dense warm-up steps (one bucket), then per step the index broadcast (int32) and the
    # values (float32); and the loss metric of every step
    assert run["stats"]["allreduce_paths"]["inagg"] == 2 + 28 * 2 + 30
    assert not any(k.startswith("allreduce") for k in run["stats"]["fallbacks"])
    assert np.mean(run["losses"][-5:]) < np.mean(run["losses"][:5])


def test_host_fallback_is_a_visible_warning_with_its_reason(tmp_path, caplog):
    """Ranks whose address is no switch host run on the host aggregator, and rank 0 says why."""
    import logging

    import torch

    from inagg.bmv2_env.emulation.loopback import LoopbackDeployment
    from inagg.hostlib.worker.communicator import Communicator

    store = dist.FileStore(str(tmp_path / "store"), 2)
    comms = [None, None]
    with LoopbackDeployment(2) as dep, caplog.at_level(logging.INFO, logger="inagg"):
        def join(r):
            comms[r] = Communicator(store, r, 2, dep.controller, bind_ip="127.0.0.1")

        threads = [threading.Thread(target=join, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        try:
            futs = [c.allreduce_async(torch.ones(10)) for c in comms]
            assert all(f.wait().tolist() == [2.0] * 10 for f in futs)
            assert [c.grant.mode for c in comms] == ["host", "host"]
        finally:
            for c in comms:
                c.close()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and r.name == "inagg.communicator"]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
    assert "rank 0: aggregating on the host aggregator" in warnings[0].getMessage()
    assert "worker address(es) 127.0.0.1 are not hosts of any switch" in warnings[0].getMessage()


@pytest.mark.parametrize("command", ["inagg", "inagg-aggregator", "inagg-demo", "inagg-allreduce-demo",
                                     "inagg-soft-switch", "inagg-controller", "inaggctl",
                                     "inagg-tofino-ports"])
def test_every_command_tells_its_version(command):
    from inagg.hostlib import __version__

    out = subprocess.run([str(BIN / command), "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == f"{command} (inagg) {__version__}", out


def test_the_commented_example_controller_config_loads():
    from inagg.controller.config import load_config

    config = load_config(ROOT / "examples" / "controller.toml")
    assert config.listen == "0.0.0.0:50051" and config.host_aggregator == "10.0.0.100:42666"
    assert [s.name for s in config.switches] == ["s1"] and config.switches[0].ports == [1, 2, 3, 4]
    assert config.database == str(ROOT / "examples" / "controller.sqlite")
    assert config.tls_cert == str(ROOT / "examples" / "controller.pem") and not config.insecure
    assert config.metrics_listen == "127.0.0.1:9464" and config.switches[0].program.target == "bmv2"


@contextlib.contextmanager
def groups_on(path: str):
    """Two ranks' inagg process groups in one process (a thread each), every eligible call
    pinned to ``path``, on a local deployment of their own."""
    import torch  # noqa: F401 - torch.distributed's Store types need torch loaded

    from inagg.hostlib.pytorch.backend import InaggProcessGroup
    from inagg.hostlib.pytorch.lifecycle import PATH_ENV

    saved = os.environ.get(PATH_ENV)
    os.environ[PATH_ENV] = path
    store = dist.HashStore()
    groups = [None, None]
    try:
        on_ranks(lambda r: groups.__setitem__(r, InaggProcessGroup(store, r, 2, timedelta(seconds=60))), 2, 120)
    finally:
        if saved is None:
            os.environ.pop(PATH_ENV)
        else:
            os.environ[PATH_ENV] = saved
    try:
        yield groups
    finally:
        on_ranks(lambda r: groups[r].shutdown(), 2, 120)


@pytest.fixture(scope="module")
def inagg_groups():
    """Two ranks' groups, every eligible call on the inagg path."""
    with groups_on("inagg") as groups:
        yield groups


@pytest.mark.parametrize("path", ["gloo", "inagg"])
def test_the_backend_keeps_no_callers_tensor_past_its_next_call(path):
    """Before: each path's latest Work was held until the next call, and with it the caller's
    tensor: memory the caller had let go of, freed inside its next call before that was
    submitted. Now a call the chooser handles keeps nothing, and a gloo run (the fast path,
    ``opts`` given as ``dist.all_reduce`` gives them) keeps its latest Work until the next call
    is on the wire."""
    import torch
    import torch.distributed as dist

    def calls(groups, r: int, elements: int) -> list[bool]:
        alive, previous = [], None
        for _ in range(40):   # the gloo path's fast runs included
            x = torch.ones(elements)
            ref = weakref.ref(x)
            groups[r].allreduce([x], dist.AllreduceOptions()).wait()
            del x
            if previous is not None:
                alive.append(not gone(previous))
            previous = ref
            if path == "inagg":
                alive.append(not gone(ref))
        return alive

    def gone(ref: weakref.ref) -> bool:
        deadline = time.monotonic() + 1   # gloo's thread lets go of its Work just after the wake-up
        while ref() is not None and time.monotonic() < deadline:
            time.sleep(1e-3)
        return ref() is None

    with groups_on(path) as groups:
        for elements in (3, 64 << 10):
            assert not any(any(a) for a in on_ranks(lambda r: calls(groups, r, elements), 2, 120))


def test_the_gloo_paths_samples_are_timed_inside_its_runs():
    """A gloo run's calls may include samples (``PathChooser.run_length``): the backend times
    them itself, without asking the chooser, and the times reach the chooser's ring of that size
    on both ranks alike; the run's calls and samples are counted as asking would have."""
    import torch
    import torch.distributed as dist

    from inagg.hostlib.pytorch.path.choice import size_class

    def calls(groups, r: int) -> tuple[int, int]:
        pg = groups[r]
        pg.ready()   # the paths start in the background
        before = pg.lifecycle.paths.timings["gloo"].measured(size_class(4))
        samples = 0
        for _ in range(1500):
            opts = dist.AllreduceOptions()
            if pg.dispatch._run_left and pg.dispatch._to_sample == 1:
                samples += 1
            pg.allreduce([torch.ones(1)], opts).wait()
        pg.allreduce([torch.ones(1)], dist.AllreduceOptions()).wait()   # ends the last run
        return samples, pg.lifecycle.paths.timings["gloo"].measured(size_class(4)) - before

    with groups_on("gloo") as groups:
        (samples0, timed0), (samples1, timed1) = on_ranks(lambda r: calls(groups, r), 2, 120)
        assert samples0 == samples1 >= 2 and timed0 >= samples0 and timed1 >= samples1
        assert groups[0].lifecycle.paths.calls == groups[1].lifecycle.paths.calls
        assert groups[0].stats()["allreduce_paths"]["gloo"] >= 1501


def test_a_sparse_allreduce_in_a_gloo_run_goes_to_gloo():
    """A sparse tensor (no ``nbytes``: asking raises) between a gloo run's dense calls is summed by
    gloo, and the run goes on after it."""
    import torch
    import torch.distributed as dist

    def calls(groups, r: int) -> tuple[bool, torch.Tensor, float]:
        pg = groups[r]
        pg.ready()
        for _ in range(200):   # until a run begins: at the same call on both ranks (the same choices)
            pg.allreduce([torch.ones(1)], dist.AllreduceOptions()).wait()
            if pg.dispatch._run_left > 1:
                break
        in_run = bool(pg.dispatch._run_left)
        sparse = torch.sparse_coo_tensor([[r]], [1.0 + r], (2,))
        pg.allreduce([sparse], dist.AllreduceOptions()).wait()
        dense = torch.ones(1)
        pg.allreduce([dense], dist.AllreduceOptions()).wait()
        return in_run, sparse.to_dense(), dense.item()

    with groups_on("gloo") as groups:
        for in_run, sparse, dense in on_ranks(lambda r: calls(groups, r), 2, 120):
            assert in_run and sparse.tolist() == [1.0, 2.0] and dense == 2.0


def test_a_receive_from_any_source_names_its_sender():
    """``dist.recv`` without a source asks the Work which rank sent (``_source_rank``): gloo's
    Work knows, and the backend's Work around it says so."""
    import torch

    def exchange(groups, r: int) -> int | None:
        pg = groups[r]
        if r == 1:
            pg.send([torch.full((4,), 1.0)], 0, 0).wait()
            return None
        got = torch.zeros(4)
        work = pg.recv_anysource([got], 0)
        work.wait()
        assert got.tolist() == [1.0] * 4
        return work._source_rank()

    with groups_on("gloo") as groups:
        assert on_ranks(lambda r: exchange(groups, r), 2, 120)[0] == 1


@pytest.mark.parametrize("elements", [3, 64 << 10])   # run on the caller's thread; queued
def test_a_failed_inagg_call_raises_on_every_rank_from_wait_and_future(inagg_groups, elements):
    """Before: wait() on a failed inagg call returned True (torch's future-wrapping Work), so
    dist.all_reduce returned as if the call had succeeded. ``wait`` raises the call's own error;
    the future is failed as torch's C++ reads it (DDP's reducer does), so its error is torch's
    RuntimeError carrying the call's error's type and text (as a gloo Work's future's)."""
    import torch

    def poisoned(r: int) -> torch.Tensor:
        return torch.full((elements,), float("inf") if r == 0 else 1.0)

    errors = on_ranks(lambda r: inagg_groups[r].allreduce([poisoned(r)]).wait(), 2, 120, return_errors=True)
    assert all(isinstance(e, FloatingPointError) and "inf/NaN" in str(e) for e in errors), errors
    errors = on_ranks(lambda r: inagg_groups[r].allreduce([poisoned(r)]).get_future().wait(), 2, 120,
                      return_errors=True)
    assert all(isinstance(e, RuntimeError) and "FloatingPointError" in str(e) and "inf/NaN" in str(e)
               for e in errors), errors
    # the calls after it are exact
    out = on_ranks(lambda r: inagg_groups[r].allreduce([torch.full((elements,), r + 1.0)]).get_future().wait(), 2, 120)
    assert all(t[0].eq(3.0).all() for t in out)


def test_a_callback_on_an_inagg_call_may_make_another_call(inagg_groups):
    """As PowerSGD's hook does: a small call is complete when allreduce returns, so its callback
    runs at once on the caller's thread; a large one's runs on a thread of its own (or the
    caller's, where it ended first), never on the communicator's I/O thread (where waiting for
    another call would wait for itself)."""
    import torch

    def nested(r: int, elements: int) -> tuple[bool, str, list[float]]:
        work = inagg_groups[r].allreduce([torch.full((elements,), 1.0)])
        completed = work.is_completed()

        def then(f: torch.futures.Future) -> tuple[str, list[float]]:
            inner = torch.full((2,), f.value()[0][0].item() + r)
            inagg_groups[r].allreduce([inner]).wait()
            return threading.current_thread().name, inner.tolist()

        thread, values = work.get_future().then(then).wait()
        return completed, thread, values

    small = on_ranks(lambda r: (nested(r, 3), threading.current_thread().name), 2, 120)
    assert all(done and thread == caller and values == [5.0, 5.0] for (done, thread, values), caller in small)
    # a large call's callback: on its own thread, or on the caller's where the call had ended
    # before the callback was attached (torch then runs it at once); never on inagg-io
    large = on_ranks(lambda r: (nested(r, 64 << 10), threading.current_thread().name), 2, 120)
    assert all(thread in ("inagg-complete", caller) and values == [5.0, 5.0]
               for (_, thread, values), caller in large)


@pytest.mark.parametrize("path", ["gloo", "inagg"])
def test_a_non_contiguous_tensor_on_one_rank_meets_the_others_calls(path):
    """Contiguity is one rank's layout: rank 1's transposed tensor (an allreduce, inside a gloo
    run and out of one) and its strided reduce-scatter output take the same path as rank 0's
    contiguous ones, through a contiguous copy, and every sum lands in the caller's tensor.
    Before, rank 1 went to gloo alone and both ranks waited for each other's call."""
    import torch
    import torch.distributed as dist

    def calls(groups, r: int) -> tuple[list[float], list[float], list[float]]:
        pg = groups[r]
        for _ in range(40):   # a gloo run, on the gloo path
            pg.allreduce([torch.ones(6)], dist.AllreduceOptions()).wait()
        x = torch.arange(6.0).view(2, 3) + r
        t = x.t() if r == 1 else x.t().contiguous()
        pg.allreduce([t], dist.AllreduceOptions()).wait()
        small = torch.arange(3.0) if r == 0 else torch.arange(6.0).view(3, 2)[:, 0]
        pg.allreduce([small], dist.AllreduceOptions()).get_future().wait()
        out = torch.zeros(4) if r == 0 else torch.zeros(8)[::2]
        pg._reduce_scatter_base(out, torch.arange(8.0) + r, dist.ReduceScatterOptions()).wait()
        return t.flatten().tolist(), small.tolist(), out.tolist()

    with groups_on(path) as groups:
        results = on_ranks(lambda r: calls(groups, r), 2, 120)
    transposed = (2 * torch.arange(6.0).view(2, 3) + 1).t().flatten().tolist()
    assert [t for t, _, _ in results] == [transposed, transposed]
    assert [s for _, s, _ in results] == [[0.0, 3.0, 6.0]] * 2
    assert [o for _, _, o in results] == [[1.0, 3.0, 5.0, 7.0], [9.0, 11.0, 13.0, 15.0]]
def test_a_tiny_call_on_one_host_asks_no_chooser_and_is_done_when_it_returns():
    """A job on one host, no path pinned: calls of up to ``TINY_BYTES`` (every eligible dtype and
    op) take the host-local reduce on the caller's thread (done when ``allreduce`` returns: no
    thread hop), with no chooser call, agreement (a store round trip) or calibration; the first
    larger call calibrates, and asks the chooser."""
    from inagg.hostlib.pytorch.path.options import TINY_BYTES

    cases = [(torch.float32, dist.ReduceOp.SUM, TINY_BYTES // 4), (torch.float32, dist.ReduceOp.AVG, 1),
             (torch.bfloat16, dist.ReduceOp.SUM, 5), (torch.int32, dist.ReduceOp.SUM, 3)]

    def calls(groups, r: int) -> tuple:
        pg = groups[r]
        done, values = [], []
        for dtype, op, n in cases:
            x = torch.full((n,), float(r + 1)).to(dtype)
            opts = dist.AllreduceOptions()
            opts.reduceOp = op
            work = pg.allreduce([x], opts)
            done.append(work.is_completed())
            work.wait()
            values.append(x.float().unique().tolist())
        paths = pg.lifecycle.paths
        before = (paths.calls, paths.agreements, pg.stats()["path_model"]["agreed"]["inagg"]["measured_s"])
        pg.allreduce([torch.ones(TINY_BYTES // 4 + 1)], dist.AllreduceOptions()).wait()
        after = (paths.calls, pg.stats()["path_model"]["agreed"]["inagg"]["measured_s"])
        return done, values, before, after, pg.stats()["allreduce_paths"]

    with groups_on("auto") as groups:
        for done, values, before, after, by_path in on_ranks(lambda r: calls(groups, r), 2, 120):
            assert all(done) and values == [[3.0], [1.5], [3.0], [3.0]]
            assert before == (0, 0, {})
            assert after[0] == 1 and after[1]   # calibrated at the first larger call
            assert by_path["inagg"] >= len(cases) and sum(by_path.values()) == len(cases) + 1

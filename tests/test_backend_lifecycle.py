"""The ``inagg`` backend's start, Ctrl-C and rank deaths, against gloo's on the same machine, with
real rank processes (tests/backend_rank.py): ``init_process_group("inagg")`` within 0.5 s of
gloo's; a Ctrl-C to the whole torchrun process group stops everything within 2 s of gloo's stop,
with one line of inagg's and nothing left behind; a rank SIGKILLed during a call on any path,
rank 0 included, is named on every other rank within 10 s, and ``destroy_process_group`` then
takes under 2 s. Bounds in seconds are for an idle machine: each is stretched by how many times
over its CPUs the machine is loaded (``_load_factor``), the ratio, not the requirement, giving.
The peer watch and the SIGINT handler are tested on their own too."""

from __future__ import annotations

import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch._jit_internal import _extract_tensors

from inagg.hostlib.pytorch import interrupts
from inagg.hostlib.pytorch.backend import InaggProcessGroup
from inagg.hostlib.pytorch.peer_watch import EXIT, LEAVE, PeerWatch
from inagg.hostlib.pytorch.roll_call import RollCall
from inagg.hostlib.worker.host_group import RankDied
from rank_fork import RankProcess
from test_training import on_ranks

ROOT = Path(__file__).resolve().parents[1]
RANK = ROOT / "tests" / "backend_rank.py"
TORCHRUN = Path(sys.executable).parent / "torchrun"


def _load_factor() -> float:
    """How many times over its CPUs this machine runs now (1 when it is not): timings stretch so."""
    return max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INAGG_")}
    return env | extra


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- start-up ------------------------------------------------------------------------------------

def _startup(backend: str) -> tuple[float, list[str]]:
    """``init_process_group(backend)``'s time under torchrun, 2 ranks (the slower rank's), and
    each rank's ``loaded`` line after its first allreduce (tests/backend_rank.py)."""
    proc = subprocess.run([str(TORCHRUN), "--standalone", "--nproc_per_node=2", str(RANK), backend, "startup"],
                          cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    times = [float(t) for t in re.findall(r"init (\d+\.\d{3})", proc.stdout)]   # the ranks' lines may interleave
    assert len(times) == 2, proc.stdout
    return max(times), re.findall(r"loaded \[([\w.,]*)\]", proc.stdout)


def _init_seconds(backend: str) -> float:
    """``init_process_group(backend)``'s time under torchrun, 2 ranks: the slower rank's."""
    return _startup(backend)[0]


def test_init_process_group_is_within_half_a_second_of_gloos():
    gloo, inagg = [], []
    for _ in range(3):   # interleaved: both see the same load
        gloo.append(_init_seconds("gloo"))
        inagg.append(_init_seconds("inagg"))
    over = statistics.median(inagg) - statistics.median(gloo)
    bound = 0.5 * _load_factor()
    assert over <= bound, f"inagg {inagg} vs gloo {gloo}: {over:.2f}s over gloo's (bound {bound:.2f}s)"


def test_a_job_on_one_host_imports_no_switch_communicator_nor_grpc():
    """Ranks on one host with no controller named reduce through shared memory and the
    fixed-point gloo path: neither their start nor their first allreduce imports the switch's
    communicator or the controller's gRPC client (``GroupLifecycle._join`` imports them where a
    job joins a controller), so they cost the start-up nothing."""
    _, loaded = _startup("inagg")
    assert loaded == ["", ""]


# -- Ctrl-C --------------------------------------------------------------------------------------

def _processes_with(variable: str) -> list[str]:
    """The command lines of the processes whose environment holds ``variable`` (NAME=value)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if variable.encode() in (proc / "environ").read_bytes().split(b"\0"):
                found.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            continue
    return found


def _interrupted_training(backend: str, tmp: Path, **env: str) -> tuple[float, str]:
    """Train under torchrun (2 ranks, ``TMPDIR=tmp``, ``env`` added) until rank 0's 20th step,
    then SIGINT the whole torchrun process group, as a terminal's Ctrl-C does: the seconds to
    its end, its output."""
    tmp.mkdir()
    proc = subprocess.Popen([str(TORCHRUN), "--standalone", "--nproc_per_node=2", str(RANK), backend, "train"],
                            cwd=ROOT, env=_env(TMPDIR=str(tmp), **env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("step 20"):
                break
        assert proc.poll() is None, "".join(lines)[-4000:]
        os.killpg(proc.pid, signal.SIGINT)
        interrupted = time.monotonic()
        lines.append(proc.stdout.read())
        proc.wait(120)
        return time.monotonic() - interrupted, "".join(lines)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_ctrl_c_stops_everything_within_2_s_of_gloos_stop_with_one_line(tmp_path):
    gloo, _ = _interrupted_training("gloo", tmp_path / "gloo")
    # every rank a switch worker: the ranks share a host, and would otherwise start no deployment
    took, output = _interrupted_training("inagg", tmp_path / "inagg", INAGG_HOST_REDUCE="off")
    bound = 2.0 * _load_factor()
    assert took - gloo <= bound, f"{took:.2f}s after SIGINT, gloo {gloo:.2f}s (bound {bound:.2f}s over):\n{output[-4000:]}"
    ours = [line for line in output.splitlines() if line.startswith("inagg")]
    assert len(ours) == 1 and "interrupted" in ours[0] and "local deployment stopped" in ours[0], output[-4000:]
    for noise in ("terminate called", "Cannot extract tensors", "did not stop", "grant stream", "Exception in thread",
                  "Exception ignored"):
        assert noise not in output, output[-4000:]
    assert not [p.name for p in (tmp_path / "inagg").iterdir() if p.name.startswith("inagg")]
    assert not _processes_with(f"TMPDIR={tmp_path / 'inagg'}"), "the local deployment outlived the job"


# -- a rank killed during a call -----------------------------------------------------------------

def _ranks(n: int, path: str, host_reduce: str = "off") -> list[RankProcess]:
    """``n`` rank processes allreducing on ``path`` (env:// rendezvous, rank 0 holding the store);
    ``host_reduce``: ``INAGG_HOST_REDUCE`` (auto, the default, reduces on the host first).
    Forked (tests/rank_fork.py): what these tests assert starts after the ranks' imports."""
    port = _free_port()
    return [RankProcess([sys.executable, str(RANK), "inagg", "loop", "2000"], cwd=ROOT, text=True,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                        env=_env(RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(n),
                                 MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), INAGG_ALLREDUCE_PATH=path,
                                 INAGG_HOST_REDUCE=host_reduce))
            for r in range(n)]


@pytest.mark.parametrize("path", ["inagg", "host", "gloo"])
@pytest.mark.parametrize("victim", [1, 0])
def test_a_killed_rank_is_named_within_10_s_and_destroy_takes_under_2_s(path, victim):
    procs = _ranks(3, path)
    try:
        for p in procs:
            lines = [p.stdout.readline().strip() for _ in range(2)]
            assert lines == ["init", "ready"], p.stderr.read()[-4000:] if p.poll() is not None else lines
        time.sleep(0.5)   # calls running on every rank
        procs[victim].kill()
        _assert_named_and_destroyed(procs, victim, time.time())
    finally:
        _end(procs)


@pytest.mark.parametrize("victim", [1, 0])
def test_a_rank_killed_right_after_init_is_named_and_no_survivor_is_left_starting(victim):
    """Killed while the paths still start in the background (``init_process_group`` returned,
    the deployment and the joins not done): each survivor's first call raises naming it, its
    destroy is as quick, and its start gives up instead of waiting for the dead rank (at the
    program's end such a wait aborts the process: "terminate called without an active exception")."""
    procs = _ranks(3, "auto")
    try:
        line = procs[victim].stdout.readline().strip()
        assert line == "init", procs[victim].stderr.read()[-4000:] if procs[victim].poll() is not None else line
        procs[victim].kill()
        killed = time.time()
        _assert_named_and_destroyed(procs, victim, killed)
        for rank, p in enumerate(procs):
            assert rank == victim or p.returncode == 1, (rank, p.returncode)   # loop's own exit status
    finally:
        _end(procs)


@pytest.mark.parametrize("collective", ["broadcast", "allreduce"])
def test_a_rank_dead_before_a_gloo_groups_first_call_is_named_by_that_call(collective):
    """The inner gloo group (a broadcast) and the fixed-point path's (a 64 KiB allreduce: the
    chooser's calibration) are made at their first call; a rank that died before it is named by
    that call on every survivor, within 10 s, as any call names it: the ranks meet in the store
    first, in a wait that ends with the peer watch's word, not in gloo's rendezvous, which would
    wait for the dead rank until the store's timeout."""
    port, victim = _free_port(), 1
    procs = [RankProcess([sys.executable, str(RANK), "inagg", "after", collective], cwd=ROOT, text=True,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=_env(RANK=str(r), WORLD_SIZE="3", LOCAL_RANK=str(r), LOCAL_WORLD_SIZE="3",
                                  MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))
             for r in range(3)]
    try:
        for p in procs:
            line = p.stdout.readline().strip()
            assert line == "init", p.stderr.read()[-4000:] if p.poll() is not None else line
        procs[victim].kill()
        procs[victim].wait()
        killed = time.time()
        for rank, p in enumerate(procs):
            if rank != victim:
                p.stdin.write("go\n")
                p.stdin.flush()
        _assert_named_and_destroyed(procs, victim, killed)
    finally:
        _end(procs)


def test_a_one_host_start_is_one_store_round_and_makes_a_gloo_group_only_for_a_call_that_needs_one():
    """A job on one host writes one key per rank in its start, beside the launch's claim (the
    roll call: ``inagg.hostlib.pytorch.roll_call``), and its tiny allreduces write none: no
    gloo group is made (each is a rendezvous of its own in the store) until a call needs one,
    a broadcast here, which then runs."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
    # a client each, as each rank's process has (one client serves one call at a time)
    clients = [dist.TCPStore("127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=60)) for _ in range(2)]
    groups = on_ranks(lambda r: InaggProcessGroup(clients[r], r, 2, timedelta(seconds=60)), 2)
    try:
        assert store.num_keys() == 2 + 1
        tensors = [torch.full((4,), float(r + 1)) for r in range(2)]
        on_ranks(lambda r: groups[r].allreduce([tensors[r]]).wait(), 2)
        assert [t.tolist() for t in tensors] == [[3.0] * 4] * 2
        assert store.num_keys() == 2 + 1
        on_ranks(lambda r: groups[r].broadcast([tensors[r].fill_(r + 5)], dist.BroadcastOptions()).wait(), 2)
        assert [t.tolist() for t in tensors] == [[5.0] * 4] * 2
        assert store.num_keys() > 2 + 1
    finally:
        on_ranks(lambda r: groups[r].shutdown(), 2)


def _tcp_sockets() -> set[str]:
    """This process's TCP sockets (/proc: the inodes of its sockets in this network namespace's
    TCP tables)."""
    inodes = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    tcp = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            tcp |= {line.split()[9] for line in f.read().splitlines()[1:]}
    return inodes & tcp


def test_a_one_host_starts_peer_watch_rides_its_host_star_with_no_tcp_connection():
    """Counted, not timed: a job on one host connects its host group's star once (one link per
    rank beside rank 0, the host's leader) and its peer watch rides it (each hello passed the
    watch's connection: ``RollCall.peer_watch``), so its start leaves no TCP socket open, where
    the peer watch's TCP star held one on each end of each rank's connection to rank 0; a rank's
    end is still named on the others (``test_a_killed_rank_is_named...``, the ``_watches`` tests)."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
    clients = [dist.TCPStore("127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=60)) for _ in range(3)]
    before = _tcp_sockets()
    groups = on_ranks(lambda r: InaggProcessGroup(clients[r], r, 3, timedelta(seconds=60)), 3)
    try:
        assert not _tcp_sockets() - before   # (an earlier test's may have closed meanwhile)
        assert [len(g.lifecycle.host.links) for g in groups] == [2, 1, 1]
        assert [sorted(g.lifecycle.peers._socks) for g in groups] == [[1, 2], [0], [0]]
        assert {s.family for g in groups for s in g.lifecycle.peers._socks.values()} == {socket.AF_UNIX}
        tensors = [torch.full((4,), float(r + 1)) for r in range(3)]
        on_ranks(lambda r: groups[r].allreduce([tensors[r]]).wait(), 3)
        assert [t.tolist() for t in tensors] == [[6.0] * 4] * 3
    finally:
        on_ranks(lambda r: groups[r].shutdown(), 3)


def test_a_collective_only_one_rank_calls_times_out_as_gloos_would():
    """Rank 0 alone calls a barrier (torch's test_barrier_timeout_global): its gloo group is made
    at that call, and its wait for the other rank ends by the group's timeout with an error that
    says "Timed out", as gloo's barrier's would, not at the store's own timeout."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
    clients = [dist.TCPStore("127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=60)) for _ in range(2)]
    groups = on_ranks(lambda r: InaggProcessGroup(clients[r], r, 2, timedelta(seconds=1)), 2)
    try:
        started = time.monotonic()
        with pytest.raises(RuntimeError, match=" Timed out ") as raised:
            groups[0].barrier(dist.BarrierOptions()).wait()
        assert 1.0 <= time.monotonic() - started < 1.0 + 10.0 * _load_factor()
        assert "ranks [1]" in str(raised.value)
    finally:
        on_ranks(lambda r: groups[r].shutdown(), 2)


# -- a rank stopped during a call ----------------------------------------------------------------

# the peer watch's lease is 8 s (peer_watch.LEASE_SECONDS: named within 10 s on a quiet machine);
# the bound leaves room for a loaded one
_STOPPED_NAMED_WITHIN = 30.0


@pytest.mark.parametrize("path", ["inagg", "auto", "gloo"])
@pytest.mark.parametrize("victim", [1, 0])
def test_a_stopped_rank_is_named_on_the_default_paths(path, victim):
    """A rank SIGSTOPped (alive, its sockets open) while the others allreduce, with the
    defaults (the host-local reduce on one host): every other rank's call raises naming it once
    its lease at the peer watch ran out, on the host-local reduce (``inagg``), the chosen path
    and the gloo path alike. Before, they waited without bound."""
    procs = _ranks(3, path, host_reduce="auto")
    try:
        for p in procs:
            lines = [p.stdout.readline().strip() for _ in range(2)]
            assert lines == ["init", "ready"], p.stderr.read()[-4000:] if p.poll() is not None else lines
        time.sleep(0.5)   # calls running on every rank
        procs[victim].send_signal(signal.SIGSTOP)
        stopped = time.time()
        for rank, p in enumerate(procs):
            if rank == victim:
                continue
            out, err = p.communicate(timeout=_STOPPED_NAMED_WITHIN + 60)   # it raised, destroyed and ended
            line = next((line for line in out.splitlines() if line.startswith("error ")), "")
            assert f"rank {victim} " in line and "stopped responding" in line, (rank, line, err[-3000:])
            assert float(line.split()[1]) - stopped < _STOPPED_NAMED_WITHIN, (rank, line)
            assert "destroyed " in out, (rank, out)
    finally:
        procs[victim].send_signal(signal.SIGCONT)
        _end(procs)


# a few in CI; INAGG_KILL_TRIALS=20 for the count
_KILL_TRIALS = int(os.environ.get("INAGG_KILL_TRIALS", "3"))


def _ddp_ranks(n: int, victim: int, step: int, how: str = "kill") -> list[RankProcess]:
    """``n`` DDP ranks (defaults: the host-local reduce, the path chosen), ``victim`` SIGKILLing
    (``how``: stop, SIGSTOPping) itself in its backward pass of ``step`` (tests/backend_rank.py
    ``ddp``); env:// as torchrun's; forked (tests/rank_fork.py)."""
    port = _free_port()
    return [RankProcess([sys.executable, str(RANK), "inagg", "ddp", str(victim), str(step), how], cwd=ROOT,
                        text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                        env=_env(RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(n),
                                 MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))
            for r in range(n)]


@pytest.mark.parametrize("trial", range(_KILL_TRIALS))
def test_a_rank_killed_in_ddp_backward_is_an_error_naming_it_on_every_survivor_never_a_crash(trial):
    """A rank SIGKILLed while DDP's bucket allreduces are in flight: every survivor's
    ``backward`` raises (torch's reducer carries the error as a RuntimeError whose text is
    ``RankDied: rank V (pid P) died ...``), it destroys its group and exits by itself: no
    SIGSEGV, no abort. Before, a failed call's future reached DDP's reducer holding the error
    as its value, and every survivor crashed."""
    victim = (1, 0, 2)[trial % 3]
    procs = _ddp_ranks(3, victim, 3 + trial % 4)
    try:
        for rank, p in enumerate(procs):
            out, err = p.communicate(timeout=240)
            if rank == victim:
                assert p.returncode == -signal.SIGKILL, (rank, p.returncode, err[-3000:])
                continue
            assert p.returncode == 1, (rank, p.returncode, out, err[-3000:])   # the mode's own exit status
            error = next((line for line in out.splitlines() if line.startswith("error ")), "")
            assert "RankDied" in error and f"rank {victim} " in error, (rank, victim, error, err[-3000:])
            assert "destroyed " in out, (rank, out)
    finally:
        _end(procs)


def test_a_rank_stopped_in_ddp_backward_is_an_error_naming_it_on_every_survivor():
    """A rank SIGSTOPped in its backward pass (alive, its sockets open): every survivor's
    ``backward`` raises naming it once its lease ran out, and it destroys its group and exits."""
    victim = 1
    procs = _ddp_ranks(3, victim, 4, how="stop")
    try:
        for rank, p in enumerate(procs):
            if rank == victim:
                continue
            out, err = p.communicate(timeout=240)
            assert p.returncode == 1, (rank, p.returncode, out, err[-3000:])
            error = next((line for line in out.splitlines() if line.startswith("error ")), "")
            assert f"RankDied: rank {victim} " in error and "stopped responding" in error, (rank, error)
            assert "destroyed " in out, (rank, out)
    finally:
        procs[victim].send_signal(signal.SIGCONT)
        _end(procs)


def _assert_named_and_destroyed(procs: list[RankProcess], victim: int, killed: float) -> None:
    """Every survivor's call raised naming ``victim`` within 10 s of ``killed`` (time.time()), its
    ``destroy_process_group`` took under 2 s, and it ended without an abort."""
    for rank, p in enumerate(procs):
        if rank == victim:
            continue
        out, err = p.communicate(timeout=120)
        error = next((line for line in out.splitlines() if line.startswith("error ")), "")
        assert error, (rank, out, err[-3000:])
        raised_after = float(error.split()[1]) - killed
        assert raised_after < 10.0 and f"rank {victim} " in error, (rank, error)
        destroyed = float(out.split("destroyed ")[1].split()[0])
        assert destroyed <= 2.0 * _load_factor(), (rank, out)
        assert "terminate called" not in err, (rank, err[-3000:])


def _end(procs: list[RankProcess]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


# -- the peer watch on its own -------------------------------------------------------------------

# the two ways the peer watch's star is connected (``RollCall.peer_watch``): the host group's
# star (one host, reducing there) or rank 0's TCP hub (each rank a worker: as across hosts)
STARS = pytest.mark.parametrize("host_reduce", ["auto", "off"])


def _watches(tmp_path: Path, n: int, host_reduce: str, monkeypatch) -> tuple[list[PeerWatch], list[list[RankDied]]]:
    """``n`` ranks' peer watches, each rank a thread that meets the others as a start does (its
    roll call's one round); ``host_reduce``: ``INAGG_HOST_REDUCE`` (auto: the host group's star
    carries the watch's connections, off: the TCP hub)."""
    monkeypatch.setenv("INAGG_HOST_REDUCE", host_reduce)
    store = dist.FileStore(str(tmp_path / "store"), n)
    told: list[list[RankDied]] = [[] for _ in range(n)]

    def watch(rank: int) -> PeerWatch:
        call = RollCall(store, rank, n, "127.0.0.1")
        try:
            call.read()
            return call.peer_watch(timedelta(seconds=30), told[rank].append)
        finally:
            call.close()

    return on_ranks(watch, n), told


def _end_without_a_word(watch: PeerWatch) -> None:
    """End a watch's connections as a process that dies does: no LEAVE or EXIT first."""
    for sock in watch._socks.values():
        sock.shutdown(socket.SHUT_RDWR)


@STARS
def test_a_rank_that_leaves_fails_no_one_and_one_that_ends_is_named_everywhere(tmp_path, host_reduce, monkeypatch):
    watches, told = _watches(tmp_path, 4, host_reduce, monkeypatch)
    watches[3].close(LEAVE)
    time.sleep(0.3)
    assert told == [[], [], [], []] and watches[0].failure is None
    _end_without_a_word(watches[2])   # relayed to rank 1 by rank 0
    for r in (0, 1):
        gone = watches[r].wait_for_failure(10.0)
        assert gone is not None and gone.rank == 2 and "died" in str(gone), (r, gone)
        assert [e.rank for e in told[r]] == [2]
    watches[1].close(LEAVE)
    started = time.monotonic()
    watches[0].close(LEAVE, wait=30.0)   # every other rank is gone: no wait
    assert time.monotonic() - started < 5.0
    watches[2].close()


@STARS
def test_rank_0_exiting_is_named_on_every_other_rank(tmp_path, host_reduce, monkeypatch):
    watches, told = _watches(tmp_path, 3, host_reduce, monkeypatch)
    watches[0].close(EXIT, wait=0.0)
    for r in (1, 2):
        gone = watches[r].wait_for_failure(10.0)
        assert gone is not None and gone.rank == 0 and "exited" in str(gone), (r, gone)
        assert len(told[r]) == 1
    for w in watches[1:]:
        w.close()


# -- the SIGINT handler on its own ---------------------------------------------------------------

class _InterruptsWhilePickled:
    """Sends this process a SIGINT while torch's tensor extraction pickles it."""

    def __reduce__(self):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)   # the signal is due while the extraction still runs
        return (list, ())


def test_a_ctrl_c_during_torchs_tensor_extraction_comes_after_it_as_a_keyboard_interrupt(monkeypatch):
    monkeypatch.setattr(interrupts, "_state", {"interrupted": False})
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    extracted = []
    try:
        interrupts.install()
        with pytest.raises(KeyboardInterrupt):
            extracted += _extract_tensors([torch.ones(2), _InterruptsWhilePickled()])
            time.sleep(5.0)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert len(extracted) == 1, "the interrupt came inside the extraction"   # it ended, then the interrupt came
    assert interrupts.interrupted()


# -- the Work's future and wait on their own -----------------------------------------------------

def test_a_failed_calls_future_is_failed_in_torchs_terms_so_ddps_reducer_raises_it():
    """``_resolve_to``'s future of a failed call fails in C++ (a ``then`` callback that raises,
    ``setError``), as DDP's reducer reads it: its text names the error. A future completed with
    ``set_exception`` holds the error as its value there, which the reducer took for tensors
    (SIGSEGV)."""
    from inagg.hostlib.pytorch.works import _resolve_to

    for done_first in (True, False):
        fut = torch.futures.Future()
        if done_first:
            fut.set_exception(RankDied(1, "rank 1 (pid 7) died"))
        out = _resolve_to(fut, [torch.ones(2)], lambda e: e)
        if not done_first:
            fut.set_exception(RankDied(1, "rank 1 (pid 7) died"))
        with pytest.raises(RuntimeError, match=r"RankDied: rank 1 \(pid 7\) died") as raised:
            out.wait()
        assert not isinstance(raised.value, RankDied)   # torch's C++ error: what the reducer raises
        ok = torch.futures.Future()
        ok.set_result(None)
        assert _resolve_to(ok, [torch.ones(2)], lambda e: e).wait()[0].tolist() == [1.0, 1.0]


def test_a_calls_wait_ends_by_its_timeout_or_the_groups_failure():
    from inagg.hostlib.pytorch.works import _wait_for

    never = torch.futures.Future()
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="timeout"):
        _wait_for(never, lambda: None, timedelta(seconds=0.3))
    assert 0.3 <= time.monotonic() - started < 30
    with pytest.raises(RankDied, match="rank 2 "):
        _wait_for(never, lambda: RankDied(2, "rank 2 (pid 9) stopped responding"))

"""One emulation run's directory and its record of what it started, so that runs of this and
other checkouts can share a machine and ``make stop`` touches only its own.

Each run gets a short random id and a directory ``<id>/`` in RUNS_DIR (a checkout's
``build/emulation``; installed from a wheel, ``emulation`` in ``inagg up``'s state folder): logs,
pcaps, the controller's socket, config and database, the admin token, and ``run.json``, which
lists every process the run started (PID and kernel start time, so a recycled PID is never
signalled) and every interface it created in the root namespace (named
``<id><switch>-eth<port>``, unique per run) and the user who started it (``current_user``).
``stop_run`` signals exactly those processes and deletes exactly those interfaces; nothing is
found by pattern. ``make stop``/``make clean`` act on the runs of the user who calls them
(``runs_of``), so users sharing a checkout stop only their own.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import signal
import string
import subprocess
import time
from pathlib import Path

from inagg.bmv2_env.emulation.services import default_state_dir

ROOT = Path(__file__).resolve().parents[2]
# where `make run`/`make stop`/`make ctl` look in a checkout; an installed wheel's ROOT is
# site-packages, which is no place for logs and sockets
RUNS_DIR = ROOT / "build" / "emulation" if (ROOT / "pyproject.toml").is_file() else default_state_dir() / "emulation"
MAX_IFNAME = 15          # Linux IFNAMSIZ - 1
RUN_ID_LEN = 4           # a run id's characters: the prefix of its interfaces' names
KEEP_ENV = "INAGG_KEEP_RUNS"   # finished runs kept beside a new one (default 3)
_KEEP_DEFAULT = 3
_ID_CHARS = string.ascii_lowercase + string.digits


def process_start_time(pid: int) -> int | None:
    """The kernel's start time of ``pid`` (clock ticks since boot), or None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def current_user() -> str:
    """Who starts or stops runs: the user behind ``sudo`` (Mininet needs root, so runs are
    started through it), else this process's user (its uid when it has no name)."""
    if os.environ.get("SUDO_USER"):
        return os.environ["SUDO_USER"]
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def root_interfaces() -> set[str]:
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines()}


def new_run_id() -> str:
    """A RUN_ID_LEN-character id no interface on this machine starts with and no run directory has."""
    taken = root_interfaces()
    for _ in range(100):
        rid = secrets.choice(string.ascii_lowercase) + "".join(secrets.choice(_ID_CHARS) for _ in range(RUN_ID_LEN - 1))
        if not (RUNS_DIR / rid).exists() and not any(n.startswith(rid) for n in taken):
            return rid
    raise RuntimeError("no free run id found")


class RunDir:
    """The directory of one run and its ``run.json`` record, saved after every addition."""

    def __init__(self, run_id: str, base: Path = RUNS_DIR) -> None:
        self.run_id = run_id
        self.path = base / run_id
        self.record_path = self.path / "run.json"
        self.pruned: list[str] = []   # finished runs deleted to make room for this one (create)
        self.record: dict = {"run_id": run_id, "user": current_user(), "processes": [], "interfaces": [],
                             "finished": False}
        if self.record_path.exists():
            self.record = json.loads(self.record_path.read_text())

    @classmethod
    def create(cls, base: Path = RUNS_DIR, keep: int | None = None) -> "RunDir":
        """A new run's directory, after the caller's finished runs beyond the newest ``keep``
        are deleted (``prune_finished_runs``); their ids are in the new run's ``pruned``, for
        the launcher to say."""
        pruned = prune_finished_runs(base, keep)
        run = cls(new_run_id(), base)
        run.pruned = pruned
        for sub in ("logs", "pcaps"):
            (run.path / sub).mkdir(parents=True)
        run.add_process(os.getpid(), "launcher")
        latest = base / "latest"
        tmp = base / f".latest-{run.run_id}"
        tmp.symlink_to(run.run_id)
        os.replace(tmp, latest)
        return run

    def interface_name(self, switch: str, port: int) -> str:
        name = f"{self.run_id}{switch}-eth{port}"
        if len(name) > MAX_IFNAME:
            raise ValueError(f"interface name {name} is longer than {MAX_IFNAME} characters: "
                             f"shorten switch name {switch!r}")
        return name

    def save(self) -> None:
        tmp = self.record_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.record, indent=2))
        os.replace(tmp, self.record_path)

    def add_process(self, pid: int, what: str) -> None:
        self.record["processes"].append({"pid": pid, "start": process_start_time(pid), "what": what})
        self.save()

    def add_interfaces(self, names: list[str]) -> None:
        self.record["interfaces"].extend(names)
        self.save()

    def finish(self) -> None:
        self.record["finished"] = True
        self.save()

    def live_processes(self) -> list[dict]:
        """Recorded processes still running (same PID and same start time)."""
        return [p for p in self.record["processes"]
                if p["start"] is not None and process_start_time(p["pid"]) == p["start"]]

    def live_interfaces(self) -> list[str]:
        return sorted(set(self.record["interfaces"]) & root_interfaces())


def _signal_all(procs: list[dict], sig: int) -> None:
    for p in procs:
        try:
            os.kill(p["pid"], sig)
        except ProcessLookupError:
            pass


def _wait_gone(run: RunDir, procs: list[dict], timeout: float) -> list[dict]:
    deadline = time.time() + timeout
    pids = {p["pid"] for p in procs}
    while True:
        left = [p for p in run.live_processes() if p["pid"] in pids]
        if not left or time.time() > deadline:
            return left
        time.sleep(0.1)


def stop_run(run: RunDir, launcher_grace: float = 30.0) -> list[str]:
    """Stop what ``run`` started: its launcher first (it tears its network down itself), then any
    recorded process still alive, then any recorded interface still present. Returns what it did."""
    done = []
    me = os.getpid()
    launcher = [p for p in run.live_processes() if p["what"] == "launcher" and p["pid"] != me]
    if launcher:
        _signal_all(launcher, signal.SIGTERM)
        _wait_gone(run, launcher, launcher_grace)
        done.append(f"launcher {launcher[0]['pid']} stopped")
    rest = [p for p in run.live_processes() if p["pid"] != me]
    if rest:
        # host shells are interactive bash, which ignores SIGTERM: SIGHUP as Mininet does
        _signal_all(rest, signal.SIGTERM)
        _signal_all(rest, signal.SIGHUP)
        _signal_all(_wait_gone(run, rest, 3.0), signal.SIGKILL)
        _wait_gone(run, rest, 3.0)
        done += [f"{p['what']} (pid {p['pid']}) stopped" for p in rest]
    for name in run.live_interfaces():
        subprocess.run(["ip", "link", "del", name], capture_output=True)
        done.append(f"interface {name} deleted")
    run.finish()
    return done


def keep_runs() -> int:
    """How many finished runs a new run leaves in place (``INAGG_KEEP_RUNS``, default 3)."""
    value = os.environ.get(KEEP_ENV, str(_KEEP_DEFAULT))
    try:
        keep = int(value)
    except ValueError:
        keep = -1
    if keep < 0:
        raise ValueError(f"{KEEP_ENV} must be a whole number >= 0, got {value!r}")
    return keep


def prune_finished_runs(base: Path = RUNS_DIR, keep: int | None = None) -> list[str]:
    """Delete the caller's finished runs of this checkout but the ``keep`` newest
    (``keep_runs()`` when None: ``INAGG_KEEP_RUNS``, ``make run KEEP_RUNS=``) and return their
    ids. Every run keeps pcaps of every switch port: a bandwidth-flip run wrote 2-7 GB, and a
    checkout's runs had filled the 252 GB disk, failing the tests that ran next. Other users'
    runs stay (each user's new runs prune their own), and so do unfinished runs (``make stop``
    needs their record of processes and interfaces)."""
    keep = keep_runs() if keep is None else keep
    if keep < 0:
        raise ValueError(f"runs to keep must be a whole number >= 0, got {keep}")
    mine, _ = runs_of(all_runs(base), current_user())
    finished = [(mtime, r.path) for r in mine if r.record.get("finished")
                and (mtime := _record_mtime(r.path)) is not None]
    old = [p for _, p in sorted(finished, reverse=True)[keep:]]
    for path in old:
        shutil.rmtree(path, ignore_errors=True)
    return [p.name for p in old]


def _record_mtime(path: Path) -> float | None:
    """When a run's record was last saved; None where the run is gone (a run started beside
    this one pruned it meanwhile)."""
    try:
        return (path / "run.json").stat().st_mtime
    except FileNotFoundError:
        return None


def all_runs(base: Path = RUNS_DIR) -> list[RunDir]:
    """This checkout's runs (directories with a record), by id."""
    if not base.exists():
        return []
    runs = []
    for p in sorted(base.iterdir()):
        if p.is_dir() and not p.is_symlink() and (p / "run.json").exists():
            try:
                runs.append(RunDir(p.name, base))
            except FileNotFoundError:   # pruned by a run started beside this one meanwhile
                continue
    return runs


def unfinished_runs(base: Path = RUNS_DIR) -> list[RunDir]:
    """This checkout's runs whose record does not say they finished."""
    return [r for r in all_runs(base) if not r.record.get("finished")]


def runs_of(runs: list[RunDir], user: str | None) -> tuple[list[RunDir], list[RunDir]]:
    """``runs`` split into those ``user`` started and the others (``user`` None: all are
    its); a record without a user (written before runs recorded one) is nobody's."""
    mine = [r for r in runs if user is None or r.record.get("user") == user]
    return mine, [r for r in runs if r not in mine]


def delete_runs(runs: list[RunDir], base: Path = RUNS_DIR) -> None:
    """Delete the directories of ``runs`` (stopped or finished), and ``latest`` if it pointed
    to one of them; RUNS_DIR itself goes once it holds nothing else."""
    for run in runs:
        shutil.rmtree(run.path, ignore_errors=True)
    latest = base / "latest"
    if latest.is_symlink() and not latest.exists():
        latest.unlink()
    if base.is_dir() and not any(base.iterdir()):
        base.rmdir()

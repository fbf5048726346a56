"""``inagg``: bring a local inagg deployment up and down by hand, and see what it runs.

A local deployment is ``inagg.bmv2_env.emulation.loopback.LoopbackDeployment``: the software data plane, the
controller and a host aggregator on a loopback /24 of its own and Unix sockets, no root needed.

* ``inagg up [--workers N]``: start one in the background; prints the ``INAGG_CONTROLLER`` to
  export so that ``init_process_group("inagg")`` jobs use it (at most N ranks each).
* ``inagg status``: its addresses and the controller's jobs.
* ``inagg down``: stop it.
* ``inagg serve``: run one in the foreground until SIGTERM/SIGINT (or, with
  ``--until-stdin-closes``, until the parent's pipe closes: how a training job's rank 0 runs its
  own deployment, ``inagg.hostlib.worker.local``). Prints one JSON line describing it when ready.

The description is also written to ``deployment.json`` beside the controller's socket (mode
0600: it holds the admin token), where ranks find their addresses (``inagg.hostlib.worker.local``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from inagg.hostlib import add_version_flag
from inagg.hostlib.launch import python_m
from inagg.hostlib.worker.local import CONTROLLER_ENV, DEPLOYMENT_FILE

from inagg.bmv2_env.emulation.loopback import LoopbackDeployment

STATE_DIR_ENV = "INAGG_STATE_DIR"
STATE_FILE = "up.json"


def default_state_dir() -> Path:
    """Where ``inagg up`` records the deployment it started: $INAGG_STATE_DIR, else
    $XDG_RUNTIME_DIR/inagg, else ~/.cache/inagg."""
    if os.environ.get(STATE_DIR_ENV):
        return Path(os.environ[STATE_DIR_ENV])
    if os.environ.get("XDG_RUNTIME_DIR"):
        return Path(os.environ["XDG_RUNTIME_DIR"]) / "inagg"
    return Path.home() / ".cache" / "inagg"


def describe(dep: LoopbackDeployment) -> dict:
    return {"controller": dep.controller, "worker_ips": dep.worker_ips,
            "switch": dep.switch_address, "host_aggregator": dep.host_aggregator,
            "admin_token": dep.admin_token, "dir": str(dep.dir), "pid": os.getpid()}


def _write_private(path: Path, data: dict) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2)


def serve(workers: int, until_stdin_closes: bool) -> int:
    """Run a deployment until told to stop; its description goes to stdout (one line) first."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with LoopbackDeployment(workers, die_with_parent=True, fork_services=True) as dep:
        info = describe(dep)
        _write_private(dep.dir / DEPLOYMENT_FILE, info)
        print(json.dumps(info), flush=True)
        if until_stdin_closes:
            threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True,
                             name="inagg-parent-watch").start()
        stop.wait()
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _running(state_dir: Path) -> dict | None:
    """The deployment ``inagg up`` recorded in ``state_dir``, if its process still runs."""
    try:
        info = json.loads((state_dir / STATE_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return info if _alive(int(info["pid"])) else None


def up(workers: int, state_dir: Path, timeout: float = 60.0) -> int:
    running = _running(state_dir)
    if running:
        print(f"inagg: a local deployment is already running (pid {running['pid']}); "
              f"export {CONTROLLER_ENV}={running['controller']}", file=sys.stderr)
        return 1
    state_dir.mkdir(parents=True, exist_ok=True)
    log_path = state_dir / "services.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(python_m(sys.modules[__name__], "serve", "--workers", str(workers)),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, text=True,
                                start_new_session=True)
    line = proc.stdout.readline()
    proc.stdout.close()
    try:
        info = json.loads(line)
    except json.JSONDecodeError:
        proc.terminate()
        print(f"inagg: the deployment did not start; see {log_path}:\n{log_path.read_text()[-2000:]}",
              file=sys.stderr)
        return 2
    _write_private(state_dir / STATE_FILE, info)
    print(f"inagg: local deployment up (pid {info['pid']}, {workers} worker addresses, logs in {info['dir']})")
    print(f"export {CONTROLLER_ENV}={info['controller']}")
    return 0


def down(state_dir: Path, timeout: float = 15.0) -> int:
    info = _running(state_dir)
    (state_dir / STATE_FILE).unlink(missing_ok=True)
    if info is None:
        print("inagg: no local deployment running", file=sys.stderr)
        return 1
    pid = int(info["pid"])
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pid):
        print(f"inagg: pid {pid} still running after {timeout:.0f}s", file=sys.stderr)
        return 2
    print(f"inagg: local deployment (pid {pid}) stopped")
    return 0


def status(state_dir: Path) -> int:
    from inagg.hostlib.jobservice.client import ControllerClient, ControllerError

    info = _running(state_dir)
    if info is None:
        print("inagg: no local deployment running (start one with `inagg up`)")
        return 1
    print(f"local deployment pid {info['pid']}: controller {info['controller']}, switch {info['switch']}, "
          f"host aggregator {info['host_aggregator']}, {len(info['worker_ips'])} worker addresses "
          f"{info['worker_ips'][0]}..{info['worker_ips'][-1]}; logs in {info['dir']}")
    client = ControllerClient(info["controller"], timeout=5)
    try:
        jobs = client.list_jobs(info["admin_token"]).jobs
    except ControllerError as e:
        print(f"inagg: {e}", file=sys.stderr)
        return 2
    finally:
        client.close()
    print(f"{len(jobs)} job(s)")
    for j in jobs:
        print(f"  job {j.job_id} {j.name or '-'}: {j.joined}/{j.n_workers} joined, {j.active.mode or 'waiting'} "
              f"epoch {j.active.epoch}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="inagg", description=__doc__.split("\n\n")[0])
    add_version_flag(p)
    p.add_argument("--state-dir", type=Path, default=None,
                   help=f"where `up` records its deployment (default: ${STATE_DIR_ENV}, "
                        f"$XDG_RUNTIME_DIR/inagg or ~/.cache/inagg)")
    sub = p.add_subparsers(dest="cmd", required=True)
    sp = sub.add_parser("up", help="start a local deployment in the background")
    sp.add_argument("--workers", type=int, default=8, help="worker addresses (the largest job), default 8")
    sub.add_parser("down", help="stop the local deployment")
    sub.add_parser("status", help="the local deployment and its jobs")
    sp = sub.add_parser("serve", help="run a local deployment in the foreground")
    sp.add_argument("--workers", type=int, default=8)
    sp.add_argument("--until-stdin-closes", action="store_true",
                    help="also stop when stdin reaches EOF (the parent died or closed the pipe)")
    args = p.parse_args(argv)
    if getattr(args, "workers", 1) < 1:
        p.error(f"--workers must be >= 1, got {args.workers}")
    state_dir = args.state_dir or default_state_dir()
    if args.cmd == "serve":
        return serve(args.workers, args.until_stdin_closes)
    if args.cmd == "up":
        return up(args.workers, state_dir)
    if args.cmd == "down":
        return down(state_dir)
    return status(state_dir)


if __name__ == "__main__":
    sys.exit(main())

"""Where a rank finds inagg: the controller to talk to and the address to send from.

Two ways, and nothing typed by hand:

* ``INAGG_CONTROLLER`` set (a cluster, or services started with ``inagg up``): that controller.
  The rank's address is the one its kernel would send from towards the controller's host (the
  interface that routes there). A ``unix:`` controller of a local deployment (``inagg up``) has a
  ``deployment.json`` beside its socket that assigns rank r the loopback address of switch
  port r + 1.
* Unset: the job brings up its own local deployment (software data plane, controller and host
  aggregator on loopback and Unix sockets) where it needs one (the backend does not when its
  ranks all share one host: ``start_endpoint``'s ``now``). Rank 0 starts it as a child process
  (``python -m inagg.bmv2_env.emulation.services serve``: a process boundary, so the host library imports none of
  the control plane) and publishes its description in the job's store; every rank takes its
  address from it. It goes down with the process group, and with rank 0's process however that
  ends: the child exits when its stdin (a pipe from rank 0) closes.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import logging
import os
import select
import socket
import subprocess
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from inagg.hostlib.errors import InaggSetupError
from inagg.hostlib.launch import python_m
from inagg.hostlib.worker.abortable_store import Stop, wait_keys
from inagg.hostlib.wire.grant import parse_address

log = logging.getLogger("inagg.local")

CONTROLLER_ENV = "INAGG_CONTROLLER"
# the local deployment's services: a launch up the layers (hostlib must not import bmv2_env), so
# by name (declared in tests/test_layers.py's LAUNCHES_UP, which checks that it names a real module)
SERVICES_MODULE = "inagg.bmv2_env.emulation.services"
# what the local deployment imports beyond a worker's install (pyproject's inagg[control])
_CONTROL_PLANE_MODULES = ("p4runtime_sh", "prometheus_client")
DEPLOYMENT_FILE = "deployment.json"   # written beside a local deployment's controller socket
_STORE_KEY = "deployment"
_START_SECONDS = 120.0   # a local deployment is up in seconds; waiting longer helps no one
_STOP_CHECK_SECONDS = 0.05   # how often a wait for the deployment asks whether to give up


def route_source_ip(host: str, port: int = 9) -> str:
    """The local address this machine sends from to ``host`` (a connected UDP socket sends
    nothing; the kernel only picks the route and its source address)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((socket.gethostbyname(host), port))
        except OSError as e:
            raise InaggSetupError(f"no route to the controller's host {host!r}: {e}") from None
        return s.getsockname()[0]


def read_deployment(directory: Path) -> dict:
    """The description a local deployment wrote in ``directory`` (see inagg.bmv2_env.emulation.services)."""
    path = directory / DEPLOYMENT_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise InaggSetupError(f"cannot read the local deployment's {path}: {e}") from None


def _missing_control_plane() -> list[str]:
    """The modules of inagg's control plane (``inagg[control]``) this environment lacks."""
    return [m for m in _CONTROL_PLANE_MODULES if importlib.util.find_spec(m) is None]


def _rank_address(deployment: dict, rank: int, world_size: int, where: str) -> str:
    ips = deployment["worker_ips"]
    if world_size > len(ips):
        raise InaggSetupError(f"{where} has addresses for {len(ips)} workers, the job has {world_size}: "
                              f"start it with `inagg up --workers {world_size}` or more")
    return ips[rank]


def bind_address(controller: str, rank: int, world_size: int) -> str:
    """This rank's address for a job at ``controller`` (see the module docstring)."""
    if controller.startswith("unix:"):
        path = controller[len("unix:"):]
        directory = Path("/" + path.lstrip("/") if path.startswith("//") else path).parent
        return _rank_address(read_deployment(directory), rank, world_size, f"the deployment in {directory}")
    try:
        host, _ = parse_address(controller)
    except ValueError as e:
        raise InaggSetupError(f"{CONTROLLER_ENV}={controller!r} is neither host:port nor unix:PATH ({e})") from None
    return route_source_ip(host)


class LocalServices:
    """The local deployment rank 0 started for this job (a child process), until ``close``. It
    runs in a session of its own: a Ctrl-C at the terminal reaches the ranks, not it, and it
    stops when rank 0 closes its pipe (``close``, or rank 0's process ending however it ends),
    once the ranks are done with it."""

    def __init__(self, n_workers: int, timeout: float | None = None) -> None:
        """Start it; with ``timeout``, wait for it too (``wait_ready``)."""
        cmd = python_m(SERVICES_MODULE, "serve", "--workers", str(n_workers), "--until-stdin-closes")
        self.n_workers = n_workers
        self.info: dict | None = None
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     start_new_session=True)
        atexit.register(self.close)
        if timeout is not None:
            self.wait_ready(timeout)

    def wait_ready(self, timeout: float, stop: Stop = lambda: None) -> dict:
        """Its description, once it is up (waiting up to ``timeout`` seconds; ``stop()``'s error,
        should it have one first, is raised, and the deployment stopped)."""
        if self.info is None:
            try:
                self.info = self._read_ready(timeout, stop)
            except BaseException:
                self.close()
                raise
            log.info("started a local inagg deployment for %d workers: controller %s, switch %s (logs in %s)",
                     self.n_workers, self.info["controller"], self.info["switch"], self.info["dir"])
        return self.info

    def _read_ready(self, timeout: float, stop: Stop) -> dict:
        deadline = time.monotonic() + timeout
        while not (ready := select.select([self.proc.stdout], [], [], _STOP_CHECK_SECONDS)[0]):
            if (error := stop()) is not None:
                raise error
            if time.monotonic() >= deadline:
                break
        if not ready:
            why = f"no answer within {timeout:.0f}s"
        else:
            line = self.proc.stdout.readline()
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                pass
            try:
                why = f"it exited with status {self.proc.wait(5)}"
            except subprocess.TimeoutExpired:
                why = f"it printed {line[:200]!r} instead of its description"
        missing = _missing_control_plane()
        remedy = (f"it needs inagg's control plane, not installed here (no {', '.join(missing)}): "
                  f"pip install 'inagg[control]'" if missing else "its errors above say why")
        raise InaggSetupError(f"the local inagg deployment did not start ({why}); {remedy}. Or name a running "
                              f"controller with {CONTROLLER_ENV}=host:port.")

    def close(self, timeout: float = 10.0) -> None:
        """Stop the deployment (idempotent): closing its stdin tells it to stop."""
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("local deployment (pid %d) did not stop within %.0fs; killing it", self.proc.pid, timeout)
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout and not self.proc.stdout.closed:
            self.proc.stdout.close()
        atexit.unregister(self.close)


def _single_node() -> None:
    """Refuse a job that spans machines (torchrun's LOCAL_WORLD_SIZE < WORLD_SIZE): each machine
    would start its own deployment, and ranks on different ones cannot aggregate together."""
    local, world = os.environ.get("LOCAL_WORLD_SIZE"), os.environ.get("WORLD_SIZE")
    if local is not None and world is not None and int(local) != int(world):
        raise InaggSetupError(
            f"this job spans several machines ({world} ranks, {local} on this one) and no "
            f"controller is named: start the services (docs/training.md) and set "
            f"{CONTROLLER_ENV}=host:port on every rank")


@dataclass
class Endpoint:
    """What a rank needs to join a job: the controller, its own address, and (rank 0 of a job
    that brought up its own deployment) that deployment."""

    controller: str
    bind_ip: str
    services: LocalServices | None = None

    def close(self) -> None:
        """Stop the deployment this rank started, if any (the caller waits until every rank is
        done with it)."""
        if self.services is not None:
            self.services.close()


@dataclass
class PendingEndpoint:
    """``find_endpoint`` begun (``start_endpoint``): rank 0's local deployment starting while
    the rank does other work; ``result`` waits for it. ``local``: no controller is named, so the
    job's own local deployment would serve it (``start_services`` starts it, on rank 0)."""

    store: object
    rank: int
    world_size: int
    endpoint: Endpoint | None = None      # known at once: a named controller
    services: LocalServices | None = None   # rank 0's deployment, starting
    local: bool = False

    @property
    def watch_ip(self) -> str:
        """An address of this rank's that the job's other ranks reach, known at once: its
        address towards a named controller, or loopback (a local deployment's job runs on one
        machine)."""
        return self.endpoint.bind_ip if self.endpoint is not None else "127.0.0.1"

    def start_services(self) -> None:
        """Rank 0 of a job with no controller named: start the local deployment, once (a
        failure to start is published for the other ranks, then raised). Any other rank, or a
        named controller: nothing."""
        if self.rank != 0 or not self.local or self.services is not None:
            return
        try:
            self.services = LocalServices(self.world_size)
        except Exception as e:
            self.store.set(_STORE_KEY, json.dumps({"error": str(e)}))
            raise

    def result(self, stop: Stop = lambda: None) -> Endpoint:
        """The endpoint; rank 0 starts its deployment if it has not yet (``start_services``) and
        publishes its description (or why it did not start) in the store, every other rank waits
        for it there, up to ``_START_SECONDS``. ``stop()``'s error, should it have one first,
        ends the wait (``wait_keys``)."""
        if self.endpoint is not None:
            return self.endpoint
        self.start_services()
        if self.services is not None:
            try:
                self.store.set(_STORE_KEY, json.dumps(self.services.wait_ready(_START_SECONDS, stop)))
            except Exception as e:
                self.store.set(_STORE_KEY, json.dumps({"error": str(e)}))
                raise
        wait_keys(self.store, [_STORE_KEY], stop, timedelta(seconds=_START_SECONDS + 5))
        info = json.loads(self.store.get(_STORE_KEY))
        if "error" in info:
            raise InaggSetupError(f"rank 0 could not start the local inagg deployment: {info['error']}")
        self.endpoint = Endpoint(info["controller"], _rank_address(info, self.rank, self.world_size,
                                                                   "the job's deployment"), self.services)
        return self.endpoint

    def cancel(self) -> None:
        """Stop a deployment started and not handed on (the rank failed before ``result``)."""
        if self.endpoint is None and self.services is not None:
            self.services.close()


def start_endpoint(store, rank: int, world_size: int, now: bool = True) -> PendingEndpoint:
    """Begin ``find_endpoint``: with no controller named, rank 0 starts the local deployment
    now (``now``) and the rank goes on with other work until ``result``; without ``now`` it
    starts it only if ``result`` is ever called (a job whose ranks all share one host needs
    none: the host-local reduce carries its calls)."""
    controller = os.environ.get(CONTROLLER_ENV, "").strip()
    if controller:
        return PendingEndpoint(store, rank, world_size, Endpoint(controller, bind_address(controller, rank, world_size)))
    _single_node()
    pending = PendingEndpoint(store, rank, world_size, local=True)
    if now:
        pending.start_services()
    return pending


def find_endpoint(store, rank: int, world_size: int) -> Endpoint:
    """The controller and this rank's address (module docstring); rank 0 starts the local
    deployment when no controller is named. ``store`` is the job's (prefixed) store. Starting
    the deployment takes what it takes, whatever the group's timeout for its collectives
    (torch's suite creates groups with 1 s): every rank waits for it up to ``_START_SECONDS``."""
    return start_endpoint(store, rank, world_size).result()

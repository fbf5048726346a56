"""The job service over gRPC: a thin servicer over ``Controller``, the listening port, and the
controller's background threads (lease expiry, one keeper per switch).

Every call checks its token (a job's or the admin's) before anything else and answers a
``Refused`` with its gRPC code. The two watch calls stream a new message whenever the
controller's state changes (``Controller.changed``) and the message differs from the last one.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent import futures
from typing import Callable

import grpc

from inagg.controller.config import ControllerConfig
from inagg.controller.controller import Controller
from inagg.controller.jobs import Refused, check_rank
from inagg.controller.store import StoreError
from inagg.controller.validation import MAX_STALL_CHARS
from inagg.hostlib.jobservice.credentials import is_unix, server_credentials
from inagg.hostlib.jobservice.proto import inagg_controller_pb2 as pb
from inagg.hostlib.jobservice.proto import inagg_controller_pb2_grpc as pb_grpc

log = logging.getLogger("inagg.controller")
# Largest request the job service reads: every valid one is far smaller.
MAX_REQUEST_BYTES = 64 << 10
# Threads serving calls. A call waiting for the controller's lock (a placement) holds one; a
# call that finds none free queues behind them all, so there are enough that heartbeats and
# listings (which need no lock: a listing answers from what the last change published) find
# one during a storm of placements.
SERVER_THREADS = 256


def run_forever(name: str, period: float, stopped: threading.Event,
                step: Callable[[], object]) -> threading.Thread:
    """A daemon thread calling ``step()`` every ``period`` seconds until ``stopped``; an
    exception is logged and the thread goes on (a dead background thread would silently stop
    leases from expiring or switches from being re-programmed). A step that fails once
    ``stopped`` is set ends the thread with no error: the stopping controller closed what it
    was using (a switch keeper's P4Runtime channel), which is no fault of the step."""
    def loop() -> None:
        while not stopped.wait(period):
            try:
                step()
            except Exception:  # noqa: BLE001 - logged; the next period tries again
                if stopped.is_set():
                    return
                log.exception("%s: step failed", name)

    thread = threading.Thread(target=loop, daemon=True, name=name)
    thread.start()
    return thread


class LeaseLooks:
    """The lease thread's step: ``Controller.expire_leases`` told how late this look wakes, the
    time since the last look ended beyond the period, which is the controller's own stall (a
    SIGSTOP, a starved CPU), not its ranks' silence. Measured from the last look's end, so a look
    that waited for the lock (a placement, during which beats go on) pauses no lease."""

    def __init__(self, ctl: Controller) -> None:
        self.ctl = ctl
        self.last = time.monotonic()

    def __call__(self) -> None:
        stall = max(time.monotonic() - self.last - self.ctl.lease_check_seconds, 0.0)
        try:
            self.ctl.expire_leases(stall)
        finally:
            self.last = time.monotonic()


class JobServicer(pb_grpc.JobServiceServicer):
    """The JobService calls, each answered by the controller's method of the same meaning."""

    def __init__(self, ctl: Controller) -> None:
        self.ctl = ctl

    def _call(self, context, fn, *args):
        try:
            return fn(*args)
        except (Refused, StoreError) as e:
            context.abort(e.code, str(e))

    def CreateJob(self, request, context):
        job_id, token = self._call(context, self.ctl.create_job, request.n_workers,
                                   request.bytes_per_iteration, request.iteration_seconds, request.name,
                                   request.transport, request.host_only, request.nonce)
        return pb.CreateJobReply(job_id=job_id, token=token)

    def JoinJob(self, request, context):
        job = self._call(context, self.ctl.join, request.job_id, request.token, request.rank,
                         request.address, request.mac, request.roce_qp, request.roce_rkey, request.nonce)
        return pb.JoinJobReply(n_workers=job.demand.n_workers, lease_seconds=self.ctl.config.lease_seconds,
                               rank_lease_seconds=self.ctl.config.rank_lease_seconds)

    def WatchGrant(self, request, context):
        ctl = self.ctl
        job = self._call(context, lambda: ctl.authenticate(request.job_id, request.token))
        rank = request.rank if request.HasField("rank") else None
        if rank is not None:
            self._call(context, check_rank, job, rank)
        sent = None
        while context.is_active() and not ctl.stopped.is_set():
            with ctl.lock:
                job = ctl.jobs.get(request.job_id)
                if job is None:
                    return
                grants = ctl.grants(job, rank)
                if grants == sent:
                    ctl.changed.wait(timeout=1.0)
                    continue
            sent = grants
            yield from grants

    def ActivateGrant(self, request, context):
        rank = request.rank if request.HasField("rank") else None
        if request.stalled:
            if rank is None:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a stall report names the stalled rank")
            grant, waiting = self._call(context, self.ctl.stalled, request.job_id, request.token, request.epoch,
                                        request.boundary, rank, request.stalled[:MAX_STALL_CHARS])
            return pb.ActivateReply(activated=not waiting, grant=grant, waiting_for=waiting)
        ok, grant, waiting = self._call(context, self.ctl.activate, request.job_id, request.token,
                                        request.epoch, request.boundary, rank)
        return pb.ActivateReply(activated=ok, grant=grant, waiting_for=waiting)

    def Heartbeat(self, request, context):
        self._call(context, self.ctl.heartbeat, request.job_id, request.token,
                   request.rank if request.HasField("rank") else None)
        return pb.HeartbeatReply(lease_seconds=self.ctl.config.lease_seconds,
                                 rank_lease_seconds=self.ctl.config.rank_lease_seconds)

    def LeaveJob(self, request, context):
        self._call(context, lambda: self.ctl.authenticate(request.job_id, request.token))
        if not request.HasField("rank"):   # a job token is every rank's: it cannot speak for all
            context.abort(grpc.StatusCode.PERMISSION_DENIED,
                          f"ending job {request.job_id} needs the admin token (ReleaseJob) or every "
                          f"rank's LeaveJob naming its rank")
        self._call(context, self.ctl.leave, request.job_id, request.rank)
        return pb.Empty()

    def WatchHostJobs(self, request, context):
        self._call(context, self.ctl.admin, request.admin_token)
        sent = None
        while context.is_active() and not self.ctl.stopped.is_set():
            snapshot = self.ctl.host_jobs()
            if snapshot != sent:
                sent = snapshot
                yield snapshot
            with self.ctl.lock:
                self.ctl.changed.wait(timeout=1.0)

    def ListJobs(self, request, context):
        self._call(context, self.ctl.admin, request.admin_token)
        return self.ctl.list_jobs()

    def DrainJob(self, request, context):
        self._call(context, self.ctl.admin, request.admin_token)
        return self._call(context, self.ctl.drain, request.job_id)

    def ReleaseJob(self, request, context):
        self._call(context, self.ctl.admin, request.admin_token)
        self._call(context, self.ctl.release, request.job_id)
        return pb.Empty()


def add_port(server: grpc.Server, address: str, config: ControllerConfig) -> None:
    """Listen on ``address``: TLS when the config has a certificate; plaintext only on a Unix
    socket or when the config asks for it (``insecure``), as tokens travel in every request."""
    if config.tls_cert:
        port = server.add_secure_port(address, server_credentials(config.tls_cert, config.tls_key))
    elif is_unix(address) or config.insecure:
        port = server.add_insecure_port(address)
    else:
        raise OSError(f"refusing to serve job tokens in plaintext on {address}: give tls_cert and "
                      f"tls_key, listen on a unix: socket, or set insecure (--insecure)")
    if port == 0:
        raise OSError(f"cannot listen on {address}")


def serve(ctl: Controller, address: str) -> grpc.Server:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=SERVER_THREADS),
                         options=[("grpc.max_receive_message_length", MAX_REQUEST_BYTES)])
    pb_grpc.add_JobServiceServicer_to_server(JobServicer(ctl), server)
    add_port(server, address, ctl.config)
    server.start()
    run_forever("leases", ctl.lease_check_seconds, ctl.stopped, LeaseLooks(ctl))
    for name in ctl.fabric.switches:
        run_forever(f"keeper-{name}", ctl.config.switch_check_seconds, ctl.stopped,
                    lambda name=name: ctl.keep_switch(name))
    return server

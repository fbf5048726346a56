"""Client side of the job service, used by workers (inagg.hostlib.worker), host aggregators and inaggctl."""

from __future__ import annotations

from pathlib import Path

import grpc

from inagg.hostlib.wire.grant import Grant, parse_address

from inagg.hostlib.jobservice.credentials import open_channel

from inagg.hostlib.jobservice.proto import inagg_controller_pb2 as pb
from inagg.hostlib.jobservice.proto import inagg_controller_pb2_grpc as pb_grpc


class ControllerError(RuntimeError):
    """The controller refused a call or could not be reached; the message says which, ``code``
    (a ``grpc.StatusCode``) how."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code


# A call's deadline unless the caller gives its own: a call made while the controller is down
# waits this long for it to come back.
CALL_SECONDS = 10.0
# How long a channel waits at most between two tries to reach a controller that is down, so a
# restarted controller is heard from within about a second (gRPC's default backs off to 120 s).
CHANNEL_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 200), ("grpc.min_reconnect_backoff_ms", 200),
                   ("grpc.max_reconnect_backoff_ms", 1000)]


def to_grant(g: pb.Grant) -> Grant:
    return Grant(g.job_id, g.epoch, g.slot_base, g.slot_count, g.values_per_packet,
                 parse_address(g.aggregator), g.mode, g.transport or "udp", g.reason, g.aggregator_mac)


class ControllerClient:
    """The job service's calls. TCP addresses need TLS (``ca``, or $INAGG_CONTROLLER_CA) unless
    plaintext is asked for (``insecure``, or $INAGG_CONTROLLER_INSECURE=1); see credentials.py."""

    def __init__(self, address: str, timeout: float = CALL_SECONDS, *, ca: str | Path | None = None,
                 insecure: bool | None = None) -> None:
        self.address = address
        self.timeout = timeout
        try:
            self.channel = open_channel(address, ca, insecure, CHANNEL_OPTIONS)
        except ValueError as e:
            raise ControllerError(str(e)) from None
        self.stub = pb_grpc.JobServiceStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def _call(self, method: str, request, timeout: float | None = None):
        try:
            # wait_for_ready: ride out a controller restart (up to the timeout) instead of failing
            # at once while the channel backs off from a refused connection
            return getattr(self.stub, method)(request, timeout=timeout or self.timeout, wait_for_ready=True)
        except grpc.RpcError as e:
            if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise ControllerError(f"controller at {self.address} unreachable: {e.details()}", e.code()) from None
            raise ControllerError(f"controller refused {method}: {e.code().name}: {e.details()}", e.code()) from None

    def create_job(self, n_workers: int, bytes_per_iteration: int = 0, iteration_seconds: float = 1.0,
                   name: str = "", transport: str = "udp", host_only: bool = False,
                   nonce: str = "") -> tuple[int, str]:
        r = self._call("CreateJob", pb.CreateJobRequest(
            n_workers=n_workers, bytes_per_iteration=bytes_per_iteration,
            iteration_seconds=iteration_seconds, name=name, transport=transport, host_only=host_only,
            nonce=nonce))
        return r.job_id, r.token

    def join(self, job_id: int, token: str, rank: int, address: str, mac: str = "", *,
             roce_qp: int = 0, roce_rkey: int = 0, nonce: str = "") -> pb.JoinJobReply:
        return self._call("JoinJob", pb.JoinJobRequest(job_id=job_id, token=token, rank=rank,
                                                       address=address, mac=mac, roce_qp=roce_qp,
                                                       roce_rkey=roce_rkey, nonce=nonce))

    def watch(self, job_id: int, token: str, rank: int | None = None):
        """Iterator of pb.Grant (no deadline: it lasts as long as the job): rank ``rank``'s (a
        job on an aggregation tree has one grant per rank; without a rank, its root's)."""
        return self.stub.WatchGrant(pb.JobRef(job_id=job_id, token=token, rank=rank), wait_for_ready=True)

    def activate(self, job_id: int, token: str, epoch: int, boundary: int, rank: int) -> pb.ActivateReply:
        """Rank ``rank`` asks to use pending grant ``epoch`` from ``boundary`` on; a reply with
        ``waiting_for`` > 0 means other ranks have not asked yet: ask again."""
        return self._call("ActivateGrant", pb.ActivateRequest(job_id=job_id, token=token, epoch=epoch,
                                                              boundary=boundary, rank=rank))

    def report_stall(self, job_id: int, token: str, epoch: int, boundary: int, rank: int,
                     why: str) -> pb.ActivateReply:
        """Rank ``rank``'s call before ``boundary`` made no progress in grant ``epoch`` (``why``);
        a reply with ``waiting_for`` > 0 means other ranks have not reported it yet: ask again.
        Else its grant is the one to run the call again on."""
        return self._call("ActivateGrant", pb.ActivateRequest(job_id=job_id, token=token, epoch=epoch,
                                                              boundary=boundary, rank=rank, stalled=why))

    def heartbeat(self, job_id: int, token: str, rank: int | None = None,
                  timeout: float | None = None) -> pb.HeartbeatReply:
        """Renew the job's lease and, with ``rank``, that rank's; ``timeout``: this beat's
        deadline (a rank keeps it under its lease, so one beat never blocks the next)."""
        return self._call("Heartbeat", pb.JobRef(job_id=job_id, token=token, rank=rank), timeout)

    def leave(self, job_id: int, token: str, rank: int | None = None) -> None:
        """Say that rank ``rank`` is done: the job ends when every rank is. Without a rank the
        controller refuses (only the operator's ``release`` ends a job for all its ranks)."""
        self._call("LeaveJob", pb.JobRef(job_id=job_id, token=token, rank=rank))

    def list_jobs(self, admin_token: str) -> pb.JobList:
        return self._call("ListJobs", pb.AdminRef(admin_token=admin_token))

    def drain(self, admin_token: str, job_id: int) -> pb.Grant:
        return self._call("DrainJob", pb.AdminJobRef(admin_token=admin_token, job_id=job_id))

    def release(self, admin_token: str, job_id: int) -> None:
        self._call("ReleaseJob", pb.AdminJobRef(admin_token=admin_token, job_id=job_id))

    def watch_host_jobs(self, admin_token: str):
        return self.stub.WatchHostJobs(pb.AdminRef(admin_token=admin_token), wait_for_ready=True)

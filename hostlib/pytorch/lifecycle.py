"""Start and stop of an ``inagg`` process group (``inagg.hostlib.pytorch.backend``): what it opens,
joins and leaves, and what it does when a rank goes.

Design: the group is up once its ranks have met, in one round of the store that tells each what
it needs of the others (``GroupLifecycle.__init__``, a collective; ``roll_call``), and its peer
watch is up; its two gloo groups (the inner one, the fixed-point path's) are made at their
first call (``_gloo_group``). The inagg paths (the host-local reduce, rank 0's local deployment
where the job needs one, the joins at the controller, the path chooser) start in the background
(``start``, thread ``inagg-start``; a job on one host with no controller named, on the caller's
thread: nothing there waits beyond the host) and the first call that needs them waits for them
(``ready``). Every rank watches the others
(``inagg.hostlib.pytorch.peer_watch``): a rank that ends fails every call of the others at once,
on every path, with an error naming it (``_rank_gone``, ``named``), and a start still under way
gives up at its next wait (``_start_stop``) instead of waiting for that rank. ``shutdown``
leaves the jobs, lets the inner gloo group go and stops the local deployment; a group left open
at exit does the same while the interpreter can still run (``_close_at_exit``).
"""

from __future__ import annotations

import atexit
import gc
import logging
import math
import os
import signal
import sys
import threading
from datetime import timedelta
from typing import TYPE_CHECKING, Callable

import torch.distributed as dist

from inagg.hostlib.errors import InaggError, InaggSetupError, JobFailed
from inagg.hostlib.pytorch import interrupts
from inagg.hostlib.pytorch.agreement import StoreMin
from inagg.hostlib.pytorch.carriers import by_carrier, route_names, summary
from inagg.hostlib.pytorch.inner_gloo import InnerGloo
from inagg.hostlib.pytorch.path.choice import PATHS, PathChooser
from inagg.hostlib.pytorch.path.links import GrantMove, LinkShape, job_links
from inagg.hostlib.pytorch.path.news import GrantNews
from inagg.hostlib.pytorch.peer_watch import EXIT, LEAVE, PeerWatch
from inagg.hostlib.pytorch.roll_call import RollCall
from inagg.hostlib.pytorch.reproducible import FixedPointGloo
from inagg.hostlib.pytorch.works import _FAILURE_CHECK_SECONDS
from inagg.hostlib.wire.grant import Grant
from inagg.hostlib.worker.abortable_store import AbortableStore, wait_keys
from inagg.hostlib.worker.call_protocol import one_round_capacity
from inagg.hostlib.worker.host_communicator import (ONE_HOST_VALUES_PER_PACKET, HostCommunicator, HostGroup,
                                                    host_reduce_setting, host_reduce_wanted)
from inagg.hostlib.worker.host_group import RankDied
from inagg.hostlib.worker.local import Endpoint, PendingEndpoint, start_endpoint
from inagg.hostlib.worker.stream_base import Reduction

if TYPE_CHECKING:
    from inagg.hostlib.worker.communicator import Communicator
    from inagg.hostlib.pytorch.backend import InaggProcessGroup
    from inagg.hostlib.pytorch.dispatch import AllreduceDispatch

log = logging.getLogger("inagg.backend")
paths_log = logging.getLogger("inagg.paths")   # rank 0's line saying what carries the calls

# a call that failed with no rank known gone yet waits this long for the peer watch to name one:
# a rank's end reaches its peers' gloo connections and the peer watch's socket together
_NAMING_SECONDS = 2.0
# after a failure, ``destroy_process_group`` waits this long for the start to give up (it does
# at its next wait: a poll of the store, a slice of a call's wait)
_GIVE_UP_SECONDS = 1.0
# at interpreter exit, rank 0 waits this long for the other ranks to end before it stops the
# local deployment (they were told it is going: their calls fail and they end at once)
_EXIT_WAIT_SECONDS = 5.0
# a gloo group's wait for every rank before its rendezvous (``_gloo_group``) polls the store
# from this pause, doubling to the longest: the ranks come within a call of each other
_GLOO_POLL_SECONDS = (1e-4, 2e-3)
PATH_ENV = "INAGG_ALLREDUCE_PATH"   # auto (default) | inagg | host | gloo
REPRODUCIBLE_ENV = "INAGG_REPRODUCIBLE"   # 1 (default): the same bits on every path | 0


def _reproducible_requested() -> bool:
    """Whether ``INAGG_REPRODUCIBLE`` asks for the same bits on every path (the default)."""
    value = os.environ.get(REPRODUCIBLE_ENV, "1").strip().lower()
    if value not in ("0", "1"):
        raise InaggSetupError(f"{REPRODUCIBLE_ENV} must be 1 (the same bits on every path, the default) or 0 "
                              f"(gloo sums floats in its own order); got {value!r}")
    return value == "1"


def _forced_path() -> str | None:
    """The path ``INAGG_ALLREDUCE_PATH`` pins every eligible allreduce to (None: auto)."""
    value = os.environ.get(PATH_ENV, "auto").strip().lower()
    if value == "auto":
        return None
    if value not in PATHS:
        raise InaggSetupError(f"{PATH_ENV} must be auto, {' or '.join(PATHS)}; got {value!r}")
    return value


def _on_one_host(pending: PendingEndpoint, call: RollCall) -> bool:
    """Whether a job's paths wait for nothing beyond its host: no controller named, and its
    ranks all on one host, reducing there (the host-local reduce carries its calls)."""
    layout = call.layout()
    return pending.local and len(layout.hosts) == 1 and host_reduce_wanted(layout)


class GroupLifecycle:
    """One rank's inagg paths, from the ranks' meeting to ``shutdown`` (module
    docstring): the endpoint, the communicators (``comm``, the host lane ``lane``, the host's
    ``host`` group), the fixed-point gloo path ``fixed``, the peer watch ``peers`` and the path
    chooser ``paths``. ``group`` is the inagg process group it belongs to (its rank, size and
    stats)."""

    def __init__(self, group: InaggProcessGroup, store: dist.Store, timeout: timedelta) -> None:
        """The ranks' meeting, one round of the store that tells every rank what it needs of the
        others (``inagg.hostlib.pytorch.roll_call``), and the peer watch (a collective: every
        rank is here after it); the inner gloo group is made at its first call. Rank 0's local
        deployment starts now, in the background, where every rank is a worker
        (``INAGG_HOST_REDUCE=off``). ``start`` starts the rest."""
        rank, world_size = group.rank(), group.size()
        forced, self._same_bits = _forced_path(), _reproducible_requested()
        self._group, self.timeout, self.forced = group, timeout, forced
        self.closed = False
        self.endpoint: Endpoint | None = None
        self.comm: Communicator | HostCommunicator | None = None
        self.lane: Communicator | HostCommunicator | None = None
        self.host: HostGroup | None = None   # this host's ranks reduce together first (worker.host_reduce)
        self.fixed: FixedPointGloo | None = None
        self.peers: PeerWatch | None = None
        self.path_names: tuple[str, ...] = ()   # the paths this job's eligible allreduces may take
        self._paths: PathChooser | None = None   # made at its first use (``paths``)
        self._new_chooser: Callable[[], PathChooser] | None = None
        self._chooser_lock = threading.Lock()
        # a job on one host with no controller named and no path forced: its tiny calls skip the
        # chooser (``AllreduceDispatch._tiny``)
        self.tiny_on_host = False
        # one leaving at a time: a start that gives up (its thread) and destroy may both leave
        self._leave_lock = threading.Lock()
        # rank 0's local deployment starts now where every rank is a switch worker
        # (INAGG_HOST_REDUCE=off); otherwise once the start knows the job spans hosts (``_open_paths``)
        pending = start_endpoint(dist.PrefixStore("local", store), rank, world_size,
                                 now=host_reduce_setting() == "off")
        call: RollCall | None = None
        try:
            call = RollCall(dist.PrefixStore("hello", store), rank, world_size, pending.watch_ip)
            call.read()   # waits for every rank's answer: the start's one rendezvous
            # every rank is here: from now on a rank that ends is named
            self.peers = call.peer_watch(timeout, self._rank_gone)
        except BaseException:
            pending.cancel()
            if call is not None:
                call.close()
            raise
        self.gloo = InnerGloo(lambda: self._gloo_group(store, "gloo"), store, group)
        self._start_args: tuple | None = (pending, store, call, forced)   # for ``start``
        self._start_error: BaseException | None = None
        self.is_ready = False   # the paths started (``_start_paths``) and calibrated (``ready``)
        self._calibrated = False
        self._ready_lock = threading.Lock()
        # set when the start ended, one way or the other (waited on as an Event: a Ctrl-C that
        # interrupts Thread.join leaves the thread looking stopped while it runs, Python 3.11)
        self._started = threading.Event()
        self._dispatch: AllreduceDispatch | None = None

    def start(self, dispatch: AllreduceDispatch) -> None:
        """Start the paths (``_start_paths``): in the background, or here where nothing in them
        waits for anything beyond this host (``_on_one_host``); ``dispatch`` calibrates them and
        holds the gloo run's latest Work (let go at shutdown). Installs the Ctrl-C handling and
        the close at exit (after the local deployment's own: runs before it)."""
        self._dispatch = dispatch
        args, self._start_args = self._start_args, None
        pending, _, call, _ = args
        if _on_one_host(pending, call):
            self._start_paths(*args)
        else:
            threading.Thread(target=self._start_paths, args=args, daemon=True, name="inagg-start").start()
        interrupts.install()
        atexit.register(self._close_at_exit)

    def _start_paths(self, pending: PendingEndpoint, store: dist.Store, call: RollCall, forced: str | None) -> None:
        """The inagg paths, from ``init_process_group`` on: the host group, the endpoint (rank
        0's local deployment coming up), the communicators' joins and the path chooser. A job
        whose ranks all share one host and that names no controller opens them before
        ``init_process_group`` returns (nothing in them waits beyond the host: a few
        milliseconds); any other in the background (thread ``inagg-start``), as gloo's
        ``init_process_group`` returns once its ranks have met: what the program does
        next (its model, its data, DDP's broadcasts on gloo) overlaps this, and the first call
        that needs the paths waits for the rest (``ready``). With the same bits on every path the
        paths are calibrated here too (the gloo path's calls then run on a gloo group of their
        own, made at its first call, ``_gloo_group``, not the inner one the program's collectives
        use meanwhile). A failure leaves what was joined and is kept for that call to raise; a
        rank gone meanwhile ends the start at its next wait (``_start_stop``)."""
        try:
            self._open_paths(pending, store, call, forced)
        except BaseException as e:  # noqa: BLE001 - raised by ``ready``
            pending.cancel()
            self._leave_paths()
            self._start_error = e
        finally:
            call.close()
            self._started.set()

    def _open_paths(self, pending: PendingEndpoint, store: dist.Store, call: RollCall, forced: str | None) -> None:
        """The host group, then the endpoint and the joins (``_join_paths``), and the path
        chooser over the paths this job has; with the same bits on every path, their
        calibration too. A job with no controller named whose ranks all share one host starts
        no local deployment and joins no job: the host-local reduce carries its calls, and a
        switch would carry nothing (``HostCommunicator`` without a job)."""
        rank, world_size = self._group.rank(), self._group.size()
        self.host = call.host_group(self.timeout, self._start_stop)
        if self.host is not None and (gone := self.failure()) is not None:   # named before ``_rank_gone`` saw it
            self.host.fail(gone)
        if pending.local and self.host is not None and self.host.n_hosts == 1:
            self.comm = HostCommunicator(self.host, None)
        else:
            self.endpoint = pending.result(self._start_stop)
            try:
                self._join_paths(store)
            except Exception as e:
                raise InaggSetupError(f"rank {rank}: cannot join an inagg job at {self.endpoint.controller}: {e}") from e
        self.fixed = self._reproducible(store) if self._same_bits else None
        self.tiny_on_host = self.endpoint is None and forced is None
        paths = tuple(p for p in PATHS if p != "host" or self.lane is not None)
        if forced is not None and forced not in paths:
            why = ("its ranks reduce on their one host; INAGG_HOST_REDUCE=off makes each rank a worker"
                   if self.host is not None else "its grant is on the host aggregator already")
            raise InaggSetupError(f"{PATH_ENV}={forced}: this job has no host lane ({why}); use inagg")
        self.path_names, one_clock = paths, call.one_clock()
        self._new_chooser = lambda: self._chooser_of(StoreMin(dist.PrefixStore("agree", store), rank, world_size,
                                                              self.failure), paths, forced, one_clock)
        if self.fixed is not None and not self.tiny_on_host:
            self._dispatch.calibrate()
            self._calibrated = True

    def _gloo_group(self, store: dist.Store, prefix: str) -> dist.ProcessGroupGloo:
        """A gloo group of this process group's ranks under ``prefix``: the inner one
        (``InnerGloo``) or the fixed-point path's (``FixedPointGloo``), each made at its first
        call (the same call on every rank). Every rank says it is here first, in the store, waited
        for as the start's waits are (a rank gone ends it, named) up to the process group's
        timeout, as gloo's own call would wait for a rank that does not come (a collective only
        some ranks call: its error says "Timed out", as gloo's); gloo's rendezvous after it
        waits in C++, which nothing could end, for ranks that are all there."""
        rank, world_size = self._group.rank(), self._group.size()
        if world_size > 1:
            here = dist.PrefixStore(f"{prefix}-here", store)
            here.set(str(rank), "")
            keys = [str(r) for r in range(world_size)]
            try:
                wait_keys(here, keys, self.failure, self.timeout, poll=_GLOO_POLL_SECONDS)
            except TimeoutError:
                missing = [r for r in range(world_size) if not here.check([str(r)])]
                raise RuntimeError(f"inagg: Timed out waiting {self.timeout.total_seconds() * 1e3:.0f}ms for ranks "
                                   f"{missing} to come to this collective (the process group's timeout; no rank is "
                                   f"known gone): do all ranks call it?") from None
        return dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), rank, world_size, self.timeout)

    @property
    def paths(self) -> PathChooser | None:
        """The path chooser (None until the paths are open), made at its first use: a job on one
        host whose calls are all tiny (``tiny_on_host``) makes none, so its start does not pay
        for one."""
        if self._paths is None and self._new_chooser is not None:
            with self._chooser_lock:
                if self._paths is None:
                    self._paths = self._new_chooser()
        return self._paths

    def _chooser_of(self, agree: StoreMin, paths: tuple[str, ...], forced: str | None, one_clock: bool) -> PathChooser:
        """The path chooser over ``paths``, agreeing through ``agree``, following the job's grant
        (``_grant_move``), with the gloo path's news of its moves where that path is the fixed
        point's (``GrantNews``: it carries the news)."""
        move = self._grant_move()
        news = GrantNews(move, self.failure) if move is not None and self.fixed is not None else None
        return PathChooser(agree, paths, forced=forced, shared_clock=one_clock, links=self._links(self.comm.grant),
                           move=move, news=news)

    def _grant_move(self) -> GrantMove | None:
        """How the path choice sees the job's grant move; None where this rank's host reduces
        first (only a host's leader follows the job's grants)."""
        comm = self.comm
        if comm is None or isinstance(comm, HostCommunicator):
            return None
        return GrantMove(lambda: comm.grant.epoch, lambda: (comm.pending_grant or comm.grant).epoch,
                         lambda: self._links(comm.pending_grant or comm.grant))

    def _links(self, grant: Grant | None) -> LinkShape | None:
        """The job's links under ``grant`` (and its host lane's), where their rate is known;
        None without a grant (a job on one host: nothing crosses a link)."""
        if grant is None:
            return None
        return job_links(self.endpoint.bind_ip, self._group.size(), grant, self.lane.grant if self.lane else None)

    def ready(self) -> None:
        """Wait for the inagg paths (``_start_paths``) and, the first time, calibrate them (the same
        calls on every rank: every rank's first call that needs the paths is the same call;
        a job on one host calibrates at its first call that asks the chooser, ``chooser``);
        raises what kept them from starting, or the rank gone meanwhile (a join waits for every
        rank). Every eligible allreduce asks first."""
        if self.is_ready:
            return
        with self._ready_lock:
            if self.is_ready:
                return
            while not self._started.wait(_FAILURE_CHECK_SECONDS):
                if (gone := self.failure()) is not None:
                    raise gone
            if self._start_error is not None:   # a rank's end may be what broke it (rank 0's, the store's host)
                error = InaggSetupError(str(self._start_error))
                error.__cause__ = self._start_error
                raise self.named(error)
            if not self._calibrated and not self.tiny_on_host:
                self._dispatch.calibrate()
                self._calibrated = True
            self.is_ready = True
            if self._group.rank() == 0 and paths_log.isEnabledFor(logging.INFO):
                paths_log.info("%s", summary(self, self._group.size()))

    def chooser(self) -> PathChooser:
        """The path chooser, once the paths are up (``ready``) and calibrated. A job on one host
        (``tiny_on_host``) calibrates here, at its first call that asks the chooser (the same
        call on every rank): its tiny calls never do, so its start and its first tiny call wait
        for no calibration."""
        self.ready()
        if not self._calibrated:
            with self._ready_lock:
                if not self._calibrated:
                    self._dispatch.calibrate()
                    self._calibrated = True
        return self.paths

    def _start_stop(self) -> RankDied | None:
        """Why the start gives up now: a rank gone while it runs (its waits would wait for that
        rank until the group's timeout, and past the program's end). None once the start is
        over: a communicator's later store calls (its heartbeat's) are its own."""
        return None if self._started.is_set() else self.failure()

    def _start_store(self, store: dist.Store, prefix: str) -> AbortableStore:
        """``store`` under ``prefix``, for the start's joins: its waits end with ``_start_stop``."""
        return AbortableStore(dist.PrefixStore(prefix, store), self._start_stop)

    def _join_paths(self, store: dist.Store) -> None:
        """Every path's communicator: the joins of the jobs at the controller (through the host
        group, where the ranks reduce on their hosts first)."""
        self.comm = self._join(store, "comm")
        # every rank sees the same first grant (a change needs every rank's agreement); a job
        # on one host sends nothing between hosts, so a lane would be the same path again
        if self.comm.grant.mode == "switch" and (self.host is None or self.host.n_hosts > 1):
            self.lane = self._join(store, "comm-host", host_only=True)

    def _rank_gone(self, error: RankDied) -> None:
        """A rank ended without leaving (the peer watch's thread): every path's calls fail with
        ``error``, which names it, now and from now on."""
        for comm in (self.comm, self.lane):
            if comm is not None:
                comm.fail(str(error))
        if self.host is not None:   # its waits for a rank of the host (a stopped one: no end-of-file)
            self.host.fail(error)
        if self.fixed is not None:
            self.fixed.fail(self.failure)

    def failure(self) -> RankDied | None:
        """The rank gone that failed this group, if one has (an error of its own to raise)."""
        gone = self.peers.failure if self.peers is not None else None
        return RankDied(gone.rank, str(gone)) if gone is not None else None

    def named(self, error: BaseException) -> BaseException:
        """``error``, or one naming the rank whose end caused it: a rank's end fails its peers'
        calls in the words of whatever noticed first (gloo's "Connection closed by peer", a
        store that is gone with rank 0...: a RuntimeError); the peer watch names it. Any other
        error (a refused input: ValueError, FloatingPointError) and a use after shutdown stay as
        they are. One naming a rank stays unless the peer watch names another: a host's ranks
        see their leader's socket close when it ends after a call that failed (another rank's
        death), and the peer watch's relay of that death came first."""
        named = isinstance(error, RankDied)
        if self.peers is None or self.closed or not (named or isinstance(error, RuntimeError)) \
                or (isinstance(error, JobFailed) and not named):
            return error
        gone = self.peers.wait_for_failure(_NAMING_SECONDS)
        if gone is None or (named and gone.rank == error.rank):
            return error
        return self._blame(gone, error)

    @staticmethod
    def _blame(gone: RankDied, error: BaseException) -> RankDied:
        """A ``RankDied`` naming ``gone``, caused by ``error`` (what this rank's call saw)."""
        named = RankDied(gone.rank, f"{gone} (this rank's call failed: {error})")
        named.__cause__ = error
        return named

    def _join(self, store: dist.Store, prefix: str, **kwargs: bool) -> Communicator | HostCommunicator:
        """This rank's communicator of a job at the endpoint's controller (rank 0 creates it):
        every rank a worker, or each host's leader when the host reduces first. Imported here:
        a job on one host joins none, and so never loads the communicator, its streams and
        transports (the start-up's import time)."""
        from inagg.hostlib.worker.communicator import Communicator

        def join(rank: int, size: int) -> Communicator:
            """Rank ``rank`` of ``size`` workers joins the job (a host's leader: of its hosts)."""
            return Communicator(self._start_store(store, prefix), rank, size, self.endpoint.controller,
                                bind_ip=self.endpoint.bind_ip, timeout=self.timeout.total_seconds(),
                                name=os.environ.get("TORCHELASTIC_RUN_ID", ""), **kwargs)

        return join(self._group.rank(), self._group.size()) if self.host is None else HostCommunicator(self.host, join)

    def _reproducible(self, store: dist.Store) -> FixedPointGloo:
        """For ``INAGG_REPRODUCIBLE`` (on by default): one ``Reduction`` for every path, so a float call
        gives the same bits whichever it takes (``inagg.hostlib.pytorch.reproducible``). The
        communicators' streams share its exponent block (a multiple of each one's K: its first
        grant's, or a job on one host's ``ONE_HOST_VALUES_PER_PACKET``) and the limit of calls
        that ride in the control round (the smallest capacity); the gloo path runs their
        arithmetic. Decided from the first grants, the same on every rank."""
        comms = [c for c in (self.comm, self.lane) if c is not None]
        size = self._group.size()
        ks = [c.grant.values_per_packet if c.grant is not None else ONE_HOST_VALUES_PER_PACKET for c in comms]
        reduction = Reduction(block=math.lcm(*ks), exact_limit=max(0, min(one_round_capacity(k, size, True) for k in ks)))
        for comm in comms:
            if not isinstance(comm, HostCommunicator):
                comm.stream.reduction = reduction
        if self.host is not None:   # its leader's calls between hosts are int32 sums
            self.host.reduce.reduction = reduction
        return FixedPointGloo(lambda: self._gloo_group(store, "gloo-fixed"), size, reduction)

    def shutdown(self) -> None:
        """Leave the inagg job; rank 0 stops the local deployment it started once every rank
        is done with it. Called by ``dist.destroy_process_group``; idempotent."""
        if self.closed:
            return
        self.closed = True
        atexit.unregister(self._close_at_exit)
        # what the start joins must be there to be left; after a failure, what it has once it
        # gave up (at its next wait, ``_start_stop``): it leaves what it joins later itself
        self._started.wait(_GIVE_UP_SECONDS if self.failure() is not None else None)
        self._leave()
        if not self.is_ready:
            return
        # what carried the calls on rank 0 (the same on every rank); every rank's stats in DEBUG:
        # each worked out only where it is logged (the stats make a path chooser a job on one
        # host's tiny calls never made, milliseconds on the way to the next init_process_group)
        if self._group.rank() == 0 and paths_log.isEnabledFor(logging.INFO):
            paths_log.info("inagg: process group closed; allreduces by carrier: %s",
                           by_carrier(self._dispatch.volume(), route_names(self)))
        if log.isEnabledFor(logging.DEBUG):
            log.debug("rank %d: inagg process group closed: %s", self._group.rank(), self._group.stats())

    def _close_at_exit(self) -> None:
        """At interpreter exit, a group still open (the script ended without
        ``destroy_process_group``, or a Ctrl-C ended it) leaves as ``shutdown`` does, saying
        it exits (the other ranks' calls then fail at once, naming it) and while threads can
        still run: a gloo or communicator thread still running when the interpreter finalizes
        aborts the process. A second Ctrl-C (torchrun forwards one) does not cut it short.
        After a Ctrl-C, rank 0 says what became of the job in one line."""
        if self.closed:
            return
        self.closed = True
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        self._started.wait(_EXIT_WAIT_SECONDS)
        if interrupts.interrupted() and self.fixed is not None:
            # the program let go of its calls: one queued on the fixed-point path would wait in
            # gloo for a peer that never sends its part (it was interrupted before queueing it)
            self.fixed.fail(lambda: InaggError("inagg: interrupted (Ctrl-C) before this call ran"))
        self._leave(_EXIT_WAIT_SECONDS, how=EXIT)
        if interrupts.interrupted() and self._group.rank() == 0:
            job = (f"job {self.comm.job_id}" if self.comm is not None and self.comm.job_id is not None
                   else "the job" if self.comm is not None else "the job (still starting)")
            stopped = " and its local deployment stopped" if self.endpoint and self.endpoint.services else ""
            print(f"inagg: interrupted: {job} ended{stopped}", file=sys.stderr, flush=True)

    def _leave(self, timeout: float = 30.0, how: bytes = LEAVE) -> None:
        """Leave the jobs joined so far, let the inner gloo group go (its connections close, so
        a peer's gloo call stuck on this rank after a failure ends), leave the peer watch
        (``how``; rank 0, where it stops a local deployment after, waits up to ``timeout`` for
        the other ranks to leave or end, unless the group failed: a failed job's ranks call its
        controller no more) and stop the local deployment this rank started."""
        with self._leave_lock:
            self._close_communicators()
            self._release_gloo()
            self._close_watch(timeout, how)

    def _leave_paths(self) -> None:
        """Leave what the start joined (it failed): the inner gloo group stays, the program's
        other collectives go on until ``destroy_process_group``."""
        with self._leave_lock:
            self._close_communicators()
            self._close_watch(0.0, LEAVE)

    def _close_communicators(self) -> None:
        """Close every path's communicator, the fixed-point gloo path and the host group."""
        for comm in (self.lane, self.comm):
            if comm is not None:
                comm.close()
        if self.fixed is not None:
            self.fixed.close()
        if self.host is not None:
            self.host.close()

    def _close_watch(self, timeout: float, how: bytes) -> None:
        """Leave the peer watch, then stop the local deployment this rank started (``_leave``):
        only then does rank 0 wait for the others (nothing else of it serves them: a job on one
        host's ranks go on to their next ``init_process_group`` at once, as gloo's do)."""
        if self.peers is not None:
            serving = self.endpoint is not None and self.endpoint.services is not None
            self.peers.close(how, wait=timeout if serving and self.failure() is None else 0)
        if self.endpoint is not None:
            self.endpoint.close()

    def _release_gloo(self) -> None:
        """Destroy the inner gloo group (its backend and the process group around it) now, while
        the interpreter runs: its destructor joins its worker threads. A worker still letting go
        of a finished call (a tensor Python owns) needs the GIL; once the interpreter is
        finalizing, Python ends such a thread with a forced unwind that std::terminate()s the
        process (SIGABRT, "terminate called without an active exception", seen with PyTorch's own
        gloo groups, which outlive destroy_process_group under DDP). Nothing else holds the inner
        group (the dispatch lets go of its gloo run's latest Work first), so dropping it destroys
        it (torch releases the GIL in that destructor). After a failure a failed call's Work may
        still hold its gloo context (and its connections: a peer's call stuck on them ends only
        when they close) in an exception's reference cycle: collected now."""
        if self._dispatch is not None:
            self._dispatch.forget_run()
        self.gloo.release()
        if self.failure() is not None:
            gc.collect()

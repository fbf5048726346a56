"""The ``dist.Work`` objects the ``inagg`` process group returns (``inagg.hostlib.pytorch.backend``).

Design: a Work of a path of ours (``_CallWork``) waits on the call's own future in slices on a
Python lock, so a Ctrl-C is raised at once and a rank gone ends the wait (``_wait_for``), and
raises the call's error naming that rank (the group's ``named``); its future, when a caller
takes one (DDP, comm hooks), is delivered off the communicator's I/O thread (``_resolve_to``).
A call done on the caller's thread (a tiny call in C++) returns a Work that is complete
(``_DoneWork``). A Work of the inner gloo group is wrapped the same way (``_GlooWork``); a timed call reports its
time where its caller waits (``_TimedWork``); reduce-scatters run as allreduces keep their
shard once every allreduce is done (``_ShardWork``).
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Callable

import torch
import torch.distributed as dist

from inagg.hostlib.pytorch.outside_dynamo import torch_calls
from inagg.hostlib.pytorch.peer_watch import wait_gloo

if TYPE_CHECKING:
    from inagg.hostlib.pytorch.backend import InaggProcessGroup

# a Work's methods torch calls (kept out of Dynamo: ``inagg.hostlib.pytorch.outside_dynamo``)
_WORK_CALLS = ("wait", "get_future", "is_completed")

# a wait on a call of ours looks this often whether a rank has gone (which no path may report)
_FAILURE_CHECK_SECONDS = 0.2


Named = Callable[[BaseException], BaseException]   # an error, or one naming the rank gone that caused it


def _settle(out: torch.futures.Future, fut: torch.futures.Future, value, named: Named) -> None:
    """Complete ``out`` (a future made by ``_resolve_to``, not the one it returns) with ``value``
    if ``fut`` succeeded, else with ``fut``'s error (``named``) as its value: ``_raise_failure``
    raises it into the future its caller holds."""
    try:
        fut.value()
        out.set_result(value)
    except Exception as e:  # noqa: BLE001 - handed on to whoever waits on ``out``
        out.set_result(_Failure(named(e)))


class _Failure:
    """A call's error carried as a future's value (``_settle``) to ``_raise_failure``."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


def _raise_failure(fut: torch.futures.Future):
    """``fut``'s value, or the error it carries raised: a future torch's C++ sees failed."""
    value = fut.value()
    if isinstance(value, _Failure):
        raise value.error
    return value


def _resolve_to(fut: torch.futures.Future, value, named: Named) -> torch.futures.Future:
    """A future of ``value`` once the communicator's ``fut`` succeeds (else failed with its error,
    ``named``). Already complete if ``fut`` is (a call run on the caller's thread): callbacks then
    run on the caller's thread. Otherwise delivered on a thread of its own: the communicator
    completes its futures on its one I/O thread, and a callback that waits there for another
    allreduce (PowerSGD's hook does) would wait for itself. (gloo's callbacks run on one of its
    worker threads.)

    The error is raised in a ``then`` callback, never set with ``Future.set_exception``: that
    completes the C++ future *successfully* with the exception object as its value (only Python's
    ``wait``/``value`` raise it), and DDP's reducer, reading a bucket's result in C++ at the end
    of the backward pass, takes that value for the bucket's tensors: it finds none and reads past
    an empty list (SIGSEGV in ``parseCppCommHookResult``). A ``then`` callback that raises fails
    its future in C++ (``setError``), so the reducer raises it: a RuntimeError whose text is the
    error's type and message, as for any failed c10d future."""
    settled = torch.futures.Future()
    out = settled.then(_raise_failure)
    if fut.done():
        _settle(settled, fut, value, named)
    else:
        fut.add_done_callback(lambda f: threading.Thread(target=_settle, args=(settled, f, value, named), daemon=True,
                                                         name="inagg-complete").start())
    return out


def _wait_for(fut: torch.futures.Future, failure: Callable[[], BaseException | None],
              timeout: timedelta | None = None) -> None:
    """Wait for ``fut`` on a Python lock, not in torch's C++ wait: a Ctrl-C is raised at once,
    and the wait ends with ``failure()`` (a rank gone or stopped) should the call never end, or
    with a RuntimeError once ``timeout`` (None or 0: none) has passed, as gloo's wait does."""
    done = threading.Event()
    fut.add_done_callback(lambda _: done.set())
    deadline = time.monotonic() + timeout.total_seconds() if timeout else None
    while not done.wait(_FAILURE_CHECK_SECONDS):
        error = failure()
        if error is not None:
            raise error
        if deadline is not None and time.monotonic() >= deadline and not done.is_set():
            raise RuntimeError(f"the call did not complete within its timeout ({timeout}): no rank is known "
                               f"gone (a rank that stops is named once its lease runs out)")


@torch_calls(*_WORK_CALLS)
class _CallWork(dist.Work):
    """The Work of one call on a path of ours: ``wait`` waits on the call's own future ``done``
    and raises its error, ``named`` (the Work of torch's ``_create_work_from_future`` returns
    True from a failed future: ``dist.all_reduce`` would return as if the call had succeeded);
    a caller that takes its future (DDP, comm hooks) gets ``result()``, made on first use."""

    def __init__(self, done: torch.futures.Future, result: Callable[[], torch.futures.Future],
                 pg: "InaggProcessGroup") -> None:
        super().__init__()
        self._done, self._result, self._future, self._pg = done, result, None, pg

    def wait(self, timeout: timedelta | None = None) -> bool:
        try:
            if not self._done.done():
                _wait_for(self._done, self._pg.failure, timeout if timeout is not None else self._pg.lifecycle.timeout)
            self._done.value()   # raises the call's error
        except Exception as e:  # noqa: BLE001 - re-raised, naming the rank gone that caused it
            raise self._pg.named(e)
        return True

    def get_future(self) -> torch.futures.Future:
        if self._future is None:
            self._future = self._result()
        return self._future

    def is_completed(self) -> bool:
        return self._done.done()


@torch_calls(*_WORK_CALLS)
class _DoneWork(dist.Work):
    """The Work of a call that succeeded before it was returned (``AllreduceDispatch._tiny``):
    nothing to wait for; its future, made on first use, holds ``[tensor]`` (as gloo's)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        super().__init__()
        self._tensor = tensor

    def wait(self, timeout: timedelta | None = None) -> bool:
        return True

    def get_future(self) -> torch.futures.Future:
        fut = torch.futures.Future()
        fut.set_result([self._tensor])
        return fut

    def is_completed(self) -> bool:
        return True


def failed_work(error: Exception, tensor: torch.Tensor, pg: "InaggProcessGroup") -> dist.Work:
    """The Work of a call that failed on the caller's thread with ``error``: raised by ``wait``
    (named) and into its future, as a call's error on a communicator's thread is."""
    fut = torch.futures.Future()
    fut.set_exception(error)
    return _CallWork(fut, lambda: _resolve_to(fut, [tensor], pg.named), pg)


@torch_calls(*_WORK_CALLS, "_source_rank")
class _GlooWork(dist.Work):
    """A Work of the inner gloo group, waited for in slices (``wait_gloo``: Ctrl-C and a rank
    gone end the wait) and its error naming the rank gone that caused it; its future likewise."""

    def __init__(self, work: dist.Work, pg: "InaggProcessGroup") -> None:
        super().__init__()
        self._work, self._pg = work, pg

    def wait(self, timeout: timedelta | None = None) -> bool:
        try:
            return wait_gloo(self._work, self._pg.failure, timeout if timeout is not None else self._pg.lifecycle.timeout)
        except Exception as e:  # noqa: BLE001 - re-raised, naming the rank gone that caused it
            raise self._pg.named(e)

    def get_future(self) -> torch.futures.Future:
        named = self._pg.named

        def value(f: torch.futures.Future):
            try:
                return f.value()
            except Exception as e:  # noqa: BLE001 - re-raised, naming the rank gone that caused it
                raise named(e)

        return self._work.get_future().then(value)

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def _source_rank(self) -> int:
        """The rank a receive from any source got its tensor from (``dist.recv`` asks)."""
        return self._work._source_rank()


@torch_calls(*_WORK_CALLS)
class _TimedWork(dist.Work):
    """A path's Work that reports when it is done (``on_done``, once), timed where it is waited
    for: in ``wait`` on the caller's thread, which costs the call nothing and counts the
    caller's wake-up on every path alike, so every path's time is what its callers see. Only a
    caller that takes its future (DDP) gets a callback on it instead: gloo runs future callbacks
    on its own thread before waiters learn the call is done, so a callback on every call would
    delay the calls themselves."""

    def __init__(self, work: dist.Work, on_done: Callable[[], None]) -> None:
        super().__init__()
        self._work, self._on_done = work, on_done

    def _done(self) -> None:
        on_done, self._on_done = self._on_done, None
        if on_done is not None:
            on_done()

    def wait(self, timeout: timedelta | None = None) -> bool:
        ok = self._work.wait() if timeout is None else self._work.wait(timeout)
        self._done()
        return ok

    def get_future(self) -> torch.futures.Future:
        fut = self._work.get_future()
        fut.add_done_callback(lambda _: self._done())
        return fut

    def is_completed(self) -> bool:
        return self._work.is_completed()


@torch_calls(*_WORK_CALLS)
class _ShardWork(dist.Work):
    """The Work of reduce-scatters on inagg's paths (``inagg.hostlib.pytorch.reduce_scatter``):
    ``calls`` are (output, full, work), ``full`` the tensor ``work`` allreduces, or None where
    ``work`` writes the shard into ``output`` itself; once every ``work`` is done, this rank's
    shard of each ``full`` is copied to its output, once, on
    whichever thread learns it first (``wait`` or the future's callback). ``wait`` raises a
    call's error; the future resolves to the outputs (as gloo's reduce-scatter's)."""

    def __init__(self, calls: list[tuple[torch.Tensor, torch.Tensor | None, dist.Work]], rank: int) -> None:
        super().__init__()
        self._calls, self._rank = calls, rank
        self._lock, self._kept = threading.Lock(), False

    @classmethod
    def whole(cls, output: torch.Tensor, staged: torch.Tensor, work: dist.Work) -> "_ShardWork":
        """The Work of ``work`` (an allreduce of ``staged``, a contiguous copy of ``output``)
        that copies the sum back into ``output``: rank 0's shard of a tensor of the output's
        size is all of it."""
        return cls([(output, staged, work)], 0)

    def _keep_shards(self) -> list[torch.Tensor]:
        with self._lock:
            if not self._kept:
                for output, full, _ in self._calls:
                    if full is None:
                        continue
                    n = output.numel()
                    output.copy_(full.view(-1)[self._rank * n:(self._rank + 1) * n].view_as(output))
                self._kept = True
        return [output for output, _, _ in self._calls]

    def wait(self, timeout: timedelta | None = None) -> bool:
        for _, _, work in self._calls:
            work.wait(timeout) if timeout is not None else work.wait()
        self._keep_shards()
        return True

    def get_future(self) -> torch.futures.Future:
        def kept(f: torch.futures.Future) -> list[torch.Tensor]:
            for done in f.value():
                done.value()   # raises a call's error into the returned future
            return self._keep_shards()

        return torch.futures.collect_all([work.get_future() for _, _, work in self._calls]).then(kept)

    def is_completed(self) -> bool:
        return all(work.is_completed() for _, _, work in self._calls)


"""Host-local reduce: the ranks of one host sum in shared memory, and one leader per host takes
part in the job's round between hosts, so the switch sees one worker per host.

**Exact, and the switch path's bits.** The result is bit-identical to the job's result when
every rank is a switch worker (N = all the job's ranks), because a host sums exactly what the
switch would have summed, as integers, whose sums have no order:

* int32: wrapping int32 sums.
* floats (float32, float16, bfloat16: ``codec.FLOAT_DTYPES``) are widened to float32 as each
  rank copies them into the shared buffer (exact), summed as below, and the float32 result is
  rounded once to each rank's own format as it copies it out: what the streams send and return.
* floats of at most ``one_round_capacity(K, N)`` values (the calls that ride in the control
  round): the exact fixed-point limbs of ``codec.fixed_encode`` for N ranks; the summed limbs
  are the exact sum, rounded once to float32.
* larger floats: every block of K values (the grant's K) is scaled by the largest of all the
  job's ranks' block exponents (a host's largest, then the hosts' largest) and quantized with
  ``codec.shift_for(N)``; the int32 sums of a host's ranks and then of the hosts are the switch's
  sums of all N, dequantized once (``native/host_reduce.cpp``). AVG then divides by N.
* a job that wants the same bits on every path (``HostReduce.reduction``, set by the backend:
  ``inagg.hostlib.pytorch.reproducible``) uses its ``Reduction``: blocks of its ``block`` values and
  its ``exact_limit`` on the calls that ride in the control round, as every other path does.
* inf/NaN or |x| >= 2**127 anywhere: as on the switch path, the call fails on every rank with
  ``FloatingPointError``; the blocks holding them are left unchanged (one-round calls: all).

**A call on one host** (messages through ``inagg.hostlib.worker.host_group``'s star; the data in its
shared memory): every rank copies its tensor into its row of the buffer (with its block
exponents), then says READY with its tensor's description; the leader checks them (a refusal
or a mismatch fails the call on every rank with the same ``CallRefused``, naming ranks), makes
the buffer larger if a rank had no room (GROW, then READY again), and has each rank reduce one
range of the values (SEGMENT, DONE), or reduces it alone when the call is small
(``SERIAL_VALUES``): one exchange of messages less. RESULT: every rank copies the result out,
or in a reduce-scatter (a ``Shard``) only its own shard, into its output: the input is only
read (copied into the buffer), and each rank moves S/N of the result out of shared memory, not S.

**Between hosts** (H > 1) the leader runs int32 calls on its Communicator, a job of H workers.
Each host-call's first such call carries, ahead of its data, every host's tensor description
and overflow flag (each host writes only its own words, so the sum hands every host every
host's), or why the host refuses it (a rank that died, a refusal or mismatch among its ranks):
every host learns the same verdict from the same call, so all fail together or all go on, and
their calls stay aligned. Blocks of float32 make two calls: the block exponents (each host's
in its own lanes: an exchange through the sum), then the quantized sums. In a reduce-scatter
the call of the sums (an int32 call's only one) keeps only the host's part (``_host_part``: its
ranks' shards end to end, after the hosts' words): the leader's blocks wholly in it carry
FLAG_MINE, the other hosts' come as headers alone (``Communicator.allreduce``'s ``keep``), and
each rank dequantizes only its own shard. A host whose ranks are not consecutive (Slurm's cyclic
placement: ranks 0 and 2 on one host) keeps several ranges, one per run of consecutive ranks
(docs/protocol.md, "Reduce-scatter").

A rank that dies is named (``RankDied``) on every rank of its host at once (its socket
closes), and by the next call between hosts on every other host; every later call raises it.
A rank that stops without ending is named by the job's failure (``failed``: the backend's peer
watch sets it through ``HostGroup.fail`` once the rank's lease ran out), which ends every wait
for a rank of the host (``inagg.hostlib.worker.host_group``); so does the group's timeout.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import numpy as np

from inagg.hostlib.errors import InaggError, JobFailed
from inagg.hostlib.native_build import _native
from inagg.hostlib.wire import codec
from inagg.hostlib.worker.host_group import (HostLayout, Link, Message, RankDied, SharedBuffer, Stop, never,
                                             receive_all)
from inagg.hostlib.worker.call_protocol import (
    CallRefused, CallSpec, Part, Refusal, Shard, check_part, one_round_capacity, overflow_error,
)
from inagg.hostlib.worker.stream_base import AllreduceError, Reduction

_READY, _GROW, _SEGMENT, _DONE, _RESULT, _ERROR = range(6)
_INT, _ONE_ROUND, _BLOCKS = range(3)                  # how a call is summed
_SUM_INT, _SUM_FLOAT, _SUM_QUANTIZED, _DEQUANTIZE = range(4)   # what a SEGMENT asks for
_DIED, _REFUSED = 1, 2                                # why a host refuses a call between hosts
# a call of fewer values (all the host's ranks' together) is reduced by the leader alone
SERIAL_VALUES = 1 << 18
_ALIGN = 64
# errors a leader hands to its host's ranks, by index (anything else arrives as InaggError)
_ERRORS = (RankDied, JobFailed, CallRefused, FloatingPointError, AllreduceError, InaggError)
_TINY_DTYPES = (np.dtype(np.float32), np.dtype(np.int32))   # what C++ takes (``host_tiny``)


class TinyPlan(NamedTuple):
    """A kind of tiny call as C++ needs it (``HostReduce.tiny_plan``): its word, whether it rides
    in one round (float32; else int32), the ends of its two regions (``_areas``' in_end and
    out_end), where its int32 sums (after the hosts' words) and its float result lie in the
    second region, and the K the leader answers (a job without a grant: its own)."""

    word: int
    one_round: bool
    in_end: int
    out_end: int
    wire_at: int
    result_at: int
    k_next: int


@dataclass
class _Call:
    """One call as this rank sees it; ``word`` is its control-vector word (stream.ControlVector:
    size << 2 | average << 1 | is_float, or minus the refusal)."""

    call: int
    x: np.ndarray | None
    word: int
    k: int
    n_ranks: int
    n_workers: int
    n_hosts: int
    mode: int = _INT
    divisor: float = 1.0
    next_area: str = ""   # the area of the next call between hosts ('': none is left)
    shard: Shard | None = None   # a reduce-scatter's: only this part of the result, into its output
    host_part: Part | None = None   # a reduce-scatter's values this host's leader owns
    areas: dict[str, tuple[int, int, object, int]] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return 0 if self.word < 0 else self.word >> 2

    @property
    def is_float(self) -> bool:
        return self.word >= 0 and bool(self.word & 1)

    @property
    def n_blocks(self) -> int:
        return -(-self.n // self.k)


def _word(x: np.ndarray | None, average: bool, refusal: Refusal | None) -> int:
    if refusal is not None:
        return -(int(refusal.code) | refusal.detail << 4)
    return x.size << 2 | int(average) << 1 | int(codec.is_float(x.dtype))


def _mode(c: _Call, reduction: Reduction) -> int:
    if not c.is_float:
        return _INT
    rides = reduction.rides(one_round_capacity(c.k, c.n_workers, True), True)
    return _ONE_ROUND if c.n <= rides else _BLOCKS


def _body(c: _Call) -> int:
    """int32 values after the hosts' words in the first call between hosts."""
    if c.mode == _INT:
        return c.n
    if c.mode == _ONE_ROUND:
        return c.n * codec.fixed_limbs(c.n_workers)
    return c.n_hosts * c.n_blocks


def _areas(c: _Call) -> dict[str, tuple[int, int, object, int]]:
    """Where the call's arrays lie in the shared buffer: name -> (region, offset, dtype, count). Two
    regions: the ranks' inputs ("in", from the buffer's start) and what the leader and the
    segments write ("out", from ``SharedBuffer.split``). A rank that starts the next call writes
    only its own input rows, so a rank still copying this call's result out is never overwritten.
    Worked out once per kind of call (``_layout``; a training job repeats a few) and only read."""
    return _layout(c.n, c.is_float, c.mode, c.k, c.n_ranks, c.n_hosts, _body(c))


@functools.lru_cache(maxsize=256)
def _layout(n: int, is_float: bool, mode: int, k: int, n_ranks: int, n_hosts: int,
            body: int) -> dict[str, tuple[int, int, object, int]]:
    """``_areas`` of a call of ``n`` values (``body``: its int32 values between hosts)."""
    blocks = -(-n // k) if mode == _BLOCKS else 0
    regions = [[("x", np.float32 if is_float else np.int32, n_ranks * n),
                ("exps", np.int8, n_ranks * blocks), ("bad", np.uint8, n_ranks * blocks), ("in_end", np.uint8, 0)],
               [("agreed", np.int8, blocks), ("any_bad", np.uint8, blocks),
                ("wire", np.int32, 2 * n_hosts + body), ("result", np.float32, n if is_float else 0),
                ("sums", np.int32, 2 * n_hosts + n if mode == _BLOCKS and n_hosts > 1 else 0),
                ("out_end", np.uint8, 0)]]
    areas = {}
    for region, sizes in enumerate(regions):
        offset = 0
        for name, dtype, count in sizes:
            areas[name] = (region, offset, dtype, count)
            offset += -(-count * np.dtype(dtype).itemsize // _ALIGN) * _ALIGN
    return areas


class HostReduce:
    """This rank's part in its host's calls (module docstring). Calls run one at a time, in the
    same order on every rank of the job (the caller's ``inagg.hostlib.worker.host_communicator``)."""

    def __init__(self, layout: HostLayout, links: dict[int, Link], timeout: float | None = None) -> None:
        """``timeout``: the longest wait for a rank of the host, in seconds (the process group's)."""
        self.layout, self.links, self.timeout = layout, links, timeout
        self.failed: BaseException | None = None   # the job's failure, which ends every wait (``HostGroup.fail``)
        self.n_workers = layout.world_size
        self.shift = codec.shift_for(self.n_workers)
        self.buffer: SharedBuffer | None = None
        self.reduction = Reduction()   # the job's, when it wants the same bits on every path
        self.calls = 0
        self.broken: Exception | None = None
        # result_bytes: what the calls' results moved out of shared memory to this rank
        self.stats = {"calls": 0, "local_bytes": 0, "result_bytes": 0, "calls_between_hosts": 0, "seconds": 0.0}

    def allreduce(self, x: np.ndarray | None, average: bool, refusal: Refusal | None, k: int, comm=None,
                  shard: Shard | None = None) -> int:
        """Sum (``average``: mean) ``x`` over the job's ranks, in place, or with ``shard`` (a
        reduce-scatter) only the shard's values of the sum into its output, ``x`` left as it was.
        ``k``: the values per packet of the path's grant (the leader's ``comm``'s; ``comm`` is the
        leader's Communicator of the path, None on the other ranks). Returns the K of the path's
        next call (the leader's grant may have changed); raises what failed, on every rank alike."""
        started = time.perf_counter()
        c = self._new_call(self.calls, x, average, refusal, k, shard)
        self.calls += 1
        if self.broken is not None:   # the leader still fails each call between hosts, naming the rank
            if self.layout.leader:
                self._refuse_between_hosts(c, comm.allreduce if c.n_hosts > 1 else None, _DIED, self.broken.rank)
                self._tell(c, self.broken)   # the host's other ranks wait for this call's answer
            raise self.broken
        return self._done(c, started, lambda: self._lead(c, comm) if self.layout.leader else self._follow(c))

    def _new_call(self, call: int, x: np.ndarray | None, average: bool, refusal: Refusal | None, k: int,
                  shard: Shard | None) -> _Call:
        """Call number ``call`` of ``x`` as this rank sees it: how it is summed and where it lies."""
        c = _Call(call, x, _word(x, average, refusal), self.reduction.block or k, len(self.layout.local),
                  self.n_workers, len(self.layout.hosts), shard=shard if refusal is None else None)
        c.mode = _mode(c, self.reduction)
        c.areas = _areas(c)
        c.next_area = "wire" if c.n_hosts > 1 else ""
        c.host_part = _host_part(self.layout, c.shard)
        return c

    def _done(self, c: _Call, started: float, run: Callable[[], int]) -> int:
        """``run()`` (the call's part of the protocol, returning the next call's K), then the call counted."""
        try:
            k_next = run()
        except RankDied as e:
            self.broken = e
            raise
        self.count(c.n, c.x.itemsize * (c.n if c.shard is None else c.shard.out.size) if c.n else 0, started)
        return k_next

    def count(self, n: int, result_bytes: int, started: float) -> None:
        """A call of ``n`` values done, ``result_bytes`` of its result moved out to this rank."""
        stats = self.stats
        stats["calls"] += 1
        stats["local_bytes"] += 4 * n
        stats["result_bytes"] += result_bytes
        stats["seconds"] += time.perf_counter() - started

    # -- tiny calls in C++ (``inagg.hostlib.worker.host_tiny``) ---------------------------------------

    def tiny_plan(self, x: np.ndarray, average: bool, k: int) -> TinyPlan | None:
        """What C++ needs to know of a call of ``x``'s kind (``host_tiny``), from this protocol;
        None where it does not take such a call: not float32 or int32, between hosts, in blocks
        (the exact limit is lower) or reduced in parallel."""
        if x.dtype not in _TINY_DTYPES or len(self.layout.hosts) > 1 or (average and x.dtype != np.float32):
            return None
        c = self._new_call(0, x, average, None, k, None)
        if c.mode == _BLOCKS or not _serial(c):
            return None
        a = c.areas
        return TinyPlan(c.word, c.mode == _ONE_ROUND, a["in_end"][1], a["out_end"][1], a["wire"][1] + 8 * c.n_hosts,
                        a["result"][1], c.k)

    def carry_on(self, call: int, x: np.ndarray, average: bool, k: int, status: int, taken: list[tuple],
                 sent: int, started: float) -> int:
        """Tiny call number ``call``, handed over by C++ with ``status`` (``host_tiny``): this
        protocol carries on where C++ stopped, with the messages it received (``taken``), or
        after a RESULT it sent to the first ``sent`` ranks only. Returns the next call's K."""
        c = self._new_call(call, x.reshape(-1), average, None, k, None)
        got = {i: Message(kind, number, a, b, cc, text, fd if fd >= 0 else None)
               for i, kind, number, a, b, cc, text, fd in taken}
        if status == _native.TINY_SEND_FAILED:
            return self._done(c, started, lambda: self._send_result(c, c.k, "", sent))
        if self.layout.leader:
            return self._done(c, started, lambda: self._lead(c, None, got))
        sent_ready = status != _native.TINY_NOT_SENT
        return self._done(c, started, lambda: self._follow(c, sent_ready, got.get(0)))

    def share_buffer(self, stop: Stop = never) -> None:
        """The host's first shared buffer, made at the start (a collective of the host's ranks):
        the leader's, handed to every rank as a GROW, so the job's first call needs no GROW round
        (a start's time: two messages and a wake-up each fewer). The others' wait for it ends
        with ``stop()``'s error (the start's: a rank named gone) or this group's failure."""
        if self.layout.leader:
            self._use(SharedBuffer.create(2 * _megabytes(0), _megabytes(0)))
            for link in self.links.values():
                link.send(Message(_GROW, 0, self.buffer.nbytes, self.buffer.split, fd=self.buffer.fd))
            return
        link = self.links[0]
        link.wait_readable(lambda: stop() or self._stop(), self.timeout)
        m = link.recv()
        if m.kind != _GROW or m.fd is None:
            raise InaggError(f"rank {self.layout.rank}: expected the host's shared buffer from {link.peer}, "
                             f"got message kind {m.kind}: the host's ranks run different versions of inagg?")
        self._use(SharedBuffer(m.fd, m.a, m.b))

    def _stop(self) -> BaseException | None:
        """Why a wait for a rank of the host ends now: the job failed (``failed``; an error of its
        own each time: a raised error keeps the frames it passed), else None."""
        e = self.failed
        if e is None:
            return None
        return RankDied(e.rank, str(e)) if isinstance(e, RankDied) else JobFailed(str(e))

    # -- the shared buffer -----------------------------------------------------------------------

    def _view(self, c: _Call, name: str) -> np.ndarray:
        region, offset, dtype, count = c.areas[name]
        return self.buffer.view(offset + region * self.buffer.split, dtype, count)

    def _row(self, c: _Call, name: str, i: int) -> np.ndarray:
        per = c.areas[name][3] // c.n_ranks
        return self._view(c, name)[i * per:(i + 1) * per]

    def _write(self, c: _Call) -> bool:
        """This rank's tensor (and block exponents) into its rows; False when there is no room."""
        if c.word < 0:
            return True
        if not self._fits(c, self.buffer):
            return False
        i = self.layout.local_index
        if c.is_float:
            codec.widen_into(c.x, self._row(c, "x", i))
        else:
            np.copyto(self._row(c, "x", i), c.x)
        if c.mode == _BLOCKS:
            _native.block_exponents(self._row(c, "x", i), c.k, self._row(c, "exps", i), self._row(c, "bad", i))
        return True

    @staticmethod
    def _fits(c: _Call, buffer: SharedBuffer | None) -> bool:
        return (buffer is not None and c.areas["in_end"][1] <= buffer.split
                and c.areas["out_end"][1] <= buffer.nbytes - buffer.split)

    def _use(self, buffer: SharedBuffer) -> None:
        if self.buffer is not None:
            self.buffer.close()
        self.buffer = buffer

    def _segment(self, c: _Call, step: int) -> None:
        """Do this rank's ranges of ``step`` (all of it on the leader of a serial call)."""
        xs = [self._row(c, "x", j) for j in range(c.n_ranks)]
        result, agreed, head = self._view(c, "result"), self._view(c, "agreed"), 2 * c.n_hosts
        for begin, end in _segment_ranges(c, step, self.layout):
            if step == _SUM_INT:
                _native.host_sum_int(xs, begin, end, self._view(c, "wire")[head:])
            elif step == _SUM_FLOAT:
                _native.host_reduce_float(xs, begin, end, c.k, agreed, self.shift, c.divisor, result)
            elif step == _SUM_QUANTIZED:
                _native.host_sum_quantized(xs, begin, end, c.k, agreed, self.shift, self._view(c, "sums")[head:])
            else:
                _native.host_dequantize(self._view(c, "sums")[head:], begin, end, c.k, agreed, self.shift,
                                        c.divisor, result)

    def _copy_out(self, c: _Call, overflow: str) -> None:
        """The result into this rank's tensor, or its shard's values into the shard's output;
        with ``overflow``, the blocks holding inf/NaN keep this rank's values and the call raises
        (as on the switch path)."""
        if c.n == 0:
            return
        out = self._view(c, "result") if c.is_float else self._view(c, "wire")[2 * c.n_hosts:]
        target, first = (c.x, 0) if c.shard is None else (c.shard.out, c.shard.first)
        end = first + target.size
        if not overflow:
            _into(target, out[first:end])
            return
        # from the tensor itself: another rank's next call may already write where this one's row was
        kept = {}
        for b in np.flatnonzero(self._view(c, "any_bad")).tolist():
            lo, hi = max(first, b * c.k), min(end, (b + 1) * c.k)
            if lo < hi:
                kept[lo - first] = c.x[lo:hi].copy()
        _into(target, out[first:end])
        for at, values in kept.items():
            target[at:at + values.size] = values
        raise FloatingPointError(overflow)

    # -- the other ranks -------------------------------------------------------------------------

    def _follow(self, c: _Call, sent: bool = False, first: Message | None = None) -> int:
        """A follower's part of call ``c``: READY (unless ``sent``), then the leader's messages
        (the first of them ``first`` when C++ received it, ``host_tiny``) until its RESULT."""
        link = self.links[0]
        if not sent:
            link.send(Message(_READY, c.call, c.word, 0, int(self._write(c))))
        while True:
            if first is None:
                link.wait_readable(self._stop, self.timeout)
                m = link.recv()
            else:
                m, first = first, None
            if m.kind == _GROW:
                self._use(SharedBuffer(m.fd, m.a, m.b))
                link.send(Message(_READY, c.call, c.word, 0, int(self._write(c))))
            elif m.kind == _SEGMENT:
                c.divisor = m.b
                self._segment(c, m.a)
                link.send(Message(_DONE, c.call))
            elif m.kind == _ERROR:
                error = _ERRORS[m.a]
                raise error(m.b, m.text) if error is RankDied else error(m.text)
            else:
                self._copy_out(c, m.text)
                return m.c

    # -- the leader ------------------------------------------------------------------------------

    def _lead(self, c: _Call, comm, ready: dict[int, Message] | None = None) -> int:
        """The leader's part of call ``c``; ``ready``: the messages C++ received before it handed
        the call over (``host_tiny``; its row is written)."""
        cross = comm.allreduce if c.n_hosts > 1 else None
        try:
            self._gather(c, self._write(c) if ready is None else True, cross, ready)
            overflow = self._reduce(c, cross)
        except Exception as e:
            self._tell(c, e)
            raise
        return self._send_result(c, comm.grant.values_per_packet if comm is not None else c.k, overflow)

    def _send_result(self, c: _Call, k_next: int, overflow: str, first: int = 0) -> int:
        """RESULT to the host's ranks from local index ``first`` + 1 on, and the result into this
        rank's tensor; returns ``k_next``."""
        self._broadcast(c, Message(_RESULT, c.call, 0, 0, k_next, overflow), first)
        self._copy_out(c, overflow)
        return k_next

    def _broadcast(self, c: _Call, m: Message, first: int = 0) -> None:
        """``m`` to every other rank of the host (from the ``first``-th on). A rank found dead
        here (its socket closed) fails the call: every rank that did not get ``m`` yet gets the
        error naming it instead, so no rank takes the leader's later end for the cause (ranks
        that got ``m`` learn it at their next call)."""
        links = list(self.links.values())
        for i, link in enumerate(links[first:], first):
            try:
                link.send(m)
            except RankDied as e:
                self.broken = e
                for later in links[i + 1:]:
                    self._send_error(later, c, e)
                raise

    def _tell(self, c: _Call, e: Exception) -> None:
        """Every live rank of the host gets the call's error (the dead one cannot)."""
        index = next((i for i, t in enumerate(_ERRORS) if isinstance(e, t)), len(_ERRORS) - 1)
        text = str(e) if index < len(_ERRORS) - 1 or isinstance(e, InaggError) else f"{type(e).__name__}: {e}"
        for link in self.links.values():
            if not (isinstance(e, RankDied) and link.rank == e.rank):
                try:
                    link.send(Message(_ERROR, c.call, index, getattr(e, "rank", 0), 0, text))
                except RankDied:
                    pass

    def _send_error(self, link: Link, c: _Call, e: RankDied) -> None:
        """``e`` to ``link``'s rank as call ``c``'s error (``_tell``'s, for one rank)."""
        try:
            link.send(Message(_ERROR, c.call, _ERRORS.index(RankDied), e.rank, 0, str(e)))
        except RankDied:
            pass

    def _gather(self, c: _Call, wrote: bool, cross, got: dict[int, Message] | None = None) -> None:
        """Every rank READY with the same call (``got``: those received already); the buffer made
        larger if a rank had no room."""
        ready = self._receive(c, cross, got)
        self._check_ranks(c, ready, cross)
        if wrote and all(m.c for m in ready.values()):
            return
        old = self.buffer
        split = max(_megabytes(c.areas["in_end"][1]), old.split if old else 0)
        out = max(_megabytes(c.areas["out_end"][1]), old.nbytes - old.split if old else 0)
        self._use(SharedBuffer.create(split + out, split))
        for link in self.links.values():
            link.send(Message(_GROW, c.call, split + out, split, fd=self.buffer.fd))
        self._write(c)
        self._receive(c, cross)

    def _receive(self, c: _Call, cross, got: dict[int, Message] | None = None) -> dict[int, Message]:
        """One message from every other rank (``got``: those received already); a dead rank fails
        the call here and between hosts."""
        try:
            return receive_all(self.links, self._stop, self.timeout, got)
        except RankDied as e:
            self.broken = e
            self._refuse_between_hosts(c, cross, _DIED, e.rank)
            raise

    def _check_ranks(self, c: _Call, ready: dict[int, Message], cross) -> None:
        """Raise the call's ``CallRefused`` when a rank refused it or the ranks' calls differ."""
        words = {self.layout.rank: c.word} | {self.layout.local[i]: m.a for i, m in ready.items()}
        calls = {self.layout.local[i]: m.call for i, m in ready.items()}
        problem = ""
        if any(call != c.call for call in calls.values()):
            problem = (f"allreduce call numbers differ across ranks (rank {self.layout.rank}: call {c.call}, "
                       + ", ".join(f"rank {r}: call {n}" for r, n in sorted(calls.items())) + ")")
        elif min(words.values()) < 0:
            problem = f"allreduce call {c.call} refused: " + "; ".join(
                f"rank {r} passed {Refusal.describe_word(w)}"
                for r, w in sorted(words.items()) if w < 0)
        elif len(set(words.values())) > 1:
            problem = "allreduce tensors differ across ranks (" + ", ".join(
                f"rank {r}: {_spec(w).describe()}" for r, w in sorted(words.items())) + ")"
        if problem:
            first = min((r for r, w in words.items() if w < 0), default=self.layout.rank)
            self._refuse_between_hosts(c, cross, _REFUSED, first)
            raise CallRefused(problem)

    def _refuse_between_hosts(self, c: _Call, cross, why: int, rank: int) -> None:
        """Take part in the host-call's first call between hosts with this host's refusal, so
        every other host fails the same call, naming ``rank``."""
        area, c.next_area = c.next_area, ""
        if cross is None or not area:
            return
        wire = np.zeros(c.areas[area][3], np.int32)
        wire[self.layout.host] = -(why | rank << 4)
        try:
            cross(wire, keep=_keep(c, area))
        except Exception:  # noqa: BLE001 - this host's own error is the one raised
            pass

    # -- the sums ----------------------------------------------------------------------------------

    def _reduce(self, c: _Call, cross) -> str:
        """The call's sums into the buffer; returns the overflow error's text ('' if none)."""
        if c.mode == _INT or c.n == 0:
            if c.n:
                self._steps(c, _SUM_INT, cross)
            return self._between_hosts(c, cross, "wire", 0) if cross else ""
        if c.mode == _ONE_ROUND:
            return self._reduce_one_round(c, cross)
        return self._reduce_blocks(c, cross)

    def _steps(self, c: _Call, step: int, cross) -> None:
        """Every rank does its range of ``step`` (the leader alone in a serial call)."""
        if not _serial(c):
            self._broadcast(c, Message(_SEGMENT, c.call, step, int(c.divisor)))
        self._segment(c, step)
        if not _serial(c):
            self._receive(c, cross)

    def _between_hosts(self, c: _Call, cross, area: str, overflow: int) -> str:
        """A call between hosts on ``area``: the hosts' words, then its data; raises what some
        host refused. Returns the overflow error's text if any host flagged one."""
        wire = self._view(c, area)
        h, hosts = self.layout.host, c.n_hosts
        wire[:2 * hosts] = 0
        wire[h], wire[hosts + h] = c.word, overflow
        c.next_area = ""
        cross(wire, keep=_keep(c, area))
        self.stats["calls_between_hosts"] += 1
        _check_hosts(wire[:hosts], self.layout)
        if area == "wire" and c.mode == _BLOCKS:
            c.next_area = "sums"
        return overflow_error([0], c.k).args[0] if wire[hosts:2 * hosts].any() else ""

    def _reduce_one_round(self, c: _Call, cross) -> str:
        """The exact fixed-point limbs of every rank, summed (by the leader: a small call)."""
        limbs = self._view(c, "wire")[2 * c.n_hosts:]
        limbs[:] = 0
        mine = np.empty_like(limbs)
        good = True
        for j in range(c.n_ranks):
            good &= _native.fixed_encode(self._row(c, "x", j), c.n_workers, mine)
            np.add(limbs, mine, out=limbs)
        overflow = self._between_hosts(c, cross, "wire", int(not good)) if cross else not good
        if overflow:
            raise overflow_error([0], c.k)
        result = self._view(c, "result")
        _native.fixed_decode(limbs, c.n_workers, result)
        if c.word & 2:
            np.divide(result, np.float32(c.n_workers), out=result)
        return ""

    def _reduce_blocks(self, c: _Call, cross) -> str:
        """The agreed block exponents (the hosts' exchanged), then the quantized sums."""
        agreed, any_bad = self._view(c, "agreed"), self._view(c, "any_bad")
        np.max(self._view(c, "exps").reshape(c.n_ranks, -1), axis=0, out=agreed)
        np.max(self._view(c, "bad").reshape(c.n_ranks, -1), axis=0, out=any_bad)
        if cross:
            self._exchange_exponents(c, cross)
        overflow = bool(any_bad.any())
        c.divisor = c.n_workers if c.word & 2 and not overflow else 1
        if not cross:
            self._steps(c, _SUM_FLOAT, cross)
        else:
            self._steps(c, _SUM_QUANTIZED, cross)
            self._between_hosts(c, cross, "sums", 0)
            self._steps(c, _DEQUANTIZE, cross)
        return overflow_error(list(np.flatnonzero(any_bad)), c.k).args[0] if overflow else ""

    def _exchange_exponents(self, c: _Call, cross) -> None:
        """Each host's block exponents and inf/NaN flags in its own lanes; the sum hands every
        host every host's, and each keeps the largest exponent and any flag."""
        agreed, any_bad = self._view(c, "agreed"), self._view(c, "any_bad")
        lanes = self._view(c, "wire")[2 * c.n_hosts:].reshape(c.n_hosts, c.n_blocks)
        lanes[:] = 0
        lanes[self.layout.host] = (agreed.astype(np.int32) - codec.EXP_MIN + 1) | any_bad.astype(np.int32) << 8
        self._between_hosts(c, cross, "wire", 0)
        agreed[:] = (lanes & 0xFF).max(axis=0) + codec.EXP_MIN - 1
        any_bad[:] = (lanes >> 8).max(axis=0)


def _into(x: np.ndarray, result: np.ndarray) -> None:
    """The call's result (float32 or int32) into the rank's tensor ``x``, a 16-bit float one
    rounded once to its format."""
    if x.dtype == result.dtype:
        np.copyto(x, result)
    else:
        codec.narrow(result, x)


def _host_part(layout: HostLayout, shard: Shard | None) -> Part | None:
    """The values of a reduce-scatter's sum that this host's leader marks its own: its ranks'
    shards, one range per run of consecutive ranks (all of them in one under torchrun's
    numbering; ranks 0 and 2 of a host under Slurm's cyclic one: two). None for an allreduce."""
    if shard is None:
        return None
    per = shard.out.size
    return check_part(((r * per, (r + 1) * per) for r in layout.local), layout.world_size * per)


def _keep(c: _Call, area: str) -> Part | None:
    """What this host needs of the call between hosts on ``area`` (``Communicator.allreduce``'s
    ``keep``): of a reduce-scatter's data (the int32 sums: ``wire`` of an int32 call, ``sums``
    of a float one in blocks) its part (``_host_part``), after the hosts' words; else
    everything (None). The hosts' words lie in a block no host's part holds whole, so every
    host gets them."""
    if c.host_part is None or area != {_INT: "wire", _BLOCKS: "sums"}.get(c.mode):
        return None
    head = 2 * c.n_hosts
    return tuple((head + first, head + end) for first, end in c.host_part)


def _megabytes(nbytes: int) -> int:
    """``nbytes`` rounded up to whole MiB (at least one): a buffer is replaced seldom."""
    return max(1, -(-nbytes // (1 << 20))) << 20


def _segment_ranges(c: _Call, step: int, layout: HostLayout) -> list[tuple[int, int]]:
    """The values this rank works on in ``step``: a range of whole blocks (all of them on the
    leader of a serial call). A reduce-scatter between hosts dequantizes only its ranks' shards
    (the rank's own in a parallel call): the rest of its sums need not have come."""
    if step == _DEQUANTIZE and c.shard is not None:
        per = c.shard.out.size
        return [(r * per, (r + 1) * per) for r in (layout.local if _serial(c) else (layout.rank,))]
    if _serial(c):
        return [(0, c.n)]
    i, per = layout.local_index, -(-c.n_blocks // c.n_ranks) * c.k
    return [(min(c.n, i * per), min(c.n, (i + 1) * per))]


def _serial(c: _Call) -> bool:
    return c.n * c.n_ranks < SERIAL_VALUES


def _spec(word: int) -> CallSpec:
    return CallSpec(0, word >> 2, bool(word & 1), bool(word & 2))


def _check_hosts(words: np.ndarray, layout: HostLayout) -> None:
    """Raise what some host refused, or that the hosts' tensors differ (the same on every host)."""
    words = words.tolist()
    for h, w in enumerate(words):
        if w < 0:
            why, rank = -w & 0xF, -w >> 4
            if why == _DIED:
                raise RankDied(rank, f"rank {rank} (on host {h}) died; {layout.describe()}")
            raise CallRefused(f"rank {rank} (on host {h}) refused this call or its host's ranks differ on it "
                              f"(their error says which)")
    if len(set(words)) > 1:
        raise CallRefused("allreduce tensors differ between hosts (" + ", ".join(
            f"host {h}: {_spec(w).describe()}" for h, w in enumerate(words)) + f"); {layout.describe()}")

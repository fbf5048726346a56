"""The native slot engine (native/engine.cpp) behind the Python engine's interface.

``inagg.hostlib.aggregator.engine_reference.AggregationEngine`` is the specification; ``NativeEngine`` runs the same
decisions in C++ (a few hundred nanoseconds a packet, GIL released) and answers the same calls:
``set_job``/``remove_job``/``replace_jobs`` with ``JobConfig``, ``process`` returning ``Emit``
lists, ``last_outcome``, ``counters`` and ``snapshot_counters``. tests/test_engine_native.py
holds the two to identical packets, outcomes and counters.

The C++ engine compares integer sender ids, not addresses. ``SenderIds`` gives every job
member an id (and every non-member the id 0, which no member has); ``udp_sender_id`` is the
fixed mapping a native packet loop computes itself from a UDP source address.
"""

from __future__ import annotations

import socket
import struct
from collections import Counter
from typing import Callable, Hashable, Iterable

from inagg.hostlib.native_build import _native
from inagg.hostlib.aggregator.engine_reference import (
    AggregationEngine, Emit, JobConfig, JobCounters, slot_space,
)
from inagg.hostlib.wire.protocol import Outcome

SenderIdOf = Callable[[Hashable], int]


def udp_sender_id(address: Hashable) -> int:
    """``(host, port)`` -> ``(IPv4 << 16) | port``, the id native/host_loop.cpp gives a UDP
    source; the host is resolved once, when the job is configured."""
    host, port = address  # type: ignore[misc]
    try:
        addr = struct.unpack("!I", socket.inet_aton(socket.gethostbyname(host)))[0]
    except OSError as e:
        raise ValueError(f"worker address {host}:{port}: cannot resolve {host!r} to IPv4 ({e})") from None
    return _native.sender_id_ipv4(addr, port)


class SenderIds:
    """Interned ids of job members (from 1); any other sender is 0 and matches no member."""

    def __init__(self) -> None:
        self._ids: dict[Hashable, int] = {}

    def member(self, sender: Hashable) -> int:
        return self._ids.setdefault(sender, len(self._ids) + 1)

    def __call__(self, sender: Hashable) -> int:
        return self._ids.get(sender, 0)


class NativeEngine:
    """``AggregationEngine``'s interface over ``inagg.hostlib._native.Engine``."""

    def __init__(self, n_slots: int, values_per_packet: int, *, host_mode: bool = True,
                 sender_id: SenderIdOf | None = None) -> None:
        self.native = _native.Engine(n_slots, values_per_packet, host_mode)
        self.n_slots = n_slots
        self.k = values_per_packet
        self.host_mode = host_mode
        self.jobs: dict[int, JobConfig] = {}
        self._member_id: SenderIdOf   # a job member's id (set_job)
        self._sender_id: SenderIdOf   # a packet's sender's id (process)
        if sender_id is None:
            ids = SenderIds()
            self._member_id, self._sender_id = ids.member, ids
        else:
            self._member_id = self._sender_id = sender_id

    def _native_job(self, job: JobConfig) -> tuple:
        up = job.uplink
        return (job.job_id, job.epoch, job.slot_base, job.slot_count,
                [self._member_id(m) for m in job.members],
                None if up is None else (self._member_id(up.parent), up.rank, up.slot_base),
                job.n_children, None if job.atp_peer is None else self._member_id(job.atp_peer))

    # -- configuration -------------------------------------------------------------------

    def set_job(self, job: JobConfig) -> None:
        job.validate(slot_space(job, self.n_slots, self.host_mode))  # names members as given
        self.native.set_job(*self._native_job(job))
        self.jobs[job.job_id] = job

    def set_atp_pool(self, base: int, count: int) -> None:
        """A switch's slots for ATP jobs (``AggregationEngine.set_atp_pool``)."""
        self.native.set_atp_pool(base, count)

    @property
    def atp_held(self) -> int:
        """Aggregators of the pool a live round holds (``AggregationEngine.atp_held``)."""
        return self.native.atp_held

    def remove_job(self, job_id: int) -> None:
        self.native.remove_job(job_id)
        self.jobs.pop(job_id, None)

    # the Python engine's, step for step (a refused job leaves the same jobs applied, with the
    # same error): it only calls set_job/remove_job and reads ``jobs``
    replace_jobs = AggregationEngine.replace_jobs

    # -- data path -------------------------------------------------------------------------

    @property
    def last_outcome(self) -> Outcome | None:
        code = self.native.last_outcome
        return Outcome(code) if code else None

    def process(self, data: bytes | bytearray | memoryview, sender: Hashable,
                framing_ok: bool = True) -> list[Emit]:
        _, job_id, rank, result, owner = self.native.process(data, self._sender_id(sender), framing_ok)
        if result is None:
            return []
        return [self._emit(job_id, rank, result, owner)]

    def process_batch(self, packets: Iterable[tuple[bytes, Hashable, bool]]
                      ) -> tuple[list[Outcome], list[tuple[int, Emit]]]:
        """Many packets in one native call: (each packet's outcome, [(index of the packet that
        caused it, Emit)])."""
        datas, senders, framing = [], [], []
        for data, sender, ok in packets:
            datas.append(bytes(data))
            senders.append(self._sender_id(sender))
            framing.append(ok)
        outcomes, emits = self.native.process_batch(b"".join(datas), [len(d) for d in datas],
                                                    senders, framing)
        return ([Outcome(o) for o in outcomes],
                [(i, self._emit(*emit)) for i, *emit in emits])

    def _emit(self, job_id: int, rank: int, result: bytes, owner: int) -> Emit:
        job = self.jobs[job_id]
        if rank == _native.EMIT_UPSTREAM:
            return Emit(job, (), result, upstream=True)
        return Emit(job, tuple(range(job.n_workers)) if rank < 0 else (rank,), result, owner=owner)

    # -- counters --------------------------------------------------------------------------

    def snapshot_counters(self) -> dict:
        return self.native.snapshot_counters()

    @property
    def counters(self) -> dict[int, JobCounters]:
        return {j: JobCounters(**{**c, "drops": Counter(c["drops"])})
                for j, c in self.snapshot_counters()["jobs"].items()}

    @property
    def drops(self) -> dict[str, int]:
        return self.snapshot_counters()["drops"]

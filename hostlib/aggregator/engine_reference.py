"""The aggregation engine: the switch's slot logic as pure Python/numpy, no I/O.

One engine instance models one aggregator: a fixed pool of ``n_slots`` slots, each with two
shadow sets (SwitchML) holding K int32 values, a worker bitmap, a contribution count, the
maximum block exponent, ORed flags and the offset/count of the round it holds; plus a per-slot
owner tag (job id, epoch) that lets the first packet of a new allocation reset the slot without
any control-plane register write (BMv2's P4Runtime cannot write registers). This is the
executable specification: the host aggregator and the software data plane run its C++ twin
(``native/engine.cpp``), held to it packet for packet by tests/test_engine_native.py, and
``p4/inagg.p4`` implements the same table control by control.

Per-packet decision for a contribution of worker w to set s of a slot (``o`` = the other set;
"same round": the packet's offset and count are those stored for the round in set s; "this
round": the packet's round tag is the one stored for set s, "next round": it is that tag + 1
modulo ROUND_TAGS); the P4 program's const table slot_decision, whose twin is
``protocol.SLOT_DECISION``::

    bit w in | bitmap[s] | round    | same  | sent | round  | action
    bitmap[s]|           | complete | round | up   | tag    |
    ---------+-----------+----------+-------+------+--------+---------------------------------
    any      | any       | any      | any   | any  | other  | STALE_ROUND: drop (older round)
    0        | == 0      | any      | any   | any  | next   | FIRST: overwrite set s, keep tag
    0        | != 0      | any      | any   | any  | next   | BAD_ROUND: drop (never sent)
    1        | any       | any      | any   | any  | next   | BAD_ROUND: drop (never sent)
    0        | == 0      | any      | any   | any  | this   | STALE_ROUND: drop (all moved on)
    0        | != 0      | no       | yes   | no   | this   | ADD: sum, max exponent, OR flags
    0        | != 0      | no       | no    | no   | this   | BAD_ROUND: drop
    0        | != 0      | yes      | any   | any  | this   | STALE_ROUND: drop (reordered)
    0        | != 0      | no       | any   | yes  | this   | STALE_ROUND: drop (all in already)
    1        | any       | no       | yes   | no   | this   | DUP_PENDING: drop
    1        | any       | no       | yes   | yes  | this   | DUP_UPSTREAM: partial sum up again
    1        | any       | yes      | yes   | any  | this   | DUP_DONE: stored result to w
    1        | any       | any      | no    | any  | this   | BAD_ROUND: drop
    after FIRST/ADD: set bit w in bitmap[s], clear it in bitmap[o]; when all N members are in,
                     multicast the result to them, or, on a job with an uplink (a switch below
                     the root of an aggregation tree, docs/trees.md), send the partial sum up.

In a tree a round is complete once the parent's result is stored (its count is N + 1; "sent
up": N, with an uplink). A RESULT from the parent (``_parent_result``): another round tag is
STALE_ROUND, another offset/count BAD_ROUND, a stored round DUP_RESULT, a round sent up
PARENT_RESULT (store, multicast), anything else STALE_ROUND.

Why the round tag: a worker counts each slot's rounds from 0 at every grant and sends round k
on set k % 2 with tag (k // 2) % ROUND_TAGS; a slot reset by a new owner holds no tag in either
set (ROUND_UNSET): each set's first opener sets it (round 0 and 1 normally; after a switch lost its
slot state, the rounds the workers are at). Only the set's next
round opens it, so a copy of round r delayed past round r + 1 (its set's bitmap empty, same
offset and count as round r + 2) is stale instead of FIRST: it can neither change round r + 2's
sum nor make r + 2's packets BAD_ROUND. A copy delayed by 2 * ROUND_TAGS - 2 rounds of its slot
or more can alias (docs/protocol.md).
Reduce-scatter (docs/protocol.md): each set also keeps its round's owner. FIRST sets it to the
sender when the contribution carries FLAG_MINE (its block is wholly in the sender's shard), else
to none; a marked ADD sets it when there is none; a second marked rank, or a child switch's sum
(FLAG_FROM_SWITCH: its members all need the values), makes the round SHARED_ROUND. A completed
round's result, and a DUP_DONE answer, go with their values to the owner only and as the header
alone to every other rank (``Emit.data_for``); a round with no owner goes whole to every rank.
Why FIRST is safe: a worker sends round r+2 of a slot only after the result of round r+1,
so all workers have contributed to r+1 on set o and cleared their bits in set s.
Why BAD_ROUND: a round's result is what its first contribution announced (offset, count); a
packet claiming other values never joins it nor gets its result (p4/include/slot_state.p4).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Hashable, NamedTuple

import numpy as np

from inagg.hostlib.aggregator.atp_reference import AtpSharing
from inagg.hostlib.wire.protocol import (
    EXP_NONE,
    FLAG_CONGESTION,
    FLAG_FROM_HOST,
    FLAG_FROM_SWITCH,
    FLAG_MINE,
    FLAG_OVERFLOW,
    FLAG_RETRANSMIT,
    HEADER_BYTES,
    HEADER_STRUCT,
    MAX_SLOT,
    MAX_WORKERS,
    MSG_CONTRIBUTION,
    MSG_RESULT,
    ROUND_TAG_MASK,
    ROUND_TAG_SHIFT,
    ROUND_TAGS,
    VERSION,
    Outcome,
    round_tag,
    unpack_raw,
)

_STICKY_FLAGS = FLAG_OVERFLOW | FLAG_CONGESTION  # ORed into a round, returned with its result
ROUND_UNSET = ROUND_TAGS   # a reset set's round tag: none yet, its first opener's is next (module docstring)
NO_OWNER = -1      # a round no rank marked FLAG_MINE: every member gets the values
SHARED_ROUND = -2  # FLAG_MINE from two ranks, or a child switch's sum in: every member gets the values


@dataclass(frozen=True)
class Uplink:
    """Where a non-root aggregator of a tree sends its partial sums (docs/trees.md): its parent
    (the sender id results come from), its rank at the parent and the job's first slot there."""

    parent: Hashable
    rank: int
    slot_base: int


@dataclass(frozen=True)
class JobConfig:
    """What an aggregator must know about one job.

    ``members[r]`` is rank r's identity as the front end sees it (a UDP ``(ip, port)`` for the
    host aggregator, ``(port, IPv4, MAC, UDP port)`` for the software switch): a packet claiming
    rank r from anyone else is dropped. Results go to every member. ``n_children`` (0: every
    member) contributions complete a round: a switch of an aggregation tree knows its children
    by sparse ids (its workers' job ranks, ids given to its child switches), the other members
    are placeholders no sender matches (docs/trees.md).
    """

    job_id: int
    epoch: int
    slot_base: int
    slot_count: int
    members: tuple[Hashable, ...]
    uplink: Uplink | None = None   # None: this aggregator completes the job's rounds
    n_children: int = 0
    # ATP sharing (atp_reference.py): on a switch, the host aggregator whose results free
    # the pool's aggregators; on the host aggregator, the switch whose complete sums it takes.
    atp_peer: Hashable | None = None

    @property
    def n_workers(self) -> int:
        return len(self.members)

    @property
    def children(self) -> int:
        """Contributions that complete a round here."""
        return self.n_children or len(self.members)

    def validate(self, n_slots: int) -> None:
        """Raise ``ValueError`` naming the first bad field."""
        if not 1 <= self.job_id <= 0xFFFF:
            raise ValueError(f"job {self.job_id}: job_id must be in 1..65535")
        if not 0 <= self.epoch <= 0xFFFF:
            raise ValueError(f"job {self.job_id}: epoch must be in 0..65535")
        if not 1 <= self.n_workers <= MAX_WORKERS:
            raise ValueError(f"job {self.job_id}: needs 1..{MAX_WORKERS} workers, got {self.n_workers}")
        if len(set(self.members)) != self.n_workers:
            raise ValueError(f"job {self.job_id}: duplicate worker addresses {self.members}")
        if self.slot_count < 1 or self.slot_base < 0 or self.slot_base + self.slot_count > n_slots:
            raise ValueError(
                f"job {self.job_id}: slots [{self.slot_base}, {self.slot_base + self.slot_count}) "
                f"outside the pool of {n_slots}"
            )
        if not 0 <= self.n_children <= self.n_workers:
            raise ValueError(f"job {self.job_id}: n_children must be in 0..{self.n_workers}")
        if self.atp_peer is not None and (self.uplink is not None or self.n_children):
            raise ValueError(f"job {self.job_id}: ATP sharing and an aggregation tree do not mix: "
                             "give the job an atp_peer or an uplink, not both")
        up = self.uplink
        if up is not None and not 0 <= up.rank < MAX_WORKERS:
            raise ValueError(f"job {self.job_id}: uplink rank must be in 0..{MAX_WORKERS - 1}")
        if up is not None and not 0 <= up.slot_base <= MAX_SLOT + 1 - self.slot_count:
            raise ValueError(f"job {self.job_id}: the parent's slots [{up.slot_base}, "
                             f"{up.slot_base + self.slot_count}) are outside 0..{MAX_SLOT}")


@dataclass
class JobCounters:
    """Per-job counters, named as the P4 program's counters."""

    packets: int = 0
    aggregated: int = 0
    duplicates: int = 0
    results: int = 0
    resent_results: int = 0
    collisions: int = 0        # ATP: contributions whose aggregator another round held
    drops: Counter = field(default_factory=Counter)

    def as_dict(self) -> dict:
        return {
            "packets": self.packets, "aggregated": self.aggregated,
            "duplicates": self.duplicates, "results": self.results,
            "resent_results": self.resent_results, "collisions": self.collisions,
            "drops": dict(self.drops),
        }


class Emit(NamedTuple):
    """A packet to send: ``data`` (inagg header + payload) to the listed ranks of ``job``, or
    with ``upstream`` to the job's parent (a contribution; ``ranks`` empty). A reduce-scatter's
    round has an ``owner`` (the rank whose contributions carried FLAG_MINE): it alone gets the
    values, every other rank the header alone, values elided (``data_for``)."""

    job: JobConfig
    ranks: tuple[int, ...]
    data: bytes
    upstream: bool = False
    owner: int = NO_OWNER

    def data_for(self, rank: int) -> bytes:
        """The result rank ``rank`` gets: the values for the owner (or when there is none), else
        the header alone, its count kept (the C++ twin is ``Emit::length_for``)."""
        if self.owner == NO_OWNER or rank == self.owner:
            return self.data
        return self.data[:HEADER_BYTES]


class AggregationEngine(AtpSharing):
    """Slot pool + per-job admission; ``process()`` maps one packet to the packets it causes.
    An ATP job (``JobConfig.atp_peer``) takes its rounds to the switch's ATP pool instead of a
    window of its own (atp_reference.py)."""

    def __init__(self, n_slots: int, values_per_packet: int, *, host_mode: bool = True) -> None:
        if not 1 <= n_slots <= MAX_SLOT + 1:
            raise ValueError(f"n_slots must be in 1..{MAX_SLOT + 1}, got {n_slots}")
        if values_per_packet < 1:
            raise ValueError("values_per_packet must be >= 1")
        self.n_slots = n_slots
        self.k = values_per_packet
        self.result_flags = FLAG_FROM_HOST if host_mode else 0
        self.jobs: dict[int, JobConfig] = {}
        self.counters: dict[int, JobCounters] = {}
        self.drops: Counter = Counter()  # drops that belong to no known job, by label
        # What the last process() call did; the software data plane maps it onto the P4
        # program's counters. None before the first packet.
        self.last_outcome: Outcome | None = None
        # Per-slot state. Scalars live in Python lists (faster than numpy scalars per packet).
        self._tag: list[int] = [0] * n_slots          # (job_id << 16) | epoch of the owner
        self._bitmap = [[0] * n_slots, [0] * n_slots]
        self._seen = [[0] * n_slots, [0] * n_slots]   # contributions in the current round
        self._exp = [[EXP_NONE] * n_slots, [EXP_NONE] * n_slots]
        self._flags = [[0] * n_slots, [0] * n_slots]
        self._offset = [[0] * n_slots, [0] * n_slots]
        self._count = [[0] * n_slots, [0] * n_slots]
        self._round = [[ROUND_UNSET] * n_slots, [ROUND_UNSET] * n_slots]  # the round's tag
        self._owner = [[NO_OWNER] * n_slots, [NO_OWNER] * n_slots]       # the round's FLAG_MINE rank
        self.atp_pool = range(0)                      # the switch's slots for ATP jobs
        self._pool_round: list[int] = [0] * n_slots   # an ATP pool slot's round (atp_identity)
        self._values = np.zeros((2, n_slots, values_per_packet), dtype=np.int32)

    # -- configuration -------------------------------------------------------------------

    def set_job(self, job: JobConfig) -> None:
        """Admit a job or replace its configuration (a new grant); validated before use.

        Slots are not touched here: the owner tag resets each slot lazily on the job's first
        packet with the new (job, epoch), exactly as the switch does."""
        job.validate(slot_space(job, self.n_slots, bool(self.result_flags)))
        self._check_atp(job)
        for other in self.jobs.values():
            if other.job_id != job.job_id and self._share_slots(other, job):
                raise ValueError(
                    f"job {job.job_id}: slots [{job.slot_base}, {job.slot_base + job.slot_count}) "
                    f"overlap job {other.job_id}"
                )
        self.jobs[job.job_id] = job
        self.counters.setdefault(job.job_id, JobCounters())

    def _share_slots(self, a: JobConfig, b: JobConfig) -> bool:
        """Two jobs' windows overlap (an ATP job's slots on a switch are the host's: none here)."""
        on_switch_atp = not self.result_flags and (a.atp_peer is not None or b.atp_peer is not None)
        return not on_switch_atp and _overlaps(a, b)

    def remove_job(self, job_id: int) -> None:
        self.jobs.pop(job_id, None)

    def replace_jobs(self, wanted: dict[int, JobConfig]) -> None:
        """Serve exactly ``wanted`` (job id -> config): jobs not in it are removed first, so
        their slots are free for the others; unchanged jobs are left as they are. Raises
        ``ValueError`` (from ``set_job``) for a config the pool cannot hold."""
        for job_id in [j for j in self.jobs if j not in wanted]:
            self.remove_job(job_id)
        for job in wanted.values():
            if self.jobs.get(job.job_id) != job:
                self.remove_job(job.job_id)
                self.set_job(job)

    # -- data path -------------------------------------------------------------------------

    def _from_peer(self, job: JobConfig, msg_type: int, flags: int) -> bool:
        """An ATP job's packet from the other end: on a switch the host aggregator's RESULT,
        on the host aggregator the switch's sum (atp_reference.py)."""
        if job.atp_peer is None:
            return False
        if self.result_flags:
            return msg_type == MSG_CONTRIBUTION and bool(flags & FLAG_FROM_SWITCH)
        return msg_type == MSG_RESULT

    def _admission(self, job: JobConfig, data: bytes | bytearray | memoryview, sender: Hashable,
                   framing_ok: bool, head: tuple) -> Outcome | None:
        """The per-job checks in the order of the P4 program's JobAdmission; None when admitted.
        A RESULT is admitted only on a job with an uplink: from its parent, in the parent's
        slots (docs/trees.md), or on an ATP job at a switch from its host aggregator."""
        msg_type, flags, worker, epoch, slot, count = head
        from_parent = msg_type == MSG_RESULT and job.uplink is not None
        from_peer = self._from_peer(job, msg_type, flags)
        if msg_type != MSG_CONTRIBUTION and not (from_parent or from_peer):
            return Outcome.BAD_TYPE
        if from_parent or from_peer:
            if sender != (job.uplink.parent if from_parent else job.atp_peer):
                return Outcome.BAD_WORKER
            if from_peer and worker >= len(job.members):
                return Outcome.BAD_WORKER
        elif worker >= len(job.members) or job.members[worker] != sender:
            return Outcome.BAD_WORKER
        if epoch != job.epoch:
            return Outcome.STALE_EPOCH
        base = job.uplink.slot_base if from_parent else job.slot_base
        if not base <= slot < base + job.slot_count:
            return Outcome.BAD_SLOT
        if (not framing_ok or count > self.k
                or len(data) - HEADER_BYTES != (4 * self.k if count else 0)):
            return Outcome.BAD_LENGTH
        return None

    def process(self, data: bytes | bytearray | memoryview, sender: Hashable,
                framing_ok: bool = True) -> list[Emit]:
        """Handle one received inagg packet (header + payload) from ``sender``. ``framing_ok``
        False: the encapsulation's own length (RoCE's RETH DMA length, its ICRC's presence)
        disagrees with the packet, which is then malformed (bad_length, in check order)."""
        if len(data) < HEADER_BYTES:
            return self._drop_global(Outcome.TRUNCATED)
        vt, flags, job_id, worker, exp, epoch, ss, count, offset = unpack_raw(data)
        if vt >> 4 != VERSION:
            return self._drop_global(Outcome.BAD_VERSION)
        job = self.jobs.get(job_id)
        if job is None:
            return self._drop_global(Outcome.UNKNOWN_JOB)
        ctr = self.counters[job_id]
        ctr.packets += 1
        slot = ss & MAX_SLOT
        refused = self._admission(job, data, sender, framing_ok,
                                  (vt & 0xF, flags, worker, epoch, slot, count))
        if refused is not None:
            return self._drop_job(ctr, refused)
        head = (vt, flags, worker, exp, slot, ss >> 15, count, offset)
        if job.atp_peer is not None and not self.result_flags:
            return self._atp_switch(ctr, job, data, head)
        if self._from_peer(job, vt & 0xF, flags):
            emits = self._switch_sum(ctr, job, data, head)
        else:
            emits = self._window(ctr, job, data, head)
        if job.atp_peer is not None and self.last_outcome == Outcome.STALE_ROUND:
            return [self._up(job, self._atp_release(job, head))]
        return emits

    def _window(self, ctr: JobCounters, job: JobConfig, data: bytes | bytearray | memoryview,
                head: tuple) -> list[Emit]:
        """An admitted packet into its job's own slot: the decision table (module docstring),
        or a parent's result in a tree."""
        vt, flags, worker, exp, slot, s, count, offset = head
        from_parent = vt & 0xF == MSG_RESULT
        if from_parent:                                        # the parent's slot -> ours
            slot += job.slot_base - job.uplink.slot_base
        self._claim(slot, (job.job_id << 16) | job.epoch)
        n = job.children
        seen = self._seen[s][slot]
        complete = seen == n + (job.uplink is not None)        # a tree's result counts one more
        sent_up = job.uplink is not None and seen == n
        same_round = self._offset[s][slot] == offset and self._count[s][slot] == count
        tag, stored = round_tag(flags), self._round[s][slot]
        if from_parent:
            if tag != stored:                                  # an older round's result
                return self._drop_job(ctr, Outcome.STALE_ROUND)
            return self._parent_result(ctr, job, slot, s, data, flags, exp, worker,
                                       (complete, same_round, sent_up))
        bit = 1 << worker
        bitmap = self._bitmap[s]
        if tag != stored:                                      # FIRST, BAD_ROUND, STALE_ROUND
            if stored != ROUND_UNSET and tag != (stored + 1) % ROUND_TAGS:   # an older round's copy
                return self._drop_job(ctr, Outcome.STALE_ROUND)
            if bitmap[slot]:                                   # never sent: the set is busy
                return self._drop_job(ctr, Outcome.BAD_ROUND)
            self._first(slot, s, data, flags, exp, offset, count)
        elif bitmap[slot] & bit:           # BAD_ROUND, DUP_PENDING, DUP_UPSTREAM, DUP_DONE
            return self._duplicate(ctr, job, slot, s, worker, (complete, same_round, sent_up))
        elif bitmap[slot] == 0 or complete or sent_up:         # STALE_ROUND
            return self._drop_job(ctr, Outcome.STALE_ROUND)
        elif not same_round:                                   # BAD_ROUND
            return self._drop_job(ctr, Outcome.BAD_ROUND)
        else:                                                  # ADD
            self._add(slot, s, data, flags, exp, count)
        return self._joined(ctr, job, slot, s, worker)

    def _joined(self, ctr: JobCounters, job: JobConfig, slot: int, s: int, worker: int) -> list[Emit]:
        """After FIRST/ADD: the worker's bit moves to set ``s``; the round leaves when complete
        (multicast to the members, or up to the parent)."""
        bit = 1 << worker
        self._bitmap[s][slot] |= bit
        self._bitmap[1 - s][slot] &= ~bit
        ctr.aggregated += 1
        if self._seen[s][slot] < job.children:
            return []
        ctr.results += 1
        if job.uplink is not None:                             # this level's part: up
            return [self._up(job, self._upstream(slot, s, job, 0))]
        return self._joined_result(job, slot, s, worker, self._owner_of(slot, s))

    def _joined_result(self, job: JobConfig, slot: int, s: int, worker: int, owner: int = NO_OWNER) -> list[Emit]:
        """The round in set ``s`` complete: its result to every member, its values to ``owner``
        alone where the round has one (a reduce-scatter's; NO_OWNER: to every member)."""
        return [Emit(job, tuple(range(job.n_workers)), self._result(slot, s, job, worker, 0), owner=owner)]

    @staticmethod
    def _up(job: JobConfig, data: bytes) -> Emit:
        """A contribution to the job's parent (a tree's, or an ATP job's host aggregator)."""
        return Emit(job, (), data, upstream=True)

    def _claim(self, slot: int, tag: int) -> None:
        """The first packet of a new owner/epoch (tag = job << 16 | epoch) resets the slot."""
        if self._tag[slot] != tag:
            self._tag[slot] = tag
            for s in (0, 1):
                self._bitmap[s][slot] = 0
                self._seen[s][slot] = 0
                self._round[s][slot] = ROUND_UNSET   # its first opener's tag is its next

    def _duplicate(self, ctr: JobCounters, job: JobConfig, slot: int, s: int, worker: int,
                   state: tuple[bool, bool, bool]) -> list[Emit]:
        """A contribution of a worker whose bit is set in set ``s``: the table's rows 5 to 8;
        ``state`` is (complete, same_round, sent_up)."""
        complete, same_round, sent_up = state
        if not same_round:                                     # BAD_ROUND
            return self._drop_job(ctr, Outcome.BAD_ROUND)
        ctr.duplicates += 1
        if complete:                                           # DUP_DONE
            ctr.resent_results += 1
            self.last_outcome = Outcome.DUP_DONE
            return [Emit(job, (worker,), self._result(slot, s, job, worker, FLAG_RETRANSMIT),
                         owner=self._owner_of(slot, s))]
        if sent_up:                                            # DUP_UPSTREAM
            self.last_outcome = Outcome.DUP_UPSTREAM
            return [Emit(job, (), self._upstream(slot, s, job, FLAG_RETRANSMIT), upstream=True)]
        self.last_outcome = Outcome.DUP_PENDING                # DUP_PENDING
        return []

    def _parent_result(self, ctr: JobCounters, job: JobConfig, slot: int, s: int,
                       data: bytes | bytearray | memoryview, flags: int, exp: int, worker: int,
                       state: tuple[bool, bool, bool]) -> list[Emit]:
        """The parent's result for set ``s`` (docs/trees.md): stored and sent to every member
        when this set sent its sum up and waits for it; ``state`` is (complete, same_round,
        sent_up)."""
        complete, same_round, sent_up = state
        if not same_round:
            return self._drop_job(ctr, Outcome.BAD_ROUND)
        if complete:
            ctr.duplicates += 1
            self.last_outcome = Outcome.DUP_RESULT
            return []
        if not sent_up:
            return self._drop_job(ctr, Outcome.STALE_ROUND)
        self.last_outcome = Outcome.PARENT_RESULT
        self._seen[s][slot] += 1
        self._exp[s][slot] = exp
        self._flags[s][slot] = flags & ~(FLAG_RETRANSMIT | FLAG_FROM_SWITCH | ROUND_TAG_MASK)
        if self._count[s][slot]:
            self._values[s, slot] = np.frombuffer(data, ">i4", self.k, HEADER_BYTES)
        else:
            self._values[s, slot] = 0
        return [Emit(job, tuple(range(job.n_workers)), self._result(slot, s, job, worker, 0),
                     owner=self._owner_of(slot, s))]

    def _first(self, slot: int, s: int, data: bytes | bytearray | memoryview, flags: int, exp: int,
               offset: int, count: int) -> None:
        """FIRST: the contribution opens a round in set ``s``, overwriting what it held."""
        self.last_outcome = Outcome.FIRST
        self._round[s][slot] = round_tag(flags)
        self._seen[s][slot] = 1
        self._exp[s][slot] = exp
        self._flags[s][slot] = flags & _STICKY_FLAGS
        self._offset[s][slot] = offset
        self._count[s][slot] = count
        self._owner[s][slot] = NO_OWNER
        self._note_owner(slot, s, flags, data[4])
        if count:
            self._values[s, slot] = np.frombuffer(data, ">i4", self.k, HEADER_BYTES)
        else:
            self._values[s, slot] = 0

    def _note_owner(self, slot: int, s: int, flags: int, worker: int) -> None:
        """FLAG_MINE makes its sender the round's owner; a second owner, or a child switch's
        partial sum (whose members all need the values), makes the round shared."""
        owner = self._owner[s][slot]
        if flags & FLAG_FROM_SWITCH:
            self._owner[s][slot] = SHARED_ROUND
        elif flags & FLAG_MINE:
            self._owner[s][slot] = worker if owner == NO_OWNER else SHARED_ROUND

    def _owner_of(self, slot: int, s: int) -> int:
        """The rank that gets set ``s``'s values alone, or NO_OWNER (every member gets them)."""
        owner = self._owner[s][slot]
        return owner if owner >= 0 else NO_OWNER

    def _add(self, slot: int, s: int, data: bytes | bytearray | memoryview, flags: int, exp: int,
             count: int) -> None:
        """ADD: the contribution joins the round in set ``s``: sum, max exponent, OR flags."""
        self.last_outcome = Outcome.ADD
        self._note_owner(slot, s, flags, data[4])
        self._seen[s][slot] += 1
        if exp > self._exp[s][slot]:
            self._exp[s][slot] = exp
        self._flags[s][slot] |= flags & _STICKY_FLAGS
        if count:
            self._values[s, slot] += np.frombuffer(data, ">i4", self.k, HEADER_BYTES)

    def _drop_global(self, reason: Outcome) -> list[Emit]:
        self.drops[reason.label] += 1
        self.last_outcome = reason
        return []

    def _drop_job(self, ctr: JobCounters, reason: Outcome) -> list[Emit]:
        ctr.drops[reason.label] += 1
        self.last_outcome = reason
        return []

    def _result(self, slot: int, s: int, job: JobConfig, worker: int, extra_flags: int) -> bytes:
        """The round in set ``s`` as a RESULT to the job's members."""
        return self._round_packet(MSG_RESULT, self._flags[s][slot] | self.result_flags | extra_flags,
                                  worker, slot, slot, s, job)

    def _upstream(self, slot: int, s: int, job: JobConfig, extra_flags: int) -> bytes:
        """The round in set ``s`` (this level's partial sum) as a contribution to the parent:
        from this aggregator's rank there, in the parent's slot."""
        up = job.uplink
        return self._round_packet(MSG_CONTRIBUTION,
                                  self._flags[s][slot] | FLAG_FROM_SWITCH | extra_flags,
                                  up.rank, slot - job.slot_base + up.slot_base, slot, s, job)

    def _round_packet(self, msg_type: int, flags: int, worker: int, wire_slot: int, slot: int,
                      s: int, job: JobConfig) -> bytes:
        """The round in set ``s`` as a packet: its flags with the round's tag."""
        count = self._count[s][slot]
        flags |= self._round[s][slot] << ROUND_TAG_SHIFT
        header = HEADER_STRUCT.pack(
            (VERSION << 4) | msg_type, flags, job.job_id, worker, self._exp[s][slot], job.epoch,
            (s << 15) | wire_slot, count, self._offset[s][slot],
        )
        if not count:
            return header
        return header + self._values[s, slot].astype(">i4").tobytes()

    def snapshot_counters(self) -> dict:
        """All counters as plain data (for logs, the CLI and tests)."""
        return {
            "jobs": {j: c.as_dict() for j, c in self.counters.items()},
            "drops": dict(self.drops),
        }


def slot_space(job: JobConfig, n_slots: int, host_mode: bool) -> int:
    """The slots a job's range must fit: the pool's, but the host's for an ATP job on a switch."""
    return MAX_SLOT + 1 if job.atp_peer is not None and not host_mode else n_slots


def _overlaps(a: JobConfig, b: JobConfig) -> bool:
    return a.slot_base < b.slot_base + b.slot_count and b.slot_base < a.slot_base + a.slot_count


"""ATP's aggregator sharing beside SwitchML's windows (docs/atp.md): the switch's and the host
aggregator's halves of it, as part of the reference engine.

The worker side is a host-aggregator job, unchanged: its grant names the host aggregator (the
parameter server of ATP) and a window of slots there, every result comes from the host
aggregator. A switch on the path intercepts the job's contributions instead of forwarding them:

- **Where a round goes.** Round identity T = (job, epoch, wire slot, set, round tag), packed by
  ``atp_identity``; its aggregator is ``atp_aggregator``: CRC-32 of T's 8 big-endian bytes
  plus a per-job offset, modulo the switch's ATP pool. The switch computes it, not the worker,
  so the wire is the host job's and the worker does not know the pool (a resized pool changes
  nothing there).
- **The switch's table** (aggregator a of T; owner o of a; "free": no owner, or an owner whose
  job or epoch is no longer configured; "done": all N contributions in)::

      o == T | bit w | done | action
      -------+-------+------+----------------------------------------------------------------
      yes    | any   | any  | BAD_ROUND if offset or count differ from the round's
      yes    | 0     | no   | ADD; the last one sends the sum up (SWITCH_SUM at the host)
      yes    | 1     | no   | DUP_PENDING: the packet goes up (the host may hold T complete)
      yes    | 1     | yes  | DUP_UPSTREAM: the sum up again, as w's (the host answers w)
      no, a free     |      | FIRST: a claims T; the packet goes up too (N = 1: the sum)
      no, a held     |      | COLLISION: the packet goes up unchanged, counted
      the host aggregator's RESULT of T passing through (ACK): a is freed if o == T

  The switch never sends a partial sum: only a complete one (with every bit), so nothing it
  holds is ever counted twice; a partial it holds is never lost either: its contributors have
  no result, so they resend, and a resend joins it (o == T) or goes up to the host. A resend
  the partial already holds goes up too: the round may be complete at the host (its other
  workers' packets collided there), whose answer then frees the aggregator as it passes.
- **The host aggregator's rule**: workers' packets (collided, or mirrored on FIRST) follow its
  ordinary decision table with its own bitmaps (engine_reference.py). A switch's sum of round
  T (FLAG_FROM_SWITCH, from ``atp_peer``) replaces whatever partial the host holds of T, as
  if every worker had joined at once (SWITCH_SUM: its bits set in T's set, cleared in the
  other, the result sent to every member); for a round already complete it answers the rank in
  its header (DUP_DONE); an older round's is STALE_ROUND. Every result is therefore the sum of
  one packet of each worker, made either wholly on the switch or wholly at the host.
- **A stale copy's aggregator is released**: a packet of an ATP job that is STALE_ROUND at the
  host aggregator (worker's or switch's: its round is over for every worker, who all moved on)
  is answered to the switch alone with a header-only RESULT of its round (``_atp_release``),
  which frees the aggregator a late copy may have claimed there. It goes to no worker: an old
  round's result could pass a worker's checks for a later call's round on the same slot.
- **Why FIRST is mirrored up**: a late or duplicated copy of a round already answered can claim
  a free aggregator; nobody resends that round, so only an answer passing back can free it.
  The host aggregator answers the mirrored copy (DUP_DONE, which frees a on its way) or, for a
  live round, keeps it as one more worker's contribution (then the round completes at either).
  Its cost: the host aggregator receives at least 2 packets a round (the mirror and the sum).
- **Limit**: a copy delayed past ``2 * ROUND_TAGS - 2`` rounds of its slot aliases a later
  round's identity (as in the window mode, docs/protocol.md); a claim the release does not
  reach (the release lost) holds its aggregator until the job's epoch changes (a stall's fresh
  epoch frees it: an owner of another epoch is free).
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

from inagg.hostlib.wire.protocol import (
    EXP_NONE,
    FLAG_FROM_HOST,
    FLAG_FROM_SWITCH,
    FLAG_RETRANSMIT,
    MSG_CONTRIBUTION,
    MSG_RESULT,
    ROUND_TAG_MASK,
    ROUND_TAGS,
    VERSION,
    HEADER_STRUCT,
    Outcome,
    round_tag,
)

if TYPE_CHECKING:
    from inagg.hostlib.aggregator.engine_reference import Emit, JobConfig, JobCounters


def atp_identity(job_id: int, epoch: int, slot: int, slot_set: int, tag: int) -> int:
    """A round's owner tag, never 0 (job ids start at 1): job 16 | epoch 16 | slot 15 | set 1 |
    round tag 3 bits (native/engine_atp.cpp: atp_identity)."""
    return job_id << 35 | epoch << 19 | slot << 4 | slot_set << 3 | tag


JOB_SPREAD = 0x9E3779B1   # 2^32 / golden ratio: each job's offset into the pool (atp_aggregator)


def atp_aggregator(identity: int, pool_base: int, pool_count: int) -> int:
    """The pool slot of a round: CRC-32 (zlib's, BMv2's crc32) of its identity's 8 bytes, plus
    the job's offset ``job * JOB_SPREAD`` (mod 2^32), modulo the pool.

    Why the offset: CRC is linear over GF(2), so two jobs whose identities differ by a fixed
    xor (their ids and window-aligned slot bases do) would map round for round onto the same
    aggregators, and collide on every round they run in step; an added offset breaks that."""
    spread = (identity >> 35) * JOB_SPREAD
    return pool_base + (zlib.crc32(identity.to_bytes(8, "big")) + spread) % (1 << 32) % pool_count


class AtpSharing:
    """The ATP halves of ``AggregationEngine`` (which inherits them and owns the slot arrays):
    ``set_atp_pool`` on a switch, ``_atp_switch`` for an ATP job's packets there and
    ``_switch_sum`` for a switch's sum at the host aggregator (module docstring). The engine
    gives them ``_up`` (an Emit to the host) and ``_joined_result`` (a result to every member)."""

    atp_pool: range

    def set_atp_pool(self, base: int, count: int) -> None:
        """Give the switch's slots [base, base + count) to ATP jobs (0 slots: none). Raises
        ``ValueError`` on the host aggregator, outside the slots or over a window job's."""
        if self.result_flags:
            raise ValueError("the ATP pool is a switch's: the host aggregator takes its ATP jobs' "
                             "rounds in their own slots")
        if count < 0 or base < 0 or base + count > self.n_slots:
            raise ValueError(f"ATP pool [{base}, {base + count}) outside the {self.n_slots} slots")
        pool = range(base, base + count)
        for job in self.jobs.values():
            if job.atp_peer is None and _overlap(pool, job):
                raise ValueError(f"ATP pool [{base}, {base + count}) overlaps job {job.job_id}'s "
                                 f"window [{job.slot_base}, {job.slot_base + job.slot_count})")
        if not count and any(j.atp_peer is not None for j in self.jobs.values()):
            raise ValueError("ATP jobs are configured: remove them before the pool")
        self.atp_pool = pool
        for a in pool:
            self._pool_round[a] = 0

    @property
    def atp_held(self) -> int:
        """Aggregators of the pool a live round holds (its job and epoch still configured)."""
        return sum(not self._atp_free(self._pool_round[a]) for a in self.atp_pool)

    def _check_atp(self, job: JobConfig) -> None:
        """A job fits the switch's ATP pool: an ATP job needs a pool, a window job stays out."""
        if self.result_flags:
            return
        if job.atp_peer is not None and not self.atp_pool:
            raise ValueError(f"job {job.job_id}: an ATP job needs the switch's ATP pool: "
                             "set_atp_pool first")
        if job.atp_peer is None and _overlap(self.atp_pool, job):
            raise ValueError(f"job {job.job_id}: slots [{job.slot_base}, "
                             f"{job.slot_base + job.slot_count}) overlap the ATP pool")

    def _atp_free(self, owner: int) -> bool:
        """No owner, or one whose job or epoch is gone (a stall's fresh epoch frees its rounds)."""
        if not owner:
            return True
        job = self.jobs.get(owner >> 35)
        return job is None or job.atp_peer is None or job.epoch != (owner >> 19) & 0xFFFF

    def _atp_switch(self, ctr: JobCounters, job: JobConfig, data: bytes, head: tuple) -> list[Emit]:
        """One admitted packet of an ATP job at the switch: the module docstring's table."""
        vt, flags, worker, exp, slot, s, count, offset = head
        ident = atp_identity(job.job_id, job.epoch, slot, s, round_tag(flags))
        a = atp_aggregator(ident, self.atp_pool.start, len(self.atp_pool))
        if vt & 0xF == MSG_RESULT:                             # ACK: the host's result passes
            if self._pool_round[a] == ident:
                self._pool_round[a] = 0
            self.last_outcome = Outcome.ACK
            return []
        if self._pool_round[a] != ident:
            if not self._atp_free(self._pool_round[a]):             # COLLISION
                ctr.collisions += 1
                self.last_outcome = Outcome.COLLISION
                return [self._up(job, bytes(data))]
            self._pool_round[a] = ident                             # FIRST, mirrored up
            self._bitmap[s][a] = 0
            self._first(a, s, data, flags, exp, offset, count)
            return self._atp_joined(ctr, job, a, (s, worker, slot)) or [self._up(job, bytes(data))]
        if self._offset[s][a] != offset or self._count[s][a] != count:
            return self._drop_job(ctr, Outcome.BAD_ROUND)
        done = self._seen[s][a] == len(job.members)
        if self._bitmap[s][a] & 1 << worker:
            ctr.duplicates += 1
            if not done:                                       # the host may hold it complete
                self.last_outcome = Outcome.DUP_PENDING
                return [self._up(job, bytes(data))]
            self.last_outcome = Outcome.DUP_UPSTREAM
            return [self._up(job, self._atp_sum(job, a, (s, worker, slot), FLAG_RETRANSMIT))]
        self._add(a, s, data, flags, exp, count)               # ADD
        return self._atp_joined(ctr, job, a, (s, worker, slot))

    def _atp_joined(self, ctr: JobCounters, job: JobConfig, a: int, at: tuple) -> list[Emit]:
        """After FIRST/ADD on aggregator ``a``: the worker's bit; the sum up when all are in."""
        s, worker, _ = at
        self._bitmap[s][a] |= 1 << worker
        ctr.aggregated += 1
        if self._seen[s][a] < len(job.members):
            return []
        ctr.results += 1
        return [self._up(job, self._atp_sum(job, a, at, 0))]

    def _atp_sum(self, job: JobConfig, a: int, at: tuple, extra_flags: int) -> bytes:
        """Aggregator ``a``'s complete sum as worker ``at[1]``'s contribution to the host, in
        the round's own wire slot and set."""
        s, worker, slot = at
        return self._round_packet(MSG_CONTRIBUTION, self._flags[s][a] | FLAG_FROM_SWITCH | extra_flags,
                                  worker, slot, a, s, job)

    @staticmethod
    def _atp_release(job: JobConfig, head: tuple) -> bytes:
        """The host aggregator's header-only RESULT of a stale packet's round, to the switch
        alone: the ACK that frees whatever aggregator a late copy of it claimed there."""
        _, flags, worker, _, slot, s, _, offset = head
        return HEADER_STRUCT.pack((VERSION << 4) | MSG_RESULT, FLAG_FROM_HOST | (flags & ROUND_TAG_MASK),
                                  job.job_id, worker, EXP_NONE, job.epoch, (s << 15) | slot, 0, offset)

    def _switch_sum(self, ctr: JobCounters, job: JobConfig, data: bytes, head: tuple) -> list[Emit]:
        """A switch's complete sum of an ATP job's round at the host aggregator (module docstring)."""
        _, flags, worker, exp, slot, s, count, offset = head
        self._claim(slot, (job.job_id << 16) | job.epoch)     # a new grant's slot: reset first
        tag, stored, n = round_tag(flags), self._round[s][slot], len(job.members)
        busy = self._bitmap[s][slot] != 0
        same_round = self._offset[s][slot] == offset and self._count[s][slot] == count
        if tag == stored:
            if not busy:                                       # all moved on
                return self._drop_job(ctr, Outcome.STALE_ROUND)
            if not same_round:
                return self._drop_job(ctr, Outcome.BAD_ROUND)
            if self._seen[s][slot] == n:                       # DUP_DONE: answer the resender
                return self._duplicate(ctr, job, slot, s, worker, (True, True, False))
        elif stored != ROUND_TAGS and tag != (stored + 1) % ROUND_TAGS:
            return self._drop_job(ctr, Outcome.STALE_ROUND)
        elif busy:                                             # the set's round still has workers
            return self._drop_job(ctr, Outcome.BAD_ROUND)
        self._first(slot, s, data, flags, exp, offset, count)
        self.last_outcome = Outcome.SWITCH_SUM
        every = (1 << n) - 1
        self._seen[s][slot] = n
        self._bitmap[s][slot] = every
        self._bitmap[1 - s][slot] &= ~every
        ctr.aggregated += 1
        ctr.results += 1
        return self._joined_result(job, slot, s, worker)


def _overlap(pool: range, job: JobConfig) -> bool:
    return bool(pool) and pool.start < job.slot_base + job.slot_count and job.slot_base < pool.stop

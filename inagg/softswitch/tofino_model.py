"""An executable model of the TNA program's slot logic (p4/tofino/slot_state.p4, value_lanes.p4),
register by register, in the stage order bf-p4c placed them.

Why: no tofino-model or Tofino can run here, and the TNA program cannot simply be the BMv2
program (each register is reached once per pass, in stage order, so Tofino decides with what
the earlier stages returned). This model does exactly that: each ``_stage_*`` method runs the
register actions the P4 runs in that stage, reading only what earlier stages produced, so a
decision that needs a later register's value cannot be written here either. It has the slot
engine's interface (``process``, ``last_outcome``, ``replace_jobs``), so
``TofinoModelPipeline`` is the software switch's pipeline with the TNA program's slot logic,
and the conformance cases and the differential fuzz compare it with the reference engine at
the TNA's K (tests/test_tofino_model.py). ``REGISTER_STAGES``/``REGISTER_ACTIONS`` are what the
test holds against the P4 source and the committed compiler output (context.json).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable

import numpy as np

from inagg.aggregator.engine_reference import Emit, JobConfig
from inagg.control.p4info import P4Info
from inagg.softswitch.pipeline_reference import SLOT_TAG, SoftPipeline
from inagg.wire.protocol import (
    FLAG_CONGESTION, FLAG_OVERFLOW, FLAG_RETRANSMIT, HEADER_BYTES, HEADER_STRUCT, MAX_SLOT,
    MSG_CONTRIBUTION, MSG_RESULT, VERSION, Outcome, unpack_raw,
)

_CONTRIBUTOR_ACTIONS = ("set0", "set1", "restart0", "restart1")
# register -> the RegisterActions the P4 declares on it (lanes: every lane register)
REGISTER_ACTIONS: dict[str, tuple[str, ...]] = {
    "slot_tag": ("claim_slot",),
    "contributors": tuple(f"contributors_{a}" for a in _CONTRIBUTOR_ACTIONS),
    "mirror": tuple(f"mirror_{a}" for a in _CONTRIBUTOR_ACTIONS),
    "round_record": ("round_open", "round_check"),
    "seen": ("seen_first", "seen_add", "seen_read"),
    "exp_max": ("exp_first", "exp_add", "exp_read"),
    "sticky_flags": ("flags_first", "flags_add", "flags_read"),
    "lane": ("store", "add", "load"),
}
LANE_FIRST_STAGE = 7
LANES_PER_STAGE = 4   # stateful ALUs per stage


def register_stages(k: int) -> dict[str, int]:
    """Register (lanes as ``lane<i>``) -> the stage this model runs it in (bf-p4c put lane
    K-1 first)."""
    stages = {"slot_tag": 3, "contributors": 4, "mirror": 4, "round_record": 5,
              "seen": 6, "exp_max": 6, "sticky_flags": 6}
    for i in range(k):
        stages[f"lane{i}"] = LANE_FIRST_STAGE + (k - 1 - i) // LANES_PER_STAGE
    return stages


_STICKY = FLAG_OVERFLOW | FLAG_CONGESTION
_BAD_ROUND, _STALE = Outcome.BAD_ROUND, Outcome.STALE_ROUND


@dataclass
class _Meta:
    """The PHV fields SlotState reads and writes (types.p4)."""

    slot: int
    idx: int
    s: int
    me: int
    n: int
    others: int
    reset: int = 0
    old_bitmap: int = 0
    old_other: int = 0
    same_round: int = 0
    complete: int = 0      # seen's output
    outcome: Outcome | None = None
    lane_op: str = ""      # lane_choice: "store", "add" or "load"
    send_result: bool = False
    exp_result: int = 0    # biased
    flags_result: int = 0


class TofinoSlotModel:
    """Registers of SlotState and ValueLanes (one array per register, as on the chip)."""

    def __init__(self, n_slots: int, values_per_packet: int) -> None:
        self.n_slots, self.k = n_slots, values_per_packet
        self.jobs: dict[int, JobConfig] = {}
        self.last_outcome: Outcome | None = None
        self.slot_tag = [0] * n_slots
        self.contributors = [[0, 0] for _ in range(n_slots)]
        self.mirror = [[0, 0] for _ in range(n_slots)]
        self.round_record = [(0, 0)] * (2 * n_slots)
        self.seen = [0] * (2 * n_slots)
        self.exp_max = [0] * (2 * n_slots)
        self.sticky_flags = [0] * (2 * n_slots)
        self.lanes = np.zeros((2 * n_slots, values_per_packet), np.int32)

    def replace_jobs(self, wanted: dict[int, JobConfig]) -> None:
        for job in wanted.values():
            job.validate(self.n_slots)
        self.jobs = dict(wanted)

    # -- JobAdmission's checks (the order of the checks table) -------------------------------

    def _admit(self, data, sender: Hashable, framing_ok: bool) -> Outcome | None:
        if len(data) < HEADER_BYTES:
            return Outcome.TRUNCATED
        vt, _, job_id, worker, _, epoch, ss, count, _ = unpack_raw(data)
        job = self.jobs.get(job_id)
        payload = len(data) - HEADER_BYTES
        failed = [
            (vt >> 4 != VERSION, Outcome.BAD_VERSION),
            (job is None, Outcome.UNKNOWN_JOB),
            (vt & 0xF != MSG_CONTRIBUTION, Outcome.BAD_TYPE),
            (job is not None and (worker >= job.n_workers or job.members[worker] != sender),
             Outcome.BAD_WORKER),
            (job is not None and epoch != job.epoch, Outcome.STALE_EPOCH),
            (job is not None and not job.slot_base <= ss & MAX_SLOT < job.slot_base + job.slot_count,
             Outcome.BAD_SLOT),
            (not framing_ok or count > self.k or payload != (4 * self.k if count else 0),
             Outcome.BAD_LENGTH),
        ]
        return next((why for bad, why in failed if bad), None)

    # -- SlotState, stage by stage ---------------------------------------------------------

    def _stage3_claim_slot(self, m: _Meta, tag: int) -> None:
        if self.slot_tag[m.slot] != tag:
            self.slot_tag[m.slot] = tag
            m.reset = 1

    def _contributor_action(self, reg: list[list[int]], m: _Meta, out_other: bool) -> int:
        """contributors_* / mirror_*: the same update, different output half."""
        pair, s, o = reg[m.slot], m.s, 1 - m.s
        old = pair[o if out_other else s]
        if m.reset:                              # restart<s>
            pair[s], pair[o] = m.me, 0
            return 0
        if pair[s] == m.others:                  # this packet completes s: empty o
            pair[o] = 0
        pair[s] |= m.me
        return old

    def _stage4_contributors(self, m: _Meta) -> None:
        m.old_bitmap = self._contributor_action(self.contributors, m, False)
        m.old_other = self._contributor_action(self.mirror, m, True)

    def _stage5_round_record(self, m: _Meta, offset: int, count: int) -> None:
        if m.old_bitmap == 0:                    # round_open
            self.round_record[m.idx] = (offset, count)
            m.same_round = 1
        else:                                    # round_check
            m.same_round = int(self.round_record[m.idx] == (offset, count))

    def _stage6_by_maps(self, m: _Meta, exp_biased: int, flags_in: int) -> None:
        """seen_update, exp_update, flags_update and lane_choice: keyed on the maps (map_tests,
        stage 5's ALU work) and the round record, not on the decision."""
        i = m.idx
        if m.old_bitmap == 0:                                    # FIRST: store
            self.seen[i], self.exp_max[i], self.sticky_flags[i] = 1, exp_biased, flags_in
            m.complete, m.lane_op = 0, "store"
        elif not m.old_bitmap & m.me and m.same_round:           # this round, new worker: add
            m.complete = int(self.seen[i] == m.n - 1)
            self.seen[i] = (self.seen[i] + 1) & 0xFF
            self.exp_max[i] = max(self.exp_max[i], exp_biased)
            self.sticky_flags[i] |= flags_in
            m.lane_op = "add"
        else:                                                    # read
            m.complete, m.lane_op = int(self.seen[i] == m.n), "load"
        m.exp_result, m.flags_result = self.exp_max[i], self.sticky_flags[i]

    def _stage7_decision(self, m: _Meta) -> None:
        """The decision's const entries, row for row."""
        mine, moved = m.old_bitmap & m.me, m.old_other & m.me
        if m.old_bitmap == 0:
            m.outcome, m.send_result = Outcome.FIRST, m.others == 0
        elif not mine:
            m.outcome = Outcome.ADD if m.same_round else _BAD_ROUND
            m.send_result = bool(m.same_round and m.complete)
        elif m.complete and not moved:
            m.outcome = Outcome.DUP_DONE if m.same_round else _BAD_ROUND
            m.send_result = bool(m.same_round)
        elif m.complete:
            m.outcome = _STALE
        else:
            m.outcome = Outcome.DUP_PENDING if m.same_round else _BAD_ROUND

    def _stages7_lanes(self, m: _Meta, values: np.ndarray | None) -> np.ndarray | None:
        """ValueLanes: lane i's register in stage register_stages(k)[f"lane{i}"]; a packet
        without values (count 0) touches none."""
        if values is None:
            return values
        row = self.lanes[m.idx]
        if m.lane_op == "store":
            row[:] = values
            return values
        if m.lane_op == "add":
            row += values                        # int32 wrap, as the ALU
        return row.copy()

    # -- one packet --------------------------------------------------------------------------

    def process(self, data, sender: Hashable, framing_ok: bool = True) -> list[Emit]:
        self.last_outcome = why = self._admit(data, sender, framing_ok)
        if why is not None:
            return []
        vt, flags, job_id, worker, exp, epoch, ss, count, offset = unpack_raw(data)
        job = self.jobs[job_id]
        slot, s, me = ss & MAX_SLOT, ss >> 15, 1 << worker
        full = (1 << job.n_workers) - 1
        m = _Meta(slot, s * self.n_slots + slot, s, me, job.n_workers, full ^ me)
        self._stage3_claim_slot(m, (job_id << 16) | epoch)
        self._stage4_contributors(m)
        self._stage5_round_record(m, offset, count)
        self._stage6_by_maps(m, (exp & 0xFF) ^ 0x80, flags & _STICKY)
        self._stage7_decision(m)
        values = np.frombuffer(data, ">i4", self.k, HEADER_BYTES).astype(np.int32) if count else None
        values = self._stages7_lanes(m, values)
        self.last_outcome = m.outcome
        if not m.send_result:
            return []
        dup = m.outcome == Outcome.DUP_DONE
        header = HEADER_STRUCT.pack((VERSION << 4) | MSG_RESULT,
                                    m.flags_result | (FLAG_RETRANSMIT if dup else 0), job_id,
                                    worker, ((m.exp_result ^ 0x80) + 128) % 256 - 128, epoch, ss,
                                    count, offset)
        body = b"" if values is None else values.astype(">i4").tobytes()
        return [Emit(job, (worker,) if dup else tuple(range(job.n_workers)), header + body)]


class TofinoModelPipeline(SoftPipeline):
    """The software switch's pipeline with the TNA program's slot logic (TofinoSlotModel):
    run it with the Tofino program's P4Info."""

    def __init__(self, p4info: P4Info) -> None:
        super().__init__(p4info)
        self.engine = TofinoSlotModel(p4info.register_size(SLOT_TAG), p4info.values_per_packet)

"""An executable model of the TNA program's slot logic (p4/tofino/slot_claim.p4, round_record.p4,
slot_state.p4, value_lanes.p4, result_replication.p4), register by register, in the stage order
bf-p4c placed them, with a packet's two passes, for each chip the program is built for
(``CHIPS``: Tofino 1 and Tofino 2, whose lane pairs return both words of a pass).

Why: no tofino-model or Tofino can run here, and the TNA program cannot simply be the BMv2
program (each register is reached once per pass, in stage order, so Tofino decides with what
the earlier stages returned). This model does exactly that: each ``_stage*`` method runs the
register actions the P4 runs in that stage, reading only what earlier stages produced, so a
decision that needs a later register's value cannot be written here either. The program's two
passes are ``first_pass`` (every packet: claim, round record, round state, the lane pairs
adding both values and returning the first, on Tofino 2 both) and ``second_pass`` (a
recirculated packet: a result's harvest, where the other set retires and, on Tofino 1, the
pairs return their second values, or a BAD_ROUND that takes its sender's bit out of the set's
map again). On Tofino 2 a DUP_DONE answer of a harvested round leaves its first pass, and a
reduce-scatter round keeps its owner (round_owner), whose result egress sends with its values
to the owner alone (docs/tofino.md, "Reduce-scatter results"). It has
the slot engine's interface (``process``, ``last_outcome``, ``replace_jobs``), so
``TofinoModelPipeline`` is the
software switch's pipeline with the TNA program's slot logic, and the conformance cases and the
differential fuzz compare it with the reference engine at the TNA's K
(tests/test_tna_slot_model.py). ``register_actions``/``register_stages`` are what the test holds
against the P4 source and the committed compiler output (each chip's context.json).

The slot logic is this module's reading of the P4's register actions; the headers a result
leaves with are not: ``TofinoModelPipeline`` runs the first pass's rewrite, the second pass's
parse, the replication and egress's parse and rewrite as bf-p4c compiled them
(``tna_compiled``: context.json's action primitives, the parsers of the assembly), so the
frames it emits are the compiled program's."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Callable, Hashable

import numpy as np

from inagg.hostlib.aggregator.engine_reference import NO_OWNER, Emit, JobConfig
from inagg.controller.p4info import P4Info, P4Type
from inagg.bmv2_env.softswitch.pipeline_reference import (
    ETH, GUARD_TABLE, INAGG_AT, IP, JOB_TABLE, RECIRC_SPREAD, REPLICA_TABLE, SoftPipeline,
    guard_row_reason, parse,
)
from inagg.bmv2_env.softswitch.tna_compiled import CompiledProgram, header_bytes, pack, unpack
from inagg.hostlib.wire.protocol import (
    FLAG_CONGESTION, FLAG_FROM_SWITCH, FLAG_MINE, FLAG_OVERFLOW, FLAG_RETRANSMIT, HEADER_BYTES,
    HEADER_STRUCT, MAX_SLOT, MSG_CONTRIBUTION, MSG_RESULT, ROUND_TAG_MASK, VERSION, Outcome, ipv4_checksum, unpack_raw,
)

# P4Info architecture -> the chip (the P4's __TARGET_TOFINO__: 1, 2) the model runs
CHIPS = {"tna": "tofino", "t2na": "tofino2"}
# JobCounters' recirculation counters (p4/tofino/job_counters.p4), indexed by pipe
RECIRC_SENT, RECIRC_ARRIVED = (f"InaggIngress.job_counters.recirc_{n}" for n in ("sent", "arrived"))
_MAP_ACTIONS = ("join", "peek", "retire", "undo")


def check_chip(chip: str) -> str:
    """``chip`` when it is one the program is built for, else a ValueError naming them."""
    if chip not in CHIPS.values():
        raise ValueError(f"no Tofino chip {chip!r}: one of {', '.join(CHIPS.values())}")
    return chip


def register_actions(chip: str) -> dict[str, tuple[str, ...]]:
    """Register -> the RegisterActions the P4 declares on it for ``chip`` (pair: every lane
    pair's register; Tofino 2's load returns both words, so it has no load_second; round_tag:
    the round check, on both chips; round_owner: a reduce-scatter round's owner, Tofino 2
    only)."""
    tofino2 = check_chip(chip) == "tofino2"
    owner = {"round_owner": ("owner_first", "owner_add", "owner_read")} if tofino2 else {}
    return {**owner,
        "map0": tuple(f"map0_{a}" for a in _MAP_ACTIONS),
        "map1": tuple(f"map1_{a}" for a in _MAP_ACTIONS),
        "round_record": ("round_open", "round_check"),
        "seen": ("seen_first", "seen_add", "seen_read", "seen_harvested"),
        "exp_max": ("exp_first", "exp_add", "exp_read"),
        "sticky_flags": ("flags_first", "flags_add", "flags_read"),
        "round_tag": ("tag_open", "tag_open_zero", "tag_check"),
        "pair": ("store", "add", "load") + (() if tofino2 else ("load_second",)),
    }


ROUND_STATE_STAGE = 3   # seen, exp_max, sticky_flags (Tofino 2: round_owner): pinned (@stage)
PAIRS_PER_STAGE = 4     # stateful ALUs per stage


def register_stages(k: int, chip: str) -> dict[str, int]:
    """Register (lane pairs as ``pair<i>``) -> the stage this model runs it in: bf-p4c put
    seen, exp_max and sticky_flags in the pinned stage, beside them pair 0 on Tofino 1 and
    round_owner on Tofino 2, and the pairs four per stage after them, the highest first."""
    stages = {"map0": 1, "map1": 1, "round_record": 2, "round_tag": 2, "seen": ROUND_STATE_STAGE,
              "exp_max": ROUND_STATE_STAGE, "sticky_flags": ROUND_STATE_STAGE}
    pairs = k // 2
    beside = "pair0" if check_chip(chip) == "tofino" else "round_owner"
    stages[beside] = ROUND_STATE_STAGE
    rest = [i for i in reversed(range(pairs)) if f"pair{i}" != beside]
    for n, i in enumerate(rest):
        stages[f"pair{i}"] = ROUND_STATE_STAGE + 1 + n // PAIRS_PER_STAGE
    return stages


# What sticky_flags keeps of a packet's flags: the sticky flags and the round tag (slot_inputs.p4:
# the round's tag rides in the round's flags, so every result carries it).
_STICKY = FLAG_OVERFLOW | FLAG_CONGESTION | ROUND_TAG_MASK
_BAD_ROUND, _STALE = Outcome.BAD_ROUND, Outcome.STALE_ROUND
# round_kind (types.p4 KIND_*), the harvest codes (HARVEST_*), seen's harvested bit and what
# seen returns (ROUND_*)
OPEN, NEW, REPEAT = "open", "new", "repeat"
HARVEST_NONE, HARVEST_RESULT, HARVEST_ANSWER, HARVEST_ANSWER_RETIRE, HARVEST_UNDO = range(5)
SEEN_HARVESTED = 0x80
ROUND_PENDING, ROUND_COMPLETE, ROUND_HARVESTED = 0, 1, 3
# The round identity: the decision's rows for a packet whose tag is not its set's
# (an opener's not the next, another's not the set's), keyed on (round_kind, round_next),
# row for row slot_state.p4's last ones: the outcome and the second pass (UNDO: the packet
# set its bit in stage 1, before round_tag could say).
TAG_REFUSALS = {
    (OPEN, 0): (_STALE, HARVEST_UNDO),
    (NEW, 1): (_BAD_ROUND, HARVEST_UNDO),
    (NEW, 0): (_STALE, HARVEST_UNDO),
    (REPEAT, 1): (_BAD_ROUND, HARVEST_NONE),
    (REPEAT, 0): (_STALE, HARVEST_NONE),
}
TAG_SHIFT = 25   # round_tag_of: count32's tag in bits 29-31, (flags & ROUND_TAG_MASK) << 25
TAG_STEP = 1 << 5   # types.p4: round_in is tag << 5, (flags & ROUND_TAG_MASK) << 1
TAG_LAST = 7 << 5   # tag 7's round_in, the one before tag 0's (tag_open_zero)
TAG_BEHIND = -TAG_STEP & 0xFF   # types.p4: round_diff of the set's next round (a byte)
# round_owner's values (types.p4, as p4/include/round_owner.p4's), and OWNER_SHARED in the
# bridged header's 7 bits
OWNER_NONE, OWNER_SHARED, BRIDGED_OWNER_SHARED = 0, 0xFF, 0x7F


def owner_input(flags: int, worker: int) -> int:
    """SlotInputs' owner_input (Tofino 2), row for row: the owner a contribution brings."""
    if flags & FLAG_FROM_SWITCH:
        return OWNER_SHARED
    return worker + 1 if flags & FLAG_MINE else OWNER_NONE


def owner_add(value: int, owner_in: int) -> int:
    """round_owner's owner_add (slot_state.p4): an ADD's update of the round's owner."""
    if owner_in == OWNER_NONE:
        return value
    return owner_in if value == OWNER_NONE else OWNER_SHARED


def owner_rank(owner: int) -> int:
    """The rank a round's owner gives the values alone (NO_OWNER: none, or shared)."""
    return owner - 1 if owner not in (OWNER_NONE, OWNER_SHARED) else NO_OWNER


@dataclass
class _Meta:
    """The PHV fields the slot logic reads and writes (types.p4)."""

    slot: int
    idx: int
    s: int
    me: int
    n: int
    tag: int
    old_maps: tuple[int, int] = (0, 0)
    round_kind: str = ""
    same_round: int = 0
    round_next: int = 0   # round_tag's answers: tag_open's
    round_diff: int = 0   # tag_check's set tag - the packet's (tag_distance), a byte
    moved: int = 0
    round_done: int = ROUND_PENDING   # seen's output
    outcome: Outcome | None = None
    harvest: int = HARVEST_NONE
    exp_result: int = 0    # biased
    flags_result: int = 0
    owner_in: int = OWNER_NONE       # Tofino 2: owner_input's
    owner_result: int = OWNER_NONE   # Tofino 2: round_owner's answer


@dataclass
class Recirculated:
    """A packet that leaves its first pass for a second one, or (``recirculate`` False: a
    Tofino 2 DUP_DONE answer) out of the switch: what its first pass decided (meta, with the
    bridged header's harvest code) and wrote into the packet (the result's header and what the
    pairs returned: on Tofino 1 the first value of every pair, on Tofino 2 both)."""

    job: JobConfig
    meta: _Meta
    header: bytes
    values: np.ndarray | None
    recirculate: bool = True


class TofinoSlotModel:
    """Registers of SlotClaim, RoundRecord, SlotState and ValueLanes (one array per register,
    as on the chip) of the program built for ``chip`` (one of CHIPS' values)."""

    def __init__(self, n_slots: int, values_per_packet: int, chip: str = "tofino") -> None:
        if values_per_packet % 2:
            raise ValueError(f"Tofino's K must be even (lane pairs), got {values_per_packet}")
        self.n_slots, self.k, self.chip = n_slots, values_per_packet, check_chip(chip)
        # words a pair's ALU returns per pass: the first (Tofino 1) or both (Tofino 2)
        self.returned = values_per_packet if chip == "tofino2" else values_per_packet // 2
        self.jobs: dict[int, JobConfig] = {}
        self.last_outcome: Outcome | None = None
        self.maps = [[(0, 0)] * n_slots for _ in range(2)]       # map0, map1: (tag, map)
        self.round_record = [(0, 0)] * (2 * n_slots)
        self.round_tag = [(0, 0)] * (2 * n_slots)                  # (owner, round_in)
        self.seen = [0] * (2 * n_slots)
        self.exp_max = [0] * (2 * n_slots)
        self.sticky_flags = [0] * (2 * n_slots)
        self.keeps_owner = chip == "tofino2"   # round_owner: Tofino 2 only
        self.round_owner = [OWNER_NONE] * (2 * n_slots)
        # pair i = (column i, column K/2 + i): the first and second value of its register word
        self.pairs = np.zeros((2 * n_slots, values_per_packet), np.int32)

    def replace_jobs(self, wanted: dict[int, JobConfig]) -> None:
        for job in wanted.values():
            job.validate(self.n_slots)
        self.jobs = dict(wanted)

    # -- SlotClaim's checks (the order of the checks table) ----------------------------------

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

    # -- first pass, stage by stage ------------------------------------------------------------

    def _stage1_claim(self, m: _Meta) -> None:
        """map<s>_join and map<o>_peek: another owner's tag restarts both maps."""
        old = []
        for x in (0, 1):
            tag, bits = self.maps[x][m.slot]
            if tag != m.tag:
                tag, bits = m.tag, 0
            old.append(bits)
            self.maps[x][m.slot] = (tag, bits | m.me if x == m.s else bits)
        m.old_maps = (old[0], old[1])

    def _stage2_round_record(self, m: _Meta, offset: int, count: int, flags: int) -> None:
        """round_action: the set's old map and the sender's bit in it (a repeat's in the other
        set's too: moved) pick open, check or check_moved; the record keeps the round tag
        beside the count, and tag_action runs."""
        old, other = m.old_maps[m.s], m.old_maps[1 - m.s]
        count |= (flags & ROUND_TAG_MASK) << TAG_SHIFT
        self._stage2_round_tag(m, (flags & ROUND_TAG_MASK) << 1, old == 0)
        if old == 0:                                             # round_open
            m.round_kind, m.same_round = OPEN, 1
            self.round_record[m.idx] = (offset, count)
        else:                                                    # round_check
            m.round_kind = REPEAT if old & m.me else NEW
            m.same_round = int(self.round_record[m.idx] == (offset, count))
        m.moved = int(m.round_kind == REPEAT and bool(other & m.me))

    def _stage2_round_tag(self, m: _Meta, tag: int, opens: bool) -> None:
        """tag_open (an empty set; tag_open_zero for tag 0) or tag_check: the set's tag
        (``tag``: the packet's round_in) under its owner; an opener sets it when its tag is the
        next (the one before it is stored: tag_open adds TAG_STEP to it in 32 bits, so tag 0's
        opener compares with TAG_LAST) or the set holds none (another owner's), round_next;
        another packet reads the set's tag, less its own (SlotState's tag_distance, in a byte):
        round_diff."""
        owner, stored = self.round_tag[m.idx]
        next_of_stored = stored == TAG_LAST if tag == 0 else stored + TAG_STEP == tag
        if opens:
            m.round_next = int(owner != m.tag or next_of_stored)
            if m.round_next:
                self.round_tag[m.idx] = (m.tag, tag)
        else:
            m.round_diff = (stored - tag) & 0xFF

    @staticmethod
    def tag_row(m: _Meta) -> tuple[bool, tuple[str, int]]:
        """The decision on the round tag: whether the packet's tag is taken (an opener's
        is the next, another's the set's), and its TAG_REFUSALS key (round_kind, next)."""
        if m.round_kind == OPEN:
            return bool(m.round_next), (OPEN, m.round_next)
        return m.round_diff == 0, (m.round_kind, int(m.round_diff == TAG_BEHIND))

    def _stage3_round_state(self, m: _Meta, exp_biased: int, flags_in: int) -> None:
        """seen_update, exp_update, flags_update (BY_ROUND): open stores, a new sender of this
        round adds, a repeat reads (seen: complete, and whether its harvest pass was seen); a
        new sender of another round touches nothing."""
        i = m.idx
        if (m.round_kind, m.same_round) == (OPEN, 1):
            self.seen[i], self.exp_max[i], self.sticky_flags[i] = 1, exp_biased, flags_in
        elif (m.round_kind, m.same_round) == (NEW, 1):
            m.round_done = ROUND_COMPLETE if self.seen[i] == m.n - 1 else ROUND_PENDING
            self.seen[i] = (self.seen[i] + 1) & 0xFF
            self.exp_max[i] = max(self.exp_max[i], exp_biased)
            self.sticky_flags[i] |= flags_in
        elif m.round_kind == REPEAT:
            seen = self.seen[i]
            m.round_done = ROUND_COMPLETE if seen == m.n else \
                ROUND_HARVESTED if (seen - m.n) & 0xFF == SEEN_HARVESTED else ROUND_PENDING
        else:
            return
        m.exp_result, m.flags_result = self.exp_max[i], self.sticky_flags[i]
        if self.keeps_owner:
            self._stage3_round_owner(m)

    def _stage3_round_owner(self, m: _Meta) -> None:
        """owner_update (BY_ROUND, Tofino 2): owner_first stores owner_in, owner_add marks,
        a repeat reads; each answers the owner after it."""
        i = m.idx
        if m.round_kind == OPEN:
            self.round_owner[i] = m.owner_in
        elif m.round_kind == NEW:
            self.round_owner[i] = owner_add(self.round_owner[i], m.owner_in)
        m.owner_result = self.round_owner[i]

    def _stage4_decision(self, m: _Meta) -> None:
        """The decision's const entries, row for row. A repeat of a complete round whose
        harvest pass was not seen answers and retires the other set: its "moved" bits are the
        previous round's, the retire never happened."""
        done, harvested = m.round_done != ROUND_PENDING, m.round_done == ROUND_HARVESTED
        taken, row = self.tag_row(m)
        if not taken:
            m.outcome, m.harvest = TAG_REFUSALS[row]
        elif m.round_kind == OPEN:
            m.outcome, m.harvest = Outcome.FIRST, HARVEST_RESULT if m.n == 1 else HARVEST_NONE
        elif m.round_kind == NEW and not m.same_round:
            m.outcome, m.harvest = _BAD_ROUND, HARVEST_UNDO
        elif m.round_kind == NEW:
            m.outcome, m.harvest = Outcome.ADD, HARVEST_RESULT if done else HARVEST_NONE
        elif done and not m.same_round and (not harvested or not m.moved):
            m.outcome = _BAD_ROUND
        elif done and not harvested:
            m.outcome, m.harvest = Outcome.DUP_DONE, HARVEST_ANSWER_RETIRE
        elif done and not m.moved:
            m.outcome, m.harvest = Outcome.DUP_DONE, HARVEST_ANSWER
        elif done:
            m.outcome = _STALE
        else:
            m.outcome = Outcome.DUP_PENDING if m.same_round else _BAD_ROUND

    def _stages3_11_pairs_first(self, m: _Meta, values: np.ndarray | None) -> np.ndarray | None:
        """pair_update of the first pass, pair i in stage register_stages(k, chip)[f"pair{i}"]:
        store, add (returns the sums) or load; each returns the first word of its pair on
        Tofino 1, both on Tofino 2 (``returned``); a packet without values (count 0) touches
        none. Returns the packet's values after the pairs."""
        if values is None:
            return None
        out, row, n = values.copy(), self.pairs[m.idx], self.returned
        if (m.round_kind, m.same_round) == (OPEN, 1):
            row[:] = values
        elif (m.round_kind, m.same_round) == (NEW, 1):
            row += values                        # int32 wrap, as the ALU
            out[:n] = row[:n]
        elif (m.round_kind, m.same_round) == (REPEAT, 1):
            out[:n] = row[:n]
        return out

    def first_pass(self, data, sender: Hashable, framing_ok: bool = True) -> Recirculated | None:
        """Every packet's pass: the packet recirculated for a second pass (a result, or a
        BAD_ROUND that undoes its map bit) or, on Tofino 2, a DUP_DONE answer of a harvested
        round leaving at once (result_replication.p4: answer_at_once); or None."""
        self.last_outcome = why = self._admit(data, sender, framing_ok)
        if why is not None:
            return None
        vt, flags, job_id, worker, exp, epoch, ss, count, offset = unpack_raw(data)
        job = self.jobs[job_id]
        slot, s = ss & MAX_SLOT, ss >> 15
        m = _Meta(slot, s * self.n_slots + slot, s, 1 << worker, job.n_workers, (job_id << 16) | epoch)
        if self.keeps_owner:
            m.owner_in = owner_input(flags, worker)
        self._stage1_claim(m)
        self._stage2_round_record(m, offset, count, flags)
        self._stage3_round_state(m, (exp & 0xFF) ^ 0x80, flags & _STICKY)
        self._stage4_decision(m)
        values = np.frombuffer(data, ">i4", self.k, HEADER_BYTES).astype(np.int32) if count else None
        after = self._stages3_11_pairs_first(m, values)
        self.last_outcome = m.outcome
        if m.harvest == HARVEST_NONE:
            return None
        dup = m.outcome == Outcome.DUP_DONE
        header = HEADER_STRUCT.pack((VERSION << 4) | MSG_RESULT,
                                    m.flags_result | (FLAG_RETRANSMIT if dup else 0), job_id,
                                    worker, ((m.exp_result ^ 0x80) + 128) % 256 - 128, epoch, ss,
                                    count, offset)
        at_once = self.chip == "tofino2" and m.harvest == HARVEST_ANSWER
        return Recirculated(job, m, header, after, recirculate=not at_once)

    # -- second pass -----------------------------------------------------------------------------

    def _stage1_second_pass(self, m: _Meta) -> tuple[bool, bool]:
        """checks' second-pass rows: map<o>_retire (HARVEST_RESULT, HARVEST_ANSWER_RETIRE),
        map<s>_undo (HARVEST_UNDO; Tofino 1's HARVEST_ANSWER with me = 0, worker_mask: its
        owner check, answer_set<s>), each changing the map only where the slot's owner tag is
        still the packet's. Returns (retired: retire's answer, retired0/retired1; owned: the
        owner was still the packet's)."""
        undo = m.harvest == HARVEST_UNDO or m.harvest == HARVEST_ANSWER
        x = m.s if undo else 1 - m.s
        tag, bits = self.maps[x][m.slot]
        owned = tag == m.tag   # (only Tofino 1 recirculates a HARVEST_ANSWER)
        if owned:
            me = 0 if m.harvest == HARVEST_ANSWER else m.me
            self.maps[x][m.slot] = (tag, bits & ~me if undo else 0)
        return owned and not undo, owned

    def _stage3_second_pass(self, m: _Meta, retired: bool) -> None:
        """seen_harvested: a second pass that retired the other set marks the round."""
        if retired:
            self.seen[m.idx] |= SEEN_HARVESTED

    def second_pass(self, r: Recirculated) -> list[Emit]:
        """The recirculated packet: its map update or owner check (stage 1), the harvested mark
        (stage 3), on Tofino 1 the pairs' second values (load_second), then multicast (RESULT),
        unicast (ANSWER*) or drop (UNDO, and a pass whose check found another owner: the job
        was torn down while it recirculated)."""
        m = r.meta
        retired, owned = self._stage1_second_pass(m)
        self._stage3_second_pass(m, retired)
        if m.harvest == HARVEST_UNDO or not owned:
            return []
        if r.values is not None and self.returned < self.k:
            r.values[self.returned:] = self.pairs[m.idx][self.returned:]
        return self._send(r)

    @staticmethod
    def _send(r: Recirculated) -> list[Emit]:
        """The result leaving the switch: to every worker (RESULT) or to its sender (ANSWER*)."""
        m = r.meta
        body = b"" if r.values is None else r.values.astype(">i4").tobytes()
        worker = m.me.bit_length() - 1
        to = tuple(range(r.job.n_workers)) if m.harvest == HARVEST_RESULT else (worker,)
        return [Emit(r.job, to, r.header + body, owner=owner_rank(m.owner_result))]

    def process(self, data, sender: Hashable, framing_ok: bool = True) -> list[Emit]:
        r = self.first_pass(data, sender, framing_ok)
        if r is None:
            return []
        return self.second_pass(r) if r.recirculate else self._send(r)


_RR = "InaggIngress.result_replication."
RECIRCULATE, ANSWER_AT_ONCE, ANSWER_SENDER, MULTICAST = (
    _RR + a for a in ("recirculate", "answer_at_once", "answer_sender", "multicast"))
SET_WORKER_ADDRESS, ELIDE_VALUES = (f"InaggEgress.replica_rewrite.{a}" for a in ("set_worker_address", "elide_values"))
TRUNC_LEN = "eg_intr_md_for_dprsr.mtu_trunc_len"   # the egress deparser's truncation (Tofino 2)


class TofinoModelPipeline(SoftPipeline):
    """The software switch's pipeline with the TNA program's slot logic (TofinoSlotModel), and
    a result's path as bf-p4c compiled it (``tna_compiled``): the first pass's header rewrites
    (``recirculate``, Tofino 2's ``answer_at_once``), the second pass's parse of the
    recirculated packet, the harvest pass's replication and egress's parse and
    ``set_worker_address``, each from the chip's committed compiler output. Run it with the
    Tofino program's P4Info."""

    def __init__(self, p4info: P4Info) -> None:
        arch = p4info.message.pkg_info.arch
        if arch not in CHIPS:
            raise ValueError(f"the Tofino model runs the TNA program's P4Info, not one for "
                             f"{arch or 'no architecture'} (p4/out/tofino/ or p4/out/tofino2/"
                             f"inagg.p4info.txtpb)")
        super().__init__(p4info)
        self.engine = TofinoSlotModel(p4info.slot_pool, p4info.values_per_packet, CHIPS[arch])
        self.compiled = CompiledProgram.load(CHIPS[arch])
        spread = p4info.obj(P4Type.table, "recirc_spread")
        self.spread_mask = (1 << spread.match_fields[1].bitwidth) - 1
        # The recirculation ports' test hook: called with each pass sent to recirculation
        # (device port, frame), a True answer loses it there (a full queue on a chip); what
        # follows is the chip's: counted sent, never arrived, no second pass.
        self.recirc_loss: Callable[[int, bytes], bool] | None = None

    def source_guard(self, port: int, frame) -> bool:
        """No guard before admission: the TNA program guards the frames it forwards (below;
        p4/tofino/source_guard.p4, on both chips: host_port_table's ternary rows)."""
        return False

    def forwarding(self, port: int, frame) -> list[tuple[int, bytes]]:
        """Forwarding, then SourceGuard's drop, which wins: host_port_table's rows on what the
        compiled ingress parser extracted (a recirculated packet, port -1, has no rows)."""
        table = self.tables.tables.get(GUARD_TABLE)
        if port >= 0 and table is not None and table.entries:
            parsed = self.compiled.parse("ingress", frame.data, port & 0x7F).headers
            if self.guard_drop(guard_row_reason(table, port, frame, "ipv4" in parsed, "inagg" in parsed)):
                return []
        return super().forwarding(port, frame)

    def slot_logic(self, payload: bytes, sender: Hashable, framing_ok: bool) -> list:
        """The first pass: what leaves it for a second pass or, on Tofino 2, out (answer)."""
        r = self.engine.first_pass(payload, sender, framing_ok)
        return [] if r is None else [r]

    def result_replication(self, port: int, frame, admit, r: Recirculated):
        """The packet that leaves the first pass, rewritten by the compiled action (recirculate,
        or Tofino 2's answer_at_once), then its second pass or (the answer) egress."""
        d = frame.data
        udp_end = ETH + IP + struct.unpack_from("!H", d, ETH + IP + 4)[0]
        phv = {**unpack("ethernet", d), **unpack("ipv4", d, ETH), **unpack("udp", d, ETH + IP),
               **unpack("inagg", r.header), "hdr.inagg.msg_type": d[INAGG_AT] & 0xF,
               "hdr.bridged.ingress_port": port, "meta.harvest": r.meta.harvest,
               "meta.owner_result": r.meta.owner_result}
        body = (b"" if r.values is None else r.values.astype(">i4").tobytes()) + d[udp_end:]
        if not r.recirculate:
            self.compiled.run(ANSWER_AT_ONCE, phv)
            return self._egress(r, _emit(phv, body), [_unicast(phv)])
        phv["meta.recirc_port"] = self.recirc_port(port >> 7, r.meta.slot)
        self.compiled.run(RECIRCULATE, phv)
        self.counters.count(RECIRC_SENT, port >> 7)
        via, wire = phv["ig_intr_md_for_tm.ucast_egress_port"], _emit(phv, body)
        if self.recirc_loss is not None and self.recirc_loss(via, wire):
            return []
        return self._second_pass(r, wire, via)

    def recirc_port(self, pipe: int, slot: int) -> int:
        """RecircSpread: the port the controller's row for (pipe, the slot's low bits) names,
        else the pipe's recirculation port (via_pipe_port)."""
        row = self.tables[RECIRC_SPREAD].lookup((pipe, slot & self.spread_mask))
        return row.param("port") if row is not None else pipe << 7 | self.compiled.recirc_port

    def _second_pass(self, r: Recirculated, wire: bytes, via: int) -> list[tuple[int, bytes]]:
        """The recirculated packet through the compiled ingress parser, arriving on port
        ``via``: a second pass (counted in recirc_arrived, by via's pipe) where the parser takes
        the port for a recirculation or reserved loopback one and finds the bridged and inagg
        headers again; else ordinary traffic on its second pass (l2_table on what the parser
        took for its Ethernet header), as on the chip. Only ``recirc_loss`` loses a pass here;
        on a chip the difference of the two counts is what the pipe's ports lost."""
        parsed = self.compiled.parse("ingress", wire, via & 0x7F)
        if not {"bridged", "inagg"} <= set(parsed.headers):
            return self.forwarding(-1, parse(wire[parsed.headers.get("ethernet", header_bytes("bridged")):]))
        self.counters.count(RECIRC_ARRIVED, via >> 7)
        phv = dict(parsed.phv)
        emits = self.engine.second_pass(r)     # the slot logic: retire, harvested, load_second
        if not emits:
            return []
        at = parsed.headers["inagg"] + header_bytes("inagg")
        body = emits[0].data[HEADER_BYTES:] + wire[at + len(emits[0].data) - HEADER_BYTES:]
        if phv["hdr.bridged.harvest"] == HARVEST_RESULT:
            phv["meta.mcast_grp"] = self.tables[JOB_TABLE].lookup((r.job.job_id,)).param("mcast_grp")
            self.compiled.run(MULTICAST, phv)
            group = self.pre.groups.get(phv["ig_intr_md_for_tm.mcast_grp_a"], ())
            targets = [(x.port, x.instance) for x in group]
        else:
            self.compiled.run(ANSWER_SENDER, phv)
            targets = [_unicast(phv)]
        return self._egress(r, _emit(phv, body), targets)

    def _egress(self, r: Recirculated, wire: bytes, targets) -> list[tuple[int, bytes]]:
        """Each copy through the compiled egress parser, ReplicaRewrite (replica_table and the
        compiled set_worker_address; on Tofino 2 the compiled elide_values where the bridged
        owner is another replica's) and the egress deparser (IPv4 checksum recomputed, the
        frame truncated where elide_values set mtu_trunc_len)."""
        out = []
        for port, replica in targets:
            parsed = self.compiled.parse("egress", wire)
            phv = dict(parsed.phv)
            if "inagg" in parsed.headers and phv["hdr.inagg.msg_type"] == MSG_RESULT and replica:
                rewrite = self.tables[REPLICA_TABLE].lookup((r.job.job_id, replica))
                if rewrite is None:
                    continue
                self.compiled.run(SET_WORKER_ADDRESS, phv, dict(rewrite.params))
                if self.engine.keeps_owner and _elided(phv, replica, parsed.extracted.get("hdr.bridged.owner", 0)):
                    self.compiled.run(ELIDE_VALUES, phv)
            out.append((port, _egress_deparse(parsed, phv, wire)))
        return out


def _elided(phv: dict, replica: int, owner: int) -> bool:
    """ReplicaRewrite's test for elide_values (Tofino 2): a result with values whose round has
    an owner, and this copy is another replica's."""
    return phv["hdr.inagg.count"] != 0 and owner not in (OWNER_NONE, BRIDGED_OWNER_SHARED) and replica != owner


def _unicast(phv: dict) -> tuple[int, int]:
    """Where answer_sender sent the packet: its egress port and the bridged replica."""
    return phv["ig_intr_md_for_tm.ucast_egress_port"], phv["hdr.bridged.replica"]


def _emit(phv: dict, body: bytes) -> bytes:
    """The ingress deparser: every header, bridged first, then what follows them."""
    return b"".join(pack(h, phv) for h in ("bridged", "ethernet", "ipv4", "udp", "inagg")) + body


def _egress_deparse(parsed, phv: dict, wire: bytes) -> bytes:
    """The egress deparser: the valid headers of Ethernet, IPv4 (checksum recomputed), UDP and
    inagg, then the packet after what the parser took (the bridged header is not emitted); cut
    to mtu_trunc_len bytes where an action set it."""
    out = b""
    for h in ("ethernet", "ipv4", "udp", "inagg"):
        if h in parsed.headers:
            if h == "ipv4":
                phv["hdr.ipv4.hdr_checksum"] = 0
                phv["hdr.ipv4.hdr_checksum"] = ipv4_checksum(pack("ipv4", phv))
            out += pack(h, phv)
    out += wire[max(parsed.end(), header_bytes("bridged")):]
    return out[:phv[TRUNC_LEN]] if TRUNC_LEN in phv else out

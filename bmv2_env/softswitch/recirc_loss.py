"""Lost second passes on the Tofino model's recirculation ports: ``inagg-soft-switch --engine
tofino-model --recirc-loss PASS:SCHEDULE``, what a full recirculation queue does on a chip
(docs/tofino.md, "Lost passes").

A second pass is named by the harvest code its first pass bridged (p4/tofino/types.p4):
``result`` (a completed round's harvest), ``answer`` (Tofino 1's answer of a harvested round),
``answer-retire`` (the answer of a complete round whose harvest was lost) and ``undo`` (a
``bad_round`` sender's bit taken out again). Each kind has its own schedule, either

* ``PCT%``: that share of its passes lost, each a seeded draw (``--loss-seed``, with a salt per
  kind: the n-th pass of a kind meets the same fate in every run of a seed), or
* ``N[,N...]``: exactly its N-th passes lost, counted from 1 (``undo:1`` loses the first undo
  pass and no other): a deterministic schedule, which the end-to-end tests use to assert
  counts.

What is lost is counted by the program's own counters, as on a chip: the pass is counted in
``recirc_sent`` and never in ``recirc_arrived``; ``RecircLoss.lost`` keeps the count per kind,
which the switch logs at stop.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from inagg.bmv2_env.softswitch.tna_compiled import unpack
from inagg.bmv2_env.softswitch.tna_slot_model import (
    HARVEST_ANSWER, HARVEST_ANSWER_RETIRE, HARVEST_RESULT, HARVEST_UNDO,
)

# The --recirc-loss names of the second passes, by the harvest code their first pass bridged.
PASSES = {"result": HARVEST_RESULT, "answer": HARVEST_ANSWER, "answer-retire": HARVEST_ANSWER_RETIRE,
          "undo": HARVEST_UNDO}
PASS_NAMES = {code: name for name, code in PASSES.items()}
USAGE = "PASS:PCT% or PASS:N[,N...] (PASS one of " + ", ".join(PASSES) + ")"


@dataclass(frozen=True)
class Schedule:
    """Which passes of one kind are lost: a share drawn per pass, or the listed ordinals."""

    share: float = 0.0
    ordinals: frozenset[int] = frozenset()


def parse_schedule(text: str) -> tuple[int, Schedule]:
    """``PASS:PCT%`` or ``PASS:N[,N...]`` as (harvest code, schedule); a ValueError naming what
    is wrong and what to write."""
    name, sep, spec = text.partition(":")
    where = f"--recirc-loss {text!r}"
    if not sep or not spec:
        raise ValueError(f"{where}: expected {USAGE}")
    if name not in PASSES:
        raise ValueError(f"{where}: no pass named {name!r}; expected {USAGE}")
    if spec.endswith("%"):
        try:
            pct = float(spec[:-1])
        except ValueError:
            pct = float("nan")
        if not 0 <= pct <= 100:
            raise ValueError(f"{where}: the share must be a percentage in 0..100, as {name}:30%")
        return PASSES[name], Schedule(share=pct / 100)
    parts = spec.split(",")
    if not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"{where}: expected a percentage ending in % ({name}:30%) or the ordinals "
                         f"of the passes to lose, counted from 1 ({name}:1,3)")
    return PASSES[name], Schedule(ordinals=frozenset(int(p) for p in parts))


def parse_schedules(texts: list[str]) -> dict[int, Schedule]:
    """Every --recirc-loss option, by harvest code; a pass named twice is refused."""
    out: dict[int, Schedule] = {}
    for text in texts:
        code, schedule = parse_schedule(text)
        if code in out:
            raise ValueError(f"--recirc-loss names {PASS_NAMES[code]!r} twice: give one schedule per pass")
        out[code] = schedule
    return out


@dataclass
class RecircLoss:
    """The hook of ``TofinoModelPipeline.recirc_loss``: called with each pass sent to a
    recirculation port, True where its kind's schedule loses it."""

    schedules: dict[int, Schedule]
    seed: int = 0
    seen: dict[int, int] = field(default_factory=dict)
    lost: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.draws = {code: random.Random(self.seed * 8 + code) for code in self.schedules}

    def __call__(self, port: int, wire: bytes) -> bool:
        code = unpack("bridged", wire)["hdr.bridged.harvest"]
        schedule = self.schedules.get(code)
        if schedule is None:
            return False
        n = self.seen[code] = self.seen.get(code, 0) + 1
        draw = self.draws[code].random()        # drawn for every pass: the n-th pass's draw is fixed
        if n in schedule.ordinals or draw < schedule.share:
            self.lost[PASS_NAMES[code]] = self.lost.get(PASS_NAMES[code], 0) + 1
            return True
        return False

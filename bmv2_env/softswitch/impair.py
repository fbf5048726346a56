"""Impairments on the software switch's ports: the Python twin of ``native/port_impairment.cpp``.

This kernel has no netem, so a topology link's ``"loss"``, ``"delay"``, ``"jitter"``,
``"duplicate"`` and ``"reorder"`` are applied by the software data plane itself
(``inagg-soft-switch --loss PORT:in|out:PCT --delay PORT:in|out:MS --jitter PORT:in|out:MS
--duplicate PORT:in|out:PCT --reorder PORT:in|out:PCT``), with netem's meaning: each impaired
port direction drops a share of its frames, ingress before the pipeline and the capture sees
the frame (as if lost on the wire towards the switch), egress before the frame is sent or
captured (lost on the wire away from it); each frame it keeps it holds back for the direction's
delay plus a jitter drawn uniformly in +-jitter (``DelayLine`` releases them in time order, so
jitter reorders frames as netem's time-sorted queue does); a ``reorder`` share of them leaves
at once instead, ahead of the held ones (netem's reorder, whose gap is 1); a ``duplicate`` share
is sent twice, the copy with a delay of its own draw.

A frame's fate is a pure function of (seed, port, direction, its index n among the frames of
that port direction, the decision): ``impair_hash``, splitmix64 twice with one salt per
decision (``LOSS``, ``DUPLICATE``, ...), a share hit when the draw is below the fraction's
share of 2**64 (``int(fraction * 2**64)``, exact for a double). Nothing depends on time or on a
shared random stream, so the C++ loop and this twin (the Python packet loop's) treat the same
frames of the same sequence alike, which tests/test_switch_port_loss.py checks with hypothesis,
and a run's counts can be reproduced from its seed. What is counted is what happened: frames
seen, dropped, delayed, duplicated, and reordered (``left``: a frame leaving after a later one
of its direction, measured as frames leave, whether jitter or reorder put it there).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

MASK = (1 << 64) - 1
SALT_STEP = 0xD1B54A32D192ED03
LOSS, DUPLICATE, REORDER, JITTER, COPY_JITTER = range(5)   # the draws (native Draw)


def mix64(x: int) -> int:
    """splitmix64's finalizer on a 64-bit word."""
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def impair_hash(seed: int, port: int, egress: bool, n: int, salt: int) -> int:
    """The draw ``salt`` of frame ``n`` (0, 1, ...) of ``port``'s direction."""
    stream = (seed ^ (port << 49) ^ (int(egress) << 48)) & MASK
    return mix64((mix64((stream + salt * SALT_STEP) & MASK) + n) & MASK)


def _fraction(value: float, what: str) -> float:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"port {what}: the fraction must be in 0..1")
    return value


def _hit(fraction: float, draw: int) -> bool:
    """Whether a draw falls in the share ``fraction`` (the native Share::hit)."""
    return fraction >= 1.0 or draw < int(fraction * 2**64)


@dataclass
class _Impairment:
    loss: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    delay_us: int = 0
    jitter_us: int = 0
    latest_left: int = -1
    seen: int = 0
    dropped: int = 0
    delayed: int = 0
    duplicated: int = 0
    reordered: int = 0


class PortImpairments:
    """Seeded impairments per port direction, counted (``stats``: as the native loop's
    ``impairment_stats``, a dict per impaired direction, sorted by port, ingress first)."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._table: dict[tuple[int, bool], _Impairment] = {}

    def _at(self, port: int, egress: bool) -> _Impairment:
        return self._table.setdefault((port, egress), _Impairment())

    def set_loss(self, port: int, egress: bool, fraction: float) -> None:
        """Drop ``fraction`` (0..1) of ``port``'s frames in (or, ``egress``, out)."""
        self._at(port, egress).loss = _fraction(fraction, "loss")

    def set_delay(self, port: int, egress: bool, delay_us: int) -> None:
        """Hold ``port``'s frames in (or out) ``delay_us`` back."""
        if delay_us < 0:
            raise ValueError("port delay: must be >= 0 us")
        self._at(port, egress).delay_us = delay_us

    def set_jitter(self, port: int, egress: bool, jitter_us: int) -> None:
        """Draw each frame's delay uniformly in delay +- ``jitter_us`` (whole us, at least 0)."""
        if jitter_us < 0:
            raise ValueError("port jitter: must be >= 0 us")
        self._at(port, egress).jitter_us = jitter_us

    def set_duplicate(self, port: int, egress: bool, fraction: float) -> None:
        """Send ``fraction`` of the frames kept twice."""
        self._at(port, egress).duplicate = _fraction(fraction, "duplicate")

    def set_reorder(self, port: int, egress: bool, fraction: float) -> None:
        """Let ``fraction`` of the frames kept leave at once, ahead of the held ones."""
        self._at(port, egress).reorder = _fraction(fraction, "reorder")

    def _delay(self, imp: _Impairment, port: int, egress: bool, n: int, salt: int) -> int:
        if not imp.jitter_us:
            return imp.delay_us
        offset = impair_hash(self.seed, port, egress, n, salt) % (2 * imp.jitter_us + 1) - imp.jitter_us
        return max(0, imp.delay_us + offset)

    def next(self, port: int, egress: bool) -> tuple[bool, int, bool, int, int]:
        """(dropped, delay_us, duplicated, copy_delay_us, n) of the next frame of ``port``'s
        direction; counts it."""
        imp = self._table.get((port, egress))
        if imp is None:
            return False, 0, False, 0, 0
        n, imp.seen = imp.seen, imp.seen + 1
        if _hit(imp.loss, impair_hash(self.seed, port, egress, n, LOSS)):
            imp.dropped += 1
            return True, 0, False, 0, n
        at_once = imp.reorder > 0 and _hit(imp.reorder, impair_hash(self.seed, port, egress, n, REORDER))
        delay = 0 if at_once else self._delay(imp, port, egress, n, JITTER)
        duplicated = imp.duplicate > 0 and _hit(imp.duplicate, impair_hash(self.seed, port, egress, n, DUPLICATE))
        copy_delay = 0 if at_once or not duplicated else self._delay(imp, port, egress, n, COPY_JITTER)
        imp.duplicated += duplicated
        imp.delayed += delay > 0
        return False, delay, duplicated, copy_delay, n

    def left(self, port: int, egress: bool, n: int) -> None:
        """Frame ``n`` of ``port``'s direction (or its copy) leaves now: reordered when a later
        one of that direction already left."""
        imp = self._table.get((port, egress))
        if imp is None:
            return
        if n < imp.latest_left:
            imp.reordered += 1
        else:
            imp.latest_left = n

    def stats(self) -> list[dict]:
        keys = ("seen", "dropped", "delayed", "duplicated", "reordered", "loss", "duplicate", "reorder",
                "delay_us", "jitter_us")
        return [{"port": port, "egress": egress, **{k: getattr(v, k) for k in keys}}
                for (port, egress), v in sorted(self._table.items())]


class DelayLine:
    """Frames held back for their port direction's delay (the twin of native DelayLine):
    released in time order, ties in the order they were held."""

    def __init__(self) -> None:
        self._held: list[tuple[float, int, int, bool, int, bytes]] = []
        self._seq = 0

    def hold(self, release: float, port: int, egress: bool, n: int, frame: bytes) -> None:
        heapq.heappush(self._held, (release, self._seq, port, egress, n, frame))
        self._seq += 1

    def next_release(self) -> float | None:
        return self._held[0][0] if self._held else None

    def take_due(self, now: float) -> list[tuple[int, bool, int, bytes]]:
        """The frames due at ``now``, earliest first: (port, egress, n, frame) each."""
        due = []
        while self._held and self._held[0][0] <= now:
            _, _, port, egress, n, frame = heapq.heappop(self._held)
            due.append((port, egress, n, frame))
        return due


def _port_amount(text: str, option: str, unit: str) -> tuple[int, bool, float]:
    """``PORT:in|out:AMOUNT`` as (port, egress, amount >= 0); ValueError naming what to write."""
    parts = text.split(":")
    try:
        port, direction, amount = int(parts[0]), parts[1], float(parts[2])
    except (ValueError, IndexError):
        direction, amount = "", -1.0
    if len(parts) != 3 or direction not in ("in", "out") or not amount >= 0:
        raise ValueError(f"{option} {text!r}: write PORT:in|out:{unit}, e.g. 3:in:1.5")
    return port, direction == "out", amount


# the soft switch's impairment options: unit on the command line, setting of the twin
UNITS = {"loss": "PERCENT", "delay": "MS", "jitter": "MS", "duplicate": "PERCENT", "reorder": "PERCENT"}
SETTINGS = {"loss": "loss", "delay": "delay_us", "jitter": "jitter_us", "duplicate": "duplicate",
            "reorder": "reorder"}


def parse_impairment(name: str, text: str) -> tuple[int, bool, float | int]:
    """``--NAME PORT:in|out:AMOUNT`` (``UNITS``) as (port, egress, the twin's setting): a
    fraction 0..1 of a percentage, whole microseconds of milliseconds."""
    unit = UNITS[name]
    port, egress, amount = _port_amount(text, f"--{name}", unit)
    if unit == "MS":
        return port, egress, round(amount * 1000)
    if amount > 100:
        raise ValueError(f"--{name} {text!r}: PERCENT must be in 0..100")
    return port, egress, amount / 100


def settings_by_direction(parsed: dict[str, list[tuple[int, bool, float | int]]]) -> dict[tuple[int, bool], dict]:
    """Each impaired (port, egress)'s settings ({loss, delay_us, jitter_us, duplicate,
    reorder}, unset ones 0) from ``parse_impairment``'s results per option name."""
    out: dict[tuple[int, bool], dict] = {}
    for name, entries in parsed.items():
        for port, egress, value in entries:
            out.setdefault((port, egress), dict.fromkeys(SETTINGS.values(), 0))[SETTINGS[name]] = value
    return out


def configure(impair: PortImpairments, settings: dict[tuple[int, bool], dict]) -> None:
    """Set ``settings_by_direction``'s settings on the twin."""
    for (port, egress), s in settings.items():
        impair.set_loss(port, egress, s["loss"])
        impair.set_delay(port, egress, s["delay_us"])
        impair.set_jitter(port, egress, s["jitter_us"])
        impair.set_duplicate(port, egress, s["duplicate"])
        impair.set_reorder(port, egress, s["reorder"])


def stats_json(stats: list[dict]) -> list[dict]:
    """The stats (``PortImpairments.stats``, the native ``impairment_stats``) as the soft switch
    saves them (``--impair-stats``) and the summary reads them: counts, and what was asked in
    the topology's units."""
    return [{"port": e["port"], "direction": "out" if e["egress"] else "in",
             **{k: e[k] for k in ("seen", "dropped", "delayed", "duplicated", "reordered")},
             "loss_pct": 100 * e["loss"], "delay_ms": e["delay_us"] / 1000, "jitter_ms": e["jitter_us"] / 1000,
             "duplicate_pct": 100 * e["duplicate"], "reorder_pct": 100 * e["reorder"]} for e in stats]

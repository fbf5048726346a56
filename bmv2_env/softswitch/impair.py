"""Loss and delay on the software switch's ports: the Python twin of ``native/port_impairment.cpp``.

This kernel has no netem, so a topology link's ``"loss"`` and ``"delay"`` are applied by the
software data plane itself (``inagg-soft-switch --loss PORT:in|out:PCT --delay PORT:in|out:MS``):
each impaired port direction drops a share of its frames, ingress before the pipeline and the
capture sees the frame (as if lost on the wire towards the switch), egress before the frame is
sent or captured (lost on the wire away from it); the frames it keeps it holds back for the
direction's delay (``DelayLine``), a constant one, so they leave in the order they came.

A frame's fate is a pure function of (seed, port, direction, its index among the frames of
that port direction): ``loss_hash``, splitmix64 twice, dropped when the hash is below the
fraction's share of 2**64 (``int(fraction * 2**64)``, exact for a double). Nothing depends on
time or on a shared random stream, so the C++ loop and this twin (the Python packet loop's)
drop the same frames of the same sequence, which tests/test_port_impairment.py checks with
hypothesis, and a run's counts can be reproduced from its seed.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

MASK = (1 << 64) - 1


def mix64(x: int) -> int:
    """splitmix64's finalizer on a 64-bit word."""
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def loss_hash(seed: int, port: int, egress: bool, n: int) -> int:
    """The hash deciding frame ``n`` (0, 1, ...) of ``port``'s direction."""
    stream = (seed ^ (port << 49) ^ (int(egress) << 48)) & MASK
    return mix64((mix64(stream) + n) & MASK)


@dataclass
class _Impairment:
    fraction: float = 0.0
    delay_us: int = 0
    seen: int = 0
    dropped: int = 0
    delayed: int = 0


class PortImpairments:
    """Seeded loss and a constant delay per port direction, counted (``stats``: as the native
    loop's ``impairment_stats``: (port, egress, seen, dropped, fraction, delay_us, delayed),
    sorted by port, ingress first)."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._table: dict[tuple[int, bool], _Impairment] = {}

    def set_loss(self, port: int, egress: bool, fraction: float) -> None:
        """Drop ``fraction`` (0..1) of ``port``'s frames in (or, ``egress``, out)."""
        if not 0.0 <= fraction <= 1.0:
            raise ValueError("port loss: the fraction must be in 0..1")
        self._table.setdefault((port, egress), _Impairment()).fraction = fraction

    def set_delay(self, port: int, egress: bool, delay_us: int) -> None:
        """Hold ``port``'s frames in (or out) ``delay_us`` back."""
        if delay_us < 0:
            raise ValueError("port delay: must be >= 0 us")
        self._table.setdefault((port, egress), _Impairment()).delay_us = delay_us

    def next(self, port: int, egress: bool) -> tuple[bool, int]:
        """(dropped, delay_us) of the next frame of ``port``'s direction; counts it."""
        imp = self._table.get((port, egress))
        if imp is None:
            return False, 0
        n, imp.seen = imp.seen, imp.seen + 1
        if imp.fraction >= 1.0 or loss_hash(self.seed, port, egress, n) < int(imp.fraction * 2**64):
            imp.dropped += 1
            return True, 0
        imp.delayed += imp.delay_us > 0
        return False, imp.delay_us

    def stats(self) -> list[tuple[int, bool, int, int, float, int, int]]:
        return [(port, egress, v.seen, v.dropped, v.fraction, v.delay_us, v.delayed)
                for (port, egress), v in sorted(self._table.items())]


class DelayLine:
    """Frames held back for their port direction's delay (the twin of native DelayLine):
    released in time order, ties in the order they were held."""

    def __init__(self) -> None:
        self._held: list[tuple[float, int, int, bool, bytes]] = []
        self._seq = 0

    def hold(self, release: float, port: int, egress: bool, frame: bytes) -> None:
        heapq.heappush(self._held, (release, self._seq, port, egress, frame))
        self._seq += 1

    def next_release(self) -> float | None:
        return self._held[0][0] if self._held else None

    def take_due(self, now: float) -> list[tuple[int, bool, bytes]]:
        """The frames due at ``now``, earliest first: (port, egress, frame) each."""
        due = []
        while self._held and self._held[0][0] <= now:
            _, _, port, egress, frame = heapq.heappop(self._held)
            due.append((port, egress, frame))
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


def parse_loss(text: str) -> tuple[int, bool, float]:
    """``--loss PORT:in|out:PERCENT`` as (port, egress, fraction 0..1)."""
    port, egress, pct = _port_amount(text, "--loss", "PERCENT")
    if pct > 100:
        raise ValueError(f"--loss {text!r}: PERCENT must be in 0..100")
    return port, egress, pct / 100


def parse_delay(text: str) -> tuple[int, bool, int]:
    """``--delay PORT:in|out:MS`` as (port, egress, delay in whole microseconds)."""
    port, egress, ms = _port_amount(text, "--delay", "MS")
    return port, egress, round(ms * 1000)


def stats_json(stats: list[tuple[int, bool, int, int, float, int, int]]) -> list[dict]:
    """The stats as the soft switch saves them (``--impair-stats``) and the summary reads them."""
    return [{"port": port, "direction": "out" if egress else "in", "seen": seen, "dropped": dropped,
             "loss_pct": 100 * fraction, "delay_ms": delay_us / 1000, "delayed": delayed}
            for port, egress, seen, dropped, fraction, delay_us, delayed in stats]

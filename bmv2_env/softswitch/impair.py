"""Loss on the software switch's ports: the Python twin of ``native/port_impairment.cpp``.

This kernel has no netem, so a topology link's ``"loss"`` is applied by the software data plane
itself (``inagg-soft-switch --loss PORT:in|out:PCT``): each impaired port direction drops a
share of its frames, ingress before the pipeline and the capture sees the frame (as if lost on
the wire towards the switch), egress before the frame is sent or captured (lost on the wire
away from it).

A frame's fate is a pure function of (seed, port, direction, its index among the frames of
that port direction): ``loss_hash``, splitmix64 twice, dropped when the hash is below the
fraction's share of 2**64 (``int(fraction * 2**64)``, exact for a double). Nothing depends on
time or on a shared random stream, so the C++ loop and this twin (the Python packet loop's)
drop the same frames of the same sequence, which tests/test_port_impairment.py checks with
hypothesis, and a run's counts can be reproduced from its seed.
"""

from __future__ import annotations

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
class _Loss:
    fraction: float
    seen: int = 0
    dropped: int = 0


class PortImpairments:
    """Seeded loss per port direction, counted (``stats``: as the native loop's
    ``impairment_stats``: (port, egress, seen, dropped, fraction), sorted by port, ingress
    first)."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._loss: dict[tuple[int, bool], _Loss] = {}

    def set_loss(self, port: int, egress: bool, fraction: float) -> None:
        """Drop ``fraction`` (0..1) of ``port``'s frames in (or, ``egress``, out)."""
        if not 0.0 <= fraction <= 1.0:
            raise ValueError("port loss: the fraction must be in 0..1")
        self._loss[(port, egress)] = _Loss(fraction)

    def drop(self, port: int, egress: bool) -> bool:
        """Whether the next frame of ``port``'s direction is dropped; counts it."""
        loss = self._loss.get((port, egress))
        if loss is None:
            return False
        n, loss.seen = loss.seen, loss.seen + 1
        dropped = loss.fraction >= 1.0 or loss_hash(self.seed, port, egress, n) < int(loss.fraction * 2**64)
        loss.dropped += dropped
        return dropped

    def stats(self) -> list[tuple[int, bool, int, int, float]]:
        return [(port, egress, v.seen, v.dropped, v.fraction) for (port, egress), v in sorted(self._loss.items())]


def parse_loss(text: str) -> tuple[int, bool, float]:
    """``--loss PORT:in|out:PCT`` as (port, egress, fraction); ValueError naming what to write."""
    parts = text.split(":")
    try:
        port, direction, pct = int(parts[0]), parts[1], float(parts[2])
    except (ValueError, IndexError):
        raise ValueError(f"--loss {text!r}: write PORT:in|out:PERCENT, e.g. 3:in:1.5") from None
    if len(parts) != 3 or direction not in ("in", "out") or not 0 <= pct <= 100:
        raise ValueError(f"--loss {text!r}: write PORT:in|out:PERCENT with PERCENT in 0..100, e.g. 3:out:1")
    return port, direction == "out", pct / 100


def stats_json(stats: list[tuple[int, bool, int, int, float]]) -> list[dict]:
    """The stats as the soft switch saves them (``--impair-stats``) and the summary reads them."""
    return [{"port": port, "direction": "out" if egress else "in", "seen": seen, "dropped": dropped,
             "loss_pct": 100 * fraction} for port, egress, seen, dropped, fraction in stats]

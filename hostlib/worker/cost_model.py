"""Alpha-beta cost model of inagg's collectives, a link estimator that measures alpha and beta,
and a chooser that picks the cheapest collective with hysteresis. Equations and their reasoning:
docs/artopk.md.

Every collective here is a sequence of inagg sum-allreduces, so the model prices one allreduce
and adds up. One allreduce of ``b`` payload bytes costs::

    T(b) = 2 * rounds * alpha + fan_in * (1 + h) * beta * b

- ``alpha``: latency of one message (worker -> aggregator or back); a round trip is 2 alpha.
  Every allreduce takes 2 rounds: slot 0's control/priming round (sizes, grant agreement and,
  for float32, block exponents), then the data.
- ``beta``: seconds per wire byte of the bottleneck link. A switch aggregates packet by packet
  at line rate and the window keeps the pipe full, so sending b and receiving the sum overlap on
  a full-duplex link: b crosses each worker link once each way (fan_in 1). A host aggregator's
  own link carries every worker's b in and every result out: fan_in N.
- ``h``: header bytes per payload byte, (16 + 42) / (4 K) for K values per packet.

Compute time (top-k, quantization) is not modeled.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from inagg.hostlib.wire.protocol import ENCAP_BYTES, HEADER_BYTES, SWITCH_VALUES_PER_PACKET

PLANS = ("dense", "artopk", "allgather_topk")
PATHS = ("ina", "host")  # through the switch (fan-in 1) / through a host aggregator (fan-in N)
OPTIONS = tuple(f"{plan}_{path}" for plan in PLANS for path in PATHS)


def header_overhead(values_per_packet: int) -> float:
    """Wire bytes beyond the payload per payload byte (inagg header + Ethernet/IPv4/UDP)."""
    return (HEADER_BYTES + ENCAP_BYTES) / (4 * values_per_packet)


SWITCH_HEADER_OVERHEAD = header_overhead(SWITCH_VALUES_PER_PACKET)  # 58 / 256


@dataclass(frozen=True)
class CostModel:
    """Predicted seconds of each option ``<plan>_<path>`` for a gradient of ``m`` bytes
    (float32: 4 per element) at compression ratio ``c`` (fraction of elements kept)."""

    alpha: float
    beta: float
    n_workers: int
    header_overhead: float = SWITCH_HEADER_OVERHEAD
    selection: str = "star"  # AR-Topk's root selection; VAR adds one allreduce of N floats

    def __post_init__(self) -> None:
        if not (self.alpha >= 0 and self.beta >= 0 and self.header_overhead >= 0):
            raise ValueError(f"cost model needs alpha, beta, header overhead >= 0, got "
                             f"{self.alpha}, {self.beta}, {self.header_overhead}")
        if self.n_workers < 1:
            raise ValueError(f"cost model needs n_workers >= 1, got {self.n_workers}")
        if self.selection not in ("star", "var"):
            raise ValueError(f"selection must be 'star' or 'var', got {self.selection!r}")

    def allreduce(self, nbytes: float, *, is_float: bool, path: str) -> float:
        """Seconds of one sum-allreduce of ``nbytes`` payload bytes."""
        rounds = 2  # control/priming round + data, float32 and int32 alike
        fan_in = 1 if path == "ina" else self.n_workers
        return 2 * rounds * self.alpha + fan_in * (1 + self.header_overhead) * self.beta * nbytes

    def calls(self, plan: str, m: float, c: float) -> list[tuple[float, bool]]:
        """The allreduces of ``plan`` as (payload bytes, is float32). Index and value vectors of
        k = c * numel elements are both c * m bytes (4-byte int32 / float32)."""
        n = self.n_workers
        if plan == "dense":
            return [(m, True)]
        if plan == "artopk":
            selection = [(4 * n, True)] if self.selection == "var" else []
            return selection + [(c * m, False), (c * m, True)]
        if plan == "allgather_topk":
            return [(n * c * m, True), (n * c * m, False)]
        raise ValueError(f"unknown plan {plan!r}; plans are {PLANS}")

    def predict(self, option: str, m: float, c: float) -> float:
        """Seconds of one step's communication with ``option`` (one of ``OPTIONS``)."""
        if option not in OPTIONS:
            raise ValueError(f"unknown collective {option!r}; options are {OPTIONS}")
        if m <= 0 or not 0 < c <= 1:
            raise ValueError(f"need gradient bytes m > 0 and CR c in (0, 1], got {m}, {c}")
        plan, _, path = option.rpartition("_")
        return sum(self.allreduce(b, is_float=f, path=path) for b, f in self.calls(plan, m, c))

    def predict_all(self, m: float, c: float, options: Sequence[str] = OPTIONS) -> dict[str, float]:
        return {o: self.predict(o, m, c) for o in options}


class LinkEstimator:
    """alpha and beta fitted to observed transfers: least squares of
    ``seconds = alpha * latencies + beta * nbytes`` over the last ``window`` samples, with both
    parameters constrained to be >= 0.

    ``latencies`` is how many alpha a sample paid: 1 for a one-way message (then the fit is
    the plain ``T = alpha + beta * bytes``), 2 per allreduce round trip, so a float32 inagg
    allreduce is 4 (int32 too: the control round precedes the data), and 2 for a call small
    enough to ride in the control round (``StreamBase.round_trips``); ``nbytes`` are wire bytes of the bottleneck link
    (``StreamStats.wire_bytes_sent`` on a switch path). Real transfers pin beta; tiny probes
    (a one-element int32 allreduce) pin alpha. Until the window holds two samples that are not
    proportional in (latencies, nbytes), the priors given at construction are returned.
    """

    def __init__(self, alpha: float, beta: float, *, window: int = 64) -> None:
        if alpha < 0 or beta < 0 or window < 2:
            raise ValueError(f"link estimator needs alpha, beta >= 0 and window >= 2, "
                             f"got {alpha}, {beta}, {window}")
        self._prior = (float(alpha), float(beta))
        self._samples: deque[tuple[float, float, float]] = deque(maxlen=window)
        self._fit: tuple[float, float] | None = self._prior
        self._marked: tuple[float, float] | None = None

    def observe(self, nbytes: float, seconds: float, latencies: float = 1) -> None:
        if not (nbytes >= 0 and seconds >= 0 and latencies >= 0 and np.isfinite(seconds)):
            raise ValueError(f"bad transfer sample: {nbytes} bytes, {seconds} s, "
                             f"{latencies} latencies")
        self._samples.append((float(latencies), float(nbytes), float(seconds)))
        self._fit = None

    @property
    def samples(self) -> int:
        """Transfers in the window (the fit's data)."""
        return len(self._samples)

    @property
    def alpha(self) -> float:
        return self._estimate()[0]

    @property
    def beta(self) -> float:
        return self._estimate()[1]

    def mark(self) -> None:
        """Remember the current estimates as the ones the last decision was based on."""
        self._marked = self._estimate()

    def changed(self, threshold: float) -> bool:
        """Whether alpha or beta moved by more than ``threshold`` (relative) since ``mark``;
        True before the first mark."""
        if self._marked is None:
            return True
        return any(abs(new - old) > threshold * old
                   for new, old in zip(self._estimate(), self._marked))

    def _estimate(self) -> tuple[float, float]:
        if self._fit is None:
            self._fit = self._solve()
        return self._fit

    def _solve(self) -> tuple[float, float]:
        data = np.array(self._samples, dtype=np.float64).reshape(-1, 3)
        fit = nonnegative_fit(data[:, :2], data[:, 2])
        return self._prior if fit is None else fit


def nonnegative_fit(x: np.ndarray, t: np.ndarray) -> tuple[float, float] | None:
    """The least-squares ``(a, b) >= 0`` of ``x @ (a, b) = t`` (rows of x >= 0, t >= 0), or
    None when the rows do not pin both (fewer than two, or all proportional)."""
    scale = np.linalg.norm(x, axis=0)
    if len(t) < 2 or not np.all(scale > 0):
        return None
    coef, _, rank, _ = np.linalg.lstsq(x / scale, t, rcond=None)
    if rank < 2:
        return None
    coef /= scale
    if np.all(coef >= 0):
        return float(coef[0]), float(coef[1])
    # The problem is convex: with the unconstrained optimum outside the quadrant, the
    # constrained one lies on an axis, at that axis's 1-D least squares (>= 0 because every
    # sample is), whichever of the two fits better.
    on_axes = []
    for j in range(2):
        fit = np.zeros(2)
        fit[j] = x[:, j] @ t / (x[:, j] @ x[:, j])
        on_axes.append((float(np.sum((x @ fit - t) ** 2)), fit))
    best = min(on_axes, key=lambda e: e[0])[1]
    return float(best[0]), float(best[1])


class CollectiveChooser:
    """The cheapest of ``options`` for (m, c) at the estimator's alpha and beta.

    It re-decides only when (m, c) changed or the estimator reports alpha or beta moved by more
    than ``threshold`` (relative) since the last decision: measurement noise near a crossover
    must not flip the collective every step. Ties go to the earlier option.

    The decision must be the same on every rank (each collective is a different sequence of
    allreduces), while estimators are per rank: decide on one rank and broadcast the option's
    index (``artopk.broadcast_int32``), or feed every rank's estimator the same samples.
    """

    def __init__(self, estimator: LinkEstimator, n_workers: int, *,
                 options: Sequence[str] = OPTIONS, selection: str = "star",
                 threshold: float = 0.1, header_overhead: float = SWITCH_HEADER_OVERHEAD) -> None:
        unknown = [o for o in options if o not in OPTIONS]
        if not options or unknown:
            raise ValueError(f"options must be a non-empty subset of {OPTIONS}, got {options}")
        if threshold < 0:
            raise ValueError(f"threshold must be >= 0, got {threshold}")
        self.estimator = estimator
        self.n_workers = n_workers
        self.options = tuple(options)
        self.selection = selection
        self.threshold = threshold
        self.header_overhead = header_overhead
        self.decision: str | None = None
        self.predicted: dict[str, float] = {}
        self.decisions = 0  # how many times it decided
        self._inputs: tuple[float, float] | None = None

    def model(self) -> CostModel:
        """The cost model at the estimator's current alpha and beta."""
        return CostModel(self.estimator.alpha, self.estimator.beta, self.n_workers,
                         self.header_overhead, self.selection)

    def choose(self, m: float, c: float) -> str:
        if (self.decision is None or self._inputs != (m, c)
                or self.estimator.changed(self.threshold)):
            self.predicted = self.model().predict_all(m, c, self.options)
            self.decision = min(self.options, key=self.predicted.__getitem__)
            self._inputs = (m, c)
            self.estimator.mark()
            self.decisions += 1
        return self.decision

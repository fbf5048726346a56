"""The path choice's cost model (``inagg.hostlib.pytorch.path.choice``): what a call will take on a
path, from the times the ranks agreed on.

Per path, the ranks' combined timings (``PathTimings.summary``, minimum over ranks) become one
*figure* per size class: the median over the class's recent calls of each call's agreed time
(the median, because a call preempted by another process is an outlier, not a slower path).
A line ``seconds = alpha + beta * payload bytes`` is fitted to the figures, minimising relative
error with one point per class, so neither the largest calls nor the most frequent size drown
the others. The line predicts sizes a path has not been measured at; at a measured size class
the class's own figure, scaled along the line to the call's size, predicts it, because a path's
cost on a shared machine need not be one line.
"""

from __future__ import annotations

import numpy as np

from inagg.hostlib.pytorch.path.timings import SIZE_CLASSES, UNSEEN, size_class
from inagg.hostlib.worker.cost_model import nonnegative_fit

PRIOR = (1e-4, 1e-9)   # alpha, beta until measured: a loopback/LAN round trip and ~1 GB/s


def row_medians(ring: np.ndarray) -> np.ndarray:
    """Each row's median over its finite entries, ``inf`` where it has none (unseen entries are
    ``inf`` and sort last). One sort for all rows: an agreement computes every class's."""
    s = np.sort(ring, axis=1)
    n = np.isfinite(s).sum(axis=1)
    rows = np.arange(len(s))
    mid = (s[rows, np.maximum(n - 1, 0) // 2] + s[rows, n // 2]) / 2
    return np.where(n > 0, mid, UNSEEN)


def fit_alpha_beta(seconds: np.ndarray, nbytes: np.ndarray, prior: tuple[float, float]) -> tuple[float, float]:
    """alpha, beta >= 0 fitted to calls of ``nbytes`` taking ``seconds``, minimising relative
    error; the prior where nothing was seen, scaled through the point where one size was."""
    if not len(seconds):
        return prior
    fit = nonnegative_fit(np.stack([1 / seconds, nbytes / seconds], axis=1), np.ones_like(seconds))
    if fit is not None:
        return fit
    i = len(seconds) // 2
    scale = seconds[i] / (prior[0] + prior[1] * nbytes[i])
    return prior[0] * scale, prior[1] * scale


def agreed_ring(body: np.ndarray, shared_clock: bool) -> np.ndarray:
    """Per size class, each recent call's agreed time from the ranks' combined summaries'
    ring part: on a shared clock, last end minus last start (both arrive negated); otherwise
    the minimum over ranks as it is."""
    if not shared_clock:
        return body.reshape(SIZE_CLASSES, -1)
    neg_start, neg_end = body.reshape(2, SIZE_CLASSES, -1)
    with np.errstate(invalid="ignore"):
        seen = np.isfinite(neg_start) & np.isfinite(neg_end)
        return np.where(seen, np.maximum(neg_start - neg_end, 1e-9), UNSEEN)


class PathModel:
    """One path's agreed figures and the line fitted to them. ``ring`` holds the calls' agreed
    times per size class, ``counts`` each class's measured calls so far (the newest in slot
    ``counts - 1`` mod the ring's length), ``samples`` how many slots hold a time, ``seconds``
    each class's figure and ``seen`` where there is one."""

    def __init__(self, summary: np.ndarray, prior: tuple[float, float] = PRIOR, shared_clock: bool = False) -> None:
        self.summary = summary
        self.nbytes = summary[-SIZE_CLASSES:]
        self.counts = summary[-2 * SIZE_CLASSES:-SIZE_CLASSES]
        self.ring = agreed_ring(summary[:-2 * SIZE_CLASSES], shared_clock)
        self.samples = np.isfinite(self.ring).sum(axis=1)
        self.seen = (self.samples > 0) & np.isfinite(self.nbytes)
        self.seconds = np.where(self.seen, row_medians(self.ring), UNSEEN)
        self.alpha, self.beta = fit_alpha_beta(self.seconds[self.seen], self.nbytes[self.seen], prior)

    @classmethod
    def unseen(cls, summary_length: int, shared_clock: bool = False) -> PathModel:
        """The model of a path nothing was agreed on yet: the prior line."""
        return cls(np.full(summary_length, UNSEEN), PRIOR, shared_clock)

    def refit(self, summary: np.ndarray, shared_clock: bool) -> PathModel:
        """The model of a newly agreed ``summary``: this one where nothing changed (a refit is
        work every rank does while the job waits)."""
        if np.array_equal(self.summary, summary):
            return self
        return PathModel(summary, PRIOR, shared_clock)

    def line(self, nbytes: float) -> float:
        """The fitted line's seconds for ``nbytes``."""
        return self.alpha + self.beta * nbytes

    def line_elsewhere(self, c: int) -> float | None:
        """The seconds that a line fitted to the other size classes' figures gives for class
        ``c``'s size: what the path's other sizes say a call there should take (None where
        fewer than two other classes, or ``c`` itself, were measured)."""
        others = self.seen.copy()
        others[c] = False
        if not self.seen[c] or others.sum() < 2:
            return None
        alpha, beta = fit_alpha_beta(self.seconds[others], self.nbytes[others], PRIOR)
        return alpha + beta * float(self.nbytes[c])

    def newest_lags(self) -> np.ndarray:
        """Per size class, how much slower its newest call was than the median of its other
        recent calls (0 with fewer than two calls)."""
        counts = np.where(np.isfinite(self.counts), self.counts, 0).astype(np.int64)
        rows = np.arange(SIZE_CLASSES)
        newest = (counts - 1) % self.ring.shape[1]
        others = self.ring.copy()
        others[rows, newest] = UNSEEN
        with np.errstate(invalid="ignore"):
            lags = self.ring[rows, newest] - row_medians(others)
        return np.where((counts >= 2) & np.isfinite(lags), lags, 0.0)

    def predict(self, nbytes: int) -> float:
        """Seconds of a call of ``nbytes``: its class's figure scaled along the line, or the line."""
        c = size_class(nbytes)
        if not self.seen[c]:
            return self.line(nbytes)
        return float(self.seconds[c] * self.line(nbytes) / max(self.line(self.nbytes[c]), 1e-12))

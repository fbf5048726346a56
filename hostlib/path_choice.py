"""Which path one allreduce takes in the ``inagg`` backend: inagg (the switch or the host
aggregator, as the job's grant says) or plain gloo, whichever the alpha-beta model predicts
faster, so an inagg job is never slower than gloo.

Each path has its own ``LinkEstimator`` (hostlib.cost_model), fed with every call that ran while
the path was otherwise idle: ``seconds = alpha + beta * payload bytes``. A call of ``b`` bytes
takes the path with the smaller ``alpha + beta * b``.

Every rank must take the same path for the same call, but each measures its own times. So the
decision uses *agreed* parameters only: at fixed call numbers (``agree_every``; every rank makes
the same calls in the same order) the ranks combine their estimates with one small allreduce
taking each parameter's maximum (a collective is as slow as its slowest rank), and every rank
computes the same choices from the result until the next agreement. The call at an agreement
also explores: it takes the path the model did not choose, when that costs little (predicted at
most ``explore_ratio`` times the better path, or under ``explore_seconds``), so the estimate of
a path not in use does not go stale. A dearer exploration waits until its extra cost fits that
budget summed over the agreements that refused it, so a path that became slow (a throttled
link) is still measured now and then. When an exploration finds its path more than
``rebase_ratio`` times faster than that path's model, the link changed while the path was out
of use (the throttle lifted): the model starts over from its fit with the parameter that
dominates at that size refit to the measurement, since the window's samples from before the
change would outvote the new ones for a whole window (benchmarks/bandwidth_flip.py shows both).
The ratio is large: a window that mixes samples from before and after a change fits some sizes
a few times off, and refitting to such a size would be wrong.

``forced`` pins every call to one path (``INAGG_ALLREDUCE_PATH=inagg|gloo`` in the backend),
for tests and comparisons; the model still measures what runs.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

import numpy as np

from .cost_model import LinkEstimator

log = logging.getLogger("inagg.path_choice")

PATHS = ("inagg", "gloo")

# Priors until measured: a loopback/LAN round trip and ~1 GB/s; calibration replaces them.
_PRIOR_ALPHA, _PRIOR_BETA = 1e-4, 1e-9


class PathChooser:
    """Per-call path choice, identical on every rank (module docstring)."""

    def __init__(self, agree: Callable[[np.ndarray], np.ndarray], *, agree_every: int = 128,
                 explore_ratio: float = 3.0, explore_seconds: float = 2e-3, window: int = 32,
                 rebase_ratio: float = 8.0, forced: str | None = None) -> None:
        if agree_every < 2:
            raise ValueError(f"agree_every must be >= 2, got {agree_every}")
        if forced is not None and forced not in PATHS:
            raise ValueError(f"a forced path must be one of {', '.join(PATHS)}, got {forced!r}")
        self.forced = forced
        self._agree_fn = agree
        self.agree_every = agree_every
        self.explore_ratio = explore_ratio
        self.explore_seconds = explore_seconds
        self.rebase_ratio = rebase_ratio
        self._lock = threading.Lock()
        self._window = window
        self.links = {p: LinkEstimator(_PRIOR_ALPHA, _PRIOR_BETA, window=window) for p in PATHS}
        self.agreed = {p: (_PRIOR_ALPHA, _PRIOR_BETA) for p in PATHS}
        self._best: dict[int, str] = {}
        self.calls = 0
        self.agreements = 0
        self.explorations = 0
        self.rebases = 0
        self.exploring = False      # whether the call ``choose`` returned last explores
        self._unobserved: dict[str, int] = {}   # path -> bytes of its exploration, until observed
        self._refused = 0           # dear explorations refused since one was last taken

    def observe(self, path: str, nbytes: int, seconds: float) -> None:
        """One call of ``nbytes`` payload took ``seconds`` on ``path`` (any thread). The
        explored path runs no other call of that size, so its next sample of that size is the
        exploration's."""
        with self._lock:
            if self._unobserved.get(path) == nbytes:
                del self._unobserved[path]
                self._rebase_if_faster(path, nbytes, seconds)
            self.links[path].observe(nbytes, seconds)

    def _rebase_if_faster(self, path: str, nbytes: int, seconds: float) -> None:
        """Start ``path``'s model over when this exploration's ``seconds`` are more than
        ``rebase_ratio`` times faster than its fit (module docstring): the parameter that
        dominates the prediction at this size (beta for a large call, alpha for a small one) is
        refit to the measurement, the other kept, so a one-value call does not rescale the
        bandwidth. A slower exploration is not acted on: the path is out of use anyway, and a
        descheduled rank's sample is slow too."""
        link = self.links[path]
        alpha, beta = link.alpha, link.beta
        if seconds * self.rebase_ratio >= alpha + beta * nbytes:
            return
        if nbytes and beta * nbytes >= alpha:
            alpha = min(alpha, seconds)
            beta = (seconds - alpha) / nbytes
        else:
            beta = min(beta, seconds / nbytes) if nbytes else beta
            alpha = seconds - beta * nbytes
        log.debug("%s: an exploration of %d B took %.3g s, its model said %.3g s: model restarted "
                  "(alpha %.3g s, beta %.3g s/B)", path, nbytes, seconds, link.alpha + link.beta * nbytes,
                  alpha, beta)
        self.links[path] = LinkEstimator(alpha, beta, window=self._window)
        self.rebases += 1

    def predict(self, path: str, nbytes: int) -> float:
        """Seconds of an allreduce of ``nbytes`` on ``path`` at the agreed alpha and beta."""
        alpha, beta = self.agreed[path]
        return alpha + beta * nbytes

    def best(self, nbytes: int) -> str:
        """The faster path at the agreed parameters (ties: inagg), remembered per size until
        the next agreement: a training job repeats a handful of sizes."""
        path = self._best.get(nbytes)
        if path is None:
            path = self._best[nbytes] = min(PATHS, key=lambda p: self.predict(p, nbytes))
        return path

    def fastest_seconds(self, nbytes: float) -> float:
        """Predicted seconds of an allreduce of ``nbytes`` on the faster path."""
        return self.predict(self.best(nbytes), nbytes)

    def agree(self) -> None:
        """Combine every rank's estimates (each parameter's maximum over ranks); a collective,
        so every rank must call it at the same point."""
        with self._lock:
            local = np.array([v for p in PATHS for v in (self.links[p].alpha, self.links[p].beta)])
        combined = self._agree_fn(local)
        self.agreed = {p: (float(combined[2 * i]), float(combined[2 * i + 1])) for i, p in enumerate(PATHS)}
        self._best.clear()
        self.agreements += 1

    def choose(self, nbytes: int) -> str:
        """The path of the next call (every rank calls this once per eligible allreduce)."""
        self.calls += 1
        self.exploring = False
        if self.calls % self.agree_every:
            return self.forced or self.best(nbytes)
        self.agree()
        best = self.best(nbytes)
        if self.forced:
            return self.forced
        other = PATHS[1 - PATHS.index(best)]
        if not self._worth_exploring(self.predict(other, nbytes), self.predict(best, nbytes)):
            return best
        self.explorations += 1
        self.exploring = True
        with self._lock:
            self._unobserved = {other: nbytes}
        return other

    def _worth_exploring(self, cost: float, best_cost: float) -> bool:
        """Whether an agreement's call explores a path predicted ``cost`` seconds (the better
        one: ``best_cost``): at most ``explore_ratio - 1`` better calls' worth of extra time per
        agreement, summed over the agreements that refused a dearer one (module docstring)."""
        extra, budget = cost - best_cost, (self.explore_ratio - 1) * best_cost
        if cost <= self.explore_seconds or extra <= budget:
            return True
        if extra <= budget * (1 + self._refused):
            self._refused = 0
            return True
        self._refused += 1
        return False

    def as_dict(self) -> dict:
        return {"agreed": {p: {"alpha_s": a, "beta_s_per_byte": b} for p, (a, b) in self.agreed.items()},
                "agreements": self.agreements, "explorations": self.explorations, "rebases": self.rebases}

"""AR-Topk: top-k sparsified gradients summed by a plain allreduce (Tyagi & Swany, 2312.02493).

Top-k compression usually needs an allgather, because every worker keeps different indices and a
sum of sparse vectors with different supports is not an allreduce. AR-Topk makes the supports
equal: one selected worker (the root) broadcasts its top-k indices, every worker sends its *own*
values at those indices, and a normal sum-allreduce of k values does the rest. What the root's
indices miss of another worker's gradient is kept in that worker's residual (error feedback) and
sent later.

Everything here is built on one primitive, an ``AllreduceFn`` that sums a flat float32 or int32
array over all workers in place (``inagg.hostlib.worker.stream_reference.SlotStream.allreduce``, or any other
implementation with bit-identical results on every rank). The index broadcast is that same
allreduce: the root contributes its indices as int32, everybody else zeros, and an int32 sum is
exact, so no second communication primitive is needed (and gradients must have < 2**31 elements).

Every rank must call ``ARTopk.step`` (and ``allgather_topk``) the same number of times with
gradients of the same length: each call issues the same sequence of allreduces on every rank.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

AllreduceFn = Callable[[np.ndarray], np.ndarray]

SELECTIONS = ("star", "var")
DEFAULT_CANDIDATES = (0.1, 0.033, 0.011, 0.004, 0.001)
MAX_NUMEL = 2**31 - 1  # indices travel as int32


def k_for(cr: float, numel: int) -> int:
    """Number of values kept at compression ratio ``cr`` (fraction kept): at least one."""
    return max(1, round(cr * numel))


def topk_indices(x: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` largest-magnitude entries of flat ``x``, in no particular order.

    ``argpartition`` is O(n); a full sort is not needed because the selection is a set. NaN and
    inf magnitudes rank highest, so a non-finite gradient always shows in its own top-k."""
    if k >= x.size:
        return np.arange(x.size)
    return np.argpartition(np.abs(x), x.size - k)[x.size - k:]


def broadcast_int32(values: np.ndarray | None, size: int, root: int, rank: int,
                    allreduce: AllreduceFn) -> np.ndarray:
    """Broadcast ``size`` int32 values from ``root`` through a sum-allreduce.

    The root contributes its values, every other rank zeros (``values`` is ignored there); the
    int32 sum is exact, so the result is the root's values on every rank. Costs one allreduce
    of ``4 * size`` bytes, flat in the number of workers on a switch."""
    buf = np.zeros(size, dtype=np.int32)
    if rank == root:
        buf[:] = values
    return allreduce(buf)


def _check_grad(grad: np.ndarray, what: str) -> None:
    if not isinstance(grad, np.ndarray) or grad.dtype != np.float32:
        raise ValueError(f"{what}: gradient must be a float32 numpy array, "
                         f"got {getattr(grad, 'dtype', type(grad).__name__)}")
    if grad.ndim != 1:
        raise ValueError(f"{what}: gradient must be flat (1-D), got shape {grad.shape}")
    if not 1 <= grad.size <= MAX_NUMEL:
        raise ValueError(f"{what}: gradient needs 1..{MAX_NUMEL} elements (indices are int32), "
                         f"got {grad.size}")


def _check_rank(rank: int, world_size: int) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} not in 0..{world_size - 1}")


def _check_cr(cr: float, what: str) -> None:
    if not 0.0 < cr <= 1.0:
        raise ValueError(f"{what} must be in (0, 1], got {cr}")


def candidate_gains(g: np.ndarray, crs: Sequence[float]) -> np.ndarray:
    """Compression gain ``||topk(g)||^2 / ||g||^2`` of ``g`` at each ratio of ``crs``.

    One top-k at the largest k, then a sort of only those k magnitudes: the cumulative sum of
    their squares is the kept energy of every smaller k at once. 1.0 for an all-zero ``g``."""
    ks = np.array([k_for(cr, g.size) for cr in crs])
    top = np.abs(g[topk_indices(g, int(ks.max()))]).astype(np.float64)
    kept = np.cumsum(np.sort(top)[::-1] ** 2)[ks - 1]
    total = np.einsum("i,i->", g, g, dtype=np.float64)
    return kept / total if total > 0 else np.ones(len(ks))


def pareto_knee(cost_a: np.ndarray, cost_b: np.ndarray) -> int:
    """Index of the knee of two costs to minimize (time, 1/gain): among the Pareto-optimal
    points, normalized to [0, 1] per objective, the one farthest on the origin side of the line
    through the front's two extreme points.

    After normalization the extremes are (0, 1) and (1, 0), so that distance is proportional
    to ``1 - a - b``. A front of one point is that point; ties (a two-point front, or points on
    the line) go to the lowest index, i.e. the first (largest-CR) candidate."""
    a, b = np.asarray(cost_a, np.float64), np.asarray(cost_b, np.float64)
    dominated = np.any((a[None, :] <= a[:, None]) & (b[None, :] <= b[:, None])
                       & ((a[None, :] < a[:, None]) | (b[None, :] < b[:, None])), axis=1)
    front = np.flatnonzero(~dominated)

    def unit(v: np.ndarray) -> np.ndarray:
        span = v.max() - v.min()
        return (v - v.min()) / span if span > 0 else np.zeros_like(v)

    score = 1.0 - unit(a[front]) - unit(b[front])
    return int(front[np.argmax(score)])


class CompressionSchedule:
    """Compression ratio per step: a linear warm-up, then the Pareto knee of the candidates.

    Warm-up: the first ``warmup_steps`` steps use ``np.linspace(1.0, target, warmup_steps)``.
    Afterwards, every ``interval`` steps (starting at step ``warmup_steps``), each candidate CR
    is scored by (predicted communication time ``predict(cr)``, 1 / estimated gain) and the knee
    is kept until the next decision. ``predict`` is any callable (usually the cost model bound
    to the current link estimate), so the schedule itself stays pure.

    The estimates are per worker but the CR must be the same on every rank (it sets the size of
    every allreduce). ``local_estimates`` therefore returns a vector that the caller averages
    with a sum-allreduce before ``decide``; ARTopk does that. Times are normalized by their own
    maximum first: the knee is invariant to scaling, and values in [0, 1] keep the codec's
    shared block exponent from flushing small entries to zero.
    """

    def __init__(self, predict: Callable[[float], float], *, warmup_steps: int,
                 target: float = 0.1, candidates: Sequence[float] = DEFAULT_CANDIDATES,
                 interval: int = 1) -> None:
        _check_cr(target, "schedule target")
        if not candidates:
            raise ValueError("schedule needs at least one candidate CR")
        for c in candidates:
            _check_cr(c, "candidate CR")
        if warmup_steps < 0 or interval < 1:
            raise ValueError(f"schedule needs warmup_steps >= 0 and interval >= 1, "
                             f"got {warmup_steps} and {interval}")
        self.predict = predict
        self.warmup_steps = warmup_steps
        self.target = target
        self.candidates = tuple(sorted(candidates, reverse=True))
        self.interval = interval
        self.cr: float | None = None  # the last decision
        self.last_gains: np.ndarray | None = None
        self.last_times: np.ndarray | None = None

    def cr_at(self, step: int) -> float | None:
        """The CR of ``step``, or None when a decision is due there (``decide`` gives it)."""
        if step < self.warmup_steps:
            return 1.0 + (self.target - 1.0) * step / max(1, self.warmup_steps - 1)
        if self.cr is None or (step - self.warmup_steps) % self.interval == 0:
            return None
        return self.cr

    def local_estimates(self, g: np.ndarray) -> np.ndarray:
        """This worker's float32 vector ``[gains..., normalized times...]`` for the candidates."""
        times = np.array([self.predict(c) for c in self.candidates], dtype=np.float64)
        if not np.all(np.isfinite(times) & (times >= 0)):
            raise ValueError(f"predict() must give finite times >= 0, got {times.tolist()}")
        top = times.max()
        return np.concatenate([candidate_gains(g, self.candidates),
                               times / top if top > 0 else times]).astype(np.float32)

    def decide(self, estimates: np.ndarray) -> float:
        """Pick the knee from (averaged) ``local_estimates`` and keep it as ``cr``."""
        n = len(self.candidates)
        self.last_gains = estimates[:n].astype(np.float64)
        self.last_times = estimates[n:].astype(np.float64)
        # a gain quantized to 0 by the allreduce would make 1/gain infinite
        inv_gain = 1.0 / np.maximum(self.last_gains, np.finfo(np.float64).tiny)
        self.cr = self.candidates[pareto_knee(self.last_times, inv_gain)]
        return self.cr


class ARTopk:
    """One worker's AR-Topk state: residual, step counter and the last step's selection.

    ``step(grad)`` per training step (all ranks in lockstep):

    1. ``G = grad + residual`` (float32; the residual starts at zero).
    2. Root: STAR ``steps % N``; VAR the rank whose own top-k holds the largest norm, found by
       one sum-allreduce of an N-vector where each rank fills its slot (argmax, ties to the
       lowest rank). The norm is sent rather than its square: same argmax, half the exponent
       range, so large gradients do not overflow float32.
    3. The root's top-k indices of its G, broadcast as int32 through the sum-allreduce.
    4. Every rank's own ``G[indices]``, summed by one allreduce, divided by N.
    5. ``residual = G - sent`` with ``sent = G`` at the indices, 0 elsewhere: exactly G with
       the sent entries zeroed, so ``sent + residual == G`` bit for bit.

    A G holding inf/NaN on any rank makes ``step`` raise ``FloatingPointError`` on every rank
    (its contribution is poisoned, so the sum shows it everywhere) and leaves the state as it
    was. The quantization error of the allreduce is not fed back: residuals stay local and
    exact, only the sum is approximate (within ``inagg.hostlib.wire.codec.error_bound``).
    """

    def __init__(self, rank: int, world_size: int, allreduce: AllreduceFn, *,
                 selection: str = "star", cr: float | CompressionSchedule) -> None:
        _check_rank(rank, world_size)
        if selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {SELECTIONS}, got {selection!r}")
        if not isinstance(cr, CompressionSchedule):
            _check_cr(cr, "cr")
        self.rank = rank
        self.world_size = world_size
        self.selection = selection
        self.schedule = cr if isinstance(cr, CompressionSchedule) else None
        self._cr = None if self.schedule else float(cr)
        self._allreduce_fn = allreduce
        self.residual: np.ndarray | None = None
        self.steps = 0
        self.bytes_sent = 0
        self.last_cr: float | None = None
        self.last_root: int | None = None
        self.last_indices: np.ndarray | None = None
        self.last_gain: float | None = None

    def step(self, grad: np.ndarray, *, cr: float | None = None) -> np.ndarray:
        """The averaged sparse update (dense float32, same length as ``grad``) of this step.

        ``cr`` overrides this step's compression ratio (the schedule is not consulted), e.g.
        1.0 when the collective chooser finds dense cheaper; it must be the same on all ranks.
        When k = numel everything is sent: there is nothing to select or broadcast, the step is
        one dense allreduce of G (``last_root`` None) and the residual becomes zero."""
        _check_grad(grad, "ARTopk.step")
        if cr is not None:
            _check_cr(cr, "cr")
        if self.residual is None:
            self.residual = np.zeros(grad.size, dtype=np.float32)
        elif grad.size != self.residual.size:
            raise ValueError(f"ARTopk.step: gradient has {grad.size} elements, earlier steps "
                             f"had {self.residual.size}; use one ARTopk per gradient layout")
        g = grad + self.residual  # a new array: the old residual survives a failed step
        finite = bool(np.isfinite(g).all())
        cr = self._cr_for(g, finite) if cr is None else cr
        k = k_for(cr, g.size)
        if k == g.size:
            root, indices = None, np.arange(g.size)
        else:
            root, indices = self._select(g, k, finite)

        values = g[indices]
        sent_energy = np.einsum("i,i->", values, values, dtype=np.float64)
        total_energy = np.einsum("i,i->", g, g, dtype=np.float64)
        values = self._sum_floats(values, finite, "value allreduce")
        values /= np.float32(self.world_size)
        update = np.zeros(g.size, dtype=np.float32)
        update[indices] = values

        g[indices] = 0.0
        self.residual = g
        self.last_cr, self.last_root, self.last_indices = cr, root, indices
        self.last_gain = float(sent_energy / total_energy) if total_energy > 0 else 1.0
        self.steps += 1
        return update

    def _select(self, g: np.ndarray, k: int, finite: bool) -> tuple[int, np.ndarray]:
        """The root (STAR or VAR) and its top-k indices of G, broadcast to every rank."""
        own = None
        if self.selection == "star":
            root = self.steps % self.world_size
        else:
            own = topk_indices(g, k)
            norms = np.zeros(self.world_size, dtype=np.float32)
            norms[self.rank] = np.sqrt(np.einsum("i,i->", g[own], g[own], dtype=np.float64))
            root = int(np.argmax(self._sum_floats(norms, finite, "VAR selection")))
        if self.rank == root and own is None:
            own = topk_indices(g, k)
        return root, broadcast_int32(own, k, root, self.rank, self._allreduce)

    def _cr_for(self, g: np.ndarray, finite: bool) -> float:
        """This step's CR; a due schedule decision costs one allreduce of 2 floats/candidate."""
        if self.schedule is None:
            return self._cr
        cr = self.schedule.cr_at(self.steps)
        if cr is None:
            est = (self.schedule.local_estimates(g) if finite  # else poisoned anyway
                   else np.zeros(2 * len(self.schedule.candidates), dtype=np.float32))
            est = self._sum_floats(est, finite, "CR decision")
            cr = self.schedule.decide(est / np.float32(self.world_size))
        return cr

    def _allreduce(self, x: np.ndarray) -> np.ndarray:
        self.bytes_sent += x.nbytes
        return self._allreduce_fn(x)

    def _sum_floats(self, x: np.ndarray, finite: bool, what: str) -> np.ndarray:
        """Sum-allreduce ``x``; raise FloatingPointError on every rank if any rank's G is not
        finite. A rank whose G holds inf/NaN poisons its contribution, which the inagg stream
        reports on every rank and any other allreduce turns into a non-finite sum."""
        if not finite:
            x[0] = np.nan
        message = (f"ARTopk step {self.steps} ({what}): gradient + residual holds inf/NaN on "
                   f"some rank; state left unchanged")
        try:
            x = self._allreduce(x)
        except FloatingPointError as e:
            raise FloatingPointError(message) from e
        if not np.isfinite(x).all():
            raise FloatingPointError(message)
        return x


def allgather_topk(grad: np.ndarray, k: int, rank: int, world_size: int,
                   allreduce: AllreduceFn) -> np.ndarray:
    """Baseline: every worker's own top-k, gathered by the sum-allreduce, averaged densely.

    Each rank writes its k values and k indices into its own segment ``[rank*k, (rank+1)*k)``
    of N*k zeros (float32 values, int32 indices) and the two sum-allreduces concatenate the
    segments. Every rank then scatter-adds the N segments (in float64, ``bincount``) and divides
    by N. No error feedback: this is the plain sparsified average, for comparison."""
    _check_grad(grad, "allgather_topk")
    _check_rank(rank, world_size)
    if not 1 <= k <= grad.size:
        raise ValueError(f"allgather_topk: k must be in 1..{grad.size}, got {k}")
    own = topk_indices(grad, k)
    segment = slice(rank * k, (rank + 1) * k)
    values = np.zeros(world_size * k, dtype=np.float32)
    values[segment] = grad[own]
    indices = np.zeros(world_size * k, dtype=np.int32)
    indices[segment] = own
    values = allreduce(values)
    indices = allreduce(indices)
    dense = np.bincount(indices, weights=values, minlength=grad.size)
    return (dense / world_size).astype(np.float32)

"""The path choice's tunable options (``inagg.hostlib.pytorch.path.choice``), in one frozen dataclass,
apart from the chooser's state and its counters."""

from __future__ import annotations

from dataclasses import dataclass

FIRST_AGREEMENT = 16   # the first scheduled agreement's call; then 32, 64, ... up to ``agree_every``
# a job on one host with no controller named sends an eligible CPU call of at most this many bytes
# through the host-local reduce without asking the chooser (``AllreduceDispatch._tiny``): there a
# call's time is its wake-ups, two messages on a Unix socket against gloo's TCP rounds and its
# threads' hand-overs (docs/results/startup.md)
TINY_BYTES = 1024


@dataclass(frozen=True)
class PathChoiceOptions:
    """What may be tuned in ``PathChooser``. Every rank must use the same options: the
    decisions follow from them, the agreed figures and the call numbers alone."""

    agree_every: int = 128
    """Calls between scheduled agreements once past calls 16, 32 and 64 (at least 16)."""

    agree_budget: float = 0.01
    """The largest fraction of the calls' predicted time that agreements' own work may take: a
    scheduled agreement waits until the calls since the last one are predicted to have taken
    ``1 / agree_budget`` times one agreement's work (in (0, 1))."""

    agree_seconds: float = 2.0
    """A scheduled agreement comes at the latest once the calls since the last one are predicted
    to have taken this long, however few they are: where calls are dear, what the figures
    miss (a link whose rate changed, a grant that moved) is at most this old (> 0)."""

    explore_budget: float = 0.02
    """The fraction of each size class's predicted call time that explorations of other paths
    there, and the agreements they bring, may cost (in [0, 1))."""

    per_class: int = 5
    """Measured calls kept per path and size class: a class's figure is their median."""

    probes: int = 3
    """Calls each path takes, timed, when a new size class is probed."""

    probe_seconds: float = 2e-3
    """A new size class predicted under this many seconds per call is probed on every path
    whose line is within ``probe_ratio`` of the best; a dearer one only on paths predicted
    faster by ``margin`` (the rest are left to exploration)."""

    probe_ratio: float = 2.0
    """How much slower than the best a path's line may predict a cheap new size and still be
    probed there; also how close ``prefer``'s fastest recheck call must come to keep
    rechecking it (at least 1)."""

    sample_every: int = 32
    """Calls between two samples (timed calls of a class whose ring is full; at least 1)."""

    sample_seconds: float = 0.05
    """Predicted seconds of a class's calls between two of its samples (at least 0)."""

    measure_from_seconds: float = 10e-3
    """Calls predicted to take this long or longer are timed by time, not sampled; a class's
    newest call slower than its others by this much has its older times dropped."""

    measure_every_seconds: float = 0.1
    """For calls from ``measure_from_seconds`` up: one is timed per this many predicted seconds
    of its class's calls (at least 0; 0 times each one)."""

    prefer: str | None = "gloo"
    """The baseline path: it keeps a call unless another path is predicted faster by more than
    ``margin`` (None: no baseline; a name not among the chooser's paths counts as None)."""

    margin: float = 0.25
    """How much faster (as a fraction) another path must be predicted than ``prefer`` to take a
    call from it (in [0, 1))."""

    link_margin: float = 0.03
    """``margin`` where the two paths' figures are both link-bound (``inagg.hostlib.pytorch.path.links``:
    their difference is the bytes each puts on the links, not noise; in [0, ``margin``])."""

    link_bound: float = 1.5
    """A figure within this many times its path's least time on the links (its floor, where
    the links' rate is known) is link-bound (at least 1)."""

    calibration_seconds: float = 0.25
    """The most a calibration call past its first size may be predicted to take
    (``inagg.hostlib.pytorch.path.calibration``): a dearer size is left to the probes of the
    job's own calls (> 0)."""

    history: int = 4096
    """Runs of calls kept for ``PathChooser.history``."""

    def __post_init__(self) -> None:
        if self.agree_every < FIRST_AGREEMENT:
            raise ValueError(f"agree_every must be >= {FIRST_AGREEMENT}, got {self.agree_every}")
        if not 0 <= self.explore_budget < 1:
            raise ValueError(f"explore_budget must be in [0, 1), got {self.explore_budget}")
        if not 0 < self.agree_budget < 1:
            raise ValueError(f"agree_budget must be in (0, 1), got {self.agree_budget}")
        if not 0 < self.calibration_seconds < float("inf"):
            raise ValueError(f"calibration_seconds must be a positive number of seconds, got {self.calibration_seconds}")
        if not 0 < self.agree_seconds < float("inf"):
            raise ValueError(f"agree_seconds must be a positive number of seconds, got {self.agree_seconds}")
        if not 0 <= self.margin < 1:
            raise ValueError(f"margin must be in [0, 1), got {self.margin}")
        if not 0 <= self.link_margin <= self.margin or self.link_bound < 1:
            raise ValueError(f"need 0 <= link_margin <= margin and link_bound >= 1; got {self.link_margin}, "
                             f"{self.link_bound}")
        if (self.probes < 0 or self.probe_ratio < 1 or self.sample_every < 1
                or not 0 <= self.sample_seconds < float("inf") or not 0 <= self.measure_every_seconds < float("inf")):
            raise ValueError(f"need probes >= 0, probe_ratio >= 1, sample_every >= 1, sample_seconds >= 0, "
                             f"measure_every_seconds >= 0; got {self.probes}, {self.probe_ratio}, "
                             f"{self.sample_every}, {self.sample_seconds}, {self.measure_every_seconds}")

    @property
    def trusted(self) -> int:
        """Measured calls at a size class after which a path needs no handicap to win there,
        and the length of a recheck's runs."""
        return min(3, self.per_class)

"""The ranks' agreement on the path model: each element's minimum over the ranks of a vector of
float64, exchanged through the job's ``dist.Store`` and combined by rank 0.

Not through gloo: its allreduce of a vector this long runs the full ring, whose time grows with
the ranks and the vector, while the store's round trips do not grow with the vector
(docs/results/path_choice.md has the figures). Rank 0 combines, so the store carries each vector
once and the result once per rank (linear in the ranks, where every rank reading every vector
would be quadratic).

Each round's keys are unique (its number and the rank), and each goes once nothing can still
read it: a rank deletes its own vector of the last round (rank 0 read it before it published
that round's result, which this rank read), and rank 0 the last round's result (every rank read
it before sending this round's vector). So between rounds the store holds the last round's
keys, one per rank, and a group that goes leaves those behind. Each process group's keys are
its own: a group created again on the same store under the same name (torch names groups by a
counter it resets when the default group is destroyed) would otherwise read the last one's
result, left behind, as its own. The ranks count themselves in on the store at creation, per
group size; every rank of one group is counted before any rank of the next (creating a group
is a collective), so the count divided by the ranks numbers it.

A rank waits for the others' keys by polling the store (``check``: one round trip that never
waits in C++), not in one store call as long as the store's timeout: a rank that ended never
sets its key, and ``failure()`` (the process group's peer watch) names it between two polls.
Not in short ``wait`` slices either: each slice that times out makes torch's TCPStore client log
``waitForInput ... timed out after 200ms`` (c10d's logger, on every rank). The pauses between
polls start at ``_POLL_SECONDS[0]`` and double up to ``_POLL_SECONDS[1]``, so a key that comes
at once is seen within a fraction of a millisecond and a long wait costs a few round trips a
second.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch.distributed as dist

from inagg.hostlib.errors import InaggError, JobFailed
from inagg.hostlib.worker.abortable_store import wait_keys

_FAILED = b""   # rank 0's result when the ranks' vectors did not match: every rank raises
_POLL_SECONDS = (1e-4, 2e-3)   # the first and the longest pause between two polls (module docstring)


class StoreMin:
    """One rank's side of the agreement (module docstring): ``agree(values)`` returns each
    element's minimum over the ranks; every rank calls it with a vector of the same length, in
    the same order of rounds."""

    def __init__(self, store: dist.Store, rank: int, world_size: int,
                 failure: Callable[[], BaseException | None] = lambda: None) -> None:
        self._store, self._rank, self._n, self._failure = store, rank, world_size, failure
        # the group's keys, claimed at its first round (``_claim``): a process group's start,
        # which makes this, pays no store round for it
        self._prefix: str | None = None
        self._round = 0

    def _claim(self) -> str:
        """This group's prefix of keys in the store (each group of ``world_size`` ranks on it its own)."""
        if self._prefix is None:
            group = (self._store.add(f"groups/{self._n}", 1) - 1) // self._n
            self._prefix = f"{self._n}.{group}"
        return self._prefix

    def __call__(self, values: np.ndarray) -> np.ndarray:
        mine = np.ascontiguousarray(values, dtype=np.float64)
        k, self._round = self._round, self._round + 1
        if self._n == 1:
            return mine.copy()
        try:
            self._claim()
            if self._rank == 0:
                return self._combine(k, mine)
            if k:
                self._store.delete_key(self._key(k - 1, self._rank))
            self._store.set(self._key(k, self._rank), mine.tobytes())
            raw = self._get([self._key(k, "min")])[0]
        except (InaggError, JobFailed):
            raise
        except RuntimeError as e:   # the store's: a timeout (DistStoreError), a lost connection
            raise InaggError(f"agreement round {k} ({self._prefix}), rank {self._rank}: the store failed: {e}") from e
        if raw == _FAILED:
            raise InaggError(f"agreement round {k}: the ranks' vectors differ in length (rank 0 names the rank); "
                             f"do all ranks run the same inagg with the same paths?")
        return self._decode(k, raw, len(mine), "rank 0's result")

    def _key(self, k: int, who: int | str) -> str:
        return f"{self._prefix}/{k}/{who}"

    def _combine(self, k: int, mine: np.ndarray) -> np.ndarray:
        """Rank 0: wait for every other rank's vector of round ``k``, publish the minimum (or,
        where one does not match, a failure every rank raises)."""
        others = self._get([self._key(k, r) for r in range(1, self._n)])
        try:
            vectors = [self._decode(k, b, len(mine), f"rank {r}'s vector") for r, b in enumerate(others, start=1)]
        except InaggError:
            self._store.set(self._key(k, "min"), _FAILED)
            raise
        result = np.minimum.reduce([mine] + vectors)
        self._store.set(self._key(k, "min"), result.tobytes())
        if k:
            self._store.delete_key(self._key(k - 1, "min"))
        return result

    def _get(self, keys: list[str]) -> list[bytes]:
        """The values of ``keys`` once the store has them all: polled for (module docstring),
        ending with ``failure()`` where a rank is gone, or with the store's error; past the
        store's timeout, a RuntimeError saying which keys did not come."""
        try:
            wait_keys(self._store, keys, self._failure, poll=_POLL_SECONDS)
        except TimeoutError as e:
            raise RuntimeError(str(e)) from None
        return self._store.multi_get(keys)

    def _decode(self, k: int, raw: bytes, length: int, what: str) -> np.ndarray:
        """``raw`` as ``length`` float64, or an error naming the round and whose it is: the ranks
        disagree on what they agree about (different paths or versions of inagg)."""
        if len(raw) != 8 * length:
            raise InaggError(f"agreement round {k}: {what} has {len(raw)} bytes, expected {8 * length} "
                             f"(rank {self._rank}'s); do all ranks run the same inagg with the same paths?")
        return np.frombuffer(raw, dtype=np.float64)

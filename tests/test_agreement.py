"""The path chooser's agreement through the job's store (``hostlib.agreement.StoreMin``): every
rank gets each element's minimum over the ranks, round after round, the store keeps at most
two rounds' keys, a group made again under the same name reads its own rounds, and ranks that disagree on what they exchange get an error saying so."""

from __future__ import annotations

import threading
from datetime import timedelta

import numpy as np
import pytest
import torch.distributed as dist

from hostlib.agreement import StoreMin
from hostlib.errors import InaggError


def _stores(n: int, timeout: float = 10) -> tuple[dist.TCPStore, list[dist.Store]]:
    """A TCPStore server and one client per rank, as a job's ranks see their store."""
    wait = timedelta(seconds=timeout)
    server = dist.TCPStore("127.0.0.1", 0, n + 1, True, wait, wait_for_workers=False)
    clients = [dist.TCPStore("127.0.0.1", server.port, n + 1, False, wait) for _ in range(n)]
    return server, [dist.PrefixStore("agree", c) for c in clients]


def _on_ranks(n: int, body) -> list:
    """``body(rank)`` on ``n`` threads at once; their results, or the first error raised."""
    results, errors = [None] * n, []

    def run(rank):
        try:
            results[rank] = body(rank)
        except Exception as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    if errors:
        raise errors[0]
    return results


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_every_rank_gets_the_elementwise_minimum_each_round_and_old_keys_go(n):
    server, stores = _stores(n)
    agrees = [StoreMin(stores[r], r, n) for r in range(n)]
    rng = np.random.default_rng(n)
    for _ in range(6):
        vectors = rng.normal(size=(n, 40))
        vectors[rng.random(vectors.shape) < 0.2] = np.inf   # unseen entries, as the chooser sends
        got = _on_ranks(n, lambda r: agrees[r](vectors[r]))
        for r in range(n):
            np.testing.assert_array_equal(got[r], vectors.min(axis=0))
        # the next round's vectors and result, at most (plus the groups' count, torch's own key)
        assert server.num_keys() <= 2 * n + 2


def test_a_group_created_again_on_the_same_store_reads_its_own_rounds():
    """A group that made one round and went, then a new one under the same name: the new
    group's round 0 is its own, not the last one's result left in the store."""
    _, stores = _stores(2)
    first = [StoreMin(stores[r], r, 2) for r in range(2)]
    _on_ranks(2, lambda r: first[r](np.zeros(3)))
    again = [StoreMin(stores[r], r, 2) for r in range(2)]
    got = _on_ranks(2, lambda r: again[r](np.full(3, 5.0 + r)))
    for r in range(2):
        np.testing.assert_array_equal(got[r], np.full(3, 5.0))


def test_ranks_sending_different_lengths_are_told_so():
    """Rank 1 sends three values, rank 0 four: rank 0 says whose vector is wrong (rank 1 then
    waits for a result that never comes, until the store's timeout)."""
    _, stores = _stores(2, timeout=2)
    rank1 = StoreMin(stores[1], 1, 2)
    waiting = threading.Thread(target=lambda: pytest.raises(Exception, rank1, np.zeros(3)), daemon=True)
    waiting.start()
    with pytest.raises(InaggError, match="round 0: rank 1's vector has 24 bytes, expected 32"):
        StoreMin(stores[0], 0, 2)(np.zeros(4))
    waiting.join(10)
    assert not waiting.is_alive()

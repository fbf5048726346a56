"""The path chooser's agreement through the job's store (``inagg.hostlib.pytorch.agreement.StoreMin``): every
rank gets each element's minimum over the ranks, round after round, the store keeps at most
two rounds' keys, a group made again under the same name reads its own rounds, and ranks that disagree on what they exchange get an error saying so."""

from __future__ import annotations

import threading
from datetime import timedelta

import numpy as np
import pytest
import torch.distributed as dist

from inagg.hostlib.pytorch.agreement import StoreMin
from inagg.hostlib.errors import InaggError


def _stores(n: int, timeout: float = 10) -> tuple[dist.TCPStore, list[dist.Store]]:
    """A TCPStore server and one client per rank, as a job's ranks see their store, waiting
    ``timeout`` seconds for a key (connecting may take longer: a loaded CI machine took over
    1 s once)."""
    connect = timedelta(seconds=30)
    server = dist.TCPStore("127.0.0.1", 0, n + 1, True, connect, wait_for_workers=False)
    clients = [dist.TCPStore("127.0.0.1", server.port, n + 1, False, connect) for _ in range(n)]
    for c in clients:
        c.set_timeout(timedelta(seconds=timeout))
    return server, [dist.PrefixStore("agree", c) for c in clients]


def _outcomes(n: int, body) -> list:
    """``body(rank)`` on ``n`` threads at once: each rank's result or the error it raised."""
    outcomes: list = [None] * n

    def run(rank):
        try:
            outcomes[rank] = body(rank)
        except Exception as e:  # noqa: BLE001 - the caller looks at it
            outcomes[rank] = e

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "a rank is still waiting after 30 s"
    return outcomes


def _on_ranks(n: int, body) -> list:
    """``body(rank)`` on ``n`` threads at once; their results (an error raised fails the test)."""
    outcomes = _outcomes(n, body)
    for o in outcomes:
        if isinstance(o, Exception):
            raise o
    return outcomes


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_every_rank_gets_the_elementwise_minimum_each_round_and_old_keys_go(n):
    server, stores = _stores(n)
    agrees = [StoreMin(stores[r], r, n) for r in range(n)]
    created = server.num_keys() + (n > 1)   # the store's own, and the groups' count the first round claims
    rng = np.random.default_rng(n)
    for _ in range(6):
        vectors = rng.normal(size=(n, 40))
        vectors[rng.random(vectors.shape) < 0.2] = np.inf   # unseen entries, as the chooser sends
        got = _on_ranks(n, lambda r: agrees[r](vectors[r]))
        for r in range(n):
            np.testing.assert_array_equal(got[r], vectors.min(axis=0))
        # between rounds, the last round's keys only: the other ranks' vectors and the result
        assert server.num_keys() == created + (n if n > 1 else 0)


@pytest.mark.parametrize("first, then", [(2, 2), (2, 3)])
def test_a_group_made_again_under_the_same_name_reads_its_own_rounds(first, then):
    """A group that made one round and went, then a new one under the same name on the same
    store (torch reuses names once the default group is destroyed), of the same size or
    another: the new group's round 0 is its own, not the last one's result left in the store,
    and its ranks agree on its number (counted per size)."""
    _, stores = _stores(max(first, then))
    old = [StoreMin(stores[r], r, first) for r in range(first)]
    _on_ranks(first, lambda r: old[r](np.zeros(3)))
    new = [StoreMin(stores[r], r, then) for r in range(then)]
    got = _on_ranks(then, lambda r: new[r](np.full(3, 5.0 + r)))
    for r in range(then):
        np.testing.assert_array_equal(got[r], np.full(3, 5.0))


def test_ranks_sending_different_lengths_are_told_so_on_every_rank():
    """Rank 1 sends three values, rank 0 and rank 2 four: rank 0 names rank 1, and every other
    rank is told the ranks differ (rank 0 publishes the failure instead of waiting them out)."""
    _, stores = _stores(3, timeout=5)
    agrees = [StoreMin(stores[r], r, 3) for r in range(3)]
    errors = _outcomes(3, lambda r: agrees[r](np.zeros(3 if r == 1 else 4)))
    assert all(isinstance(e, InaggError) for e in errors), errors
    assert "round 0: rank 1's vector has 24 bytes, expected 32" in str(errors[0])
    for e in errors[1:]:
        assert "round 0: the ranks' vectors differ in length" in str(e)


def test_a_rank_that_never_comes_is_a_library_error_naming_the_round():
    _, stores = _stores(2, timeout=1)
    with pytest.raises(InaggError, match=r"agreement round 0 \(2\.0\), rank 1: the store failed"):
        StoreMin(stores[1], 1, 2)(np.zeros(2))

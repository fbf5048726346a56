"""Store waits that end when their caller gives up (``inagg.hostlib.worker.abortable_store``), on a real
TCPStore as a job's ranks see theirs: a key set later is seen, ``stop``'s error ends a wait at
once, a wait for a key no one sets ends at its timeout, and the store's other calls go through
(or raise ``stop``'s error once it has one)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from inagg.hostlib.worker.abortable_store import AbortableStore, wait_keys


@pytest.fixture
def store():
    server = dist.TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=30), wait_for_workers=False)
    return dist.PrefixStore("test", server)


def test_a_key_set_later_is_seen(store):
    threading.Timer(0.2, lambda: store.set("k", b"v")).start()
    assert AbortableStore(store, lambda: None).get("k") == b"v"


def test_stop_ends_a_wait_at_once_with_its_error(store):
    gone = threading.Event()
    threading.Timer(0.2, gone.set).start()
    started = time.monotonic()
    with pytest.raises(ConnectionAbortedError, match="rank 1 gone"):
        wait_keys(store, ["never"], lambda: ConnectionAbortedError("rank 1 gone") if gone.is_set() else None)
    assert time.monotonic() - started < 1.0


def test_a_key_no_one_sets_times_out(store):
    with pytest.raises(TimeoutError, match="never"):
        AbortableStore(store, lambda: None).wait(["never"], timedelta(seconds=0.1))


def test_other_calls_go_through_until_stop_has_an_error(store):
    error: list[BaseException] = []
    wrapped = AbortableStore(store, lambda: error[0] if error else None)
    assert wrapped.add("n", 2) == 2 and wrapped.check(["n"])
    error.append(ConnectionAbortedError("rank 1 gone"))
    with pytest.raises(ConnectionAbortedError):
        wrapped.add("n", 1)
    assert store.add("n", 0) == 2

"""Store waits that end when their caller gives up on them: a rank's start (joins, the local
deployment's description) waits in the rendezvous store for keys other ranks set, and a rank
that died will never set its own. torch's ``Store.wait`` and ``Store.get`` block in C++ until
the key comes or the store's timeout (the process group's: 30 minutes by default) passes, and
nothing can end them sooner; a thread left in one when the interpreter ends aborts the process
("terminate called without an active exception") once the wait returns.

So a waiter here polls the store (``check``: one round trip, no wait in C++, and no timeout
warnings, which a short sliced ``wait`` makes torch print on every slice), backing off to
``_POLL_MAX_SECONDS``, and asks ``stop`` between polls: an error it returns is raised at once.
``AbortableStore`` wraps a store so that code written for a torch store (a ``Communicator``'s
join, the host group's) waits this way.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any, Callable

Stop = Callable[[], BaseException | None]   # why to give up waiting now (None: keep waiting)

_POLL_FIRST_SECONDS = 2e-4   # a key set just after a check is seen this late (a start's waits mostly)
_POLL_MAX_SECONDS = 0.01   # how late a key is seen at most; a start waits for a handful of them


def wait_keys(store, keys: list[str], stop: Stop, timeout: timedelta | None = None,
              poll: tuple[float, float] = (_POLL_FIRST_SECONDS, _POLL_MAX_SECONDS)) -> None:
    """Wait until ``store`` holds every one of ``keys``; raise ``stop()``'s error as soon as it
    has one, or ``TimeoutError`` after ``timeout`` (the store's own if None). ``poll``: the
    first pause between checks and the longest (each pause doubles the last)."""
    seconds = (timeout if timeout is not None else store.timeout).total_seconds()
    deadline = time.monotonic() + seconds
    pause, longest = poll
    while not store.check(keys):
        error = stop()
        if error is not None:
            raise error
        if time.monotonic() >= deadline:
            raise TimeoutError(f"keys {keys} not in the rendezvous store within {seconds:.0f}s")
        time.sleep(pause)
        pause = min(2 * pause, longest)


class AbortableStore:
    """``store`` whose blocking calls (``wait``, ``get``) wait as ``wait_keys`` does and whose
    other calls raise ``stop()``'s error first, if it has one; otherwise ``store``'s own calls.
    Not a ``torch.distributed.Store``: for Python code only (torch's C++, a gloo group's
    rendezvous, cannot call it)."""

    def __init__(self, store, stop: Stop) -> None:
        self._store, self._stop = store, stop

    @property
    def timeout(self) -> timedelta:
        return self._store.timeout

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        wait_keys(self._store, keys, self._stop, timeout)

    def get(self, key: str) -> bytes:
        wait_keys(self._store, [key], self._stop)
        return self._store.get(key)

    def __getattr__(self, name: str) -> Any:
        call = getattr(self._store, name)

        def checked(*args: Any, **kwargs: Any) -> Any:
            error = self._stop()
            if error is not None:
                raise error
            return call(*args, **kwargs)

        return checked

"""The start's one round of the store: what every rank of an ``inagg`` process group needs to
know of the others, written once and read once (``inagg.hostlib.pytorch.lifecycle``).

Design: each rank writes one key, its ``Answer`` (its host, its boot id, its pid, the name of the
Unix socket it listens on for its host's ranks and, on rank 0, the address of the peer watch's
TCP star), and reads every rank's with one ``multi_get``, which the store answers once they are
all there: the start's one rendezvous, as gloo's own start makes one (its gloo group's). The
peer watch (``inagg.hostlib.pytorch.peer_watch``), the host group
(``inagg.hostlib.worker.host_group``) and the path chooser's clock check take what they need from
it, where each was a rendezvous of its own, and so did the two gloo groups, now made at their
first call (``inagg.hostlib.pytorch.inner_gloo``, ``inagg.hostlib.pytorch.reproducible``). Each
answer is made before it is written: every rank listens on its Unix socket (any rank may lead
its host) and rank 0 on the peer watch's TCP socket, so a rank that reads the answers connects
at once. The wait is the store's (in C++, up to its timeout), as gloo's rendezvous is: a rank
that never comes is not known gone before the peer watch is up.

One set of connections where one does: where the ranks all share one host and reduce there,
the host group's star (around rank 0, the host's leader) is connected as the peer watch starts,
each rank's one hello carrying the peer watch's connection too (``connect_star``'s ``watch``),
and the host group later takes the star's links; rank 0's TCP socket is then never connected to.
No hello on either star waits for an answer: the TCP one's rank 0 pid is in the answers,
and each end of a Unix link reads the other's pid from the kernel.

The launch's claim of the store stays a round trip of its own before this one
(``InaggProcessGroup``): a rank of another launch must be refused before it writes, and alone
(its own launch's ranks never coming) it would wait in this round's ``multi_get`` for good; no
write the store offers both claims a key and reads what it held (``compare_set`` waits for its
answer, ``set`` and ``append`` answer nothing).

The answers are JSON, checked as they are read: a rank of another version of inagg (another
answer) is refused with an error that says so.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from datetime import timedelta
from functools import cache
from pathlib import Path
from typing import Callable

from inagg.hostlib.errors import InaggSetupError
from inagg.hostlib.pytorch.peer_watch import Hub, PeerWatch, connect_hub
from inagg.hostlib.worker.host_communicator import HostGroup, host_reduce_wanted, join_host_group
from inagg.hostlib.worker.host_group import (HostLayout, Link, RankDied, Stop, connect_star, host_identity, layout_of,
                                             listen)

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


@cache
def boot_id() -> str:
    """This kernel's boot id ("" where there is none: not Linux), read once per process."""
    try:
        return _BOOT_ID.read_text().strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class Answer:
    """One rank's answer (module docstring)."""

    host: str        # ``host_identity()``: ranks with equal ones reduce together first
    boot: str        # ``boot_id()``: ranks with equal ones read one monotonic clock
    host_socket: str  # the name of the Unix socket it listens on (``host_group.listen``)
    hub: str         # rank 0: its peer watch's address (``peer_watch.Hub``); "" on the others
    pid: int         # its process id (how the peer watch names it)


class RollCall:
    """One rank's side of the round (module docstring): ``__init__`` listens and writes this
    rank's answer, ``read`` waits for every rank's, then
    ``peer_watch``, ``host_group`` and ``one_clock`` use them; ``close`` lets the listening
    sockets go (a connected one stays with what it connected)."""

    def __init__(self, store, rank: int, world_size: int, watch_ip: str) -> None:
        """Listen (module docstring) and write this rank's answer under ``store`` (the group's,
        prefixed). ``watch_ip``: the address rank 0's peer watch listens on."""
        self._store, self.rank, self.world_size = store, rank, world_size
        self._hub = Hub(watch_ip, world_size) if rank == 0 and world_size > 1 else None
        self._listener = None
        self._star: dict[int, Link] | None = None   # the host's star, from the peer watch's start to ``host_group``
        try:
            self._listener, name = listen(world_size)
        except BaseException:
            self.close()
            raise
        self._mine = Answer(host_identity(), boot_id(), name, self._hub.address if self._hub else "", os.getpid())
        self.answers: list[Answer] = [self._mine]
        self._layout = layout_of(rank, [self._mine.host])
        if world_size > 1:
            store.set(str(rank), json.dumps(asdict(self._mine)))

    def read(self) -> None:
        """Every rank's answer, in one round trip once they are all there (the store's wait, up
        to its timeout: module docstring)."""
        if self.world_size == 1:
            return
        raw = self._store.multi_get([str(r) for r in range(self.world_size)])
        self.answers = [_parse(r, value) for r, value in enumerate(raw)]
        self._layout = layout_of(self.rank, [a.host for a in self.answers])

    def peer_watch(self, timeout: timedelta, on_gone: Callable[[RankDied], None]) -> PeerWatch:
        """This rank's side of the peer watch's star around rank 0 (``PeerWatch``): the host
        group's star where it joins every rank (module docstring), else the TCP one. A
        collective: every rank is on its way, so a wait for one lasts at least 30 s."""
        seconds = max(timeout.total_seconds(), 30.0)
        if self.world_size == 1:
            socks = {}
        elif len(self._layout.hosts) == 1 and host_reduce_wanted(self._layout):
            self._star = connect_star(self._layout, self._listener, self._names(), timedelta(seconds=seconds),
                                      watch=True)
            socks = {link.rank: link.take_watch() for link in self._star.values()}
        elif self._hub is not None:
            socks = self._hub.accept_all(self.world_size, seconds)
        else:
            socks = {0: connect_hub(self.answers[0].hub, self.rank, seconds)}
        return PeerWatch(self.rank, self.world_size, socks, [a.pid for a in self.answers], on_gone)

    def layout(self) -> HostLayout:
        """Every host's ranks, from the answers."""
        return self._layout

    def host_group(self, timeout: timedelta, stop: Stop) -> HostGroup | None:
        """This rank's host group (``join_host_group``, over the star the peer watch's start
        connected, or connected now; None where the job does not reduce on its hosts first); a
        wait for a rank of its host ends with ``stop()``'s error."""
        if not host_reduce_wanted(self._layout):
            return None
        links, self._star = self._star, None
        if links is None:
            links = connect_star(self._layout, self._listener, self._names(), timeout, stop)
        return join_host_group(self._layout, links, timeout, stop)

    def _names(self) -> list[str]:
        return [a.host_socket for a in self.answers]

    def one_clock(self) -> bool:
        """Whether every rank reads one ``time.perf_counter`` clock: CLOCK_MONOTONIC is the
        kernel's, so one boot id on every rank (the path chooser then times a call from the last
        rank's start to the last rank's end, ``inagg.hostlib.pytorch.path.choice``)."""
        return bool(self._mine.boot) and all(a.boot == self._mine.boot for a in self.answers)

    def close(self) -> None:
        """Let the listening sockets go, and the star's links if no host group took them
        (idempotent)."""
        if self._hub is not None:
            self._hub.close()
        if self._listener is not None:
            self._listener.close()
        for link in (self._star or {}).values():
            link.close()
        self._star = None


def _parse(rank: int, raw: bytes) -> Answer:
    """Rank ``rank``'s answer, or an error saying it is not one this inagg writes."""
    try:
        return Answer(**json.loads(raw))
    except (ValueError, TypeError) as e:
        raise InaggSetupError(f"rank {rank}'s answer at the start is not this inagg's ({raw[:120]!r}: {e}): "
                              f"do all ranks run the same version of inagg (pid {os.getpid()} here)?") from None


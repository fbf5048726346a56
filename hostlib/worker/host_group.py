"""The ranks of one host: who they are, how they talk and the memory they share.

* **Who.** Ranks share a host when they run on one kernel (the same boot id,
  /proc/sys/kernel/random/boot_id) in one network namespace (containers and emulated hosts
  that share a kernel are hosts of their own); ``INAGG_HOST_ID`` overrides that identity (ranks
  with equal values are one host). Hosts are ordered by their lowest rank, which is each host's
  leader: under torchrun the rank of local rank 0, and host 0's leader is rank 0.
* **How they talk.** A star of Unix stream sockets around the leader, in the abstract namespace
  under a random name the leader publishes in the job's store: nothing in the file system, and
  the name goes with the socket. Every rank publishes a listening socket's name with its host
  identity (one round of the store, before any rank knows whether it leads: ``listen``,
  ``discover_layout``); only the leader's is connected to, each link made by one message (the
  connecting rank's hello: each end learns the other's pid from the kernel, SO_PEERCRED). The
  leader accepts only its own user's processes. A process that dies closes its socket, so its
  peer reads end-of-file at once: a dead rank is named, never waited for. A hello may carry a
  second connection for a watcher of the ranks' ends (``connect_star``'s ``watch``: the
  backend's peer watch, on a job whose ranks all share one host).
* **How long they wait.** A rank that stops without ending (SIGSTOP, a debugger) keeps its socket
  open: every wait for a rank of the host (``receive_all``, ``Link.wait_readable``) looks every
  ``SLICE_SECONDS`` whether the process group has failed (``stop``: the backend's peer watch
  names a stopped rank when its lease runs out) and ends with that error, and it ends with a
  ``JobFailed`` naming the silent ranks after the group's timeout.
* **The memory.** One anonymous ``memfd`` that the leader creates and passes to the others over
  the sockets (SCM_RIGHTS). It has no name in /dev/shm, so nothing is left behind however a
  process ends: the kernel frees it with the last mapping. The leader makes the first one as the
  star connects (``HostReduce.share_buffer``); a larger call replaces it.
"""

from __future__ import annotations

import json
import mmap
import os
import secrets
import select
import socket
import struct
import time
from dataclasses import dataclass
from functools import cache, cached_property
from datetime import timedelta
from pathlib import Path
from typing import Callable

import numpy as np

from inagg.hostlib.errors import InaggError, InaggSetupError, JobFailed

HOST_ID_ENV = "INAGG_HOST_ID"
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
_NET_NAMESPACE = Path("/proc/self/ns/net")
SLICE_SECONDS = 0.2   # a wait for a rank of the host looks this often whether the group failed
_SLICE_MS = round(SLICE_SECONDS * 1000)   # the same, as poll(2) takes it
Stop = Callable[[], "BaseException | None"]   # why a wait ends now (None: it goes on)


def never() -> None:
    """A ``Stop`` that never stops a wait."""
    return None


class RankDied(JobFailed):
    """A rank ended (its socket to its host's ranks closed); the message names it."""

    def __init__(self, rank: int, message: str) -> None:
        super().__init__(message)
        self.rank = rank


def host_identity() -> str:
    """This process's host (module docstring); a process-unique value where there is no boot
    id (not Linux): every rank is then a host of its own."""
    override = os.environ.get(HOST_ID_ENV, "").strip()
    return override or _kernel_identity() or f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(4)}"


@cache
def _kernel_identity() -> str:
    """This kernel's boot id and this process's network namespace ("" where either cannot be
    read), read once per process: a re-init's start reads no file for them."""
    try:
        return f"{_BOOT_ID.read_text().strip()}/{os.stat(_NET_NAMESPACE).st_ino}"
    except OSError:
        return ""


@dataclass(frozen=True)
class HostLayout:
    """Every host's ranks (ascending; hosts ordered by their lowest rank) and this rank. What
    follows from them is worked out once (every call of the host reduce reads it)."""

    rank: int
    hosts: tuple[tuple[int, ...], ...]

    @cached_property
    def host(self) -> int:
        return next(h for h, ranks in enumerate(self.hosts) if self.rank in ranks)

    @cached_property
    def local(self) -> tuple[int, ...]:
        return self.hosts[self.host]

    @cached_property
    def local_index(self) -> int:
        return self.local.index(self.rank)

    @cached_property
    def leader(self) -> bool:
        return self.local_index == 0

    @cached_property
    def world_size(self) -> int:
        return sum(len(ranks) for ranks in self.hosts)

    def describe(self) -> str:
        """The hosts as their ranks, e.g. 'host 0 = ranks 0-3, host 1 = ranks 4-7'."""
        return ", ".join(f"host {h} = ranks {_span(r)}" for h, r in enumerate(self.hosts))


def _span(ranks: tuple[int, ...]) -> str:
    contiguous = ranks[-1] - ranks[0] + 1 == len(ranks)
    return f"{ranks[0]}-{ranks[-1]}" if contiguous and len(ranks) > 1 else ",".join(map(str, ranks))


def layout_of(rank: int, identities: list[str]) -> HostLayout:
    """The layout of ranks whose hosts are ``identities`` (``host_identity``, by rank)."""
    hosts: dict[str, list[int]] = {}
    for r, host in enumerate(identities):
        hosts.setdefault(host, []).append(r)
    return HostLayout(rank, tuple(tuple(ranks) for ranks in hosts.values()))


def discover_layout(store, rank: int, world_size: int, listening: str = "") -> tuple[HostLayout, list[str]]:
    """Every rank's host, through the job's (prefixed) store, and the name every rank's
    ``listening`` socket has (``listen``): one round of the store, which hands a host's ranks
    their leader's name with the layout (``connect_star``). A collective. (The backend's start
    carries the same in its one round, ``inagg.hostlib.pytorch.roll_call``.)"""
    store.set(f"id/{rank}", json.dumps([host_identity(), listening]))
    keys = [f"id/{r}" for r in range(world_size)]
    store.wait(keys)   # then one round trip for all of them
    ids = [json.loads(value) for value in store.multi_get(keys)]
    return layout_of(rank, [host for host, _ in ids]), [name for _, name in ids]


# -- messages ---------------------------------------------------------------------------------

_HEADER = struct.Struct("<BxxxIqqqI")   # kind, call, a, b, c, bytes of text that follow


@dataclass(frozen=True)
class Message:
    kind: int
    call: int
    a: int = 0
    b: int = 0
    c: int = 0
    text: str = ""
    fd: int | None = None   # a memfd passed with the message (SCM_RIGHTS)


def _peer_name(rank: int, pid: int, leader: bool) -> str:
    """How errors name a rank of this host."""
    return f"rank {rank} (pid {pid}{', its host' + chr(39) + 's leader' if leader else ''})"


class Link:
    """One connected Unix stream socket to a rank of this host, in ``Message`` frames; ``watch``:
    the second connection to the same process that ``connect_star`` made for a watcher of its
    end, until that watcher takes it (``take_watch``)."""

    def __init__(self, sock: socket.socket, rank: int, pid: int, leader: bool,
                 watch: socket.socket | None = None) -> None:
        self.sock, self.rank, self.pid, self.watch = sock, rank, pid, watch
        self.peer = _peer_name(rank, pid, leader)

    def take_watch(self) -> socket.socket:
        """The watch connection (``connect_star(watch=True)``), now the caller's to close."""
        watch, self.watch = self.watch, None
        if watch is None:
            raise InaggError(f"no watch connection to {self.peer}: the star was connected without one")
        return watch

    def send(self, m: Message) -> None:
        text = m.text.encode()
        frame = _HEADER.pack(m.kind, m.call, m.a, m.b, m.c, len(text)) + text
        try:
            if m.fd is None:
                self.sock.sendall(frame)
            else:
                socket.send_fds(self.sock, [frame], [m.fd])
        except OSError as e:
            raise self._gone(e) from None

    def recv(self) -> Message:
        """The next message; raises ``RankDied`` naming the peer when its socket closed."""
        try:
            head, fds, _, _ = socket.recv_fds(self.sock, _HEADER.size, 1)
            if not head:
                raise EOFError("end of file")
            head += self.read_exactly(_HEADER.size - len(head))
            kind, call, a, b, c, n = _HEADER.unpack(head)
            text = self.read_exactly(n).decode()
        except (OSError, EOFError) as e:
            raise self._gone(e) from None
        return Message(kind, call, a, b, c, text, fds[0] if fds else None)

    def wait_readable(self, stop: Stop = never, timeout: float | None = None) -> None:
        """Return once the peer has sent something (or closed); raise ``stop()``'s error, or a
        ``JobFailed`` naming the peer after ``timeout`` seconds (module docstring)."""
        poller = select.poll()   # poll(2): no descriptor of its own to open and close, as epoll's
        poller.register(self.sock, select.POLLIN)
        deadline = None if timeout is None else time.monotonic() + timeout
        while not poller.poll(_SLICE_MS):
            _give_up(stop, deadline, timeout, [self])

    def read_exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise EOFError("end of file")
            data += chunk
        return data

    def _gone(self, cause: Exception) -> RankDied:
        return RankDied(self.rank, f"{self.peer} died (its socket to this host's ranks closed: {cause})")

    def close(self) -> None:
        """Close the connection (and the watch connection, unless a watcher took it)."""
        self.sock.close()
        if self.watch is not None:
            self.watch.close()


def receive_all(links: dict[int, Link], stop: Stop = never, timeout: float | None = None,
                got: dict[int, Message] | None = None) -> dict[int, Message]:
    """One message from each link, in the order they come (``got``: those received already);
    the first dead peer raises, and so does a wait that ``stop`` ends or that outlasts
    ``timeout`` seconds (module docstring)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    poller = select.poll()   # poll(2): no descriptor of its own to open and close, as epoll's
    by_fd = {}
    got = dict(got or {})
    for i, link in links.items():
        if i not in got:
            poller.register(link.sock, select.POLLIN)
            by_fd[link.sock.fileno()] = i
    while len(got) < len(links):
        ready = poller.poll(_SLICE_MS)
        for fd, _ in ready:
            i = by_fd[fd]
            got[i] = links[i].recv()
            poller.unregister(fd)
        if not ready:
            _give_up(stop, deadline, timeout, [link for i, link in links.items() if i not in got])
    return got


def _give_up(stop: Stop, deadline: float | None, timeout: float | None, waited_for: list[Link]) -> None:
    """Raise ``stop()``'s error if there is one, or a ``JobFailed`` naming the ranks waited for
    once ``deadline`` passed; else return (the wait goes on)."""
    error = stop()
    if error is not None:
        raise error
    if deadline is not None and time.monotonic() >= deadline:
        peers = ", ".join(link.peer for link in waited_for)
        raise JobFailed(f"no message from {peers} within the process group's timeout ({timeout:.0f}s): "
                        f"it runs, but not this call")


# -- the star ---------------------------------------------------------------------------------

_HELLO = struct.Struct("<q")   # the connecting rank (its pid: SO_PEERCRED, ``_peer_pid``)


def _peer_pid(sock: socket.socket) -> tuple[int, int]:
    """The pid and uid of the process at the other end of a connected Unix socket (SO_PEERCRED:
    the connecting process for the leader, the listening one for the others)."""
    pid, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return pid, uid


def listen(backlog: int) -> tuple[socket.socket, str]:
    """A Unix stream socket listening in the abstract namespace under a random name, and the name
    (module docstring): every rank makes one before its host's leader is known, and only the
    leader's is connected to."""
    name = f"\0inagg-host-{secrets.token_hex(16)}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(name)
        listener.listen(backlog)
    except OSError:
        listener.close()
        raise
    return listener, name[1:]


def connect_star(layout: HostLayout, listener: socket.socket, names: list[str], timeout: timedelta,
                 stop: Stop = never, watch: bool = False) -> dict[int, Link]:
    """The leader's links to the other ranks of its host (by local index), accepted on its
    ``listener``, or another rank's one link to its leader (index 0), at the leader's name in
    ``names`` (``discover_layout``'s). A collective of the host's ranks; the leader's wait for
    them ends with ``stop()``'s error (a rank gone before it connected) or after ``timeout``.

    One message makes a link: the connecting rank's hello (its rank). Each end learns the
    other's pid from the kernel (``_peer_pid``), so no answer comes back: a rank that is not
    the leader goes on at once, and the first message it waits for is the leader's first
    shared buffer (``HostReduce.share_buffer``). With ``watch``, the hello also carries one end
    of a socket pair whose other end the connecting rank keeps (SCM_RIGHTS), left on each
    ``Link`` as ``watch``: a second connection between the same two processes, made without a
    handshake of its own, whose end-of-file says the other process ended (the backend's peer
    watch reads it, never the reduce's messages)."""
    seconds = timeout.total_seconds()
    if layout.leader:
        listener.settimeout(SLICE_SECONDS)
        return _accept_all(listener, layout, stop, time.monotonic() + seconds, watch)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(seconds)
    leader = layout.local[0]
    try:
        sock.connect("\0" + names[leader])
        pid, _ = _peer_pid(sock)
        kept = _say_hello(sock, layout.rank, watch)
    except BaseException:
        sock.close()
        raise
    sock.settimeout(None)
    return {0: Link(sock, leader, pid, True, kept)}


def _say_hello(sock: socket.socket, rank: int, watch: bool) -> socket.socket | None:
    """Send this rank's hello on ``sock``; with ``watch``, with one end of a new socket pair,
    whose other end is returned (``connect_star``)."""
    if not watch:
        sock.sendall(_HELLO.pack(rank))
        return None
    kept, given = socket.socketpair()
    try:
        socket.send_fds(sock, [_HELLO.pack(rank)], [given.fileno()])
    except BaseException:
        kept.close()
        raise
    finally:
        given.close()
    return kept


def _accept_all(listener: socket.socket, layout: HostLayout, stop: Stop, deadline: float,
                watch: bool) -> dict[int, Link]:
    """The leader's accepts (``connect_star``), in slices of ``SLICE_SECONDS`` that ask ``stop``."""
    links: dict[int, Link] = {}
    try:
        while len(links) < len(layout.local) - 1:
            try:
                sock, _ = listener.accept()
            except socket.timeout:
                if (error := stop()) is not None:
                    raise error from None
                if time.monotonic() < deadline:
                    continue
                missing = [r for r in layout.local[1:] if layout.local.index(r) not in links]
                raise InaggSetupError(f"host {layout.host}: ranks {missing} did not connect to their leader, "
                                      f"rank {layout.rank}") from None
            link = _hello_of(sock, layout, watch)
            if link is not None:
                links[layout.local.index(link.rank)] = link
    except BaseException:
        for link in links.values():
            link.close()
        raise
    return links


def _hello_of(sock: socket.socket, layout: HostLayout, watch: bool) -> Link | None:
    """The link a rank of this host opened with ``sock`` (its hello read, and with ``watch`` the
    socket it passed); None for another user's process, which found the name (closed)."""
    pid, uid = _peer_pid(sock)
    if uid != os.getuid():
        sock.close()   # not one of our ranks
        return None
    sock.settimeout(None)
    link = Link(sock, -1, pid, False)
    try:
        head, fds, _, _ = socket.recv_fds(sock, _HELLO.size, 1)
        link.watch = socket.socket(fileno=fds[0]) if fds else None
        (rank,) = _HELLO.unpack(head + link.read_exactly(_HELLO.size - len(head)))
        if rank not in layout.local[1:]:
            raise InaggSetupError(f"host {layout.host}: rank {rank} connected, but this host runs ranks {layout.local}")
        if watch and link.watch is None:
            raise InaggSetupError(f"host {layout.host}: rank {rank} connected without the peer watch's socket: "
                                  f"do all ranks run the same version of inagg?")
    except BaseException:
        link.close()
        raise
    link.rank, link.peer = rank, _peer_name(rank, pid, False)
    return link


class SharedBuffer:
    """A memfd mapped read-write (module docstring), in two regions: ``[0, split)`` and
    ``[split, nbytes)``. The leader creates it (``create``); the others map the descriptor it
    passes them."""

    def __init__(self, fd: int, nbytes: int, split: int) -> None:
        self.fd, self.nbytes, self.split = fd, nbytes, split
        self.map = mmap.mmap(fd, nbytes) if nbytes else None

    @classmethod
    def create(cls, nbytes: int, split: int) -> "SharedBuffer":
        fd = os.memfd_create("inagg-host-reduce", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, nbytes)
        except OSError as e:
            os.close(fd)
            raise InaggError(f"cannot size the host-local reduce's shared memory to {nbytes} bytes: {e}") from None
        return cls(fd, nbytes, split)

    def view(self, offset: int, dtype, count: int) -> np.ndarray:
        return np.frombuffer(self.map, dtype, count, offset)

    def close(self) -> None:
        """Unmap and close (idempotent: a failed start's group is closed again at exit, and the
        descriptor's number may be another file's by then). A view still held keeps the mapping
        (numpy holds a buffer export); it is then freed with the view."""
        if self.fd < 0:
            return
        if self.map is not None:
            try:
                self.map.close()
            except BufferError:
                pass
        os.close(self.fd)
        self.fd = -1

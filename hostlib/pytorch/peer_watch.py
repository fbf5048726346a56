"""Which ranks of a process group are still there: a TCP star around rank 0 that names a rank
the moment its process ends, and one that stops answering once its lease runs out, whatever
path its calls were on and however it ended.

* **The star.** Every other rank holds one connection to rank 0, made as the ranks meet (the
  start's one round of the store, ``inagg.hostlib.pytorch.roll_call``, which also gives every
  rank's pid). Where the ranks all share one host and reduce there, the host group's star
  brings it (``host_group.connect_star``'s ``watch``: each rank's hello to rank 0, its host's
  leader, carries one end of a socket pair), so nothing more is connected. Elsewhere rank 0
  listens on a TCP address (``Hub``) it publishes, with a random token, in that round; every
  other rank connects and says hello (the token and its rank), and goes on without an answer.
  A process that ends closes its sockets, so the other end reads end-of-file at once: a
  SIGKILLed rank is seen as soon as the kernel closes its socket, rank 0 included (every rank
  holds a socket to it), on any machine the ranks reach each other from.
* **Leaving.** A rank that leaves says so first: ``LEAVE`` (``destroy_process_group``: it takes
  part in no call any more, which fails no one) or ``EXIT`` (its interpreter ends without
  leaving: the calls the others wait for will not come). End-of-file without either means the
  process died (killed or crashed).
* **The relay.** Rank 0 tells every other rank of a rank gone (``GONE``: rank, pid, how), so
  each rank learns of every other's end with one socket of its own.
* **The watch thread.** Each rank's watch runs on a thread of its own, started without
  waiting for it to run (``_thread.start_new_thread``: ``threading.Thread.start`` waits, which
  on a loaded machine is a wait for a CPU on the start's path); ``close`` tells it to end and
  does not wait either: it closes the connections itself as it ends.
* **The lease.** A rank that stops without ending (SIGSTOP, a debugger, a process frozen by its
  cgroup) keeps its sockets open, so end-of-file never comes. Every rank's watch thread sends a
  ``BEAT`` to the other end of each of its sockets every eighth of the lease and counts anything
  it reads as a beat: a rank rank 0 has heard nothing from for ``LEASE_SECONDS`` is gone as
  ``STOPPED`` (relayed as any end), and so is rank 0 for a rank that has not heard from it. A
  watcher that was itself not running for part of that time (its own wake-ups late: a loaded
  or stopped machine) restarts its count instead of blaming the others. ``INAGG_PEER_LEASE``
  (seconds) overrides the lease (``LEASE_SECONDS``). A rank named stopped then has its
  connections to this process shut down from this end (``cut_connections_to``, where it runs on
  this host), so a gloo call waiting for it fails as for a dead rank instead of at gloo's timeout.

A rank gone other than by ``LEAVE`` fails the group: ``on_gone`` is called (on the watch's
thread) with a ``RankDied`` naming it, once, for the first such rank; ``failure`` holds it.
"""

from __future__ import annotations

import _thread
import os
import secrets
import selectors
import socket
import struct
import threading
import time
from datetime import timedelta
from typing import Callable

from inagg.hostlib.errors import InaggSetupError
from inagg.hostlib.worker.host_group import RankDied

LEAVE, EXIT, GONE, BEAT = b"L", b"X", b"G", b"H"
STOPPED = b"S"   # how a rank silent for the lease is gone
LEASE_ENV = "INAGG_PEER_LEASE"
LEASE_SECONDS = 8.0   # a stopped rank is named within this (and a beat) of its last beat
_HELLO = struct.Struct("<16sq")   # token, rank
_GONE = struct.Struct("<qqc")      # rank, pid, how (LEAVE, EXIT, STOPPED or b"D": died)
_DIED = b"D"
_WAIT_SLICE = 0.2   # seconds a gloo wait stays in C++ at a time (``wait_gloo``)


def _how(rank: int, pid: int, how: bytes) -> str:
    """The words for a rank gone ``how``."""
    who = f"rank {rank} (pid {pid})"
    if how == STOPPED:
        return (f"{who} stopped responding: nothing from it for {lease_seconds():.0f}s (stopped, hung or frozen; "
                f"{LEASE_ENV} sets this lease)")
    if how == EXIT:
        return f"{who} exited without leaving the process group (its interpreter ended)"
    return f"{who} died: its process ended without leaving the process group (killed or crashed)"


def lease_seconds() -> float:
    """The peer watch's lease (module docstring): ``INAGG_PEER_LEASE`` or ``LEASE_SECONDS``."""
    value = os.environ.get(LEASE_ENV, "").strip()
    try:
        lease = float(value) if value else LEASE_SECONDS
    except ValueError:
        raise InaggSetupError(f"{LEASE_ENV} must be a number of seconds; got {value!r}") from None
    if not lease > 0:
        raise InaggSetupError(f"{LEASE_ENV} must be above 0; got {value!r}")
    return lease


class Hub:
    """Rank 0's end of the TCP star before the ranks meet: a TCP socket listening on ``ip`` and
    ``address``, what the others connect to (``ip:port:token``, the token random)."""

    def __init__(self, ip: str, backlog: int) -> None:
        self.token = secrets.token_bytes(16)
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self.listener.bind((ip, 0))
            self.listener.listen(backlog)
        except OSError:
            self.listener.close()
            raise
        self.address = f"{ip}:{self.listener.getsockname()[1]}:{self.token.hex()}"

    def accept_all(self, world_size: int, seconds: float) -> dict[int, socket.socket]:
        """Every other rank's connection (by rank), whose hello carries this hub's token; a
        stranger's is closed. Raises naming the ranks missing after ``seconds``."""
        socks: dict[int, socket.socket] = {}
        self.listener.settimeout(seconds)
        try:
            while len(socks) < world_size - 1:
                try:
                    sock, _ = self.listener.accept()
                except socket.timeout:
                    missing = sorted(set(range(1, world_size)) - set(socks))
                    raise InaggSetupError(f"ranks {missing} did not connect to rank 0's peer watch at {self.address} "
                                          f"within {seconds:.0f}s: can they reach that address?") from None
                sock.settimeout(seconds)
                hello = _read(sock, _HELLO.size)
                their_token, rank = _HELLO.unpack(hello) if hello else (b"", -1)
                if their_token != self.token or not 0 < rank < world_size or rank in socks:
                    sock.close()   # not one of this group's ranks
                    continue
                sock.settimeout(None)
                socks[rank] = sock
        except BaseException:
            for sock in socks.values():
                sock.close()
            raise
        return socks

    def close(self) -> None:
        self.listener.close()


def connect_hub(address: str, rank: int, seconds: float) -> socket.socket:
    """Rank ``rank``'s connection to rank 0's hub at ``address`` (``Hub.address``), its hello
    sent (no answer comes: rank 0's pid is in the roll call)."""
    try:
        ip, port, token = address.rsplit(":", 2)
    except ValueError:
        raise InaggSetupError(f"rank 0's peer watch address {address!r} is not ip:port:token: do all ranks "
                              f"run the same version of inagg?") from None
    sock = socket.create_connection((ip, int(port)), timeout=seconds)
    try:
        sock.sendall(_HELLO.pack(bytes.fromhex(token), rank))
    except BaseException:
        sock.close()
        raise
    sock.settimeout(None)
    return sock


class PeerWatch:
    """One rank's side of the star (module docstring) over its connections ``socks`` (rank 0: one
    to every other rank; any other rank: one to rank 0), made as the ranks met; ``pids``: every
    rank's process id. Takes the connections (``close`` closes them)."""

    def __init__(self, rank: int, world_size: int, socks: dict[int, socket.socket], pids: list[int],
                 on_gone: Callable[[RankDied], None]) -> None:
        self.rank, self.world_size, self._on_gone = rank, world_size, on_gone
        self.failure: RankDied | None = None
        self._failed = threading.Event()
        self._all_gone = threading.Event()   # rank 0: every other rank left or ended
        self._gone: set[int] = set()
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()   # one message at a time on a socket: the relay and close both send
        self._socks = socks
        self._pids = {r: pids[r] for r in socks}
        self._lease = lease_seconds()
        self._watching = False   # the watch thread runs, until ``close``
        if world_size == 1:
            self._all_gone.set()
            return
        self._open = set(self._socks)   # ranks whose sockets have not ended
        self._wake_r, self._wake_w = socket.socketpair()
        _thread.start_new_thread(self._run, ())
        self._watching = True

    # -- watching ----------------------------------------------------------------------------

    def _run(self) -> None:
        """The watch thread (``_watch``); it closes the connections as it ends (after ``close``),
        so no other thread closes a socket it may be reading."""
        try:
            self._watch()
        finally:
            for sock in self._socks.values():
                sock.close()
            self._wake_r.close()
            self._wake_w.close()

    def _watch(self) -> None:
        """The watch thread: what each socket says, this rank's beats and the others' lease."""
        beat = self._lease / 8
        heard = dict.fromkeys(self._socks, time.monotonic())   # the ranks this rank holds to the lease
        with selectors.DefaultSelector() as selector:
            selector.register(self._wake_r, selectors.EVENT_READ, None)
            for rank, sock in self._socks.items():
                selector.register(sock, selectors.EVENT_READ, rank)
            # the first beat after one interval: each lease counts from its watcher's start
            # (``heard``), and a beat now would only wake the other ranks while they start
            last = time.monotonic()
            next_beat = last + beat
            while True:
                for key, _ in selector.select(max(0.0, next_beat - time.monotonic())):
                    if key.data is None:
                        return
                    heard[key.data] = time.monotonic()
                    if self._read_from(key.data):
                        selector.unregister(key.fileobj)
                        heard.pop(key.data, None)
                now = time.monotonic()
                if now - last > 2 * beat:   # this thread was not running: the others' silence is not theirs
                    heard = dict.fromkeys(heard, now)
                last = now
                if now >= next_beat:
                    self._beat()
                    next_beat = now + beat
                for rank in [r for r, t in heard.items() if now - t > self._lease]:
                    heard.pop(rank)   # its socket stays open: it is told when the group leaves
                    selector.unregister(self._socks[rank])
                    self._gone_rank(rank, self._pids[rank], STOPPED)

    def _beat(self) -> None:
        """A beat to every rank whose socket has not ended (a send to one shut down fails
        quietly, ``_send``)."""
        for rank, sock in self._socks.items():
            if rank in self._open:
                self._tell(sock, BEAT)

    def _read_from(self, rank: int) -> bool:
        """Handle what ``rank``'s socket says; True when it is done (that rank is gone)."""
        sock = self._socks[rank]
        try:
            kind = sock.recv(1)
        except OSError:
            kind = b""
        if kind == BEAT:
            return False
        if kind == GONE:   # rank 0 relays another rank's end
            body = _read(sock, _GONE.size)
            if body:
                self._gone_rank(*_GONE.unpack(body))
                return False
            kind = b""
        self._open.discard(rank)
        self._gone_rank(rank, self._pids[rank], kind if kind in (LEAVE, EXIT) else _DIED)
        return True

    def _gone_rank(self, rank: int, pid: int, how: bytes) -> None:
        """Note ``rank`` gone ``how``; fail the group unless it left; rank 0 tells the others."""
        with self._lock:
            if rank in self._gone:
                return
            self._gone.add(rank)
            first_failure = how != LEAVE and self.failure is None
            if first_failure:
                self.failure = RankDied(rank, _how(rank, pid, how))
            if self.rank == 0 and len(self._gone) == self.world_size - 1:
                self._all_gone.set()
        if self.rank == 0 and how != LEAVE:
            for other, sock in self._socks.items():
                if other not in self._gone:
                    self._tell(sock, GONE + _GONE.pack(rank, pid, how))
        if first_failure:
            self._failed.set()
            self._on_gone(self.failure)
        if how == STOPPED:   # its connections end here, as they would at its end
            cut_connections_to(pid)

    def _tell(self, sock: socket.socket, message: bytes) -> None:
        with self._send_lock:
            _send(sock, message)

    # -- the group's side ----------------------------------------------------------------------

    def wait_for_failure(self, seconds: float) -> RankDied | None:
        """The first rank gone without leaving, waiting up to ``seconds`` for one."""
        self._failed.wait(seconds)
        return self.failure

    def close(self, how: bytes = LEAVE, wait: float = 30.0) -> None:
        """Leave the star: say ``how`` (``LEAVE`` or ``EXIT``) to every peer first, then rank 0
        waits up to ``wait`` seconds for every other rank to leave or end (where what it tears
        down after, a local deployment, serves them until then), then the watch thread is told to
        end; it closes the connections (``_run``), and nothing waits for it: on a loaded machine
        that would be a wait for a CPU, on the way to the next ``init_process_group``.
        Idempotent."""
        if not self._watching:
            return
        self._watching = False
        for sock in self._socks.values():
            self._tell(sock, how)
        if self.rank == 0:
            self._all_gone.wait(wait)
        _send(self._wake_w, b"\0")


def _read(sock: socket.socket, n: int) -> bytes:
    """Exactly ``n`` bytes, or b"" when the socket ends (or fails) first."""
    data = b""
    while len(data) < n:
        try:
            chunk = sock.recv(n - len(data))
        except OSError:
            return b""
        if not chunk:
            return b""
        data += chunk
    return data


def _send(sock: socket.socket, data: bytes) -> None:
    """Send ``data``; a peer already gone is not an error here."""
    try:
        sock.sendall(data)
    except OSError:
        pass


def wait_gloo(work, failure: Callable[[], BaseException | None], timeout: timedelta | None = None) -> bool:
    """Wait for a gloo ``work`` as its own ``wait`` does, in slices: the caller's thread stays in
    Python between them, so a Ctrl-C is raised there at once, and the wait ends with
    ``failure()`` (a rank gone: gloo waits on an op whose peers are alive but will never send)
    instead of the group's timeout. ``timeout``: as gloo's (None or 0, torch's ``kNoTimeout``:
    none), and so is its error's text ("Timed out waiting <ms>ms ...", which torch's own tests
    match), not the text of the last slice's timeout. Errors are raised outside the handler of a
    slice's timeout: chained to it, they would keep this frame, and ``work`` in it, for as long as
    they are kept."""
    deadline = time.monotonic() + timeout.total_seconds() if timeout else None
    while True:
        # never 0: gloo's wait(0) waits for good
        step = _WAIT_SLICE if deadline is None else min(_WAIT_SLICE, max(deadline - time.monotonic(), 1e-3))
        try:
            return work.wait(timedelta(seconds=step))
        except RuntimeError:
            completed = work.is_completed()
        if completed:
            return work.wait()   # its own outcome: done, or its error
        error = failure()
        if error is not None:
            raise error
        if deadline is not None and time.monotonic() >= deadline:
            raise RuntimeError(f"inagg: Timed out waiting {timeout.total_seconds() * 1e3:.0f}ms for a gloo "
                               f"call to complete (the process group's timeout; no rank is known gone)")



def cut_connections_to(pid: int) -> int:
    """Shut down this process's TCP connections to process ``pid`` of this host, as its end
    would have: a rank named stopped keeps its sockets open, and a gloo call waiting on it
    (and gloo's destructor, which joins the thread running that call) waits for its end or
    gloo's timeout; shut down, the call fails as for a dead rank ("Connection closed by
    peer"). Found through /proc: the sockets of ``pid`` (this user's, this network namespace)
    and this process's sockets whose far end is one of them. Returns how many were shut down
    (0 where ``pid`` is on another host or its sockets cannot be read)."""
    theirs = _socket_inodes(pid)
    if not theirs:
        return 0
    table = _tcp_connections()
    their_addresses = {table[inode][0] for inode in theirs if inode in table}
    cut = 0
    for fd, inode in _socket_fds(os.getpid()).items():
        if inode in table and table[inode][1] in their_addresses:
            try:
                with socket.socket(fileno=os.dup(fd)) as sock:   # the dup shares the connection
                    sock.shutdown(socket.SHUT_RDWR)
                cut += 1
            except OSError:
                pass
    return cut


def _socket_fds(pid: int) -> dict[int, int]:
    """``pid``'s open sockets: fd -> inode (none where /proc does not show them)."""
    fds: dict[int, int] = {}
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return fds
    for name in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            fds[int(name)] = int(target[8:-1])
    return fds


def _socket_inodes(pid: int) -> set[int]:
    return set(_socket_fds(pid).values())


def _tcp_connections() -> dict[int, tuple[str, str]]:
    """This network namespace's TCP sockets: inode -> (local address, remote address), as
    /proc/net/tcp and tcp6 write them."""
    table: dict[int, tuple[str, str]] = {}
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(path).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[9] != "0":
                table[int(fields[9])] = (fields[1], fields[2])
    return table

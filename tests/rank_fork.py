"""Rank processes for tests, forked from a server that imported torch and inagg's backend once:
``RankProcess([sys.executable, SCRIPT, *ARGS], env=..., cwd=..., stdout=PIPE, ...)`` answers as
``subprocess.Popen`` of the same command would (``pid``, ``stdin``/``stdout``/``stderr``,
``poll``, ``wait``, ``communicate``, ``send_signal``, ``kill``, ``terminate``, ``returncode``),
without the interpreter's start and torch's import, which were most of what a rank-killing
test spent (docs/testing.md, "Rank processes forked in the tests").

The server is this file run as a process of its own (``python tests/rank_fork.py FD``), one per
test process, started at the first rank and ended when that process ends (its end of the
control socket closes). It is not multiprocessing's fork server: a process has one of those,
whose preload is whichever caller set it last (torch's suite's, tests/torch_dist_suite.py), so
a test's ranks would import whatever another test asked for. The server imports ``PRELOAD``,
starts no thread and makes no socket but its own, then forks one child per request: the child
takes the request's stdin, stdout and stderr (passed as file descriptors), environment (the
whole of it, as a spawned process gets it), working directory and ``sys.argv``, and runs the
script as ``__main__``. The server tells the test the child's pid, then its exit status
(``Popen``'s: ``-N`` for a signal), on a socket of that rank's own; signals go straight to the
pid, so SIGKILL, SIGSTOP/SIGCONT and SIGINT reach the rank as they would a spawned one.

Only a rank whose point is not a fresh process belongs here: a test of an interpreter's start
(what ``import`` loads, ``init_process_group``'s time against gloo's) or of Ctrl-C to a
launcher's process group keeps ``subprocess``.
"""

from __future__ import annotations

import functools
import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from typing import IO, NoReturn

from inagg.bmv2_env.emulation.forked import flush_std_streams

# what every forked rank finds imported: torch, c10d, DDP and inagg's backend (a one-host job's
# imports; not the switch's communicator nor gRPC, whose core does not survive a fork once used)
PRELOAD = ("torch", "torch.distributed", "torch.nn.parallel", "inagg.hostlib.pytorch.backend",
           "inagg.hostlib.pytorch.plugin")
_MESSAGE_BYTES = 1 << 20   # one request: argv, cwd and the environment as JSON


# -- the server ----------------------------------------------------------------------------------

def serve(control: socket.socket) -> None:
    """Fork a child per request on ``control`` until it closes; report each child's end. A
    Ctrl-C at the test's terminal is the test's to handle, not the server's."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for module in PRELOAD:
        __import__(module)
    children: dict[int, tuple[int, socket.socket]] = {}   # pidfd -> pid, its status socket
    while True:
        ready, _, _ = select.select([control, *children], [], [])
        for fd in ready:
            if fd is control:
                if not _start_child(control, children):
                    return
            else:
                pid, status = children.pop(fd)
                os.close(fd)
                _, code = os.waitpid(pid, 0)
                _tell(status, f"exit {os.waitstatus_to_exitcode(code)}")
                status.close()


def _start_child(control: socket.socket, children: dict) -> bool:
    """Fork the child one request asks for (False: the test process has gone)."""
    message, fds, _, _ = socket.recv_fds(control, _MESSAGE_BYTES, 4)
    if not message:
        return False
    request = json.loads(message)
    status = socket.socket(fileno=fds[3])
    pid = os.fork()
    if pid == 0:
        for other in (control, status, *(s for _, s in children.values())):
            other.close()
        for pidfd in children:
            os.close(pidfd)
        _run(request, fds[:3])
    for fd in fds[:3]:
        os.close(fd)
    children[os.pidfd_open(pid)] = (pid, status)
    _tell(status, f"pid {pid}")
    return True


def _tell(status: socket.socket, line: str) -> None:
    """Send ``line`` to the test's ``RankProcess``, unless it is gone (its object collected
    before its rank ended): the server serves the other ranks on."""
    try:
        status.sendall(f"{line}\n".encode())
    except OSError:
        pass


def _run(request: dict, stdio: list[int]) -> NoReturn:
    """The child: ``python SCRIPT ARGS`` as its own process would run it, then ``os._exit``
    with its status (nothing of the server's, its exit handlers included, runs here); an
    uncaught KeyboardInterrupt ends it by SIGINT, as it ends an interpreter."""
    code = 1
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for target, fd in enumerate(stdio):
            os.dup2(fd, target)
            os.close(fd)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        script = request["argv"][0]
        sys.argv = list(request["argv"])
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else int(e.code is not None)
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except BaseException as e:  # noqa: BLE001 - reported on its stderr, as an uncaught error would be
        traceback.print_exc()
        code = -signal.SIGINT if isinstance(e, KeyboardInterrupt) else 1
    finally:
        _exit(code)


def _exit(code: int) -> NoReturn:
    """End the child with ``code`` once what it buffered is written: ``-N`` by signal N."""
    flush_std_streams()
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)


# -- the test's side -----------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def _server() -> tuple[socket.socket, threading.Lock]:
    """This process's server (started at the first call) and the lock its requests take."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    subprocess.Popen([sys.executable, os.path.abspath(__file__), str(theirs.fileno())], pass_fds=(theirs.fileno(),),
                     stdin=subprocess.DEVNULL)
    theirs.close()
    return ours, threading.Lock()


def _stdio(what: int | IO | None, default: int, read: bool) -> tuple[int, int | None]:
    """The child's end of one of its stdin/stdout/stderr (a new fd the caller closes) and, for
    ``PIPE``, the test's end."""
    if what == subprocess.PIPE:
        r, w = os.pipe()
        return (r, w) if read else (w, r)
    if what == subprocess.DEVNULL:
        return os.open(os.devnull, os.O_RDONLY if read else os.O_WRONLY), None
    if what is None:
        return os.dup(default), None
    return os.dup(what if isinstance(what, int) else what.fileno()), None


class RankProcess:
    """``args`` (``[sys.executable, SCRIPT, *ARGS]``) run in a child of this process's server
    (module docstring), as ``subprocess.Popen(args, ...)`` with the same arguments would run it."""

    def __init__(self, args: list[str], *, env: dict | None = None, cwd: str | os.PathLike | None = None,
                 stdin: int | IO | None = None, stdout: int | IO | None = None,
                 stderr: int | IO | None = None, text: bool = False) -> None:
        if len(args) < 2 or args[0] != sys.executable or not str(args[1]).endswith(".py"):
            raise ValueError(f"a forked rank runs [sys.executable, SCRIPT.py, ARGS...], not {args}: "
                             "start anything else with subprocess")
        self.args, self.returncode = [str(a) for a in args], None
        self._readers: list[threading.Thread] | None = None   # communicate's
        self._read: dict[int, str | bytes] = {}
        ends = [_stdio(stdin, 0, True), _stdio(stdout, 1, False)]
        ends.append((os.dup(ends[1][0]), None) if stderr == subprocess.STDOUT else _stdio(stderr, 2, False))
        self._status, theirs = socket.socketpair()
        request = {"argv": self.args[1:], "env": dict(os.environ if env is None else env),
                   "cwd": os.fspath(cwd or os.getcwd())}
        control, lock = _server()
        try:
            with lock:
                socket.send_fds(control, [json.dumps(request).encode()], [fd for fd, _ in ends] + [theirs.fileno()])
        finally:
            for fd, _ in ends:
                os.close(fd)
            theirs.close()
        self.pid = self._said()
        modes = ("w", "r", "r") if text else ("wb", "rb", "rb")
        self.stdin, self.stdout, self.stderr = (None if mine is None else os.fdopen(mine, mode)
                                                for (_, mine), mode in zip(ends, modes))

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._status], [], [], 0)[0]:
            self.returncode = self._said()
            self._status.close()
        return self.returncode

    def _said(self) -> int:
        """The server's next line on this rank's socket (``pid N``, ``exit STATUS``): its number.
        Read a byte at a time, so nothing past it waits unseen in a buffer."""
        line = b""
        while not line.endswith(b"\n"):
            byte = self._status.recv(1)
            if not byte:
                raise RuntimeError(f"the rank fork server closed {self.args}'s socket mid-line: see its stderr")
            line += byte
        return int(line.split()[1])

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
            select.select([self._status], [], [], left)
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple:
        """Close stdin, read stdout and stderr to their ends (a thread each, from what the
        test's own reads left buffered on), wait: ``Popen.communicate()``, which may be called
        again after its ``TimeoutExpired`` and goes on reading."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if self.stdin is not None and not self.stdin.closed:
            self.stdin.close()
        if self._readers is None:
            self._readers = [threading.Thread(target=lambda i=i, p=p: self._read.__setitem__(i, p.read()), daemon=True)
                             for i, p in enumerate((self.stdout, self.stderr)) if p is not None]
            for reader in self._readers:
                reader.start()
        for reader in self._readers:
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        for pipe in (self.stdout, self.stderr):
            if pipe is not None:
                pipe.close()
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return self._read.get(0), self._read.get(1)

    def send_signal(self, sig: int) -> None:
        """``sig`` to the rank unless it is known to have exited; one that exited before the
        server said so is skipped, as ``Popen.send_signal`` skips a process already gone."""
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])))

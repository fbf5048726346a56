"""A service process forked from one that has imported it already: ``python -m MODULE ARGS``
without the interpreter's start and the imports, which are most of a service's start (the
software switch, the controller and the host aggregator import gRPC, protobuf, numpy and inagg's
native core; a local deployment starts all three at once, beside the ranks that wait for it).

Only a process that runs no other thread may fork (the child would inherit locks held by threads
that do not exist in it), and only before it has made any gRPC object (gRPC's core does not
survive a fork): ``inagg.bmv2_env.emulation.services`` forks its deployment's services at its start.
``ForkedService`` answers as the ``subprocess.Popen`` of the same command would: ``stdout``
(text), ``poll``, ``wait``, ``terminate``, ``kill``.

A process that has threads or gRPC objects already starts its ranks from a fork server
instead (``rank_context``, ``ForkedRank``): multiprocessing's, one process that imported the
modules named and did nothing else, each rank a fork of it. ``ForkedCommand`` is ``python -m
MODULE ARGS`` forked so, answering as its ``subprocess.Popen``, in a session of its own and, for
a Mininet host, inside another process's network and mount namespaces (what Mininet's
``host.popen``, ``mnexec -da PID``, does); its stdout pipe and stderr reach the server's child
the way multiprocessing passes a child file descriptors (``multiprocessing.reduction.DupFd``).

A process has one fork server, started by its first ``ForkedRank`` (or ``start_fork_server``)
with the imports named by the last ``rank_context`` before it: a process that starts ranks of
two kinds this way gets one kind's imports for both (a rank still imports what it lacks, paying
for it as a spawned one would).
"""

from __future__ import annotations

import abc
import ctypes
import functools
import importlib
import multiprocessing
import multiprocessing.forkserver
import os
import runpy
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from multiprocessing import reduction
from multiprocessing.context import ForkServerContext, ForkServerProcess
from typing import Callable, NoReturn

_POLL_SECONDS = 0.01


def rank_context(*modules: str) -> ForkServerContext:
    """multiprocessing's fork server context, its server importing ``modules`` once when it
    starts (the first ``ForkedRank`` started): every rank forked from it starts from those
    imports, not from a fresh interpreter importing them again, and ends with ``os._exit``
    once its target has returned and multiprocessing has flushed its queues."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(modules))
    return context


def start_fork_server(*modules: str) -> None:
    """Start this process's fork server now, importing ``modules`` (``rank_context``), so that
    its imports overlap what this process does before its first ``ForkedRank`` (once running, it
    keeps the imports it started with)."""
    rank_context(*modules)
    multiprocessing.forkserver.ensure_running()


class ForkedRank(ForkServerProcess):
    """A process forked from the fork server (``rank_context``) with the environment and the
    working directory this process has when it creates it (the server has those of its own
    start), as a spawned process inherits them."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.environ, self.cwd = dict(os.environ), os.getcwd()

    def run(self) -> None:
        os.environ.clear()
        os.environ.update(self.environ)
        os.chdir(self.cwd)
        super().run()


def die_with_parent() -> None:
    """In a child: the kernel sends it SIGTERM when its parent dies (Linux), so a killed
    supervisor leaves no orphans."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _check_command(cmd: list[str]) -> None:
    if len(cmd) < 3 or cmd[1] != "-m":
        raise ValueError(f"a forked process runs `python -m MODULE ...`, not {cmd}")


class PopenSurface(abc.ABC):
    """What of ``subprocess.Popen`` a forked process answers (``args``, ``pid``, ``stdout``,
    ``returncode``, ``poll``, ``wait``, ``terminate``, ``kill``), so that whoever started it
    waits for it, reads it and stops it as a spawned one; a subclass knows how its exit is seen
    (``poll``)."""

    args: list[str]
    pid: int
    returncode: int | None = None

    @abc.abstractmethod
    def poll(self) -> int | None:
        """The exit status (negative: the signal that ended it), None while it runs."""

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(_POLL_SECONDS)
        return self.returncode

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, sig: int) -> None:
        """``sig`` to the process unless it is known to have exited; one that exited before its
        status reached this process (a fork server's child: the server reports it) is skipped,
        as ``Popen.send_signal`` skips a process already gone."""
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass


class ForkedService(PopenSurface):
    """``cmd`` (``[python, "-m", MODULE, *args]``) run in a fork of this process (module
    docstring), its stdout a pipe to this one, its stderr ``stderr_fd``, in directory ``cwd``
    with ``env`` added to the environment."""

    def __init__(self, cmd: list[str], stderr_fd: int, cwd: Path, env: dict | None = None,
                 with_parent: bool = False) -> None:
        _check_command(cmd)
        importlib.import_module(cmd[2])   # imported here once: the child finds it imported
        self.args = cmd
        sys.stdout.flush()   # what this process has buffered is not the child's to write
        sys.stderr.flush()
        read, write = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            os.close(read)
            _run(cmd[2], cmd[3:], write, stderr_fd, cwd, env or {}, die_with_parent if with_parent else None)
        os.close(write)
        self.stdout = os.fdopen(read, "r")

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


class ForkedCommand(PopenSurface):
    """``cmd`` (``[python, "-m", MODULE, *args]``) run in a process forked from the fork server
    (``rank_context``: whoever creates one has set the server's imports), in a session of its
    own and, with ``namespaces_of``, in that process's network and mount namespaces (a Mininet
    host's shell: ``enter_namespaces``); its stdout a pipe to this process (text), its stderr
    ``stderr_fd``, in directory ``cwd``, with this process's environment and ``env`` over it.
    Its exit status comes from the fork server (it is the server's child, not this process's)."""

    def __init__(self, cmd: list[str], stderr_fd: int, cwd: Path, env: dict | None = None,
                 namespaces_of: int | None = None) -> None:
        _check_command(cmd)
        self.args = cmd
        read, write = os.pipe()
        setup = functools.partial(_own_session, namespaces_of)
        self._process = ForkedRank(target=_run, args=(cmd[2], cmd[3:], ChildFd(write), ChildFd(stderr_fd),
                                                      cwd, env or {}, setup), name=f"python -m {cmd[2]}")
        try:
            self._process.start()   # the server's child holds its own copies of both ends now
        finally:
            os.close(write)
        self.pid = self._process.pid
        self.stdout = os.fdopen(read, "r")

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._process.exitcode
        return self.returncode


class ChildFd:
    """A file descriptor of this process that a process forked from the fork server gets as
    one of its own: pickled while the process starts, it travels beside the pickle
    (``reduction.DupFd``), and unpickles there as that process's descriptor (an int)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self):
        return _inherited, (reduction.DupFd(self.fd),)


def _inherited(dup) -> int:
    return dup.detach()


CLONE_NEWNS, CLONE_NEWNET = 0x00020000, 0x40000000   # <sched.h>


def enter_namespaces(pid: int) -> None:
    """Join process ``pid``'s network and mount namespaces, as ``mnexec -a PID`` does (a
    Mininet host's: its interfaces, and its /sys showing them). Needs root and a process of
    one thread (a mount namespace refuses a process with threads)."""
    libc = ctypes.CDLL(None, use_errno=True)
    for kind, flag in (("net", CLONE_NEWNET), ("mnt", CLONE_NEWNS)):
        path = f"/proc/{pid}/ns/{kind}"
        try:
            fd = os.open(path, os.O_RDONLY)
            try:
                if libc.setns(fd, flag) != 0:
                    raise OSError(ctypes.get_errno(), "setns")
            finally:
                os.close(fd)
        except OSError as e:
            raise OSError(e.errno, f"cannot enter process {pid}'s {kind} namespace ({e.filename or 'setns'}: "
                                   f"{os.strerror(e.errno)}): is that process still there, and this one root "
                                   "with one thread?") from None


def _own_session(namespaces_of: int | None) -> None:
    """In a child: a session of its own (so a terminal's Ctrl-C reaches only its launcher, as
    ``mnexec -d`` does), then ``namespaces_of``'s namespaces when given."""
    os.setsid()
    if namespaces_of is not None:
        enter_namespaces(namespaces_of)


def _run(module: str, args: list[str], stdout_fd: int, stderr_fd: int, cwd: Path, env: dict,
         setup: Callable[[], None] | None) -> NoReturn:
    """The child: ``python -m module args`` as its own process would run it, then exit with its
    status (``os._exit``: nothing of the parent's, its exit handlers included, runs here).
    ``setup`` runs first, once stderr is ``stderr_fd`` (its error is reported there). The
    module runs as ``__main__`` beside what was imported before the fork, its own import not
    among them (as under ``python -m``, where an import of it is a second module)."""
    code = 1
    try:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        devnull = os.open(os.devnull, os.O_RDONLY)
        for fd, target in ((devnull, 0), (stdout_fd, 1), (stderr_fd, 2)):
            os.dup2(fd, target)
        if setup is not None:
            setup()
        os.chdir(cwd)
        os.environ.update(env)
        sys.argv = [module, *args]
        sys.modules.pop(module, None)   # imported before the fork: runpy would warn that it was
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else int(e.code is not None)
    except BaseException:  # noqa: BLE001 - reported on its stderr, as an uncaught error would be
        traceback.print_exc()
    finally:
        exit_now(code)


def exit_now(code: int) -> NoReturn:
    """End this process with status ``code`` at once: what it buffered for stdout and stderr
    is written (unless their reader is gone), then ``os._exit``, skipping the interpreter's
    teardown and exit handlers. For a forked child, nothing of its parent's runs; for a rank
    that has reported and closed its groups, the teardown would only spend the machine's CPU
    collecting torch's modules while whoever started it waits for it to exit."""
    flush_std_streams()
    os._exit(code)


def flush_std_streams() -> None:
    """Write what this process buffered for stdout and stderr (unless their reader is gone)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):   # its reader is gone
            pass

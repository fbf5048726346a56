"""The processes a run depends on, watched while its jobs run, so that a death ends the run.

A rank that dies (a duplicate address, a crash, a kill) used to leave the others waiting on
gloo and the launcher waiting on them, forever; its error was only in its log. Now the
launcher's wait loop calls ``check_processes`` every 0.2 s: a rank that exited with a non-zero
code, or a service (a switch's data plane, the controller, the host aggregator) that exited at
all, raises ``RunFailed`` naming each such process, its exit code or signal and the last lines
of its log; the launcher prints that, tears the network down and exits non-zero. A rank that
exits 0 has finished its job: the others go on.
"""

from __future__ import annotations

import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

TAIL_LINES = 15


class RunFailed(Exception):
    """A process the run depends on died; the message names it and shows its log's end."""


@dataclass(frozen=True)
class Watched:
    """One process of the run: ``what`` names it in words ("job mlp rank 1 on h2"), ``log``
    is where its output goes; a ``service`` must not exit while jobs run, a rank must not
    exit with an error."""

    what: str
    proc: subprocess.Popen
    log: Path
    service: bool = False

    def failed(self) -> bool:
        code = self.proc.poll()
        return code is not None and (self.service or code != 0)


def exit_reason(code: int) -> str:
    """``code`` in words: a negative return code is the signal that killed the process."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def log_tail(path: Path, lines: int = TAIL_LINES) -> list[str]:
    """The last ``lines`` lines of ``path`` (read from its last 64 KiB), [] when absent."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 65536))
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    return text.splitlines()[-lines:]


def describe(dead: list[Watched]) -> str:
    """Each dead process by name, how it ended and the last lines of its log."""
    parts = []
    for w in dead:
        tail = log_tail(w.log)
        body = "".join(f"\n    {line}" for line in tail) if tail else "\n    (its log is empty)"
        parts.append(f"{w.what} {exit_reason(w.proc.returncode)}; last lines of {w.log}:{body}")
    return "\n".join(parts)


def check_processes(watched: list[Watched]) -> None:
    """RunFailed naming every watched process that failed (``Watched.failed``), if any."""
    dead = [w for w in watched if w.failed()]
    if dead:
        raise RunFailed(describe(dead))

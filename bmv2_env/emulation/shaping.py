"""Link rates with ``tc tbf``, set once or re-rated on a timer (a link's ``bw_schedule``).

tbf works on kernels without netem (this one), on both data planes: every link is a veth pair,
one end in a host's namespace (or a switch port in the root namespace), and each end's tbf
limits what leaves by it, so shaping both ends limits both directions. ``shape`` is the one
command that sets (or re-rates) an end: ``tc qdisc replace ... root handle 5: tbf``, which on
an end that already has tbf (Mininet's ``use_tbf`` puts it at handle 5:, netem below it where
the kernel has netem) changes its rate in place, keeping its queue and what hangs below it.
The benchmarks shape their links with it too (benchmarks/emulation_ranks.py).

A link's ``bw_schedule`` (``[[seconds, Mbit/s], ...]``, the first at 0) holds its first rate
from bring-up (Mininet's tbf, re-rated by ``shape``) and each later one from that many seconds
after the run's time zero (when the jobs without a ``start`` begin training): ``BandwidthSchedule``
re-rates both ends from a thread of its own, and records every change as tc reports it after
the command (``applied_rate``: the rate the qdisc now has, never the one asked), with its time.
The commands run by ``mnexec -a <pid>`` in a host's namespace, never through the node's shell,
which the mininet> prompt may be using meanwhile (``--cli during``).
"""

from __future__ import annotations

import re
import subprocess
import threading
import time

# A small token bucket: a large one lets an isolated call (an exploration on a link that sat idle)
# through at line rate. It must hold a whole frame (jumbo ones too) and a timer tick's worth of
# the rate (1 ms: tbf's hrtimer), or tbf cannot reach its rate.
TBF_BURST_BYTES = 16 << 10
TBF_LATENCY_MS = 100    # the queue tbf keeps, in time at its rate
_RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit)$")
_UNIT = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
_SHOWN = re.compile(r"\btbf\b.*?\brate (\d+(?:\.\d+)?)([KMG]?)bit", re.IGNORECASE)


def rate_bits(rate: str) -> float:
    """A tc rate (``100mbit``, ``1gbit``) in bits per second."""
    m = _RATE.match(rate.strip().lower())
    if not m:
        raise ValueError(f"rate {rate!r}: write it as tc does, e.g. 100mbit or 1gbit")
    return float(m.group(1)) * _UNIT[m.group(2)]


def tc(intf, *args: str) -> str:
    """``tc args`` for a Mininet interface, in its node's namespace; its output, or a
    RuntimeError with tc's message."""
    node = intf.node
    prefix = ["mnexec", "-a", str(node.pid)] if getattr(node, "inNamespace", False) else []
    proc = subprocess.run([*prefix, "tc", *args], capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"{node.name}: tc {' '.join(args)}: {(proc.stderr or proc.stdout).strip()}")
    return proc.stdout


def shape(intf, rate: str | None) -> None:
    """Limit ``intf``'s egress (one direction of its link) to ``rate`` with tc tbf (re-rated in
    place where it has one), or remove the limit (None)."""
    if rate is None:
        tc(intf, "qdisc", "del", "dev", intf.name, "root")
        return
    burst = max(TBF_BURST_BYTES, int(rate_bits(rate) / 8 / 1000))
    tc(intf, "qdisc", "replace", "dev", intf.name, "root", "handle", "5:", "tbf", "rate", rate,
       "burst", str(burst), "latency", f"{TBF_LATENCY_MS}ms")


def applied_rate(intf) -> float | None:
    """The rate of ``intf``'s tbf as tc shows it, in Mbit/s (None: no tbf there)."""
    m = _SHOWN.search(tc(intf, "qdisc", "show", "dev", intf.name))
    if not m:
        return None
    return float(m.group(1)) * {"": 1e-6, "K": 1e-3, "M": 1.0, "G": 1e3}[m.group(2).upper()]


def _shown_rate(intf) -> float | None:
    """``applied_rate``, or None where tc cannot show the end (its interface is gone)."""
    try:
        return applied_rate(intf)
    except RuntimeError:
        return None


class BandwidthSchedule:
    """Re-rates links on their ``bw_schedule`` (see the module's docstring); ``changes`` holds
    each change applied: {link, at (wall clock), mbit asked, mbit_applied per end, error: why tc
    refused it, or ''}."""

    def __init__(self, schedules: list[tuple[str, list, list]]) -> None:
        """``schedules``: (the link's name, its Mininet interfaces, its [[s, Mbit/s], ...])."""
        self.schedules = schedules
        self.changes: list[dict] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def apply(self, name: str, intfs: list, mbit: float) -> None:
        """Both ends of link ``name`` at ``mbit`` now; recorded as tc then shows them."""
        for intf in intfs:
            shape(intf, f"{mbit:g}mbit")
        self._record(name, intfs, mbit)

    def _record(self, name: str, intfs: list, mbit: float, error: str = "") -> None:
        """A change asked of link ``name``, with the rates tc shows on its ends now (and why
        tc refused it, where it did)."""
        change = {"link": name, "at": time.time(), "mbit": mbit,
                  "mbit_applied": [_shown_rate(intf) for intf in intfs], "error": error}
        with self._lock:
            self.changes.append(change)

    def bring_up(self) -> None:
        """Every scheduled link at its first rate (the entry at 0 s)."""
        for name, intfs, schedule in self.schedules:
            self.apply(name, intfs, schedule[0][1])

    def start(self, time_zero: float) -> None:
        """Apply the later entries at their times after ``time_zero``, from a thread."""
        steps = sorted(((time_zero + at, name, intfs, mbit)
                        for name, intfs, schedule in self.schedules for at, mbit in schedule[1:]),
                       key=lambda step: step[:2])
        self._thread = threading.Thread(target=self._run, args=(steps,), name="bw-schedule", daemon=True)
        self._thread.start()

    def _run(self, steps: list) -> None:
        for due, name, intfs, mbit in steps:
            if self._stop.wait(max(0.0, due - time.time())):
                return
            try:
                self.apply(name, intfs, mbit)
            except RuntimeError as e:   # tc refused: reported with what tc shows; later changes go on
                self._record(name, intfs, mbit, error=str(e))

    def stop(self) -> None:
        """No more changes (the run ends); waits for one under way."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def applied(self, time_zero: float | None) -> list[dict]:
        """The changes applied, each with ``at_s``: seconds after ``time_zero`` (negative: at
        bring-up, before it; None when the jobs never reached time zero)."""
        with self._lock:
            return [{"link": c["link"], "at_s": None if time_zero is None else round(c["at"] - time_zero, 3),
                     "mbit": c["mbit"], "mbit_applied": c["mbit_applied"], "error": c["error"]}
                    for c in self.changes]

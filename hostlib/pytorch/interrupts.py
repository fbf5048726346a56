"""Ctrl-C in a rank: a plain ``KeyboardInterrupt``, as on gloo, never a garbled one.

torch hands a Python future's value to C++ (DDP's reducer reads each bucket's result on the
main thread) through ``torch._jit_internal._extract_tensors``, Python code run inside C++: a
Ctrl-C that lands there comes out as ``RuntimeError: Cannot extract tensors from value:
KeyboardInterrupt``. The inagg backend's calls complete Python futures, so ``install`` puts a
SIGINT handler in front of Python's own (only where Python's own is the one installed): a
SIGINT that finds the main thread inside that extraction is delivered again a moment later,
once it is out; any other is Python's ``KeyboardInterrupt`` at once. ``interrupted`` says
whether one came (the group's exit says so in one line).
"""

from __future__ import annotations

import _thread
import signal
import threading

from torch._jit_internal import _extract_tensors

_REDELIVER_SECONDS = 0.01
_EXTRACTION = _extract_tensors.__code__
_state = {"interrupted": False}


def install() -> None:
    """Handle SIGINT here (module docstring); only from the main thread, and only in place of
    Python's default handler (a handler of the program's own stays)."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_sigint)


def interrupted() -> bool:
    """Whether a SIGINT reached this process since ``install``."""
    return _state["interrupted"]


def _on_sigint(signum: int, frame) -> None:
    _state["interrupted"] = True
    if _inside_extraction(frame):
        threading.Timer(_REDELIVER_SECONDS, _thread.interrupt_main, (signum,)).start()
        return
    signal.default_int_handler(signum, frame)


def _inside_extraction(frame) -> bool:
    """Whether ``frame`` runs in (or under) torch's tensor extraction."""
    while frame is not None:
        if frame.f_code is _EXTRACTION:
            return True
        frame = frame.f_back
    return False

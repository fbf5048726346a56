"""Keeps ``torch.compile``'s Dynamo out of the ``inagg`` backend's Python
(``inagg.hostlib.pytorch.backend``).

Why: torch calls a Python process group's collectives, and its Works' ``wait``/``get_future``, from
C++. Where that happens inside a compiled function, Dynamo's frame hook is still set, and it
tries to compile the backend's own frames: ``torch.compile(DDP(model))`` broadcasts DDP's
buckets from its first forward, and Dynamo stopped at the group's first attribute (a
``ProcessGroup`` is an opaque object to it). ``torch.compiler.disable``, torch's documented way to
keep a function and all it calls out of Dynamo (as torch does with FSDP2's hooks), marks each
method torch calls (``torch_calls``).

Design: ``torch.compiler.disable`` imports Dynamo, ~1 s of CPU that a job that never compiles
should not pay in ``init_process_group``; and nothing is compiled before Dynamo is imported
(``torch.compile`` imports it). So the methods are marked when Dynamo is first seen loaded: at
the next call of any of them (DDP loads it when constructed, and broadcasts the module's state
right after, uncompiled), or when a group is made with Dynamo loaded (``mark_if_dynamo_loaded``);
all of them at once. A first call since Dynamo loaded made from compiled code would run this
module's check under Dynamo's hook; the one case tried (a compiled function's ``dist.all_reduce``
on a fresh group, torch 2.13) runs, as it did before this module. Until then each call costs one
dict lookup; after, torch's wrapper: both far below an allreduce.
"""

from __future__ import annotations

import functools
import sys
import threading
from typing import Any, Callable, TypeVar

import torch

_DYNAMO = "torch._dynamo"
_Class = TypeVar("_Class", bound=type)

# every method ``torch_calls`` marks: (class, name, the method as written)
_methods: list[tuple[type, str, Callable[..., Any]]] = []
_disabled: dict[Callable[..., Any], Callable[..., Any]] = {}   # once marked: method -> its marked form
_lock = threading.Lock()


def torch_calls(*names: str) -> Callable[[_Class], _Class]:
    """Class decorator: the methods ``names`` of the class are ones torch calls (from C++ or its
    own Python), kept out of Dynamo once it is loaded (module docstring)."""
    def mark(cls: _Class) -> _Class:
        """Wrap each of ``names`` so its first call with Dynamo loaded marks every method."""
        for name in names:
            method = cls.__dict__[name]
            _methods.append((cls, name, method))
            setattr(cls, name, _until_dynamo_loaded(method))
        return cls
    return mark


def _until_dynamo_loaded(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method``, checking first whether Dynamo is loaded: if so, every method is marked
    (``_mark_all``) and this call goes through its marked form."""
    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        """``method``'s call (module docstring)."""
        if _DYNAMO in sys.modules:
            return _mark_all()[method](*args, **kwargs)
        return method(*args, **kwargs)
    return call


def mark_if_dynamo_loaded() -> None:
    """Mark every method now if Dynamo is loaded (a group made after a compile)."""
    if _DYNAMO in sys.modules:
        _mark_all()


def _mark_all() -> dict[Callable[..., Any], Callable[..., Any]]:
    """Replace every method ``torch_calls`` wrapped by its ``torch.compiler.disable`` form, once;
    each method as written -> its marked form."""
    with _lock:
        if not _disabled:
            _disabled.update((method, torch.compiler.disable(method)) for _, _, method in _methods)
            for cls, name, method in _methods:
                setattr(cls, name, _disabled[method])
    return _disabled

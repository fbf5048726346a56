"""``python -m`` commands, built from the started module itself, so that a moved module can
never leave a stale launch string behind.

Design: a process that starts another inagg module passes the module object
(``python_m(switch, ...)``), whose import is checked like any other by tests/test_layers.py and
whose name cannot go stale. Only a launch up the layers (hostlib's zero-setup deployment starts
``bmv2_env``'s services, which hostlib must not import) names its module by a string: one
module-level constant per such launch, declared in test_layers.py's ``LAUNCHES_UP`` and checked
there to name a real module.
"""

from __future__ import annotations

import sys
from types import ModuleType


def module_name(module: ModuleType | str) -> str:
    """The dotted name ``python -m`` takes for ``module``: its import name, also when it runs as
    ``__main__`` itself (``__spec__`` keeps the name it was started by; ``__name__`` does not)."""
    return module if isinstance(module, str) else module.__spec__.name


def python_m(module: ModuleType | str, *args: str) -> list[str]:
    """``[this interpreter, "-m", module, *args]``: the command that runs ``module`` in a new
    process with this process's Python (and so its virtual environment)."""
    return [sys.executable, "-m", module_name(module), *args]

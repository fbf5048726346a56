"""The compiled data path (``inagg.hostlib._native``), checked against the sources it was built from.

Why: in a checkout, ``make setup`` / ``pip install -e`` builds the extension from native/. After a
``git pull`` or a branch switch that changes native/ without a rebuild, the Python and the C++
disagree on calls and layouts, and a stale build was seen to hand back unchanged tensors with no
error. The build embeds a digest of native/*.cpp and *.hpp (cmake/source_digest.cmake); where
native/ sits beside the package (a checkout or an editable install) this module computes the same
digest and refuses a mismatch, naming the command that fixes it. An installed wheel has no
native/ beside it: its extension is the one built with it. Import ``_native`` from here.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from inagg.hostlib import _native

SOURCES = Path(__file__).resolve().parents[1] / "native"


def source_digest(folder: Path) -> str:
    """The digest cmake/source_digest.cmake writes: "name:sha256" lines of the *.cpp and *.hpp
    in name order, hashed."""
    files = sorted([*folder.glob("*.cpp"), *folder.glob("*.hpp")], key=lambda p: p.name)
    lines = "".join(f"{p.name}:{hashlib.sha256(p.read_bytes()).hexdigest()}\n" for p in files)
    return hashlib.sha256(lines.encode()).hexdigest()


def check_build(module, sources: Path = SOURCES) -> None:
    """Raise ImportError when ``sources`` exists and ``module`` was built from other sources."""
    if sources.is_dir() and source_digest(sources) != module.SOURCE_DIGEST:
        raise ImportError(f"{module.__file__} was built from other sources than {sources} holds now "
                          f"(a stale build): rebuild it with `make setup` (or `pip install -e .`)")


check_build(_native)

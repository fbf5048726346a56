"""The suite's shared setup: the checkout on ``sys.path`` (tests import each other's helpers), and
the files' order, longest first (``slow_first.txt``), so pytest-xdist's workers, which take whole
files in collection order (``make test``: ``--dist loadfile --no-loadscope-reorder``), start the
long files early and end on short ones: the run is as short as its busiest worker."""

import os
import sys
from pathlib import Path

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def slow_first() -> dict[str, int]:
    """``slow_first.txt``'s file names and their places in it (comments and blank lines left out)."""
    lines = (Path(__file__).with_name("slow_first.txt").read_text().splitlines())
    names = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    return {name: place for place, name in enumerate(names)}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files in ``slow_first.txt`` first, in its order, then the rest as collected; each
    file's tests keep their own order (a stable sort on the file alone)."""
    places = slow_first()
    items.sort(key=lambda item: places.get(item.path.name, len(places)))

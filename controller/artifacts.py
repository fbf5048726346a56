"""Where the compiled P4 programs (P4Info, BMv2 JSON, Tofino build) are found at run time.

Why a lookup: in a checkout, and in an editable install of one, they are the committed files in
p4/out/<target>/ beside the packages (`make build` regenerates them; tests/test_p4_program.py
checks they are current). An installed wheel has no checkout beside it, so the wheel carries p4/ as
``inagg/controller/p4`` (CMakeLists.txt installs it there; an editable install skips that copy and reads
p4/). Every default program path goes through ``artifact``, so the controller, the software
switch and the local deployment run the same way from either.
"""

from __future__ import annotations

from pathlib import Path

PACKAGED = Path(__file__).resolve().parent / "p4"       # an installed wheel's copy
CHECKOUT = Path(__file__).resolve().parents[1] / "p4"   # a checkout's (or an editable install's)
MARKER = "out/bmv2/inagg.p4info.txtpb"                  # in p4/ wherever p4/ is complete


def p4_dir() -> Path:
    """The folder holding the compiled programs: the wheel's copy, else the checkout's p4/."""
    for folder in (PACKAGED, CHECKOUT):
        if (folder / MARKER).is_file():
            return folder
    raise FileNotFoundError(
        f"inagg's compiled P4 programs are missing: neither {PACKAGED} (an installed wheel's copy) "
        f"nor {CHECKOUT} (a checkout's p4/) holds {MARKER}; reinstall inagg from a wheel or an "
        f"sdist (pip install 'inagg[control]'), or run from a checkout")


def artifact(name: str) -> Path:
    """The compiled program file ``name``, relative to p4/ (e.g. ``out/soft/inagg.p4info.txtpb``)."""
    return p4_dir() / name

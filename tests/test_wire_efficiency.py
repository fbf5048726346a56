"""The wire-efficiency table (benchmarks/wire_efficiency.py): inagg's K read from its programs,
the ring crossover checked by brute force, and docs/tofino.md carrying the table it prints."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import wire_efficiency as we  # noqa: E402

from inagg.controller.config import default_program  # noqa: E402


def test_inaggs_rows_are_its_programs_k_and_framing():
    rows = {(r["system"], r["target"]): r for r in we.rows()}
    assert rows["inagg", "BMv2"]["K"] == default_program("bmv2").p4info.values_per_packet
    tofino = rows["inagg", "Tofino 1"]
    assert tofino["K"] == default_program("tofino").p4info.values_per_packet == 64
    assert (tofino["frame_bytes"], tofino["wire_bytes"]) == (314, 338)   # 256 B of values in 338 on the wire
    assert tofino["beats_ring_mtu9000"] == 3
    assert rows["inagg", "soft switch / host aggregator, MTU 1500"]["frame_bytes"] <= 1514


@pytest.mark.parametrize("fmt", we.formats(), ids=lambda f: f"{f.system}-{f.values}")
@pytest.mark.parametrize("mtu", [1500, 9000])
def test_the_crossover_is_the_first_n_where_ina_takes_less_wire_time(fmt, mtu):
    g_ring = we.ring_goodput(mtu)
    faster = [n for n in range(2, 2000) if 1 / fmt.goodput < 2 * (n - 1) / n / g_ring]
    assert we.ina_beats_ring_from(fmt.goodput, g_ring) == (faster[0] if faster else None)


def test_docs_carry_the_table_the_script_prints():
    assert we.markdown(we.rows()) in (ROOT / "docs" / "tofino.md").read_text(), \
        "run `python benchmarks/wire_efficiency.py` and update docs/tofino.md's wire table"

"""The P4 program, its committed artifacts, and the names the Python side relies on."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from inagg.bmv2_env.softswitch import pipeline_reference as pipeline
from inagg.controller.config import default_program
from inagg.controller.p4info import P4Type
from inagg.hostlib.wire.protocol import SWITCH_VALUES_PER_PACKET

ROOT = Path(__file__).resolve().parents[1]
BMV2 = default_program("bmv2")
BMV2_JSON_PATH, P4INFO_PATH = BMV2.files["bmv2_json"], BMV2.p4info_path


@pytest.mark.skipif(shutil.which("p4c-bm2-ss") is None, reason="p4c-bm2-ss not on PATH")
def test_committed_artifacts_are_current(tmp_path):
    subprocess.run(["p4c-bm2-ss", "--arch", "v1model", "--p4runtime-files", str(tmp_path / "x.p4info.txtpb"),
                    "-o", str(tmp_path / "x.json"), "p4/inagg.p4"], cwd=ROOT, check=True)
    assert (tmp_path / "x.json").read_bytes() == BMV2_JSON_PATH.read_bytes(), "run `make build` and commit"
    assert (tmp_path / "x.p4info.txtpb").read_bytes() == P4INFO_PATH.read_bytes(), "run `make build` and commit"


INCLUDE = ROOT / "p4" / "include"
# size.p4's overridable sizes (#ifndef X / #define X default / #endif)
SIZES = {m.group(1): int(m.group(2)) for m in re.finditer(
    r"#ifndef (\w+)\n#define \1 (\d+)\n#endif", (INCLUDE / "size.p4").read_text())}


def test_value_loop_is_unrolled_k_times():
    """FOR_EACH_VALUE unrolls K times, for any K size.p4 allows: INAGG_UNROLL_n is
    INAGG_UNROLL_(n-1) and M(n-1), up to INAGG_UNROLL_MAX."""
    assert SIZES["SWITCH_VALUES_PER_PACKET"] == SWITCH_VALUES_PER_PACKET
    assert "#define FOR_EACH_VALUE(M) INAGG_UNROLL(SWITCH_VALUES_PER_PACKET, M)" in (INCLUDE / "size.p4").read_text()
    text = (INCLUDE / "unroll.p4").read_text()
    steps = {int(n): body.strip() for n, body in re.findall(r"#define INAGG_UNROLL_(\d+)\(M\)(.*)", text)}
    top = int(re.search(r"#define INAGG_UNROLL_MAX (\d+)", text).group(1))
    assert steps == {1: "M(0)", **{n: f"INAGG_UNROLL_{n - 1}(M) M({n - 1})" for n in range(2, top + 1)}}


def test_every_size_is_in_size_p4_and_overridable():
    """No control has a literal size: tables, registers and counters take size.p4's macros
    (const tables are sized by their entries)."""
    assert set(SIZES) == {"INAGG_SLOTS", "INAGG_MAX_JOBS", "SWITCH_VALUES_PER_PACKET",
                          "INAGG_WORKER_TABLE_SIZE", "INAGG_REPLICA_TABLE_SIZE", "INAGG_L2_TABLE_SIZE",
                          "INAGG_HOST_PORT_TABLE_SIZE", "INAGG_ATP_POOLS",
                          "INAGG_CONGESTION_QDEPTH"}
    for path in [ROOT / "p4" / "inagg.p4", *INCLUDE.glob("*.p4")]:
        text = path.read_text()
        for table in re.finditer(r"\btable (\w+) \{(.*?)\n    \}", text, re.S):
            if "const entries" not in table.group(2):
                assert not re.search(r"size = \d", table.group(2)), f"{path.name}: {table.group(1)}"
        assert not re.search(r"\b(register|counter)\b.*?\(\d+\s*[,)]", text), path.name
        assert not re.search(r"@\w+\(\d", text), path.name   # annotations too (K)
        if path.name != "size.p4":
            assert not re.search(r"#define (INAGG_|SWITCH_)", text) or path.name == "unroll.p4", path.name


@pytest.mark.skipif(shutil.which("p4c-bm2-ss") is None, reason="p4c-bm2-ss not on PATH")
def test_sizes_are_set_at_build_time(tmp_path):
    """-D overrides every size; the P4Info, which the controller reads them from, follows."""
    sizes = {"INAGG_SLOTS": 512, "INAGG_MAX_JOBS": 16, "SWITCH_VALUES_PER_PACKET": 32,
             "INAGG_WORKER_TABLE_SIZE": 256, "INAGG_REPLICA_TABLE_SIZE": 128, "INAGG_L2_TABLE_SIZE": 64,
             "INAGG_CONGESTION_QDEPTH": 8, "INAGG_HOST_PORT_TABLE_SIZE": 32, "INAGG_ATP_POOLS": 1}
    assert set(sizes) == set(SIZES)
    subprocess.run(["p4c-bm2-ss", "--arch", "v1model", *(f"-D{k}={v}" for k, v in sizes.items()),
                    "--p4runtime-files", str(tmp_path / "x.p4info.txtpb"), "-o", str(tmp_path / "x.json"),
                    "p4/inagg.p4"], cwd=ROOT, check=True, capture_output=True)
    from inagg.controller.p4info import P4Info
    info = P4Info.load(tmp_path / "x.p4info.txtpb")
    assert info.values_per_packet == 32
    assert info.slot_pool == 512
    assert info.register_size("values") == 2 * 512 * 32
    assert info.obj(P4Type.table, pipeline.JOB_TABLE).size == 16
    assert info.obj(P4Type.counter, pipeline.JOB_PACKETS).size == 16
    assert info.obj(P4Type.table, pipeline.WORKER_TABLE).size == 256
    assert info.obj(P4Type.table, pipeline.REPLICA_TABLE).size == 128
    assert info.obj(P4Type.table, pipeline.L2_TABLE).size == 64
    assert info.obj(P4Type.table, pipeline.GUARD_TABLE).size == 32
    out = subprocess.run(["p4c-bm2-ss", "--arch", "v1model", "-DSWITCH_VALUES_PER_PACKET=65",
                          "-o", str(tmp_path / "y.json"), "p4/inagg.p4"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode != 0 and "SWITCH_VALUES_PER_PACKET must be" in out.stderr


def test_one_control_per_file_with_include_guards():
    """Each include file holds one control (parser.p4: the parser and its deparser; checksum.p4:
    v1model's verify and compute pair), or none (types, sizes); the top file only wires them."""
    top = (ROOT / "p4" / "inagg.p4").read_text()
    assert not re.search(r"\b(table|register|counter|action)\b", top)
    for path in INCLUDE.glob("*.p4"):
        text = path.read_text()
        guard = re.search(r"#ifndef (_INAGG_\w+_P4_)\n#define \1\n", text)
        assert guard and text.rstrip().endswith(f"#endif /* {guard.group(1)} */"), f"{path.name} has no include guard"
        controls = re.findall(r"^control (\w+)", text, re.M)
        parsers = re.findall(r"^parser (\w+)", text, re.M)
        if parsers:
            assert [c.replace("Deparser", "Parser") for c in controls] == parsers, path.name
        elif path.name == "checksum.p4":
            assert controls == ["InaggVerifyChecksum", "InaggComputeChecksum"]
        else:
            assert len(controls) <= 1, f"{path.name}: {controls}"
        if controls:
            assert f'#include "include/{path.name}"' in top, path.name


def test_p4info_has_what_the_python_side_uses():
    info = BMV2.p4info
    assert info.program_name == "inagg"
    assert info.values_per_packet == SWITCH_VALUES_PER_PACKET   # K as the controller reads it
    assert info.encapsulations == ("udp", "roce")
    for table in (pipeline.JOB_TABLE, pipeline.WORKER_TABLE, pipeline.L2_TABLE, pipeline.REPLICA_TABLE):
        info.obj(P4Type.table, table)
    for counter in (pipeline.JOB_PACKETS, pipeline.JOB_AGGREGATED, pipeline.JOB_DUPLICATES,
                    pipeline.JOB_RESULTS, pipeline.JOB_DROPS, pipeline.GLOBAL_DROPS):
        info.obj(P4Type.counter, counter)
    n_slots = info.slot_pool
    assert info.register_size("values") == 2 * n_slots * SWITCH_VALUES_PER_PACKET
    admit = {p.name: p.bitwidth for p in info.obj(P4Type.action, "admit").params}
    assert admit == {"job_index": 8, "slot_base": 16, "slot_count": 16, "n_workers": 8, "epoch": 16,
                     "mcast_grp": 16, "encap": 2}
    roce = {p.name: p.bitwidth for p in info.obj(P4Type.action, "set_roce_worker_address").params}
    assert roce == {"mac": 48, "addr": 32, "qp": 24, "rkey": 32}


def test_bmv2_json_is_the_v1model_program():
    import json
    program = json.loads(BMV2_JSON_PATH.read_text())
    assert program["program"].endswith("inagg.p4")
    assert {p["name"] for p in program["pipelines"]} == {"ingress", "egress"}


@pytest.mark.skipif(shutil.which("p4c-bm2-ss") is None or shutil.which("make") is None,
                    reason="p4c-bm2-ss or make not on PATH")
def test_make_build_with_defines_builds_a_folder_of_its_own():
    """``make build P4_DEFINES=...`` compiles for BMv2 into build/p4/bmv2-<defines>/ with its
    flags kept in ``defines`` (the run target's rebuild reuses them), and leaves the committed
    outputs as they are; anything but -D flags is refused before p4c runs."""
    from inagg.controller.p4info import P4Info

    out = ROOT / "build" / "p4" / "bmv2-INAGG_SLOTS=64-INAGG_MAX_JOBS=8"
    committed = {p: p.read_bytes() for p in (BMV2_JSON_PATH, P4INFO_PATH)}
    shutil.rmtree(out, ignore_errors=True)
    try:
        made = subprocess.run(["make", "build", "P4_DEFINES=-DINAGG_SLOTS=64 -DINAGG_MAX_JOBS=8"], cwd=ROOT,
                              capture_output=True, text=True)
        assert made.returncode == 0, made.stdout + made.stderr
        assert f"make run DATAPLANE=bmv2 P4_BUILD=build/p4/{out.name}" in made.stdout
        assert (out / "defines").read_text() == "-DINAGG_SLOTS=64 -DINAGG_MAX_JOBS=8\n"
        info = P4Info.load(out / "inagg.p4info.txtpb")
        assert info.slot_pool == 64 and info.obj(P4Type.table, pipeline.JOB_TABLE).size == 8
        assert (out / "inagg.json").stat().st_size > 0
        assert {p: p.read_bytes() for p in committed} == committed
        bad = subprocess.run(["make", "build", "P4_DEFINES=INAGG_SLOTS=64"], cwd=ROOT, capture_output=True, text=True)
        assert bad.returncode != 0 and "P4_DEFINES takes -D flags" in bad.stderr, bad.stderr
        assert not (ROOT / "build" / "p4" / "bmv2-INAGG_SLOTS=64").exists()
    finally:
        shutil.rmtree(out, ignore_errors=True)

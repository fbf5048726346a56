"""The Tofino (TNA) program: one wire protocol with the BMv2 program, what the controller reads
from its P4Info, the committed artifacts and resource budget, and a job through a Tofino-shaped
software switch (the device config: test_tofino_device_config.py)."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from inagg.bmv2_env.emulation.loopback import LoopbackDeployment
from inagg.bmv2_env.softswitch.tna_compiled import LAYOUTS
from inagg.controller.config import default_program, parse_config
from inagg.controller.p4info import P4Type
from inagg.controller.program import read_artifact
from inagg.controller.switch import DERIVED_ADMIT_PARAMS, JobCounters, SwitchConnection
from inagg.hostlib.wire import protocol
from inagg.hostlib.worker.communicator import ReduceOp
from tools import built_from, tofino_parser
from test_training import make_comms

ROOT = Path(__file__).resolve().parents[1]
TOFINO_DIR = ROOT / "p4" / "tofino"
SOURCES = sorted(TOFINO_DIR.glob("*.p4"))


def test_the_wire_protocol_is_the_shared_one():
    """Headers and constants come from p4/include/ only: no TNA file redefines them."""
    assert '#include "../include/headers.p4"' in (TOFINO_DIR / "types.p4").read_text()
    shared = set(protocol.P4_CONSTANTS) | {"inagg_h", "inagg_value_h", "ethernet_h", "ipv4_h", "udp_h"}
    for path in SOURCES:
        text = path.read_text()
        defined = set(re.findall(r"\bconst\s+\S+\s+(\w+)\s*=", text)) | set(re.findall(r"\bheader\s+(\w+)", text))
        assert not defined & shared, f"{path.name} redefines {sorted(defined & shared)}"


def test_one_control_per_file_with_include_guards():
    for path in SOURCES:
        text = path.read_text()
        if path.name == "inagg.p4":   # the top file only wires the controls
            assert not re.search(r"\b(table|Register|Counter)\b", text)
            continue
        guard = re.search(r"#ifndef (_INAGG_TOFINO_\w+_P4_)\n#define \1", text)
        assert guard, f"{path.name} has no include guard"
        controls = re.findall(r"^control (\w+)", text, re.M)
        parsers = re.findall(r"^parser (\w+)", text, re.M)
        if parsers:    # parser.p4: the parsers and, beside them, their deparsers only
            assert {c.replace("Deparser", "Parser") for c in controls} == set(parsers), path.name
        else:
            assert len(controls) <= 1, f"{path.name}: {controls}"


CHIPS = ("tofino", "tofino2")
PROGRAMS = {chip: default_program(chip) for chip in CHIPS}
# size.p4's overridable sizes (#ifndef X / #define X default / #endif)
SIZES = {m.group(1): int(m.group(2)) for m in re.finditer(
    r"#ifndef (\w+)\n#define \1 (\d+)\n#endif", (TOFINO_DIR / "size.p4").read_text())}


def test_every_size_is_in_size_p4_and_overridable():
    """No control has a literal size: tables, registers and counters take size.p4's macros
    (const tables, and keyless ones, are sized by their entries)."""
    assert set(SIZES) == {"TOFINO_SLOT_BITS", "TOFINO_MAX_JOBS", "TOFINO_DROP_ROW_BITS",
                          "TOFINO_VALUES_PER_PACKET", "TOFINO_WORKER_TABLE_SIZE",
                          "TOFINO_REPLICA_TABLE_SIZE", "TOFINO_L2_TABLE_SIZE",
                          "TOFINO_HOST_PORT_TABLE_SIZE", "TOFINO_RECIRC_SPREAD_BITS"}
    for path in SOURCES:
        text = path.read_text()
        for table in re.finditer(r"\btable (\w+) \{(.*?)\n    \}", text, re.S):
            body = table.group(2)
            if "const entries" not in body and "key" in body:
                assert not re.search(r"size = \d", body), f"{path.name}: {table.group(1)}"
        assert not re.search(r"\b(Register|Counter)\b.*?\(\d+\s*[,)]", text), path.name
        # placement is no size, nor are the recirculation ports the controller reads
        assert not re.search(r"@(?!stage\(|placement_priority\(|inagg_recirculation_ports\()\w+\(\d", text), path.name
        if path.name != "size.p4":
            assert not re.search(r"#define TOFINO_", text), path.name


@pytest.mark.parametrize("chip", CHIPS)
def test_p4info_has_what_the_controller_uses(chip):
    """The same tables, keys and action parameters as the BMv2 program, K and the counter
    layout the controller reads, UDP only (docs/tofino.md: RoCE needs an ICRC Tofino cannot
    compute), on both chips (K = 64 each)."""
    info, bmv2 = PROGRAMS[chip].p4info, default_program("bmv2").p4info
    assert info.message.pkg_info.arch == {"tofino": "tna", "tofino2": "t2na"}[chip]
    assert info.program_name == bmv2.program_name == "inagg"
    for table in ("job_table", "worker_table", "l2_table", "replica_table"):
        ours, theirs = info.obj(P4Type.table, table), bmv2.obj(P4Type.table, table)
        assert [(m.name, m.bitwidth) for m in ours.match_fields] == [(m.name, m.bitwidth) for m in theirs.match_fields]
    for action in ("admit", "bind_worker", "set_worker_address", "forward", "flood"):
        ours, theirs = info.obj(P4Type.action, action), bmv2.obj(P4Type.action, action)
        shared = [(p.name, p.bitwidth) for p in ours.params if p.name not in DERIVED_ADMIT_PARAMS]
        assert shared == [(p.name, p.bitwidth) for p in theirs.params]
    derived = {p.name for p in info.obj(P4Type.action, "admit").params} - \
        {p.name for p in bmv2.obj(P4Type.action, "admit").params}
    assert derived == {"slot_end"} <= set(DERIVED_ADMIT_PARAMS)   # the controller fills it in
    for counter in ("job_packets", "job_aggregated", "job_duplicates", "job_results", "global_drops"):
        assert info.obj(P4Type.counter, counter).size == bmv2.obj(P4Type.counter, counter).size
    row = info.drop_row_length
    assert row >= len(protocol.DROP_REASONS) and row & (row - 1) == 0
    assert info.values_per_packet == SIZES["TOFINO_VALUES_PER_PACKET"]
    assert "#define TOFINO_PAIRS INAGG_HALF(TOFINO_VALUES_PER_PACKET)" in (TOFINO_DIR / "size.p4").read_text()
    assert info.encapsulations == ("udp",)
    assert info.slot_pool == 8192


def test_config_names_targets_artifacts_and_device_ports(tmp_path):
    base = {"host_aggregator": "10.0.0.100:42666"}
    sw = {"grpc": "127.0.0.1:9559", "aggregator": "10.0.0.254:42602", "target": "tofino",
          "hosts": {"10.0.0.1": {"port": 1, "mac": "00:00:00:00:00:01"}}}
    cfg = parse_config({**base, "switches": [{**sw, "device_ports": {"1": 132}}]})
    assert cfg.switches[0].program.target == "tofino" and cfg.switches[0].device_port(1) == 132
    with pytest.raises(ValueError, match=r"no device port for front-panel port\(s\) \[1\]"):
        parse_config({**base, "switches": [{**sw, "device_ports": {"2": 132}}]})
    with pytest.raises(ValueError, match="target must be one of bmv2, soft, tofino, tofino2, got 'tofino3'"):
        parse_config({**base, "switches": [{**sw, "target": "tofino3"}]})
    with pytest.raises(ValueError, match=r"\['bmv2_json'\] do not belong to a tofino program"):
        parse_config({**base, "switches": [{**sw, "bmv2_json": "p4/out/bmv2/inagg.json"}]})
    with pytest.raises(ValueError, match="no file"):
        parse_config({**base, "switches": [{**sw, "binary": "missing.bin"}]}, tmp_path)


@pytest.mark.parametrize("chip", CHIPS)
def test_controller_deploys_to_a_tofino_shaped_switch_and_a_job_is_exact(chip):
    """The chip's P4Info, packed device config, device ports and grants with its K, end to
    end through the software data plane: int32 sums exact, float sums as with the host."""
    k = PROGRAMS[chip].p4info.values_per_packet
    with LoopbackDeployment(3, target=chip) as dep:
        comms = make_comms(dep, 3)
        try:
            assert all(c.grant.mode == "switch" and c.grant.values_per_packet == k for c in comms)
            futures = []
            for r, c in enumerate(comms):
                ints = torch.arange(5 * k + 3, dtype=torch.int32) * (r + 1) - 7 * r
                futures.append(("int", c.allreduce_async(ints)))
                futures.append(("float", c.allreduce_async(torch.full((1000,), r + 0.5), ReduceOp.SUM)))
            for kind, f in futures:
                out = f.wait()
                if kind == "int":
                    base = torch.arange(5 * k + 3, dtype=torch.int32)
                    assert torch.equal(out, base * 6 - 21)
                else:
                    assert torch.allclose(out, torch.full_like(out, 4.5), rtol=1e-6)
            sw = SwitchConnection(parse_config(json.loads((dep.dir / "controller.json").read_text()),
                                               dep.dir).switches[0].grpc, election_id=(0, 0), program=PROGRAMS[chip])
            try:
                assert sw.installed_program() == "inagg"          # the Tofino P4Info is installed
                job = JobCounters(sw).job(0)
                assert job["results"] > 0 and job["aggregated"] >= 3 * job["results"] and not job["drops"]
            finally:
                sw.close()
        finally:
            for c in comms:
                c.close()


# What the program may use (docs/tofino.md), per chip: a change that grows past one of these
# must say so here and in the docs. Stages: Tofino 1's 12 (all of them); Tofino 2 has 20 and the
# program takes 12, the 8 others left for aggregation trees (docs/tofino.md). The rest leave room
# for the next feature. Stateful ALUs 40 of 48: 32 lane pairs (K = 64) and 7 for the slot logic
# (round_tag, the round identity check, included: docs/tofino.md). SRAM and map RAM: each
# pair's register is 16384 64-bit words (8 blocks and their map RAM). TCAM 28: the checks
# (twice, one table per contributor map: slot_claim.p4), round_action, tag_action and the
# decision (keyed on the round tag's distance too).
BUDGET = {"stages_used": 12, "stateful_alus": 40, "stats_alus": 10, "sram_blocks": 420,
          "map_ram_blocks": 360, "tcam_blocks": 28, "hash_bits": 800, "logical_tables": 80,
          "gateways": 40}
# Tofino 2: the same, but bf-p4c's Tofino 2 placement of the same program takes 52 gateways
# (about 20 on Tofino 1), of 20 x 16
BUDGETS = {"tofino": BUDGET, "tofino2": {**BUDGET, "gateways": 60}}
# PHV: Tofino 1 has 224 normal containers (the 64 values take 2048 of their 4096 bits)
PHV_BUDGET = {"tofino": 192, "tofino2": 192}


def resources(chip: str) -> dict:
    return json.loads((ROOT / "p4" / "out" / chip / "resources.json").read_text())


@pytest.mark.parametrize("chip", CHIPS)
def test_resources_within_budget(chip):
    used, budget = resources(chip), BUDGETS[chip]
    assert used["target"] == chip
    assert used["stages_used"] <= budget["stages_used"] <= used["stages_available"]
    for key, limit in budget.items():
        if key != "stages_used":
            assert used[key]["used"] <= limit, f"{chip} {key}: {used[key]['used']} > budget {limit}"
    assert used["stateful_alus"]["used"] >= PROGRAMS[chip].p4info.values_per_packet // 2   # one per pair
    assert used["phv_containers"]["normal"] <= PHV_BUDGET[chip]



# an assembly in this bf-p4c's form (Tofino 1's parse_inagg and its split): epoch in two byte
# slices on the split's rows, offset in two on parse_inagg's, and in the second row only one
# of offset's slices
_SLICED_BFA = """\
phv ingress:
  hdr.inagg.exp: B8
  hdr.inagg.epoch.0-7: B32
  hdr.inagg.epoch.8-15: B33
  hdr.inagg.offset.0-15: H14
  hdr.inagg.offset.16-31: H15
parser ingress:
  start: parse_inagg
  hdr_len_adj: 16
  states:
    parse_inagg:
      *:
        5: B8  # ingress::hdr.inagg.exp
        12..13: H15  # ingress::hdr.inagg.offset[31:16].16-31
        14..15: H14  # ingress::hdr.inagg.offset[15:0].0-15
        shift: 6
        next: parse_inagg.$split_0
      *:
        5: B8  # ingress::hdr.inagg.exp
        12..13: H15  # ingress::hdr.inagg.offset[31:16].16-31
        shift: 6
        next: end
    parse_inagg.$split_0:
      *:
        0: B33  # ingress::hdr.inagg.epoch[15:8].8-15
        1: B32  # ingress::hdr.inagg.epoch[7:0].0-7
        B34: 16
            # - value 1 -> B34 bit[4]: ingress::hdr.inagg.$valid
        shift: 10
        next: end
deparser ingress:
"""


def test_the_parser_tool_records_a_field_extracted_in_slices_whole():
    """A field bf-p4c extracts in slices (its ``phv`` section names them) is a whole field of
    the row that takes all of them, at its most significant slice's first bit; a row taking
    only some of them records nothing of it; slices that disagree on where the field starts
    are an error."""
    states = tofino_parser.parsers(_SLICED_BFA)["ingress"]["states"]
    assert [r["fields"] for r in states["parse_inagg"]] == [
        {"hdr.inagg.exp": 40, "hdr.inagg.offset": 96}, {"hdr.inagg.exp": 40}]
    (split,) = states["parse_inagg.$split_0"]
    assert (split["fields"], split["valid"]) == ({"hdr.inagg.epoch": 0}, ["inagg"])
    moved = _SLICED_BFA.replace("1: B32  # ingress::hdr.inagg.epoch[7:0]", "2: B32  # ingress::hdr.inagg.epoch[7:0]")
    with pytest.raises(ValueError, match="hdr.inagg.epoch"):
        tofino_parser.parsers(moved)


# Tofino 2's start in this bf-p4c's form: the bridged header read on every row of its split,
# dropped again on the first pass's row
_CLEARED_BFA = """\
parser ingress:
  start: $entry_point.start
  hdr_len_adj: 32
  states:
    $entry_point.start:
      *:
        B1: 1  # value 1 -> B1 bit[0]: ingress::hdr.bridged.$valid
        shift: 32
        next: $entry_point.start.$split_0
    $entry_point.start.$split_0:
      *:
        2: B2  # ingress::hdr.bridged.replica
        next: parse_harvest
      *:
        2: B2  # ingress::hdr.bridged.replica
        B1: 0  # value 0 -> B1 bit[0]: ingress::hdr.bridged.$valid
        next: parse_ethernet
deparser ingress:
"""


def test_the_parser_tool_records_a_validity_bit_a_row_clears():
    """``value 0 -> ... $valid`` clears the header's validity (``invalid``); ``value 1`` sets it."""
    states = tofino_parser.parsers(_CLEARED_BFA)["ingress"]["states"]
    (start,) = states["$entry_point.start"]
    assert (start["valid"], start["invalid"]) == (["bridged"], [])
    second, first = states["$entry_point.start.$split_0"]
    assert (second["valid"], second["invalid"]) == ([], [])
    assert (first["fields"], first["valid"], first["invalid"]) == ({"hdr.bridged.replica": 16}, [], ["bridged"])


@pytest.mark.parametrize("chip", CHIPS)
def test_the_committed_parsers_extract_every_field_of_the_headers_they_make_valid(chip):
    """What bf-p4c extracts in slices (Tofino 2's ingress epoch, its egress IPv4 addresses, the
    Ethernet addresses on both chips) is in parser.json: each field of each header a gress makes
    valid is extracted by some row of that gress."""
    program = json.loads((PROGRAMS[chip].p4info_path.parent / "parser.json").read_text())
    for gress, parser in program.items():
        rows = [r for rs in parser["states"].values() for r in rs]
        taken = {f for r in rows for f in r["fields"]}
        valid = {h for r in rows for h in r["valid"] if h in LAYOUTS}
        assert {f"hdr.{h}.{f}" for h in valid for f, _ in LAYOUTS[h]} <= taken, gress

# bf-p4c's arguments per chip, as `make tofino` passes them (with CLOTs this bf-p4c fails on
# Tofino 2's value stacks: docs/tofino.md)
BF_P4C = {"tofino": ["--target", "tofino", "--arch", "tna"],
          "tofino2": ["--target", "tofino2", "--arch", "t2na", "-Xp4c=--no-clot"]}


def bf_p4c(chip: str, out: Path, *extra: str) -> None:
    """Compile p4/tofino/ for ``chip`` into ``out`` (P4Info: out/inagg.p4info.txtpb)."""
    subprocess.run(["bf-p4c", *BF_P4C[chip], "--p4runtime-force-std-externs", *extra,
                    "--p4runtime-files", str(out / "inagg.p4info.txtpb"), "-o", str(out),
                    "p4/tofino/inagg.p4"], cwd=ROOT, check=True, capture_output=True)


def test_the_make_target_passes_the_same_arguments():
    make = (ROOT / "Makefile").read_text()
    assert "arch=$$( [ $$t = tofino2 ] && echo t2na || echo tna )" in make
    assert "extra=$$( [ $$t = tofino2 ] && echo -Xp4c=--no-clot )" in make
    assert "--target $$t --arch $$arch $$extra --p4runtime-force-std-externs" in make


# bf-p4c takes minutes per chip; on a loaded 2-core machine longer than pytest's default limit
@pytest.mark.timeout(1800)
@pytest.mark.skipif(shutil.which("bf-p4c") is None, reason="bf-p4c not on PATH (../shared/toolchains/install tofino)")
def test_sizes_are_set_at_build_time(tmp_path):
    """-D overrides every size; the P4Info, which the controller reads them from, follows."""
    sizes = {"TOFINO_SLOT_BITS": 12, "TOFINO_MAX_JOBS": 32, "TOFINO_DROP_ROW_BITS": 4,
             "TOFINO_VALUES_PER_PACKET": 8, "TOFINO_WORKER_TABLE_SIZE": 1024,
             "TOFINO_REPLICA_TABLE_SIZE": 512, "TOFINO_L2_TABLE_SIZE": 256,
             "TOFINO_HOST_PORT_TABLE_SIZE": 64,   # SourceGuard's rows
             "TOFINO_RECIRC_SPREAD_BITS": 2}      # RecircSpread's rows per pipe: 4
    assert set(sizes) == set(SIZES)
    bf_p4c("tofino", tmp_path, *(f"-D{k}={v}" for k, v in sizes.items()))
    from inagg.controller.p4info import P4Info
    info = P4Info.load(tmp_path / "inagg.p4info.txtpb")
    assert info.values_per_packet == 8
    assert info.slot_pool == 1 << 12
    assert info.obj(P4Type.table, "job_table").size == 32
    assert info.obj(P4Type.counter, "job_packets").size == 32
    assert info.drop_row_length == 1 << 4
    assert info.obj(P4Type.table, "worker_table").size == 1024
    assert info.obj(P4Type.table, "replica_table").size == 512
    assert info.obj(P4Type.table, "l2_table").size == 256
    assert info.obj(P4Type.table, "host_port_table").size == 64
    spread = info.obj(P4Type.table, "recirc_spread")
    assert spread.size == 4 << 2 and [m.bitwidth for m in spread.match_fields] == [2, 2]


@pytest.mark.parametrize("chip", CHIPS)
def test_committed_artifacts_are_what_their_build_recorded(chip):
    """``make tofino`` records what it built from (tools/built_from.py): the P4 sources are
    still those, every output is the file it wrote, with the flags the tests compile with."""
    folder = PROGRAMS[chip].p4info_path.parent
    record = json.loads((folder / built_from.STAMP).read_text())
    assert record["sources"] == list(built_from.TOFINO_SOURCES)
    assert built_from.sources_hash(record["sources"]) == record["sources_sha256"], \
        f"p4/ changed since {folder.relative_to(ROOT)} was built: run `make tofino TOFINO_TARGETS={chip}` and commit"
    assert built_from.outputs_hash(folder) == record["outputs_sha256"], \
        f"{folder.relative_to(ROOT)} is not what `make tofino` wrote: run it and commit"
    assert record["flags"].split() == [*BF_P4C[chip], "--p4runtime-force-std-externs"]


def _recompile_reason(chip: str) -> str:
    """Why the committed outputs must be recompiled to be checked ('' when their record
    vouches for them: the same compiler, so the same outputs)."""
    if os.environ.get("INAGG_RECOMPILE_P4") == "1":
        return "INAGG_RECOMPILE_P4=1"
    record = json.loads((PROGRAMS[chip].p4info_path.parent / built_from.STAMP).read_text())
    version = subprocess.run(["bf-p4c", "--version"], capture_output=True, text=True).stdout.strip()
    return "" if version == record["compiler"] else f"this bf-p4c is {version!r}, the outputs' {record['compiler']!r}"


# bf-p4c takes minutes per chip; on a loaded 2-core machine longer than pytest's default limit
@pytest.mark.timeout(1800)
@pytest.mark.skipif(shutil.which("bf-p4c") is None, reason="bf-p4c not on PATH (../shared/toolchains/install tofino)")
@pytest.mark.parametrize("chip", CHIPS)
def test_committed_artifacts_are_current(chip, tmp_path):
    """Recompile (minutes per chip) and compare what does not carry a build date: the P4Info and
    the resource summary byte for byte, the binary's and context's size and program. Only where
    the build's record cannot vouch for them (another compiler), or when asked."""
    if not _recompile_reason(chip):
        pytest.skip("built by this bf-p4c from these sources (built_from.json): INAGG_RECOMPILE_P4=1 recompiles")
    program = PROGRAMS[chip]
    bf_p4c(chip, tmp_path, "--verbose", "1")
    assert (tmp_path / "inagg.p4info.txtpb").read_bytes() == program.p4info_path.read_bytes(), "run `make tofino` and commit"
    out = subprocess.run([sys.executable, "-m", "tools.tofino_resources", str(tmp_path)], cwd=ROOT,
                         check=True, capture_output=True, text=True).stdout
    assert json.loads(out) == resources(chip), f"run `make tofino TOFINO_TARGETS={chip}` and commit"
    parsers = subprocess.run([sys.executable, "-m", "tools.tofino_parser", str(tmp_path)], cwd=ROOT,
                             check=True, capture_output=True, text=True).stdout
    assert json.loads(parsers) == json.loads((program.p4info_path.parent / "parser.json").read_text()), \
        f"run `make tofino TOFINO_TARGETS={chip}` and commit"
    fresh = json.loads((tmp_path / "pipe" / "context.json").read_text())
    committed = json.loads(read_artifact(program.files["context"]))
    for volatile in ("build_date", "run_id", "compiler_version"):
        fresh.pop(volatile), committed.pop(volatile)
    assert fresh == committed, f"run `make tofino TOFINO_TARGETS={chip}` and commit"
    assert len((tmp_path / "pipe" / f"{chip}.bin").read_bytes()) == len(read_artifact(program.files["binary"]))

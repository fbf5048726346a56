"""The P4 program, its committed artifacts, and the names the Python side relies on."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from inagg.softswitch import pipeline_reference as pipeline
from inagg.control.config import default_program
from inagg.control.p4info import P4Type
from inagg.wire.protocol import SWITCH_VALUES_PER_PACKET

ROOT = Path(__file__).resolve().parents[1]
BMV2 = default_program("bmv2")
BMV2_JSON_PATH, P4INFO_PATH = BMV2.files["bmv2_json"], BMV2.p4info_path


@pytest.mark.skipif(shutil.which("p4c-bm2-ss") is None, reason="p4c-bm2-ss not on PATH")
def test_committed_artifacts_are_current(tmp_path):
    subprocess.run(["p4c-bm2-ss", "--arch", "v1model", "--p4runtime-files", str(tmp_path / "x.p4info.txtpb"),
                    "-o", str(tmp_path / "x.json"), "p4/inagg.p4"], cwd=ROOT, check=True)
    assert (tmp_path / "x.json").read_bytes() == BMV2_JSON_PATH.read_bytes(), "run `make build` and commit"
    assert (tmp_path / "x.p4info.txtpb").read_bytes() == P4INFO_PATH.read_bytes(), "run `make build` and commit"


def test_value_loop_is_unrolled_k_times():
    text = (ROOT / "p4/include/metadata.p4").read_text()
    body = re.search(r"#define FOR_EACH_VALUE\(M\)(.*?)\n\n", text, re.S).group(1)
    assert [int(i) for i in re.findall(r"M\((\d+)\)", body)] == list(range(SWITCH_VALUES_PER_PACKET))


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
    n_slots = info.register_size(pipeline.SLOT_TAG)
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

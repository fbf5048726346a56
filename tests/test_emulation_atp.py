"""``sharing = "atp"`` (docs/atp.md) in the Mininet emulation on the software data plane (needs
root and Mininet): three jobs of 2, 3 and 4 workers on a switch pool of 4 aggregators
(``topologies/atp_three_jobs.json``) train to the same parameters, bit for bit, as under
``sharing = "dynamic"`` (every sum exact, on the switch or at the host aggregator), with
collisions counted on the switch."""

import json
import re

import pytest

from test_emulation import ROOT, mininet_missing, run_topology

pytestmark = pytest.mark.skipif(mininet_missing() is not None, reason=str(mininet_missing()))


def test_atp_trains_every_job_to_the_bits_of_dynamic_windows(tmp_path):
    atp, stdout, _ = run_topology(tmp_path, "atp_three_jobs.json", "soft")
    collisions = re.search(r"(\d+) ATP collisions", stdout)
    assert collisions and int(collisions.group(1)) > 0, stdout
    topo = json.loads((ROOT / "bmv2_env/emulation/topologies/atp_three_jobs.json").read_text())
    topo["controller"] = {"sharing": "dynamic"}
    dynamic_file = tmp_path / "dynamic.json"
    dynamic_file.write_text(json.dumps(topo))
    dynamic, _, _ = run_topology(tmp_path, str(dynamic_file), "soft")
    assert {n: r["mode"] for n, r in atp.items()} == {"two": "host", "three": "host", "four": "host"}
    assert {n: r["params_sha256"] for n, r in atp.items()} == {n: r["params_sha256"] for n, r in dynamic.items()}

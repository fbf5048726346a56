"""bmv2_env/emulation/topologies/four_hosts_four_ranks.json in the emulation (needs root and
Debian's mininet): 16 ranks on 4 hosts reduce on their hosts first, so the switch sees 4 workers
(4 contributions a round) and each host sends its gradient once; the losses are those of the 16
ranks as 16 workers of the switch. One epoch (5 steps of 16 ranks): every step's sums must match,
so it shows a difference as a second epoch would. A file of its own, apart from
tests/test_emulation_scale.py's leaf-spine run, so pytest-xdist's ``--dist loadfile`` can put the
two on different workers."""

import pytest

from test_emulation import assert_clean_logs, mininet_missing, run_topology
from test_emulation_scale import levels, variant

pytestmark = pytest.mark.skipif(mininet_missing() is not None, reason=str(mininet_missing()))


def test_sixteen_ranks_on_four_hosts_reduce_on_their_hosts_first_and_train_exactly(tmp_path):
    def every_rank_a_worker(topo: dict) -> None:
        topo["jobs"][0]["host_reduce"] = False

    plain, _, _ = run_topology(tmp_path, variant(tmp_path, "four_hosts_four_ranks.json", every_rank_a_worker),
                               "soft", "--epochs", "1")
    rows, stdout, run = run_topology(tmp_path, "four_hosts_four_ranks.json", "soft", "--epochs", "1")
    job, ref = rows["mlp16"], plain["mlp16"]
    assert job["ok"] and (job["switch_workers"], ref["switch_workers"]) == (4, 16), stdout
    assert (job["losses"], job["accuracy"]) == (ref["losses"], ref["accuracy"]), stdout
    agg, rounds = levels(stdout)["s1"]
    assert rounds > 0 and agg == 4 * rounds, stdout                   # the switch saw 4 workers
    assert job["mb_sent"] < ref["mb_sent"] * 1.2, stdout                # a host's gradient once, as one rank's
    assert_clean_logs(run)

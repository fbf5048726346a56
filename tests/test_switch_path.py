"""Several ranks of one job on one host IP (a multi-GPU host) on the switch path, against the
real processes on loopback: the switch binds each rank to its UDP port, so both ranks aggregate
on the switch and every result is exact."""

import torch

from inagg.bmv2_env.emulation.loopback import LoopbackDeployment
from test_liveness import in_process_job


def test_two_ranks_on_one_host_ip_aggregate_on_the_switch():
    with LoopbackDeployment(2) as dep:
        comms = in_process_job(dep, [0, 0, 1])   # ranks 0 and 1 share host 0's IP (and MAC)
        try:
            assert [c.grant.mode for c in comms] == ["switch"] * 3
            for i in range(20):
                futs = [c.allreduce_async(torch.full((5000,), float(r + i))) for r, c in enumerate(comms)]
                assert all(f.wait().tolist() == [float(3 * i + 3)] * 5000 for f in futs)
            assert all(c.stats()["host_results"] == 0 for c in comms)     # every result from the switch
        finally:
            for c in comms:
                c.close()

"""Two jobs given one rendezvous store, as rank processes: they must refuse each other with an
error naming both jobs on every rank, never run on as one job mixing their ranks. (Whether a
pair ran calls before the later launch's processes reached the store depends on how fast each
process starts: that window is bounded by a quarter rank lease, not tested here.)"""

import os
import re
import tempfile

from inagg.bmv2_env.emulation.loopback import LoopbackDeployment
from test_liveness import Rank


def test_two_jobs_on_one_store_refuse_each_other_on_every_rank():
    with LoopbackDeployment(4) as dep:
        store = os.path.join(tempfile.mkdtemp(), "store")
        ranks = [Rank(store, rank, 2, dep, host=2 * job + rank) for job in (0, 1) for rank in (0, 1)]
        try:
            errors = [r.wait_for("error", 90) for r in ranks]
            for r, line in zip(ranks, errors):
                message = line.split(" ", 3)[3]
                assert "share one rendezvous store" in message, message
                named = re.search(r"jobs (\d+) and (\d+) share", message)
                assert named and named[1] != named[2], message
        finally:
            for r in ranks:
                r.stop()

"""Torch's own distributed test suite (``DistributedTest._DistTestBase``, what torch runs for
gloo and nccl in test/distributed/test_distributed_spawn.py) on the inagg backend, as torch_ucc
ran it for ucc. Not collected by pytest itself: tests/test_torch_suite.py runs it in a process
of its own (torch's suite reads ``BACKEND`` and ``WORLD_SIZE`` from the environment when it is
imported), or by hand::

    BACKEND=inagg WORLD_SIZE=2 INIT_METHOD=file:///tmp/init python -m pytest tests/torch_dist_suite.py -k test_all_reduce_sum

Torch gates some tests on the backend's name. Where it offers a set to join
(``DistTestCases.backend_feature``: ddp, subgroup, plugin, gpu), inagg joins it. Where it names
gloo itself (``BACKEND != "gloo"``, ``require_backend_is_available({"gloo"})``), nothing in
torch lets another backend in; ``NAME_GATED`` lists those tests that inagg runs all the same,
each as a method of this module's class calling torch's test body (the skip torch sets is an
attribute of its method, which a method of the same name here does not have). The
monitored_barrier tests are not among them: torch's ``dist.monitored_barrier`` itself refuses
every backend not named gloo (inagg offers ``inagg.hostlib.pytorch.backend.monitored_barrier``), nor
those whose body builds its model only for a backend named gloo or nccl
(``test_accumulate_gradients_no_sync*``).
"""

from __future__ import annotations

import os
import unittest

os.environ.setdefault("BACKEND", "inagg")
os.environ.setdefault("WORLD_SIZE", "2")

from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402
from torch.testing._internal.common_utils import run_tests  # noqa: E402

import inagg.hostlib.pytorch.plugin  # noqa: E402,F401 - registers the backend where entry points are off
from inagg.bmv2_env.emulation.forked import ForkedRank, rank_context  # noqa: E402
from inagg.hostlib import BACKEND_NAME  # noqa: E402

# before torch's suite is imported: its decorators read these sets as its methods are defined.
# "gpu" gates tests that run on CPU too (all_gather_object); gloo is in it for its CUDA tensors,
# which an inagg group hands to its inner gloo group.
for _feature in ("ddp", "subgroup", "plugin", "gpu"):
    DistTestCases.backend_feature[_feature].add(BACKEND_NAME)

from torch.testing._internal.distributed import distributed_test  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    INIT_METHOD, DistributedTest, TestDistBackend)

# gloo-only by name in torch's suite; inagg runs them (the _group barrier timeout and the
# _group coalesced allreduces need more than 2 ranks; a sparse allreduce goes to the inner gloo
# group). Not test_barrier_timeout_arg: torch skips it on Linux for every backend, nor the CUDA
# ones (test_sparse_all_reduce_sum_cuda...): no GPU skips them for every backend.
NAME_GATED = (
    "test_barrier_timeout_global", "test_barrier_timeout_group", "test_barrier_timeout_full_group",
    "test_batch_isend_irecv_gloo", "test_batch_isend_irecv_gloo_tags", "test_all_reduce_coalesced_sum",
    "test_all_reduce_coalesced_product", "test_all_reduce_coalesced_min", "test_all_reduce_coalesced_max",
    "test_all_reduce_coalesced_full_group_sum", "test_all_reduce_coalesced_full_group_product",
    "test_all_reduce_coalesced_full_group_min", "test_all_reduce_coalesced_full_group_max",
    "test_sparse_all_reduce_sum",
    "test_get_future", "test_grads_same_across_ranks_with_no_sync", "test_scatter_object_list",
)
# torch's other gates on those tests (set on the same method as the name's), kept as they are
OTHER_GATES = {
    "test_barrier_timeout_global": (not INIT_METHOD.startswith("file://"),
                                    "requires INIT_METHOD=file://... (torch's gate for every backend)"),
}


# Each test's ranks are forked from one server process that imported this module (torch,
# torch's test module, inagg) and did nothing else (inagg.bmv2_env.emulation.forked.rank_context):
# a rank starts as a spawned one would, from the same imports and this process's environment
# (where torch's setUp puts the test's temporary directories), with no group, deployment or
# calibrated path of an earlier test, and without importing torch's suite again.
rank_context(__name__)


class _Rank(ForkedRank):
    """A rank forked from the server, and what torch's test module read from the environment
    at its import read again (``INIT_METHOD``: torch's setUp names a file of the test's own)."""

    def run(self) -> None:
        distributed_test.INIT_METHOD = self.environ.get("INIT_METHOD", "env://")   # as distributed_test.py reads it
        super().run()


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    """Every test of torch's suite, each in WORLD_SIZE fresh processes on the backend (torch's
    name for the class: its ranks are spawned; here forked from the module's server, above)."""

    def setUp(self) -> None:
        super().setUp()
        self._start_processes(_Rank)


def _run_anyway(name: str):
    """A method that runs torch's test ``name`` whatever backend name it was gated on."""
    body = getattr(DistributedTest._DistTestBase, name)

    skip, why = OTHER_GATES.get(name, (False, ""))

    def test(self: TestDistBackendWithSpawn) -> None:
        if skip:
            raise unittest.SkipTest(why)
        return body(self)

    test.__name__ = test.__qualname__ = name
    return test


if os.environ["BACKEND"] == BACKEND_NAME:
    for _name in NAME_GATED:
        setattr(TestDistBackendWithSpawn, _name, _run_anyway(_name))


if __name__ == "__main__":
    run_tests()

"""What carried an ``inagg`` process group's allreduces, in the words a user reads: the switch, the
host aggregator, shared memory (the host-local reduce), inagg's fixed point over gloo, or gloo.

Design: the path chooser's names (``inagg``, ``host``, ``gloo``) say which communicator a call
took, not what carried it: on one host the ``inagg`` path is shared memory, and the ``gloo``
path sums inagg's fixed point (``inagg.hostlib.pytorch.reproducible``). The dispatch counts each
allreduce under its *route* (the path, and on the gloo path ``gloo:fixed`` where gloo summed
inagg's fixed point; ``gloo`` also holds the allreduces inagg cannot take); this module names
each route by what carries it under the job's current grants (``carrier``), totals the counts by
those names (``by_carrier``: "where did my bytes go") and writes rank 0's one line at start
(``summary``). A job whose grant moves (switch to host aggregator) counts its earlier calls under
the name of its grant when asked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from inagg.hostlib.pytorch.path.options import TINY_BYTES
from inagg.hostlib.worker.host_communicator import HostCommunicator

if TYPE_CHECKING:
    from inagg.hostlib.pytorch.lifecycle import GroupLifecycle
    from inagg.hostlib.worker.communicator import Communicator

SWITCH, HOST_AGGREGATOR, SHARED_MEMORY = "switch", "host aggregator", "shared memory"
FIXED_POINT_GLOO, GLOO = "fixed point over gloo", "gloo"


def carrier(comm: Communicator | HostCommunicator) -> str:
    """What carries a communicator's calls: shared memory alone where every rank of the job is on
    one host, else its grant's aggregator (the switch or the host aggregator), after shared
    memory where each host reduces first."""
    if isinstance(comm, HostCommunicator) and (comm.grant is None or comm.group.n_hosts == 1):
        return SHARED_MEMORY
    where = SWITCH if comm.grant.mode == "switch" else HOST_AGGREGATOR
    return f"{SHARED_MEMORY} + {where}" if isinstance(comm, HostCommunicator) else where


def route_names(life: GroupLifecycle) -> dict[str, str]:
    """Each route's carrier (module docstring), for the paths ``life`` opened."""
    names = {"inagg": carrier(life.comm), "gloo:fixed": FIXED_POINT_GLOO, "gloo": GLOO}
    if life.lane is not None:
        names["host"] = carrier(life.lane)
    return names


def by_carrier(volume: dict[str, tuple[int, int]], names: dict[str, str]) -> dict[str, dict[str, int]]:
    """``volume`` (calls and bytes by route, ``AllreduceDispatch.volume``) by carrier name."""
    out: dict[str, dict[str, int]] = {}
    for route, (calls, nbytes) in volume.items():
        entry = out.setdefault(names[route], {"calls": 0, "bytes": 0})
        entry["calls"] += calls
        entry["bytes"] += nbytes
    return out


def summary(life: GroupLifecycle, size: int) -> str:
    """Rank 0's line once the paths of a group of ``size`` ranks are up: the ranks and hosts, the
    carriers the eligible allreduces may take (or the one ``INAGG_ALLREDUCE_PATH`` pins), and
    what was started."""
    names = route_names(life)
    route_of = {"gloo": "gloo:fixed" if life.fixed is not None else "gloo"}
    forced = life.forced
    paths = [forced] if forced is not None else list(life.path_names)
    carriers = " or ".join(names[route_of.get(p, p)] for p in paths)
    how = f"pinned by INAGG_ALLREDUCE_PATH={forced}" if forced is not None else "the faster per call"
    if life.tiny_on_host:
        how += f"; calls of up to {TINY_BYTES} B always on {names['inagg']}"
    hosts = life.host.n_hosts if life.host is not None else None
    where = f"{size} ranks on {hosts} host{'s' if hosts != 1 else ''}" if hosts else f"{size} ranks, each a worker"
    if life.endpoint is None:
        started = "no switch, controller or aggregator started: every rank is on this host"
    else:
        jobs = f"job {life.comm.job_id}" + (f", host lane job {life.lane.job_id}" if life.lane is not None else "")
        own = "its local deployment" if life.endpoint.services is not None else "controller"
        started = f"{jobs} at {own} {life.endpoint.controller}"
    return (f"inagg: {where}; allreduces on {carriers} ({how}), other collectives and dtypes on gloo; {started}; "
            f"stats()['carriers'] counts each")

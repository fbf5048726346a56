"""A launch's identity: what tells the ranks of one launch from those of another that was given
the same rendezvous store.

A rendezvous store cannot tell two launches apart: a rank reads whatever job is published there.
When two launches share one store and start skewed (launch A's rank 0 and launch B's rank 1
first), the first ranks to arrive look exactly like one whole job, and nothing written in the
store can say otherwise. Only something each rank gets from its launcher, not from the store,
can: the launch id. Where it comes from, first found first:

- ``Communicator(launch=...)``, or ``$INAGG_LAUNCH_ID``: set by whoever starts the ranks;
- ``$TORCHELASTIC_RUN_ID`` (torchrun's rendezvous id: a fresh uuid per ``--standalone``
  launch, the user's ``--rdzv-id`` otherwise; its default ``none`` is no identity) with
  ``$TORCHELASTIC_RESTART_COUNT`` (a restarted worker group is a new launch);
- ``$SLURM_JOB_ID`` with ``$SLURM_STEP_ID`` (one ``srun`` step).

The first rank of any launch to reach the store claims it for its launch id (compare-and-set);
every rank of another launch is refused there, before it reads the job (``Communicator``). Two
launches without an id both claim the store as ``unnamed``: then only the rank claims can find
the clash, which they do once both launches' ranks reached the store (docs/security.md).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Mapping

from inagg.hostlib.errors import InaggError

if TYPE_CHECKING:
    from torch.distributed import Store

UNNAMED = "unnamed"            # the claim of a launch without an id
LAUNCH_KEY = "inagg/launch"    # the launch that claimed the store


class SharedStore(InaggError):
    """Two jobs (launches) were given one rendezvous store; the message names both."""


def launch_id(explicit: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """This rank's launch id (module docstring), or "" when its launcher gave none."""
    env = os.environ if env is None else env
    if explicit:
        return explicit
    if env.get("INAGG_LAUNCH_ID"):
        return env["INAGG_LAUNCH_ID"]
    run = env.get("TORCHELASTIC_RUN_ID", "")
    if run and run != "none":
        return f"torchrun:{run}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    if env.get("SLURM_JOB_ID"):
        return f"slurm:{env['SLURM_JOB_ID']}.{env.get('SLURM_STEP_ID', '0')}"
    return ""


def claim_store(store: "Store", rank: int, launch: str, job_key: str = "inagg/job") -> None:
    """Claim ``store`` for this rank's launch (``launch``: ``launch_id()``, "" for none): the
    first rank of any launch to get here wins (compare-and-set of ``LAUNCH_KEY``); a rank of
    another launch raises ``SharedStore`` naming both launches (and the job the store holds, if
    published under ``job_key``), before it reads or writes anything else there."""
    mine = launch or UNNAMED
    held = store.compare_set(LAUNCH_KEY, "", mine).decode()
    if held == mine:
        return
    job = ""
    if store.check([job_key]):
        job = f" (job {store.get(job_key).decode().split(':')[0]})"
    raise SharedStore(f"launch {mine!r} rank {rank} found this rendezvous store held by launch "
                      f"{held!r}{job}: two launches share one rendezvous store; this one is refused. "
                      f"Give each job its own (another MASTER_PORT or init_method)")

"""The controller's lease clocks (``inagg.controller.jobs.pause_leases``, ``silence``): its own
stall is no rank's silence, and a rank that is really silent is still named. Pure functions of
a job and times; the processes are in tests/test_liveness.py (a SIGSTOPped controller)."""

from hypothesis import given, strategies as st

from inagg.controller.allocator import Demand
from inagg.controller.jobs import Job, Member, pause_leases, silence

LEASE = 4.0
NOW = 1000.0


def placed_job(seen: dict[int, float]) -> Job:
    """A placed job of ``len(seen)`` ranks, rank r last heard at ``seen[r]``."""
    job = Job(1, "j", "t", Demand(len(seen)), {r: Member(f"10.0.0.{r + 1}:4700{r}", "") for r in seen},
              place="s1", last_seen=NOW)
    job.rank_seen = dict(seen)
    return job


def test_a_stall_of_the_controller_is_no_ranks_silence():
    """Both ranks beat 1 s before a 9 s stall: at the look after it they seem silent 10 s, over
    the 4 s lease; with the stall paused they are 1 s silent, and no rank is named."""
    job = placed_job({0: NOW - 10.0, 1: NOW - 10.0})
    assert "rank 0" in silence(job, NOW, LEASE) and "rank 1" in silence(job, NOW, LEASE)
    pause_leases(job, 9.0, NOW)
    assert silence(job, NOW, LEASE) == ""


def test_a_dead_rank_is_named_after_the_stall_is_paused():
    """Rank 1 died 8 s before a 3 s stall: 5 s of the controller's running time is over the
    lease, so rank 1 alone is named."""
    job = placed_job({0: NOW - 3.5, 1: NOW - 11.0})
    pause_leases(job, 3.0, NOW)
    assert silence(job, NOW, LEASE).startswith("rank 1 (10.0.0.2:47001) stopped")


def test_a_restored_jobs_grace_stays_ahead():
    """A restored controller gives each rank a grace ahead of now: a stall never takes it back."""
    job = placed_job({0: NOW + 10.0})
    pause_leases(job, 5.0, NOW)
    assert job.rank_seen[0] == NOW + 10.0


@given(st.floats(0.0, 2 * NOW), st.floats(0.0, NOW))
def test_a_pause_shortens_a_silence_by_the_stall_and_never_moves_past_now(seen, stall):
    job = placed_job({0: seen})
    job.last_seen = seen
    pause_leases(job, stall, NOW)
    for new in (job.rank_seen[0], job.last_seen):
        assert new >= seen
        if seen <= NOW:
            assert new <= NOW
            assert abs((NOW - new) - max(NOW - seen - stall, 0.0)) < 1e-9
        else:
            assert new == seen

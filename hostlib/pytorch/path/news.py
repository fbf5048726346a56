"""How every rank of a job learns, at the same call and within a few calls, that the job's inagg
grant moved while its calls are on gloo: ``GrantNews``.

The path choice (``inagg.hostlib.pytorch.path.choice``) drops the ``inagg`` path's figures and
probes it again when every rank has seen a newer grant (``GrantMove``), which it learns at an
agreement. Agreements come by a schedule that keeps their cost a small share of the calls'
time, so a size class on gloo could stay there for a whole schedule's period after the
controller moved the grant to the switch (and a class on gloo makes no inagg call, where ranks
take a grant). So every float call on the gloo path carries one more lane in the control vector
it exchanges anyway (``inagg.hostlib.pytorch.reproducible``: the block exponents' MAX, or the exact
sum's lanes): whether this rank has seen a grant newer than the one last agreed on. The call's
result says whether *every* rank had; then the ranks agree at the chooser's call ``LAG + 1``
after it, and the path choice follows the grant from there.

**Why every rank takes the same path.** A call's lane result is one collective's result, the same
on every rank. A rank keeps a ``Ticket`` for each call it flagged, and only those: a call it did
not flag cannot say every rank had seen the grant. Tickets are numbered by the chooser's call
numbers, which are the same on every rank (every rank makes the same calls in the same order).
A rank holding a ticket (``owed``) takes no run of calls without asking the chooser
(``PathChooser.run_length``), so it reaches ``heard`` at every call until the ticket is used;
every rank's choice of call ``c`` uses the tickets of calls before ``c - LAG``, waiting for each
one's result where it is not in yet. So where every rank flagged call ``k``, every rank holds its
ticket, asks the chooser at every call after ``k`` and hears it at call ``k + LAG + 1``: all agree
there. Where some rank did not flag it, the result is "not all" on every rank, and no rank acts
on it; a rank that flagged it and waits for it makes the same choices as one that did not
(a run's calls are chosen as if each was asked). A ticket of an older agreed grant is stale
everywhere alike (the grant agreed at a call is the same on every rank).

**What it costs.** One int32 lane per gloo call and nothing else while no grant is offered; a
rank that has seen an offer waits, at most, for the call ``LAG + 1`` before the one it chooses,
for as long as it holds tickets (until every rank has seen it and the ranks agree, or the offer
goes). Any newer epoch is news, a resize of the switch window too, as it is at an agreement
(``PathChooser._grant_moves``): each brings its agreement within a few calls of every rank
seeing it, where several moves between two scheduled agreements brought one. Calls on gloo that
do not go through the fixed point (``INAGG_REPRODUCIBLE=0``, int32
tensors) carry no lane: there the schedule alone finds the grant.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Callable

from inagg.hostlib.pytorch.path.links import GrantMove

LAG = 1   # a call's news is heard at the chooser's call LAG + 1 after it: one call may be in flight
_WAIT_SLICE_S = 0.05   # how often a wait for a ticket's result checks for a rank gone


class Ticket:
    """One gloo call this rank flagged (it had seen a grant newer than ``epoch``, the one
    agreed when it was sent): its chooser ``call`` number, and once its control vector is
    exchanged, whether every rank had flagged it (``settle``)."""

    __slots__ = ("call", "epoch", "all_seen", "_done")

    def __init__(self, call: int, epoch: int) -> None:
        self.call, self.epoch, self.all_seen = call, epoch, False
        self._done = threading.Event()

    def settle(self, all_seen: bool) -> None:
        """The call's control vector is in: whether every rank flagged it (the first settle
        counts; a call that failed settles False)."""
        if not self._done.is_set():
            self.all_seen = all_seen
            self._done.set()

    def wait(self, failure: Callable[[], BaseException | None]) -> bool:
        """Whether every rank flagged the call, once its result is in; ``failure()`` (a rank
        gone) is raised instead of waiting on."""
        while not self._done.wait(_WAIT_SLICE_S):
            if (gone := failure()) is not None:
                raise gone
        return self.all_seen


class GrantNews:
    """One rank's side (module docstring): ``ticket`` for each gloo call sent, ``heard`` at
    each call the chooser is asked; ``agreed`` is the grant epoch the ranks last agreed on (the
    chooser's), ``move`` how this rank sees the grant offered."""

    def __init__(self, move: GrantMove, failure: Callable[[], BaseException | None] = lambda: None) -> None:
        self._move, self._failure = move, failure
        self.agreed = move.epoch()
        self._tickets: deque[Ticket] = deque()
        self._lock = threading.Lock()

    @property
    def owed(self) -> bool:
        """Whether this rank holds tickets not yet heard (then the chooser is asked every call)."""
        return bool(self._tickets)

    def ticket(self, call: int) -> Ticket | None:
        """A gloo call sent as the chooser's call ``call``: its ticket where this rank has seen
        a grant newer than the agreed one (its lane says so), else None (its lane says not)."""
        if self._move.next_epoch() <= self.agreed:
            return None
        ticket = Ticket(call, self.agreed)
        with self._lock:
            self._tickets.append(ticket)
        return ticket

    def heard(self, call: int) -> bool:
        """At the chooser's call ``call``: whether a call before ``call - LAG`` found that every
        rank had seen a grant newer than the agreed one (its tickets are used up here)."""
        due = []
        with self._lock:
            while self._tickets and self._tickets[0].call < call - LAG:
                due.append(self._tickets.popleft())
        return any([t.wait(self._failure) and t.epoch == self.agreed for t in due])

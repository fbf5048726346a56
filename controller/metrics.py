"""The controller's Prometheus endpoint: per-job grant state and the switch counters it reads.

Nothing is sampled in the background: each scrape builds the metrics from the controller's
``list_jobs()`` (the same view ``inaggctl jobs`` prints, switch counters read over P4Runtime at
that moment) and from the activations the store recorded, so a scrape is never stale and an idle
controller does no work. Off unless the config's ``metrics_listen`` (or ``--metrics-listen``)
names an address; port 0 picks a free one.

Metrics (labels ``job_id``, ``name``; counters also ``switch``):
``inagg_job_mode{mode}`` 1 for the active mode, ``inagg_job_slots``, ``inagg_job_slot_base``,
``inagg_job_epoch``, ``inagg_job_pending_epoch`` (0 when none), ``inagg_job_grant_changes_total``
(activations the workers agreed), ``inagg_job_stall_moves_total`` (the moves its ranks' stall
reports made: a fresh epoch, the host aggregator), ``inagg_job_workers``/``inagg_job_workers_joined``,
``inagg_switch_job_<packets|aggregated|duplicates|results>_total``,
``inagg_switch_job_drops_total{reason}`` (under ``sharing = "atp"``, whose grants name the host
aggregator: the ATP switch's, ``inagg_switch_job_collisions_total`` among them); and
``inagg_jobs``, ``inagg_switch_slots``. Per switch
(label ``switch``), what is no job's: ``inagg_switch_global_drops_total{reason}`` (frames no job
row could count), ``inagg_switch_guard_drops_total{reason}`` (SourceGuard: frames from a host port
claiming an aggregator's address or a result) and, where the program recirculates (TNA),
``inagg_switch_recirculation_passes_total{pipe, kind}`` (kind: sent, arrived, lost; the
listing's ``recirculation``, as ``inaggctl jobs`` prints it); and the controller's own work on it,
``inagg_switch_programming_total{kind}`` (kind: full_reads, updates_written, drift_repairs: what
its audits found changed behind the controller's back and rewrote). A switch that does not
answer has its counters left out of the scrape.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Iterator

from prometheus_client import start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

from inagg.controller.switch import JobCounters, SourceGuard, SwitchError
from inagg.hostlib.jobservice.proto import inagg_controller_pb2 as pb
from inagg.hostlib.wire.grant import parse_address

log = logging.getLogger("inagg.controller")

if TYPE_CHECKING:
    from inagg.controller.controller import Controller

JOB_LABELS = ["job_id", "name"]
SWITCH_COUNTERS = ("packets", "aggregated", "duplicates", "results", "collisions")
MODES = ("switch", "host")


class ControllerCollector:
    """A Prometheus collector over one controller's state."""

    def __init__(self, ctl: "Controller") -> None:
        self.ctl = ctl

    def collect(self) -> Iterator[Metric]:
        listing = self.ctl.list_jobs()
        with self.ctl.lock:       # the store's connection is used under the controller's lock
            changes = self.ctl.store.activation_counts()
        g = {name: GaugeMetricFamily(f"inagg_job_{name}", text, labels=JOB_LABELS) for name, text in (
            ("slots", "slots of the active grant"), ("slot_base", "first slot of the active grant"),
            ("epoch", "epoch of the active grant"), ("pending_epoch", "epoch of the pending grant, 0 if none"),
            ("workers", "ranks the job has"), ("workers_joined", "ranks that joined"))}
        mode = GaugeMetricFamily("inagg_job_mode", "1 for the mode of the active grant",
                                 labels=JOB_LABELS + ["mode"])
        grant_changes = CounterMetricFamily("inagg_job_grant_changes", "grant changes the workers activated",
                                            labels=JOB_LABELS)
        stall_moves = CounterMetricFamily("inagg_job_stall_moves", "moves the ranks' stall reports made "
                                          "(a fresh epoch, the host aggregator)", labels=JOB_LABELS)
        counters = {c: CounterMetricFamily(f"inagg_switch_job_{c}", f"switch counter job_{c}",
                                           labels=JOB_LABELS + ["switch"]) for c in SWITCH_COUNTERS}
        drops = CounterMetricFamily("inagg_switch_job_drops", "switch per-job drops by reason",
                                    labels=JOB_LABELS + ["switch", "reason"])
        for j in listing.jobs:
            labels = [str(j.job_id), j.name]
            g["workers"].add_metric(labels, j.n_workers)
            g["workers_joined"].add_metric(labels, j.joined)
            if not j.HasField("active"):
                continue      # not placed yet: no grant
            a = j.active
            for m in MODES:
                mode.add_metric(labels + [m], 1 if a.mode == m else 0)
            g["slots"].add_metric(labels, a.slot_count)
            g["slot_base"].add_metric(labels, a.slot_base)
            g["epoch"].add_metric(labels, a.epoch)
            g["pending_epoch"].add_metric(labels, j.pending.epoch if j.HasField("pending") else 0)
            grant_changes.add_metric(labels, changes.get(j.job_id, 0))
            stall_moves.add_metric(labels, j.stall_moves)
            switch = self._counting_switch(j.job_id, a)
            if j.counters and switch is not None:
                for c in SWITCH_COUNTERS:
                    if c in j.counters:
                        counters[c].add_metric(labels + [switch], j.counters[c])
                for key, n in j.counters.items():
                    if key.startswith("drop_"):
                        drops.add_metric(labels + [switch, key[len("drop_"):]], n)
        yield GaugeMetricFamily("inagg_jobs", "jobs the controller holds", value=len(listing.jobs))
        yield GaugeMetricFamily("inagg_switch_slots", "aggregation slots on all switches",
                                value=listing.switch_slots)
        yield from [*g.values(), mode, grant_changes, stall_moves, *counters.values(), drops]
        yield from self._switch_metrics(listing)

    def _switch_metrics(self, listing: pb.JobList) -> list[Metric]:
        """Each switch's own counters (module docstring), read over P4Runtime now; the
        recirculation counters are the listing's."""
        global_drops = CounterMetricFamily("inagg_switch_global_drops", "frames no job row counted, by reason",
                                           labels=["switch", "reason"])
        guard = CounterMetricFamily("inagg_switch_guard_drops", "frames SourceGuard dropped on host ports, "
                                    "by reason", labels=["switch", "reason"])
        recirc = CounterMetricFamily("inagg_switch_recirculation_passes", "recirculation passes by pipe: "
                                     "sent, arrived, lost (sent - arrived)", labels=["switch", "pipe", "kind"])
        programming = CounterMetricFamily(
            "inagg_switch_programming", "the controller's work on each switch: full read backs, updates "
            "written, entries and groups an audit found changed behind its back (drift, repaired)",
            labels=["switch", "kind"])
        for name, sw in self.ctl.fabric.switches.items():
            for kind in ("full_reads", "updates_written", "drift_repairs"):
                programming.add_metric([name, kind], getattr(sw, kind))
            try:
                read = (JobCounters(sw.sw).global_drops(), SourceGuard(sw.sw).drops() if sw.capacity.guard else {})
            except SwitchError as e:
                log.warning("switch %s: its counters are left out of this scrape (%s)", name, e)
                continue
            for family, counts in zip((global_drops, guard), read):
                for reason, n in counts.items():
                    family.add_metric([name, reason], n)
        for r in listing.recirculation:
            for kind in ("sent", "arrived", "lost"):
                recirc.add_metric([r.switch, str(r.pipe), kind], getattr(r, kind))
        return [global_drops, guard, recirc, programming]

    def _counting_switch(self, job_id: int, active) -> str | None:
        """The switch whose per-job counters the listing holds for a job: the switch its grant
        names, or under ``sharing = "atp"`` the switch whose pool its rounds share (its grant
        names the host aggregator); None for a job on the host aggregator alone or a tree under
        it (the listing shows such counters per level only)."""
        with self.ctl.lock:
            job = self.ctl.jobs.get(job_id)
            atp = self.ctl.fabric.atp_switch(job) if job is not None else None
        if atp is not None:
            return atp
        if active.mode != "switch":
            return None
        return next((name for name, sw in self.ctl.fabric.switches.items()
                     if sw.cfg.aggregator == active.aggregator), "")


def serve_metrics(ctl: "Controller", address: str):
    """Serve ``/metrics`` on ``address`` ("ip:port"); returns (server, bound port)."""
    host, port = parse_address(address)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ControllerCollector(ctl))
    server, _thread = start_http_server(port, host, registry=registry)
    return server, server.server_port

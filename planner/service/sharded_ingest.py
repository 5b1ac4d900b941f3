"""Sharded ingest on the service's side (``ingest.shards.enabled``): the decision core reads the ingest shards'
merged summaries instead of a local FleetStore fed with raw samples, so the tick does not grow with the sample
rate; and the leader tells the shards whom to ingest.

- :class:`ShardSummarySource` is an :class:`~planner.transport.settings.IngestSource` whose snapshot is the
  :class:`~planner.shard.merge.SummaryMerger`'s merge of the shards' newest summaries (received by a
  :class:`~planner.shard.process.SummaryListener` on ``fpm-shard.<ns>.*``). Its store only lays the discovered
  workers out (it never ingests a sample), so diagnostics still list every worker and rank with its freshness.
  A shard whose newest summary is older than ``max_summary_age_s`` is stale: its workers count as not fresh, so
  the core's existing safety reasons (``workers_silent``, ``ranks_missing``, ``scale_down_blocked``) hold any
  scale-down on them.
- :class:`ShardedIngest` is the runner's ingest (:class:`~planner.service.ingest_wiring.TickIngest`) in this mode. After
  every discovery refresh the leader publishes the discovered workers and the live shard set (the shards whose
  summaries are fresh) on ``fpm-shard.<ns>.membership.v1`` (:mod:`planner.shard.membership`); the shards
  (``python -m planner.shard`` without ``--workers-file``) follow it. Followers publish nothing.
- FPM traffic: every tick, the shards' traffic counters (summary version 2) are differenced into the decider's
  :class:`~planner.ingest.traffic.TrafficWindows` by a :class:`~planner.shard.traffic.TrafficDiffer`, so
  ``Observation.traffic``, the diagnostics' ``traffic`` and a decision's explain read the same windows as on the
  unsharded path, over every shard's samples (leader and followers alike, so a follower that takes over has them).
- Perf model: the membership carries the planner's FPM limits (``ingest.limits``: the shards check every sample
  against them) and the fleet-wide rate of perf-model training points (``ingest.shards.perf_points_per_s``; 0, and
  no subscription, with ``perf_model.enabled: false``); the shards forward that many of their step
  samples (:mod:`planner.shard.perf_points`), and every tick the points of workers in the current membership are
  fed to the same :class:`~planner.service.perf_feed.PerfFeed` as on the unsharded path (leader and followers).

The merger compares the shards' wall-clock stamps with this process's wall clock (the shards and the leader
need clocks in step to well under ``max_summary_age_s``); the snapshot it hands the core is stamped on the
monotonic clock the core runs on.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from typing import Any

from planner.discovery import WorkerRecord
from planner.ingest.drops import FpmLimits
from planner.ingest.store import FleetSnapshot, FleetStore
from planner.ingest.subscriber import LinkStats, LinkTotals
from planner.ingest.traffic import TrafficWindows
from planner.service.metrics import PlannerMetrics
from planner.service.perf_feed import PerfFeed
from planner.shard.membership import membership_due, membership_parts, membership_subject
from planner.shard.merge import SummaryMerger
from planner.shard.partition import partition
from planner.shard.perf_points import DEFAULT_PERF_POINTS_PER_S, PerfPointListener, attribute
from planner.shard.process import SummaryListener, summary_subject
from planner.shard.traffic import TrafficDiffer

__all__ = ["ShardSummarySource", "ShardedIngest"]


class ShardSummarySource:
    """The merged shard summaries as an ingest source (what the runner and diagnostics read)."""

    def __init__(
        self,
        merger: SummaryMerger,
        listener: SummaryListener,
        *,
        namespace: str,
        wall_clock: Callable[[], float],
    ) -> None:
        self.merger = merger
        self.listener = listener
        self.namespace = namespace
        self.store: FleetStore = merger.layout  # the workers' slot table; never a sample
        self.lock = listener.lock
        self.wall_clock = wall_clock

    @property
    def received(self) -> int:
        """Summaries received (the samples themselves stay in the shards); the listener's counter."""
        return self.listener.received

    @received.setter
    def received(self, value: int) -> None:
        self.listener.received = value

    @property
    def loop_errors(self) -> int:
        return self.listener.loop_errors

    @loop_errors.setter
    def loop_errors(self, value: int) -> None:
        self.listener.loop_errors = value

    def set_workers(self, workers: Mapping[str, WorkerRecord]) -> None:
        with self.lock:
            self.merger.set_workers(workers)

    def live_shards(self, wall_now: float) -> list[str]:
        """The shards whose newest summary is fresh at ``wall_now``, sorted."""
        with self.lock:
            ages = self.merger.shards(wall_now)
        return sorted(shard for shard, age_s in ages.items() if age_s <= self.merger.max_summary_age_s)

    @property
    def endpoints(self) -> tuple[str, ...]:
        """The summary subjects of the live shards (what ``endpoints_connected`` counts in this mode)."""
        return tuple(summary_subject(self.namespace, s) for s in self.live_shards(self.wall_clock()))

    def snapshot(self, now: float) -> FleetSnapshot:
        """The merged snapshot, freshness judged on the wall clock now, stamped ``now`` (monotonic)."""
        wall_now = self.wall_clock()
        with self.lock:
            return self.merger.snapshot(wall_now, local_now=now)

    def start(self) -> ShardSummarySource:
        self.listener.start()
        return self

    def close(self) -> None:
        self.listener.close()

    def link_totals(self) -> LinkTotals:
        return LinkTotals(disconnects=self.listener.disconnects, reconnects=self.listener.reconnects)

    def links(self) -> dict[str, LinkStats]:
        """The connection to NATS as the one link (as on the NATS ingest path)."""
        stats = LinkStats(
            endpoint=",".join(self.listener.servers),
            connected=self.listener.connected,
            connections=self.listener.connects,
            disconnects=self.listener.disconnects,
            reconnects=self.listener.reconnects,
            connect_retries=0,
            protocol_errors=0,
            socket_replacements=0,
            backoff_s=0.0,
        )
        return {stats.endpoint: stats}

    def troubled_links(self, limit: int = 50) -> list[LinkStats]:
        if limit < 1 or (self.listener.connected and not self.listener.disconnects):
            return []
        return list(self.links().values())


class ShardedIngest:
    """The runner's ingest in sharded mode: merged summaries in, membership out (leader only)."""

    def __init__(
        self,
        source: ShardSummarySource,
        *,
        wall_clock: Callable[[], float],
        leader_name: str | None = None,
        max_part_bytes: int = 48 * 1024,
        membership_repeat_s: float = 10.0,
        limits: FpmLimits | None = None,
        perf_points: PerfPointListener | None = None,
        perf_points_per_s: float = DEFAULT_PERF_POINTS_PER_S,
    ) -> None:
        self.store: FleetStore = source.store
        self.source = source
        self.shards = source
        self.wall_clock = wall_clock
        self.leader_name = leader_name or f"{socket.gethostname()}:{os.getpid()}"
        self.max_part_bytes = max_part_bytes
        self.membership_seq = 0
        self.membership_published_at: float | None = None  # wall clock
        self.membership_bytes = 0
        self.membership_parts = 0
        self.membership_shards: tuple[str, ...] = ()
        self.membership_reason: str | None = None  # why the last one went out (membership_due)
        self.membership_repeat_s = membership_repeat_s
        self._published_workers: Mapping[str, WorkerRecord] | None = None
        # the partition of the published workers over the published shards (what each shard should report)
        self._owned: dict[str, frozenset[str]] = {}
        self.traffic: TrafficWindows | None = None
        self.traffic_differ = TrafficDiffer(started_at=wall_clock())
        self.limits = limits  # the planner's ingest.limits, sent to the shards in the membership
        self.perf_points = perf_points  # the shards' training points (None: not taken, the shards send none)
        self.perf_points_per_s = perf_points_per_s if perf_points is not None else 0.0
        self.points_fed = 0
        self.points_unattributed = 0  # points of a worker not in the membership (or a rank beyond its DP size)

    def attach_traffic(self, traffic: TrafficWindows) -> None:
        """The shards' traffic counters feed ``traffic`` (the decider's windows), differenced every tick."""
        self.traffic = traffic

    def set_workers(self, workers: Mapping[str, WorkerRecord]) -> None:
        self.source.set_workers(workers)

    def snapshot(self, now: float) -> FleetSnapshot:
        return self.source.snapshot(now)

    def start(self) -> None:
        self.source.start()
        if self.perf_points is not None:
            self.perf_points.start()

    def close(self) -> None:
        self.source.close()
        if self.perf_points is not None:
            self.perf_points.close()

    def read(
        self,
        now: float,
        *,
        workers: Mapping[str, WorkerRecord],
        perf: PerfFeed,
        metrics: PlannerMetrics,
        leader: bool,
    ) -> FleetSnapshot:
        """The merged snapshot (no sample reaches this process); the shards' traffic since the last tick is added
        to the attached windows first, and their training points of workers in ``workers`` feed ``perf``."""
        if self.perf_points is not None:
            fresh, refused = attribute(self.perf_points.take(), workers)
            self.points_fed += sum(map(len, fresh.values()))
            self.points_unattributed += refused
            perf.observe(fresh, now)
        if self.traffic is not None:
            with self.shards.lock:
                summaries = self.shards.merger.summaries()
            self.traffic_differ.feed(self.traffic, summaries.values(), wall_now=self.wall_clock(), local_now=now)
        snapshot = self.source.snapshot(now)
        metrics.observe_drops({str(k): v for k, v in snapshot.drops.items()})
        metrics.observe_links(self.source.link_totals())
        return snapshot

    def after_discovery(self, workers: Mapping[str, WorkerRecord], *, leader: bool) -> None:
        """The leader publishes the discovered workers and the live shard set (in parts under the payload cap)
        when they changed, a live shard does not report what the partition gives it, or every
        ``membership_repeat_s`` (:func:`~planner.shard.membership.membership_due`); the registry hands the same
        mapping while discovery is unchanged."""
        if not leader:
            return
        wall_now = self.wall_clock()
        shards = self.shards.live_shards(wall_now)
        with self.shards.lock:
            summaries = self.shards.merger.summaries()
        reason = membership_due(
            now=wall_now,
            published_at=self.membership_published_at,
            repeat_s=self.membership_repeat_s,
            workers_changed=workers is not self._published_workers,
            shards=shards,
            published_shards=self.membership_shards,
            owned=self._owned,
            summaries=summaries,
        )
        if reason is None:
            return
        self.membership_seq += 1
        parts = membership_parts(
            leader=self.leader_name,
            seq=self.membership_seq,
            taken_at=wall_now,
            shards=shards,
            workers=workers,
            max_part_bytes=self.max_part_bytes,
            limits=self.limits,
            perf_points_per_s=self.perf_points_per_s,
        )
        subject = membership_subject(self.shards.namespace)
        if all(self.shards.listener.publish(subject, part) for part in parts):
            self.membership_published_at = wall_now
            self.membership_bytes = sum(map(len, parts))
            self.membership_parts = len(parts)
            self.membership_shards = tuple(shards)
            self.membership_reason = reason
            if workers is not self._published_workers or set(self._owned) != set(shards):
                self._owned = {s: frozenset(ws) for s, ws in partition(workers, shards).items()} if shards else {}
            self._published_workers = workers

    def diagnostics(self) -> dict[str, Any]:
        """``mode``, every shard heard from (age of its newest summary, live or stale, what it owns) and the
        last membership published."""
        wall_now = self.wall_clock()
        merger = self.shards.merger
        with self.shards.lock:
            summaries = merger.summaries()
        shards = []
        for shard_id, summary in sorted(summaries.items()):
            age_s = wall_now - summary.taken_at
            shards.append(
                {
                    "shard_id": shard_id,
                    "summary_age_s": age_s,
                    "live": age_s <= merger.max_summary_age_s,
                    "seq": summary.seq,
                    "workers": len(summary.workers),
                    "ranks": len(summary.fresh),
                    "ranks_fresh": summary.fresh.count(1),
                    "received": summary.received,
                    "version": summary.version,
                    "traffic_services": sorted(summary.traffic),
                }
            )
        return {
            "mode": "sharded",
            "max_summary_age_s": merger.max_summary_age_s,
            "shards": shards,
            "bad_summaries": self.shards.listener.bad_summaries,
            "traffic": {
                "summaries_applied": self.traffic_differ.applied,
                "runs_baselined": self.traffic_differ.baselined,
                "resets": self.traffic_differ.resets,
            },
            "membership": {
                "leader": self.leader_name,
                "seq": self.membership_seq,
                "published_at_s": self.membership_published_at,
                "parts": self.membership_parts,
                "bytes": self.membership_bytes,
                "shards": list(self.membership_shards),
                "reason": self.membership_reason,
                "limits_sent": self.limits is not None,
            },
            "perf_points": self._perf_points(),
        }

    def _perf_points(self) -> dict[str, Any]:
        listener = self.perf_points
        return {
            "rate_per_s": self.perf_points_per_s,
            "received": 0 if listener is None else listener.points_received,
            "fed": self.points_fed,
            "unattributed": self.points_unattributed,
            "dropped_full": 0 if listener is None else listener.dropped_full,
            "bad_messages": 0 if listener is None else listener.bad_messages,
        }

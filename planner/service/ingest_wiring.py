"""The service's ingest wiring: the FleetStore, the source that feeds it, and what a tick reads of them.

:func:`build_ingest` builds the ingest the configuration names: an :class:`Ingest`, the direct ZMQ subscriber (the
default) or the NATS source (``ingest.transport: nats``), both feeding a local
:class:`~planner.ingest.store.FleetStore` (:mod:`planner.transport.settings`); or, with
``ingest.shards.enabled``, a :class:`~planner.service.sharded_ingest.ShardedIngest` that reads the ingest shards'
summaries and publishes the membership they follow. The runner holds one and, every
tick, asks it for the snapshot the decision core reads (:meth:`Ingest.read`: the snapshot, the perf models fed
from the store's windows, the drop and link counters into the metrics), hands it discovery changes
(:meth:`Ingest.set_workers`) and adds what it has to say to the diagnostics (:meth:`Ingest.diagnostics`).

Nothing here reads the clock: ``now`` arrives as an argument (the sharded ingest is handed a wall clock to
compare the shards' stamps with). It never imports the runner.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from planner.discovery import WorkerRecord
from planner.errors import ConfigError
from planner.ingest.store import FleetSnapshot, FleetStore
from planner.ingest.traffic import TrafficWindows
from planner.service.config import IngestConfig
from planner.service.metrics import PlannerMetrics
from planner.service.perf_feed import PerfFeed
from planner.service.sharded_ingest import ShardedIngest, ShardSummarySource
from planner.shard.merge import SummaryMerger
from planner.shard.perf_points import PerfPointListener
from planner.shard.process import SummaryListener
from planner.transport.settings import IngestSource, make_ingest_source

__all__ = ["Ingest", "TickIngest", "build_ingest"]


class TickIngest(Protocol):
    """What the runner uses of its ingest: :class:`Ingest`, or :class:`~planner.service.sharded_ingest.ShardedIngest`
    (``ingest.shards.enabled``)."""

    @property
    def store(self) -> FleetStore: ...

    @property
    def source(self) -> IngestSource: ...

    def attach_traffic(self, traffic: TrafficWindows) -> None: ...

    def set_workers(self, workers: Mapping[str, WorkerRecord]) -> None: ...

    def snapshot(self, now: float) -> FleetSnapshot: ...

    def read(
        self,
        now: float,
        *,
        workers: Mapping[str, WorkerRecord],
        perf: PerfFeed,
        metrics: PlannerMetrics,
        leader: bool,
    ) -> FleetSnapshot: ...

    def after_discovery(self, workers: Mapping[str, WorkerRecord], *, leader: bool) -> None: ...

    def diagnostics(self) -> dict[str, Any]: ...

    def start(self) -> None: ...

    def close(self) -> None: ...


class Ingest:
    """A local FleetStore fed by ``source`` (ZMQ or NATS): raw samples in, one snapshot per tick out."""

    def __init__(self, store: FleetStore, source: IngestSource) -> None:
        self.store = store
        self.source = source

    def attach_traffic(self, traffic: TrafficWindows) -> None:
        """The FPM traffic extension of every stored step sample feeds ``traffic`` (the decider's windows)."""
        self.store.traffic = traffic

    def set_workers(self, workers: Mapping[str, WorkerRecord]) -> None:
        """Follow discovery (called on every change)."""
        self.source.set_workers(workers)

    def snapshot(self, now: float) -> FleetSnapshot:
        return self.source.snapshot(now)

    def read(
        self,
        now: float,
        *,
        workers: Mapping[str, WorkerRecord],
        perf: PerfFeed,
        metrics: PlannerMetrics,
        leader: bool,
    ) -> FleetSnapshot:
        """What one tick reads at ``now``: the snapshot; the perf models are fed the samples stored since the
        last tick and the metrics follow the drop and link counters. (``leader``: unused on this path.)"""
        snapshot = self.source.snapshot(now)
        perf.feed(self.store, self.source.lock, workers, snapshot.now)
        metrics.observe_drops({str(k): v for k, v in snapshot.drops.items()})
        metrics.observe_links(self.source.link_totals())
        return snapshot

    def after_discovery(self, workers: Mapping[str, WorkerRecord], *, leader: bool) -> None:
        """Nothing to tell anyone after a discovery refresh on this path (the sharded leader publishes)."""

    def diagnostics(self) -> dict[str, Any]:
        """Keys this ingest adds to the diagnostics' ``ingest`` section (none on this path)."""
        return {}

    def start(self) -> None:
        self.source.start()

    def close(self) -> None:
        self.source.close()


def build_ingest(
    config: IngestConfig, *, perf_model_enabled: bool, wall_clock: Callable[[], float] = time.time
) -> TickIngest:
    """The ingest ``config`` names; raises ConfigError for settings that cannot work (a NATS password file that
    cannot be read, an unreadable CURVE key). With ``shards.enabled``: the merged shard summaries
    (:mod:`planner.service.sharded_ingest`; ``wall_clock`` is what their stamps are compared with), and the
    shards' perf-model training points at ``shards.perf_points_per_s`` while ``perf_model_enabled`` (else the
    leader announces rate 0 and takes none: nothing would learn from them)."""
    if config.shards.enabled:
        return _sharded(config, wall_clock, perf_model_enabled=perf_model_enabled)
    store = FleetStore(ttl_s=config.ttl_s, window_size=config.window_size, limits=config.limits)
    # ZMQ (default): the subscriber owns its ZMQ context, with the socket limit raised for large fleets.
    # NATS (ingest.transport: nats): the same store fed from NATS subjects (planner.transport).
    source = make_ingest_source(
        store,
        config.transport,
        config.nats,
        max_msg_bytes=config.max_msg_bytes,
        curve=config.curve_keys(),
        round_interval_s=config.round_interval_s,
    )
    return Ingest(store, source)


def _sharded(config: IngestConfig, wall_clock: Callable[[], float], *, perf_model_enabled: bool) -> ShardedIngest:
    nats = config.nats
    if not nats.servers or not nats.namespace:
        raise ConfigError("ingest.nats: servers and namespace must not be empty with shards.enabled")
    password = nats.password()
    merger = SummaryMerger(ttl_s=config.ttl_s, max_summary_age_s=config.shards.max_summary_age_s)
    listener = SummaryListener(
        merger, servers=nats.servers, namespace=nats.namespace, user=nats.user, password=password
    )
    source = ShardSummarySource(merger, listener, namespace=nats.namespace, wall_clock=wall_clock)
    rate_per_s = config.shards.perf_points_per_s if perf_model_enabled else 0.0
    points = None  # no model to feed, or rate 0: no subscription, and the membership tells the shards 0
    if rate_per_s > 0:
        points = PerfPointListener(servers=nats.servers, namespace=nats.namespace, user=nats.user, password=password)
    return ShardedIngest(
        source, wall_clock=wall_clock, limits=config.limits, perf_points=points, perf_points_per_s=rate_per_s
    )

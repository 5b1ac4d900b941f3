"""Where a simulated engine's forward-pass metrics go (:class:`FpmSink`): :class:`NullSink` emits nothing,
:class:`StoreSink` feeds a :class:`~planner.ingest.store.FleetStore` in-process (replay), :class:`ZmqSink`
publishes over real ZMQ through :class:`~worker_shim.publisher.FpmPublisher` (demo). Every call takes ``now``."""

from __future__ import annotations

from typing import Protocol

from planner.ingest.store import FleetStore
from planner.ingest.traffic import TrafficWindows
from planner.sim.engine import SimEngine
from worker_shim import fpm
from worker_shim.fpm import ForwardPassMetrics, QueuedRequests, ScheduledRequests

__all__ = ["FpmSink", "NullSink", "StoreSink", "ZmqSink"]


class FpmSink(Protocol):
    def attach(self, engine: SimEngine, now: float) -> str:
        """The engine starts serving; returns the FPM endpoint it publishes on."""
        ...

    def detach(self, engine: SimEngine, now: float) -> None: ...

    def step(
        self, engine: SimEngine, wall_time_s: float, scheduled: ScheduledRequests, queued: QueuedRequests, end_s: float
    ) -> None: ...

    def idle(self, engine: SimEngine, now: float) -> None:
        """Called at least once per heartbeat interval while the engine is ready (heartbeat when idle)."""
        ...


class NullSink:
    """Emits nothing (baselines that read engine state directly)."""

    def attach(self, engine: SimEngine, now: float) -> str:
        return f"sim://{engine.worker_id}/{engine.dp_rank}"

    def detach(self, engine: SimEngine, now: float) -> None:
        return None

    def step(
        self, engine: SimEngine, wall_time_s: float, scheduled: ScheduledRequests, queued: QueuedRequests, end_s: float
    ) -> None:
        return None

    def idle(self, engine: SimEngine, now: float) -> None:
        return None


class StoreSink:
    """Builds real :class:`ForwardPassMetrics` (one counter per engine, heartbeats included) and ingests them into
    a :class:`FleetStore` at the simulated time they would arrive."""

    def __init__(
        self, store: FleetStore, heartbeat_interval_s: float = 1.0, *, traffic: TrafficWindows | None = None
    ) -> None:
        self.store = store
        self.heartbeat_interval_s = heartbeat_interval_s
        if traffic is not None:
            store.traffic = traffic  # the store feeds it each stored sample's extension, as in the service
        self._counter: dict[str, int] = {}
        self._last_at: dict[str, float] = {}
        self._endpoint: dict[str, str] = {}
        self.samples = 0
        self.heartbeats = 0
        self.dropped = 0

    def attach(self, engine: SimEngine, now: float) -> str:
        endpoint = f"sim://{engine.worker_id}/{engine.dp_rank}"
        self._counter[engine.worker_id] = 0
        self._last_at[engine.worker_id] = now
        self._endpoint[engine.worker_id] = endpoint
        return endpoint

    def detach(self, engine: SimEngine, now: float) -> None:
        self._counter.pop(engine.worker_id, None)
        self._last_at.pop(engine.worker_id, None)
        self._endpoint.pop(engine.worker_id, None)

    def step(
        self, engine: SimEngine, wall_time_s: float, scheduled: ScheduledRequests, queued: QueuedRequests, end_s: float
    ) -> None:
        wid = engine.worker_id
        counter = self._counter.get(wid)
        if counter is None:
            return
        self._counter[wid] = counter + 1
        self._last_at[wid] = end_s
        sample = ForwardPassMetrics(
            worker_id=wid,
            dp_rank=engine.dp_rank,
            counter_id=counter,
            wall_time=wall_time_s,
            scheduled_requests=scheduled,
            queued_requests=queued,
            traffic=engine.traffic.take(),
        )
        self.samples += 1
        if self.store.ingest(self._endpoint[wid], sample, end_s, end_s) is not None:
            self.dropped += 1

    def idle(self, engine: SimEngine, now: float) -> None:
        wid = engine.worker_id
        last = self._last_at.get(wid)
        if last is None or engine.busy or now - last < self.heartbeat_interval_s:
            return
        counter = self._counter[wid]
        self._counter[wid] = counter + 1
        self._last_at[wid] = now
        self.heartbeats += 1
        if self.store.ingest(self._endpoint[wid], fpm.heartbeat(wid, engine.dp_rank, counter), now, now) is not None:
            self.dropped += 1


class ZmqSink:
    """One real :class:`~worker_shim.publisher.FpmPublisher` per engine (its own thread sends heartbeats), bound
    on ``tcp://{host}:{port}`` from ``base_port`` upwards (``base_port=0``: an ephemeral port)."""

    def __init__(self, *, host: str = "127.0.0.1", base_port: int = 0, heartbeat_interval_s: float = 1.0) -> None:
        from worker_shim.publisher import FpmPublisher  # imported here: replay must not need zmq threads

        self._cls = FpmPublisher
        self.host = host
        self.base_port = base_port
        self.heartbeat_interval_s = heartbeat_interval_s
        self._next_port = base_port
        self.publishers: dict[str, FpmPublisher] = {}

    def attach(self, engine: SimEngine, now: float) -> str:
        endpoint = f"tcp://{self.host}:{self._next_port if self.base_port else '*'}"
        if self.base_port:
            self._next_port += 1
        pub = self._cls(
            worker_id=engine.worker_id,
            dp_rank=engine.dp_rank,
            endpoint=endpoint,
            heartbeat_interval_s=self.heartbeat_interval_s,
        ).start()
        self.publishers[engine.worker_id] = pub
        bound = pub.bound_endpoint or endpoint
        return bound.replace("0.0.0.0", self.host)

    def detach(self, engine: SimEngine, now: float) -> None:
        pub = self.publishers.pop(engine.worker_id, None)
        if pub is not None:
            pub.close()

    def step(
        self, engine: SimEngine, wall_time_s: float, scheduled: ScheduledRequests, queued: QueuedRequests, end_s: float
    ) -> None:
        pub = self.publishers.get(engine.worker_id)
        if pub is not None:
            pub.publish(wall_time_s, scheduled, queued, engine.traffic.take())

    def idle(self, engine: SimEngine, now: float) -> None:
        return None  # the publisher thread sends heartbeats on its own clock

    def close(self) -> None:
        for pub in self.publishers.values():
            pub.close()
        self.publishers.clear()

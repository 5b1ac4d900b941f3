"""The runner: the only part of the planner that reads the clock and awaits I/O.

Every ``tick_interval_s`` it expires leases and follows discovery (the subscriber connects to the endpoints
of the known workers), reads the deployment's status from the actuator, takes a snapshot of the FleetStore,
runs the decision core, records every decision, and — when this planner is the leader — applies the final
counts through the actuator and records every outcome. Discovery is also refreshed every
``discovery.refresh_interval_s`` so a lapsed lease stops being listened to promptly.

The runner composes parts that never import it (arrows run from here down)::

    runner ──> ingest_wiring     the store and the source feeding it (ZMQ / NATS), what a tick reads of them
           ──> registry          registrations, leases, static file, discovery sources, conflict checks
           ──> perf_feed         the per-role perf models fed from the store
           ──> deciding          observation, the core's step, decision records, bounds
           ──> actuation         send-or-not gate, outcome records, status read, actuator errors
           ──> views             explain, what-if
           ──> diagnostics_view  the diagnostics document
           ──> deadline          the core's step and the what-if off the event loop, with deadlines (TickGuard)
           ──> operations        durable state + audit, pause, fallback, Events and conditions, decision log
           ──> state_restore     registrations as the durable state keeps them; taking the stored state over

Each part is handed what it needs (a clock function, a leader flag, the history); the runner wires them,
reads the clock and awaits the actuator.

Times: the FleetStore, the leases and the core run on the monotonic clock; what the API shows is wall-clock
Unix seconds (``*_at_s``), converted here.

Leadership: an optional elector object with an ``is_leader`` attribute (planner.actuators' Lease elector).
Followers run the core and serve the API and diagnostics but never call ``actuator.scale``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import msgspec

from planner.actuators.base import Actuator, ScaleRequest, ServiceStatus, replica_bounds
from planner.core import CoreConfig, CoreState, Observation, Traffic
from planner.core import load_config as load_core_config
from planner.discovery import Discovery, EngineCapacity, Role, WorkerRecord
from planner.errors import ActuatorError
from planner.ingest.store import FleetSnapshot, FleetStore
from planner.service.actuation import Actuation, ActuatorErrorEntry, Gate
from planner.service.auth import Credentials, load_credentials
from planner.service.config import ServiceConfig
from planner.service.deadline import OffLoop, TickGuard
from planner.service.deciding import Decider, agree_bounds
from planner.service.diagnostics_view import DiagnosticsView, TickFigures
from planner.service.history import DecisionEntry, History, OutcomeEntry
from planner.service.ingest_wiring import TickIngest, build_ingest
from planner.service.metrics import PlannerMetrics
from planner.service.operations import PAUSED, Operations, OperationsConfig, StatusSink, build_store
from planner.service.perf_feed import PerfFeed
from planner.service.registry import EndpointConflictError, Registration, WorkerRegistry, WorkerSource
from planner.service.schemas import BoundsResponse, ExplainResponse, WhatIfResponse, WorkersResponse
from planner.service.state_restore import registration_value, restore_state
from planner.service.state_store import RuntimeState, StateStore
from planner.service.views import explain, what_if_decisions, what_if_inputs
from planner.transport.settings import IngestSource

__all__ = [
    "ActuatorErrorEntry",
    "EndpointConflictError",
    "LeaderElector",
    "PlannerRunner",
    "Registration",
    "WorkerSource",
]

log = logging.getLogger(__name__)


class LeaderElector(Protocol):
    @property
    def is_leader(self) -> bool: ...


class PlannerRunner:
    """Owns the store, the subscriber and the parts; runs the discovery and tick loops."""

    def __init__(
        self,
        config: ServiceConfig,
        *,
        actuator: Actuator | None = None,
        elector: LeaderElector | None = None,
        sources: Sequence[Discovery] = (),
        state_store: StateStore | None = None,
        status_sink: StatusSink | None = None,
    ) -> None:
        """``sources``: further discovery sources (e.g. planner.k8s's PodDiscovery), merged after the static
        file and before registrations; one that also offers ``readiness(now) -> {worker_id: bool}`` reports
        workers the deployment holds not ready. ``state_store``: where runtime state lives (default: what
        ``operations.state`` names); ``status_sink``: where Events and conditions go (None: nowhere)."""
        self.config = config
        # refuses (ConfigError) tokens shorter than 32 bytes, repeated names, a bad tokens file
        self.credentials: Credentials = load_credentials(
            operator_token=config.auth_token,
            worker_token=config.auth_worker_token,
            read_token=config.auth_read_token,
            tokens_file=config.auth.tokens_file,
        )
        self.actuator = actuator
        self.sources = tuple(sources)
        self.elector = elector
        self.metrics = PlannerMetrics()
        self.history = History(max_decisions=config.history.max_decisions, max_outcomes=config.history.max_outcomes)
        # the store and the source that feeds it (ZMQ by default, NATS with ingest.transport: nats)
        self.ingest: TickIngest = build_ingest(config.ingest, perf_model_enabled=config.perf_model.enabled)
        self.store: FleetStore = self.ingest.store
        self.subscriber: IngestSource = self.ingest.source
        # released by stop()/close(); a runner collected without either is safe too (the ZMQ subscriber releases
        # its own sockets and context when collected)
        self._released = False
        self.registry = WorkerRegistry(
            config.discovery,
            sources=self.sources,
            clock=self.now,
            to_wall=self.to_wall,
            on_change=self.ingest.set_workers,
        )
        core_config = load_core_config(config.core_config_data())
        if actuator is not None:  # the core's effective bounds never exceed the actuator's (else: refused here)
            core_config = agree_bounds(core_config, replica_bounds(actuator))
        self.decider = Decider(core_config)
        self.ingest.attach_traffic(self.decider.fpm_traffic)  # the FPM traffic extension feeds the decider
        self.perf = PerfFeed(config.perf_model)
        self.actuation = Actuation(
            history=self.history,
            metrics=self.metrics,
            clock=self.now,
            wall_clock=time.time,
            max_errors=config.history.max_errors,
        )
        ops_config = OperationsConfig.from_mapping(config.operations)
        self.operations = Operations(
            ops_config,
            store=state_store or build_store(ops_config.state, time.time, config.kubernetes),
            metrics=self.metrics,
            sink=status_sink,
            clock=self.now,
            wall_clock=time.time,
        )
        self.view = DiagnosticsView(
            subscriber=self.subscriber,
            registry=self.registry,
            decider=self.decider,
            actuation=self.actuation,
            perf=self.perf,
            history=self.history,
            actuator_configured=actuator is not None,
            clock=self.now,
            wall_clock=time.time,
            is_leader=lambda: self.is_leader,
            tick_figures=self._tick_figures,
        )
        self.started_at = time.monotonic()
        self.ticks = 0
        self.tick_durations_s: deque[float] = deque(maxlen=1000)
        self.last_tick_at: float | None = None  # monotonic
        self.last_tick_error: str | None = None
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._tick_lock = asyncio.Lock()
        self._running = False
        # the core runs off the event loop with a deadline: a stuck step never freezes the API or SIGTERM
        # a replica whose ticks stop deciding for three intervals plus the deadline is not ticking
        self.tick_guard = TickGuard(
            clock=self.now,
            wall_clock=time.time,
            deadline_s=config.tick_deadline_s,
            stale_after_s=3 * config.tick_interval_s + config.tick_deadline_s,
        )
        self._what_if = OffLoop("planner-what-if", clock=self.now, slots=config.what_if_concurrency)
        set_health_check = getattr(elector, "set_health_check", None)
        if set_health_check is not None:  # the Lease elector renews only while ticks decide
            set_health_check(self.tick_guard.ticking)

    # -- clock ---------------------------------------------------------------------------------------------

    @staticmethod
    def now() -> float:
        return time.monotonic()

    def to_wall(self, mono: float) -> float:
        return time.time() - (time.monotonic() - mono)

    # -- leadership ----------------------------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return True if self.elector is None else bool(self.elector.is_leader)

    # -- the parts' state, read through (what tests and callers read) ------------------------------------

    @property
    def core_config(self) -> CoreConfig:
        return self.decider.core_config

    @property
    def core_state(self) -> CoreState:
        return self.decider.core_state

    @property
    def traffic(self) -> dict[Role, Traffic]:
        """Traffic set by whoever knows it (the demo's router); it overrides what the FPM extension gives."""
        return self.decider.traffic

    # -- discovery -----------------------------------------------------------------------------------------

    def register(
        self,
        worker_id: str,
        *,
        role: Role,
        service: str,
        dp_size: int,
        fpm_endpoints: tuple[str, ...],
        capacity: EngineCapacity,
        ttl_s: float | None,
        who: str = "",
    ) -> Registration:
        """Register or renew a worker's lease. Raises LeaseError (bad record, bad TTL, endpoint taken).
        ``who``: the credential's name; the registration is then kept in the durable state."""
        registration = self.registry.register(
            worker_id,
            role=role,
            service=service,
            dp_size=dp_size,
            fpm_endpoints=fpm_endpoints,
            capacity=capacity,
            ttl_s=ttl_s,
        )
        if who:
            value = registration_value(
                role=role, service=service, dp_size=dp_size, fpm_endpoints=fpm_endpoints, capacity=capacity, ttl_s=ttl_s
            )
            self.operations.record_registration(worker_id, value, who=who)
        return registration

    def deregister(self, worker_id: str, who: str = "") -> bool:
        gone = self.registry.deregister(worker_id)
        if who:
            self.operations.record_registration(worker_id, None, who=who)
        return gone

    def apply_state(self, state: RuntimeState) -> None:
        """Take the durable state over: run-time bounds, and the registrations this replica does not know."""
        restore_state(state, operations=self.operations, decider=self.decider, registry=self.registry)

    def refresh_discovery(self, now: float) -> Mapping[str, WorkerRecord]:
        return self.registry.refresh(now)

    def worker_views(self) -> WorkersResponse:
        return self.registry.worker_views()

    def worker_source(self, worker_id: str) -> WorkerSource:
        return self.registry.worker_source(worker_id)

    def snapshot(self) -> FleetSnapshot:
        return self.ingest.snapshot(self.now())

    # -- lifecycle -----------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the subscriber thread and the loops; returns at once."""
        if self._running:
            return
        self._running = True
        self._stop.clear()
        state = await asyncio.to_thread(self.operations.sync, force=True)
        if state is not None:
            self.apply_state(state)
        self.refresh_discovery(self.now())
        self.ingest.start()
        self._tasks = [
            asyncio.create_task(self._discovery_loop(), name="planner-discovery"),
            asyncio.create_task(self._tick_loop(), name="planner-tick"),
        ]

    def close(self) -> None:
        """Release the ingest (its sockets and threads) of a runner never started or already stopped; once."""
        if not self._released:
            self._released = True
            self.ingest.close()

    async def stop(self) -> None:
        """Stop the loops (a tick in progress finishes first) and close the subscriber (also when never started)."""
        if not self._running:
            self.close()
            return
        self._stop.set()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        await asyncio.to_thread(self.close)
        self._running = False

    @property
    def running(self) -> bool:
        return self._running and all(not t.done() for t in self._tasks)

    @property
    def ready(self) -> bool:
        return self.running and self.ticks > 0

    async def _sleep(self, seconds: float) -> bool:
        """Sleep unless stopped; True when stopped."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), timeout=seconds)
        return self._stop.is_set()

    async def _discovery_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh_discovery(self.now())
                # sharded ingest: the leader tells the shards the workers and the live shard set
                self.ingest.after_discovery(self.registry.workers, leader=self.is_leader)
            except Exception:  # a bad source must not stop the loop
                log.exception("discovery refresh failed")
            if await self._sleep(self.config.discovery.refresh_interval_s):
                return

    async def _tick_loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                await self.tick()
                self.last_tick_error = None
            except Exception as exc:  # the loop survives; the error is shown in diagnostics
                error = f"{type(exc).__name__}: {exc}"
                if error != self.last_tick_error:  # log each distinct failure once, not every tick
                    log.exception("planner tick failed")
                self.last_tick_error = error
            elapsed = time.monotonic() - started
            if await self._sleep(max(0.0, self.config.tick_interval_s - elapsed)):
                return

    # -- one tick ------------------------------------------------------------------------------------------

    async def read_status(self) -> Mapping[str, ServiceStatus] | None:
        if self.actuator is None:
            return None
        try:
            status = await asyncio.to_thread(self.actuator.status)
        except ActuatorError as exc:
            self.actuation.status_failed(exc)
            return None
        return self.actuation.status_read(status)

    async def tick(self) -> None:
        async with self._tick_lock:
            started = time.perf_counter()
            now = self.now()
            stored = await asyncio.to_thread(self.operations.sync)
            if stored is not None:
                self.apply_state(stored)
            self.refresh_discovery(now)
            status = await self.read_status()
            snapshot = self.ingest.read(
                self.now(), workers=self.registry.workers, perf=self.perf, metrics=self.metrics, leader=self.is_leader
            )
            observation = self.observe(snapshot, status)
            decided = await self.tick_guard.decide(self.decider.decide, observation, snapshot.now, self.perf.predictors)
            if decided is None:  # held: nothing decided, nothing sent
                self.ticks += 1
                self.last_tick_at = now
                self.tick_durations_s.append(time.perf_counter() - started)
                return
            state, decisions = decided
            planned = self.decider.commit(
                state,
                observation,
                decisions,
                history=self.history,
                metrics=self.metrics,
                tick=self.ticks + 1,
                leader=self.is_leader,
                wall_s=time.time(),
            )
            outcomes = [
                await self.apply(item.request, role=item.role, decision_id=item.decision_id) for item in planned
            ]
            for request, role in self.operations.fallback(decisions, snapshot.now):
                outcomes.append(await self.apply(request, role=role, decision_id=None))
            await asyncio.to_thread(
                self.operations.after_tick,
                decisions,
                outcomes,
                leader=self.is_leader,
                advisory=self.actuator is None,
            )
            self.ticks += 1
            self.last_tick_at = now
            duration_s = time.perf_counter() - started
            self.tick_durations_s.append(duration_s)
            self.metrics.tick_duration_seconds.observe(duration_s)

    def observe(self, snapshot: FleetSnapshot, status: Mapping[str, ServiceStatus] | None) -> Observation:
        return self.decider.observe(self.registry.workers, snapshot, status, self.registry.not_ready(self.now()))

    # -- actuator ------------------------------------------------------------------------------------------

    async def apply(self, request: ScaleRequest, *, role: str, decision_id: int | None) -> OutcomeEntry:
        """Send one scale request through the actuator (leader only), carrying the count it expects to replace,
        and record what became of it. While the status is unreadable nothing below the last known count is
        sent."""
        at_s = time.time()
        gate = self.actuation.gate(request, leader=self.is_leader, configured=self.actuator is not None)
        paused = self.operations.gate(request.service)
        if paused is not None:
            gate = Gate(kind=PAUSED, message=paused)
        if gate is None:
            request, gate = self.actuation.expect(request)
        if gate is not None or self.actuator is None:
            return self.actuation.record(request, role=role, decision_id=decision_id, at_s=at_s, gate=gate)
        try:
            outcome = await asyncio.to_thread(self.actuator.scale, request)
        except ActuatorError as exc:
            return self.actuation.record(request, role=role, decision_id=decision_id, at_s=at_s, failure=exc)
        return self.actuation.record(request, role=role, decision_id=decision_id, at_s=at_s, outcome=outcome)

    # -- read models ---------------------------------------------------------------------------------------

    def explain(self, entry: DecisionEntry) -> ExplainResponse:
        """A decision with its inputs, coverage, every pipeline stage (value and reason) and its outcomes."""
        return explain(entry, self.history)

    async def what_if(self, request: Mapping[str, Any]) -> WhatIfResponse:
        """What the core would decide now under the given traffic, load or SLA; nothing is applied or kept.
        The core runs off the event loop: raises DeadlineMissed after ``what_if_deadline_s``, Busy when
        ``what_if_concurrency`` what-ifs are still computing."""
        now = self.now()
        observation = self.observe(self.ingest.snapshot(now), self.actuation.status)
        observation, config = what_if_inputs(
            observation, self.decider.core_config, self.decider.last_decisions, request
        )
        decisions = await self._what_if.run(
            what_if_decisions,
            self.decider.core_state,
            observation,
            now,
            config,
            self.perf.predictors,
            deadline_s=self.config.what_if_deadline_s,
        )
        return WhatIfResponse(applied=False, decided_at_s=time.time(), decisions=decisions)

    def bounds(self) -> BoundsResponse:
        return self.decider.bounds()

    def patch_bounds(self, patch: Mapping[str, Any], who: str = "") -> BoundsResponse:
        """Merge ``patch`` into the bounds the next tick uses. Raises ConfigError (nothing changed). ``who``:
        the credential's name; the new bounds are then kept in the durable state."""
        result = self.decider.patch_bounds(patch)
        if who:
            self.operations.record_bounds(patch, msgspec.to_builtins(result), who=who)
        return result

    def diagnostics(self) -> dict[str, Any]:
        """Everything an operator needs to see why the planner does what it does (see docs/service.md)."""
        document = self.view.document()
        document["ingest"].update(self.ingest.diagnostics())
        return document

    def _tick_figures(self) -> TickFigures:
        return TickFigures(
            ticks=self.ticks,
            last_tick_at_s=None if self.last_tick_at is None else self.to_wall(self.last_tick_at),
            last_tick_error=self.last_tick_error,
            tick_interval_s=self.config.tick_interval_s,
            last_tick_duration_ms=None if not self.tick_durations_s else self.tick_durations_s[-1] * 1000.0,
            last_tick_hold=self.tick_guard.last_hold,
            tick_holds=dict(self.tick_guard.holds),
            ticking=self.tick_guard.ticking(),
        )

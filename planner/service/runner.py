"""The runner: the only part of the planner that reads the clock and awaits I/O.

Every ``tick_interval_s`` it expires leases and follows discovery (the subscriber connects to the endpoints
of the known workers), reads the deployment's status from the actuator, takes a snapshot of the FleetStore,
runs the decision core, records every decision, and — when this planner is the leader — applies the final
counts through the actuator and records every outcome. Discovery is also refreshed every
``discovery.refresh_interval_s`` so a lapsed lease stops being listened to promptly.

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

from perf_model.api import PerfPredictor
from perf_model.model import PerfModel
from perf_model.step_timer import ProfileStepTimer
from planner.actuators.base import Actuator, OutcomeKind, ScaleOutcome, ScaleRequest, ServiceStatus
from planner.core import (
    Action,
    Bounds,
    CoreConfig,
    CoreState,
    Decision,
    DeploymentStatus,
    Observation,
    RoleBounds,
    RoleLoad,
    Traffic,
    step,
)
from planner.core import load_config as load_core_config
from planner.discovery import Discovery, EngineCapacity, LeaseRegistry, Role, StaticFileDiscovery, WorkerRecord
from planner.errors import ActuatorError, ConfigError, DiscoveryError, LeaseError, PlannerError
from planner.ingest.store import FleetSnapshot, FleetStore
from planner.ingest.subscriber import FpmSubscriber
from planner.service.config import ServiceConfig
from planner.service.history import DecisionEntry, History, OutcomeEntry
from planner.service.metrics import PlannerMetrics
from planner.service.schemas import (
    BoundsResponse,
    ExplainResponse,
    RoleBoundsView,
    WhatIfResponse,
    WorkersResponse,
    WorkerView,
)
from worker_shim.fpm import ForwardPassMetrics

__all__ = [
    "ActuatorErrorEntry",
    "EndpointConflictError",
    "LeaderElector",
    "PlannerRunner",
    "Registration",
    "WorkerSource",
]

log = logging.getLogger(__name__)

_DEFERRED = "deferred"  # outcome kind: not sent because the API server's Retry-After has not passed
_ENDPOINT_SCHEMES = ("tcp://", "ipc://", "inproc://")


class EndpointConflictError(LeaseError):
    """A registration naming an FPM endpoint another registered worker already holds."""


class LeaderElector(Protocol):
    @property
    def is_leader(self) -> bool: ...


class WorkerSource(msgspec.Struct, frozen=True, kw_only=True):
    """Where a worker came from and, for a lease, when it lapses (wall clock)."""

    source: str  # "registration" | "static"
    expires_at_s: float | None


class Registration(msgspec.Struct, frozen=True, kw_only=True):
    worker_id: str
    expires_at_s: float


class ActuatorErrorEntry(msgspec.Struct, frozen=True, kw_only=True):
    at_s: float
    operation: str  # "status" | "scale"
    service: str
    kind: str
    message: str


class PlannerRunner:
    """Owns the store, the subscriber, discovery, the actuator and the history; runs the tick loop."""

    def __init__(
        self,
        config: ServiceConfig,
        *,
        actuator: Actuator | None = None,
        elector: LeaderElector | None = None,
        sources: Sequence[Discovery] = (),
    ) -> None:
        """``sources``: further discovery sources (e.g. planner.k8s's PodDiscovery), merged after the static
        file and before registrations; one that also offers ``readiness(now) -> {worker_id: bool}`` reports
        workers the deployment holds not ready."""
        self.config = config
        self.actuator = actuator
        self.sources = tuple(sources)
        self.elector = elector
        self.metrics = PlannerMetrics()
        self.history = History(max_decisions=config.history.max_decisions, max_outcomes=config.history.max_outcomes)
        self.store = FleetStore(ttl_s=config.ingest.ttl_s, window_size=config.ingest.window_size)
        # The subscriber owns its ZMQ context, with the socket limit raised for large fleets.
        self.subscriber = FpmSubscriber(self.store, max_msg_bytes=config.ingest.max_msg_bytes)
        self.leases = LeaseRegistry(default_ttl_s=config.discovery.default_ttl_s, max_ttl_s=config.discovery.max_ttl_s)
        self.static: StaticFileDiscovery | None = None
        if config.discovery.static_file is not None:
            try:
                self.static = StaticFileDiscovery(config.discovery.static_file)
            except DiscoveryError as exc:
                raise ConfigError(f"discovery.static_file: {exc}") from exc
        self.actuator_errors: deque[ActuatorErrorEntry] = deque(maxlen=config.history.max_errors)
        self.started_at = time.monotonic()
        self.ticks = 0
        self.tick_durations_s: deque[float] = deque(maxlen=1000)
        self.last_tick_at: float | None = None  # monotonic
        self.last_tick_error: str | None = None
        self.status: Mapping[str, ServiceStatus] | None = None
        self.status_error: str | None = None
        self.core_config: CoreConfig = load_core_config(config.core_config_data())
        self.core_state = CoreState()
        self.perf_models: dict[Role, PerfModel] = {}
        if config.perf_model.enabled:
            bootstrap = None
            if config.perf_model.profile_dir is not None:
                try:
                    bootstrap = ProfileStepTimer.from_dir(config.perf_model.profile_dir)
                except (PlannerError, OSError, ValueError) as exc:
                    raise ConfigError(f"perf_model.profile_dir: {exc}") from exc
            self.perf_models = {role: PerfModel(role, bootstrap=bootstrap) for role in Role}
        self.predictors: dict[Role, PerfPredictor] | None = dict(self.perf_models) or None
        self.perf_model_error: str | None = None
        self._fed_at: dict[tuple[str, int], float] = {}
        self._retry_not_before: dict[str, float] = {}  # service -> monotonic time a Retry-After allows again
        self.last_observation: Observation | None = None
        self.last_decisions: dict[str, Decision] = {}
        self.traffic: dict[Role, Traffic] = {}  # set by whoever knows it (the demo's router); none by default
        self._workers: dict[str, WorkerRecord] = {}
        self._sources: dict[str, str] = {}
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._tick_lock = asyncio.Lock()
        self._running = False

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
    ) -> Registration:
        """Register or renew a worker's lease. Raises LeaseError (bad record, bad TTL, endpoint taken)."""
        if not self.config.discovery.registration:
            raise LeaseError("the registration API is disabled (discovery.registration: false)")
        if self.static is not None and worker_id in self.static.workers(self.now()):
            raise LeaseError(f"worker {worker_id!r} is listed in the static workers file; it cannot register")
        for endpoint in fpm_endpoints:
            if not endpoint.startswith(_ENDPOINT_SCHEMES) or len(endpoint) <= len(endpoint.split("//")[0]) + 2:
                raise LeaseError(
                    f"worker {worker_id!r}: fpm endpoint {endpoint!r} is not a ZMQ endpoint "
                    "(tcp://host:port, ipc://path or inproc://name)"
                )
        try:
            record = WorkerRecord(
                worker_id=worker_id,
                role=role,
                service=service,
                dp_size=dp_size,
                fpm_endpoints=fpm_endpoints,
                capacity=capacity,
            )
        except ValueError as exc:
            raise LeaseError(str(exc)) from exc
        now = self.now()
        current = dict(self.leases.workers(now))
        if self.static is not None:
            current.update(self.static.workers(now))
        for other_id, other in current.items():
            taken = set(other.fpm_endpoints).intersection(fpm_endpoints)
            if other_id != worker_id and taken:
                raise EndpointConflictError(
                    f"worker {worker_id!r}: endpoint {sorted(taken)[0]} is already registered by {other_id!r}"
                )
        expires = self.leases.register(record, now, ttl_s)
        self.refresh_discovery(now)
        return Registration(worker_id=worker_id, expires_at_s=self.to_wall(expires))

    def deregister(self, worker_id: str) -> bool:
        gone = self.leases.deregister(worker_id)
        if gone:
            self.refresh_discovery(self.now())
        return gone

    def refresh_discovery(self, now: float) -> Mapping[str, WorkerRecord]:
        """Merge the sources (static first: a registration cannot shadow it) and let the subscriber follow."""
        workers: dict[str, WorkerRecord] = {}
        sources: dict[str, str] = {}
        if self.static is not None:
            for wid, record in self.static.workers(now).items():
                workers[wid] = record
                sources[wid] = "static"
        for source in self.sources:
            label = _source_label(source)
            try:
                found = source.workers(now)
            except DiscoveryError as exc:
                log.warning("discovery source %s failed: %s", label, exc)
                continue
            for wid, record in found.items():
                if wid not in workers:
                    workers[wid] = record
                    sources[wid] = label
        for wid, record in self.leases.workers(now).items():
            if wid not in workers:
                workers[wid] = record
                sources[wid] = "registration"
        if workers != self._workers:
            self._workers = workers
            self.subscriber.set_workers(workers)
        self._sources = sources
        return workers

    @property
    def workers(self) -> Mapping[str, WorkerRecord]:
        return self._workers

    def worker_views(self) -> WorkersResponse:
        views = []
        for wid, record in sorted(self._workers.items()):
            source = self.worker_source(wid)
            views.append(
                WorkerView(
                    worker_id=wid,
                    role=record.role.value,
                    service=record.service,
                    dp_size=record.dp_size,
                    fpm_endpoints=record.fpm_endpoints,
                    capacity=record.capacity,
                    source=source.source,
                    expires_at_s=source.expires_at_s,
                )
            )
        return WorkersResponse(workers=tuple(views))

    def worker_source(self, worker_id: str) -> WorkerSource:
        expires = self.leases.expires_at(worker_id)
        return WorkerSource(
            source=self._sources.get(worker_id, "registration"),
            expires_at_s=None if expires is None else self.to_wall(expires),
        )

    def snapshot(self) -> FleetSnapshot:
        return self.subscriber.snapshot(self.now())

    # -- lifecycle -----------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the subscriber thread and the loops; returns at once."""
        if self._running:
            return
        self._running = True
        self._stop.clear()
        self.refresh_discovery(self.now())
        self.subscriber.start()
        self._tasks = [
            asyncio.create_task(self._discovery_loop(), name="planner-discovery"),
            asyncio.create_task(self._tick_loop(), name="planner-tick"),
        ]

    async def stop(self) -> None:
        """Stop the loops (a tick in progress finishes first) and close the subscriber."""
        if not self._running:
            return
        self._stop.set()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        await asyncio.to_thread(self.subscriber.close)
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
            self.status_error = f"{type(exc).__name__}: {exc}"
            self._actuator_error("status", "", type(exc).__name__, str(exc))
            return None
        self.status_error = None
        return dict(status)

    async def tick(self) -> None:
        async with self._tick_lock:
            started = time.perf_counter()
            now = self.now()
            self.refresh_discovery(now)
            self.status = await self.read_status()
            snapshot = self.subscriber.snapshot(self.now())
            self._feed_perf_models(snapshot.now)
            self.metrics.observe_drops({str(k): v for k, v in snapshot.drops.items()})
            await self._decide_and_act(snapshot, self.status, snapshot.now)
            self.ticks += 1
            self.last_tick_at = now
            duration_s = time.perf_counter() - started
            self.tick_durations_s.append(duration_s)
            self.metrics.tick_duration_seconds.observe(duration_s)

    def _not_ready_now(self) -> set[str]:
        """Discovered workers a source with readiness (pods) reports not ready."""
        out: set[str] = set()
        for source in self.sources:
            readiness = getattr(source, "readiness", None)
            if readiness is None:
                continue
            out.update(wid for wid, ready in readiness(self.now()).items() if not ready and wid in self._workers)
        return out

    def _feed_perf_models(self, now: float) -> None:
        """Offer the perf models the step samples stored since the last tick — at most
        ``perf_model.max_samples_per_tick``, the newest of every rank in equal shares (a model keeps a bounded,
        load-binned store; a large fleet produces far more samples than it needs) — then refit on their cadence.
        A model that fails is reported in diagnostics and left out of this tick (threshold mode)."""
        if not self.perf_models:
            return
        fresh: dict[Role, list[ForwardPassMetrics]] = {}
        with self.subscriber.lock:
            pending = []
            for key, window in self.store.iter_windows():
                record = self._workers.get(key[0])
                if record is not None and window and window[-1][0] > self._fed_at.get(key, -1.0):
                    pending.append((key, record.role, window))
            share = max(1, self.config.perf_model.max_samples_per_tick // max(1, len(pending)))
            for key, role, window in pending:
                since = self._fed_at.get(key, -1.0)
                newest: list[ForwardPassMetrics] = []
                for at, sample in reversed(window):
                    if at <= since or len(newest) >= share:
                        break
                    newest.append(sample)
                fresh.setdefault(role, []).extend(reversed(newest))  # in publishing order, as the model expects
                self._fed_at[key] = window[-1][0]
        for key in [k for k in self._fed_at if k[0] not in self._workers]:
            del self._fed_at[key]
        try:
            for role, samples in fresh.items():
                self.perf_models[role].observe_many(samples, now)
            for model in self.perf_models.values():
                model.maybe_refit(now)
        except Exception as exc:  # a model bug must not stop the planner deciding
            self.perf_model_error = f"{type(exc).__name__}: {exc}"
            log.exception("perf model update failed; deciding without it")
            self.predictors = None
            return
        self.perf_model_error = None
        self.predictors = dict(self.perf_models)

    def observe(self, snapshot: FleetSnapshot, status: Mapping[str, ServiceStatus] | None) -> Observation:
        not_ready: dict[str, list[str]] = {}
        for wid in self._not_ready_now():
            not_ready.setdefault(self._workers[wid].service, []).append(wid)
        deployments = (
            {}
            if status is None
            else {
                name: DeploymentStatus.from_service_status(st, not_ready_workers=tuple(sorted(not_ready.get(name, ()))))
                for name, st in status.items()
            }
        )
        return Observation(
            workers=dict(self._workers), fleet=snapshot, deployments=deployments, traffic=dict(self.traffic)
        )

    async def _decide_and_act(
        self, snapshot: FleetSnapshot, status: Mapping[str, ServiceStatus] | None, now: float
    ) -> None:
        observation = self.observe(snapshot, status)
        self.core_state, decisions = step(
            self.core_state, observation, now, self.core_config, predictors=self.predictors
        )
        self.last_observation = observation
        self.last_decisions = {d.service: d for d in decisions}
        leader = self.is_leader
        wall = time.time()
        tick = self.ticks + 1
        entries: list[DecisionEntry] = []
        for decision in decisions:
            entry = DecisionEntry(
                id=self.history.next_decision_id(),
                tick=tick,
                role=decision.role.value,
                service=decision.service,
                decided_at_s=wall,
                leader=leader,
                current=decision.current_replicas,
                recommended=decision.recommended_replicas,
                final=decision.final_replicas,
                action=decision.action.value,
                reasons=tuple(r.value for r in decision.reasons),
                summary=decision.summary,
                decision=decision,
            )
            self.history.add_decision(entry)
            entries.append(entry)
            self.metrics.observe_decision(
                decision.role.value,
                current=decision.current_replicas,
                recommended=decision.recommended_replicas,
                final=decision.final_replicas,
                reasons=entry.reasons,
                ttft_ms=decision.inputs.predicted_ttft_ms,
                itl_ms=decision.inputs.predicted_itl_ms,
            )
        self.history.set_latest(entries)
        for entry in entries:
            decision = entry.decision
            if decision.action != Action.HOLD:
                request = ScaleRequest(
                    service=decision.service,
                    replicas=decision.final_replicas,
                    reason=entry.reasons[0] if entry.reasons else decision.action.value,
                )
                await self.apply(request, role=decision.role.value, decision_id=entry.id)

    # -- explain, what-if, bounds -------------------------------------------------------------------------

    def explain(self, entry: DecisionEntry) -> ExplainResponse:
        """A decision with its inputs, coverage, every pipeline stage (value and reason) and its outcomes."""
        decision = entry.decision
        outcomes = tuple(o for o in self.history.outcomes(limit=10_000) if o.decision_id == entry.id)
        return ExplainResponse(
            id=entry.id,
            core_id=decision.id,
            tick=entry.tick,
            role=entry.role,
            service=entry.service,
            decided_at_s=entry.decided_at_s,
            leader=entry.leader,
            mode=decision.mode.value,
            current=entry.current,
            recommended=entry.recommended,
            final=entry.final,
            action=entry.action,
            reasons=entry.reasons,
            summary=entry.summary,
            inputs=decision.inputs,
            coverage=decision.coverage,
            stages=decision.stages,
            outcomes=outcomes,
        )

    def what_if(self, request: Mapping[str, Any]) -> WhatIfResponse:
        """What the core would decide now under the given traffic, load or SLA; nothing is applied or kept."""
        now = self.now()
        observation = self.observe(self.subscriber.snapshot(now), self.status)
        traffic = dict(observation.traffic)
        overrides: dict[Role, RoleLoad] = {}
        config = self.core_config
        roles = dict(config.roles)
        for role_key, spec in (request.get("roles") or {}).items():
            role = Role(role_key)
            given = {k: spec[k] for k in ("request_rate_per_s", "isl_tokens", "osl_tokens") if k in spec}
            if given:
                base = traffic.get(role) or Traffic()
                traffic[role] = msgspec.structs.replace(base, **given)
            load_given = {k: float(spec[k]) for k in RoleLoad.__struct_fields__ if k in spec}
            scale = spec.get("load_scale")
            if load_given or scale is not None:
                measured = self._measured_load(role)
                factor = 1.0 if scale is None else float(scale)
                values = {k: getattr(measured, k) * factor for k in RoleLoad.__struct_fields__}
                values.update(load_given)
                overrides[role] = RoleLoad(**values)
            sla_given = {k: float(spec[k]) for k in ("ttft_ms", "itl_ms") if k in spec}
            if sla_given:
                role_config = config.role(role)
                try:
                    sla = msgspec.structs.replace(role_config.sla, **sla_given)
                    roles[role] = msgspec.structs.replace(role_config, sla=sla)
                except ValueError as exc:
                    raise ConfigError(f"roles.{role.value}: {exc}") from exc
        if roles != config.roles:
            config = CoreConfig(roles=roles, max_total_gpus=config.max_total_gpus)
        observation = msgspec.structs.replace(observation, traffic=traffic, load_override=overrides)
        _, decisions = step(self.core_state, observation, now, config, predictors=self.predictors)
        return WhatIfResponse(applied=False, decided_at_s=time.time(), decisions=decisions)

    def _measured_load(self, role: Role) -> RoleLoad:
        for decision in self.last_decisions.values():
            if decision.role == role:
                inputs = decision.inputs
                return RoleLoad(
                    queued_prefill_tokens=inputs.queued_prefill_tokens,
                    scheduled_prefill_tokens=inputs.scheduled_prefill_tokens,
                    decode_requests=inputs.decode_requests,
                    queued_decode_requests=inputs.queued_decode_requests,
                    decode_kv_tokens=inputs.decode_kv_tokens,
                )
        return RoleLoad()

    def bounds(self) -> BoundsResponse:
        bounds = self.core_config.bounds()
        return BoundsResponse(
            roles={
                role.value: RoleBoundsView(
                    min_replicas=rb.min_replicas,
                    max_replicas=rb.max_replicas,
                    gpus_per_replica=self.core_config.role(role).gpus_per_replica,
                )
                for role, rb in sorted(bounds.roles.items())
            },
            max_total_gpus=bounds.max_total_gpus,
        )

    def patch_bounds(self, patch: Mapping[str, Any]) -> BoundsResponse:
        """Merge ``patch`` (``roles.<role>.min_replicas|max_replicas``, ``max_total_gpus``) into the bounds
        the next tick uses. Raises ConfigError (nothing changed) when the result does not validate."""
        current = self.core_config.bounds()
        roles = dict(current.roles)
        try:
            for role_key, spec in (patch.get("roles") or {}).items():
                role = Role(role_key)
                old = roles.get(role) or self.core_config.role(role).bounds
                roles[role] = RoleBounds(
                    min_replicas=_given(spec.get("min_replicas"), old.min_replicas),
                    max_replicas=_given(spec.get("max_replicas"), old.max_replicas),
                )
            max_total_gpus = patch["max_total_gpus"] if "max_total_gpus" in patch else current.max_total_gpus
            self.core_config = self.core_config.with_bounds(Bounds(roles=roles, max_total_gpus=max_total_gpus))
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        return self.bounds()

    # -- actuator ------------------------------------------------------------------------------------------

    async def apply(self, request: ScaleRequest, *, role: str, decision_id: int | None) -> OutcomeEntry:
        """Send one scale request through the actuator (leader only) and record what became of it."""
        at_s = time.time()
        outcome: ScaleOutcome | None = None
        not_before = self._retry_not_before.get(request.service)
        wait_s = None if not_before is None else not_before - self.now()
        if wait_s is not None and wait_s > 0:
            kind, applied, message = (
                _DEFERRED,
                False,
                f"not sent: the API server asked to retry after {wait_s:.1f} more s (Retry-After)",
            )
        elif not self.is_leader:
            kind, applied, message = (
                OutcomeKind.NOT_LEADER.value,
                False,
                "not the leader: recorded, not applied",
            )
        elif self.actuator is None:
            kind, applied, message = (
                OutcomeKind.ADVISORY.value,
                False,
                "no actuator configured: recorded only",
            )
        else:
            try:
                outcome = await asyncio.to_thread(self.actuator.scale, request)
            except ActuatorError as exc:
                kind, applied, message = "error", False, f"{type(exc).__name__}: {exc}"
            else:
                kind, applied, message = outcome.kind.value, outcome.applied, outcome.message
                if outcome.retry_after_s is not None and outcome.retry_after_s > 0:
                    self._retry_not_before[request.service] = self.now() + outcome.retry_after_s
                else:
                    self._retry_not_before.pop(request.service, None)
        entry = OutcomeEntry(
            id=self.history.next_outcome_id(),
            decision_id=decision_id,
            role=role,
            service=request.service,
            at_s=at_s,
            requested=request.replicas,
            kind=kind,
            applied=applied,
            message=message,
            outcome={} if outcome is None else msgspec.to_builtins(outcome),
        )
        self.history.add_outcome(entry)
        self.metrics.observe_outcome(kind)
        log.info("scale %s to %d (decision %s): %s %s", request.service, request.replicas, decision_id, kind, message)
        if kind in ("error", _DEFERRED) or (
            outcome is not None
            and not outcome.applied
            and outcome.kind
            not in (
                OutcomeKind.UNCHANGED,
                OutcomeKind.ADVISORY,
            )
        ):
            self._actuator_error("scale", request.service, kind, message)
        return entry

    def _actuator_error(self, operation: str, service: str, kind: str, message: str) -> None:
        self.actuator_errors.append(
            ActuatorErrorEntry(at_s=time.time(), operation=operation, service=service, kind=kind, message=message)
        )

    # -- diagnostics ---------------------------------------------------------------------------------------

    def diagnostics(self) -> dict[str, Any]:
        """Everything an operator needs to see why the planner does what it does (see docs/service.md)."""
        now = self.now()
        snapshot = self.subscriber.snapshot(now)
        workers: list[dict[str, Any]] = []
        not_ready = self._not_ready_now()
        for wid, record in sorted(self._workers.items()):
            source = self.worker_source(wid)
            ranks = []
            for rank in range(record.dp_size):
                view = snapshot.ranks.get((wid, rank))
                endpoint = record.fpm_endpoints[rank]
                seen = snapshot.endpoints.get(endpoint)
                ranks.append(
                    {
                        "dp_rank": rank,
                        "endpoint": endpoint,
                        "fresh": bool(view and view.fresh),
                        "last_sample_age_s": None if view is None else view.age_s,
                        "last_active_age_s": None if view is None else view.active_age_s,
                        "samples": 0 if view is None else view.samples,
                        "heartbeats": 0 if view is None else view.heartbeats,
                        "counter_restarts": 0 if view is None else view.restarts,
                        "counter_gaps": 0 if view is None else view.gaps,
                        "lost_samples": 0 if view is None else view.lost_samples,
                        "endpoint_publishes_as": None if seen is None else seen.worker_id,
                        "endpoint_publishes_rank": None if seen is None else seen.dp_rank,
                        "load": _load(view.last_active if view is not None else None),
                    }
                )
            drops = snapshot.drops_by_worker.get(wid, {})
            workers.append(
                {
                    "worker_id": wid,
                    "role": record.role.value,
                    "service": record.service,
                    "dp_size": record.dp_size,
                    "source": source.source,
                    "lease_expires_at_s": source.expires_at_s,
                    "capacity": msgspec.to_builtins(record.capacity),
                    "ranks": ranks,
                    "drops": {str(k): v for k, v in drops.items() if v},
                    **self._classification(wid, ranks, not_ready),
                }
            )
        services = self._service_counts(workers)
        return {
            "now_s": time.time(),
            "leader": self.is_leader,
            "leadership": "leader" if self.is_leader else "follower",
            "ticks": self.ticks,
            "last_tick_at_s": None if self.last_tick_at is None else self.to_wall(self.last_tick_at),
            "last_tick_error": self.last_tick_error,
            "tick_interval_s": self.config.tick_interval_s,
            "last_tick_duration_ms": None if not self.tick_durations_s else self.tick_durations_s[-1] * 1000.0,
            "ingest": {
                "ttl_s": snapshot.ttl_s,
                "received": self.subscriber.received,
                "loop_errors": self.subscriber.loop_errors,
                "endpoints_connected": len(self.subscriber.endpoints),
                "leases_expired": self.leases.expired,
                "static_file_error": None if self.static is None else self.static.last_error,
            },
            "workers": workers,
            "services": services,
            "roles": _role_counts(services),
            "drops": {str(k): v for k, v in snapshot.drops.items()},
            "actuator": {
                "configured": self.actuator is not None,
                "status_error": self.status_error,
                "status": None if self.status is None else {k: msgspec.to_builtins(v) for k, v in self.status.items()},
                "recent_errors": [msgspec.to_builtins(e) for e in reversed(self.actuator_errors)],
            },
            "latest_decisions": [_entry_brief(e) for e in self.history.latest()],
            "perf_model": {
                "enabled": bool(self.perf_models),
                "error": self.perf_model_error,
                "roles": {role.value: _perf_brief(model) for role, model in self.perf_models.items()},
            },
        }

    def _classification(self, worker_id: str, ranks: list[dict[str, Any]], not_ready: set[str]) -> dict[str, Any]:
        """The worker's classification and its cause, now (read off the live snapshot with the core's
        rules), and as the core's Coverage had it at the last tick (``at_last_tick``; None: not covered)."""
        record = self._workers.get(worker_id)
        decision = self.last_decisions.get(record.service) if record is not None else None
        at_last_tick: dict[str, Any] | None = None
        if decision is not None:
            at_last_tick = {"classification": "healthy", "cause": "fresh FPM on every rank"}
            for problem in decision.coverage.problems:
                if problem.worker_id == worker_id:
                    at_last_tick = {"classification": problem.status.value, "cause": problem.detail}
        missing = [r["dp_rank"] for r in ranks if not r["fresh"]]
        foreign = [r for r in ranks if r["endpoint_publishes_as"] not in (None, worker_id)]
        if worker_id in not_ready:
            classification, cause = "not_ready", "the deployment reports it not ready"
        elif foreign:
            shown = ", ".join(repr(r["endpoint_publishes_as"]) for r in foreign)
            classification = "identity_not_synced"
            cause = f"its endpoint publishes under {shown}, not {worker_id!r}: identity not synced"
        elif not missing:
            classification, cause = "healthy", "fresh FPM on every rank"
        elif len(missing) == len(ranks):
            heard = any(r["last_sample_age_s"] is not None for r in ranks)
            classification = "silent"
            cause = "no fresh FPM from any rank" if heard else "no FPM received yet"
        else:
            classification = "partial"
            cause = f"no fresh FPM from rank(s) {', '.join(map(str, missing))} of {len(ranks)}"
        return {
            "classification": classification,
            "cause": cause,
            "missing_ranks": missing,
            "published_as": sorted({str(r["endpoint_publishes_as"]) for r in foreign}),
            "at_last_tick": at_last_tick,
        }

    def _service_counts(self, workers: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Discovered vs FPM-covered vs deployment counts per service, now; with the core's Coverage verdict
        at the last tick (complete enough for a scale-down, and the gaps when not)."""
        names = sorted({w["service"] for w in workers} | set(self.last_decisions))
        out = []
        for service in names:
            decision = self.last_decisions.get(service)
            mine = [w for w in workers if w["service"] == service]
            status = None if self.status is None else self.status.get(service)
            by_class = {
                c: sum(1 for w in mine if w["classification"] == c)
                for c in ("healthy", "partial", "silent", "identity_not_synced", "not_ready")
            }
            role = mine[0]["role"] if mine else (decision.role.value if decision is not None else "")
            out.append(
                {
                    "service": service,
                    "role": role,
                    "discovered": len(mine),
                    "fpm_covered": by_class["healthy"],
                    "partial": by_class["partial"],
                    "silent": by_class["silent"],
                    "identity_not_synced": by_class["identity_not_synced"],
                    "ranks_expected": sum(len(w["ranks"]) for w in mine),
                    "ranks_fresh": sum(1 for w in mine for r in w["ranks"] if r["fresh"]),
                    "deployment_desired": None if status is None else status.desired,
                    "deployment_ready": None if status is None else status.ready,
                    "coverage_at_last_tick": None
                    if decision is None
                    else {
                        "complete": decision.coverage.complete,
                        "gaps": [g.value for g in decision.coverage.gaps],
                        "discovered": decision.coverage.discovered,
                        "fpm_covered": decision.coverage.healthy,
                    },
                }
            )
        return out


def _role_counts(services: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for role in Role:
        mine = [s for s in services if s["role"] == role.value]
        desired = [s["deployment_desired"] for s in mine if s["deployment_desired"] is not None]
        ready = [s["deployment_ready"] for s in mine if s["deployment_ready"] is not None]
        out[role.value] = {
            "services": [s["service"] for s in mine],
            "discovered": sum(s["discovered"] for s in mine),
            "fpm_covered": sum(s["fpm_covered"] for s in mine),
            "deployment_desired": sum(desired) if desired else None,
            "deployment_ready": sum(ready) if ready else None,
        }
    return out


def _perf_brief(model: PerfModel) -> dict[str, Any]:
    status = model.status()
    return {
        "source": status.source.value,
        "ready": status.ready,
        "live_ready": status.live_ready,
        "not_ready_because": list(status.not_ready_because),
        "samples": status.samples,
        "offered": sum(status.verdicts.values()),
        "accepted": status.accepted,
        "fits": status.fits,
    }


def _source_label(source: Discovery) -> str:
    name = type(source).__name__
    return {"PodDiscovery": "kubernetes"}.get(name, name)


def _given(value: int | None, default: int) -> int:
    return default if value is None else value


def _load(sample: Any) -> dict[str, float] | None:
    if sample is None:
        return None
    sched = sample.scheduled_requests
    queued = sample.queued_requests
    return {
        "wall_time_ms": sample.wall_time * 1000.0,
        "prefill_tokens": float(sched.sum_prefill_tokens),
        "decode_requests": float(sched.num_decode_requests),
        "decode_kv_tokens": float(sched.sum_decode_kv_tokens),
        "queued_prefill_tokens": float(queued.sum_prefill_tokens),
        "queued_requests": float(queued.num_prefill_requests + queued.num_decode_requests),
    }


def _entry_brief(entry: DecisionEntry) -> dict[str, Any]:
    return {
        "id": entry.id,
        "role": entry.role,
        "service": entry.service,
        "action": entry.action,
        "decided_at_s": entry.decided_at_s,
        "current": entry.current,
        "recommended": entry.recommended,
        "final": entry.final,
        "reasons": list(entry.reasons),
        "summary": entry.summary,
    }

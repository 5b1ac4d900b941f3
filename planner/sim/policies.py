"""Scaling policies compared in a replay. A policy is called every ``tick_s`` of simulated time with the fleet
and the traffic of the last tick, and sets replica counts through :meth:`SimFleet.scale`.

- :class:`OursPolicy`: the planner itself — real FPM into a :class:`~planner.ingest.store.FleetStore`, then
  :func:`planner.core.step` on an :class:`~planner.core.Observation`, exactly as the service runner does,
  at the service's tick interval.
- :class:`FixedPolicy`: a constant count (``fixed`` = the smallest one meeting the SLA over the whole trace,
  found by :func:`planner.sim.replay.find_fixed_peak`).
- :class:`HpaQueuePolicy`: Kubernetes HPA on queue depth (waiting requests per replica), 15 s sync, tolerance
  0.1, unready pods counted at zero on scale-up, and the ``behavior`` defaults: scale-up max(+100%, +4) per
  15 s, no stabilization; scale-down 100% per 15 s after a 300 s stabilization window.
- :class:`DynamoRulesPolicy`: Dynamo's load rules — per-engine TTFT / ITL estimates from the engine's own
  state and the step timer; +1 only when *every* engine's estimate exceeds the SLA; -1 only when the load
  consolidated onto one fewer replica keeps every estimate under ``consolidation_frac`` of the SLA; nothing
  while a previous change is still starting.

The hindsight oracle is not a policy (it needs the future): see :func:`planner.sim.replay.run_oracle`.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Mapping
from typing import Protocol

import msgspec

from perf_model.api import PerfPredictor
from planner.core import CoreConfig, CoreState, Decision, DeploymentStatus, Observation, Traffic, step
from planner.discovery import Role
from planner.ingest.store import FleetStore
from planner.ingest.traffic import TrafficWindows, role_traffic
from planner.sim.decision_log import DecisionSink
from planner.sim.fleet import FpmSink, ReplicaState, SimFleet, StoreSink
from planner.sim.metrics import SlaConfig
from planner.sim.timing import StepTimer

__all__ = [
    "DynamoRulesPolicy",
    "FixedPolicy",
    "HpaQueuePolicy",
    "OursPolicy",
    "Policy",
    "TickTraffic",
]


class TickTraffic(msgspec.Struct, frozen=True, kw_only=True):
    """Requests that arrived during the last tick (what a router in front of the fleet knows)."""

    request_rate_per_s: float
    isl_tokens: float | None
    osl_tokens: float | None


class Policy(Protocol):
    name: str
    tick_s: float

    def make_sink(self) -> FpmSink | None:
        """The FPM sink its fleet should use (None: no FPM needed)."""
        ...

    def attach(self, fleet: SimFleet) -> None: ...

    def tick(self, fleet: SimFleet, now: float, traffic: TickTraffic) -> None: ...


class FixedPolicy:
    def __init__(self, replicas: int, *, name: str = "fixed", tick_s: float = 60.0) -> None:
        self.replicas = replicas
        self.name = name
        self.tick_s = tick_s

    def make_sink(self) -> FpmSink | None:
        return None

    def attach(self, fleet: SimFleet) -> None:
        return None

    def tick(self, fleet: SimFleet, now: float, traffic: TickTraffic) -> None:
        for role in fleet.config.roles:
            if fleet.desired(role) != self.replicas:
                fleet.scale(role, self.replicas, now)


class HpaQueuePolicy:
    """See module docstring. ``target_queue_per_replica``: waiting requests per replica HPA aims for."""

    def __init__(
        self,
        *,
        target_queue_per_replica: float = 5.0,
        tick_s: float = 15.0,
        tolerance: float = 0.1,
        min_replicas: int = 1,
        max_replicas: int = 64,
        down_stabilization_s: float = 300.0,
    ) -> None:
        self.name = "hpa"
        self.tick_s = tick_s
        self.target = target_queue_per_replica
        self.tolerance = tolerance
        self.min_replicas = min_replicas
        self.max_replicas = max_replicas
        self.down_stabilization_s = down_stabilization_s
        self._recs: dict[Role, deque[tuple[float, int]]] = {}

    def make_sink(self) -> FpmSink | None:
        return None

    def attach(self, fleet: SimFleet) -> None:
        return None

    def tick(self, fleet: SimFleet, now: float, traffic: TickTraffic) -> None:
        for role in fleet.config.roles:
            current = fleet.desired(role)
            reps = [r for r in fleet.replicas[role] if r.state is ReplicaState.READY]
            unready = sum(1 for r in fleet.replicas[role] if r.state is ReplicaState.STARTING)
            total_queue = sum(len(r.engine.waiting) for r in reps)
            ready = len(reps)
            if ready == 0:
                desired = current
            else:
                ratio = (total_queue / ready) / self.target
                if abs(ratio - 1.0) <= self.tolerance:
                    desired = current
                else:
                    desired = math.ceil(ratio * ready)
                    if desired > current and unready:
                        # HPA: on scale-up, pods not yet ready count as consuming 0 of the metric.
                        ratio = (total_queue / (ready + unready)) / self.target
                        desired = current if ratio <= 1.0 + self.tolerance else math.ceil(ratio * (ready + unready))
            desired = min(max(desired, self.min_replicas), self.max_replicas)
            recs = self._recs.setdefault(role, deque())
            recs.append((now, desired))
            while recs and recs[0][0] < now - self.down_stabilization_s:
                recs.popleft()
            if desired < current:
                desired = min(current, max(r for _, r in recs))
            if desired > current:
                desired = min(desired, max(2 * current, current + 4))
            if desired != current:
                fleet.scale(role, desired, now)


class DynamoRulesPolicy:
    """See module docstring."""

    def __init__(
        self,
        timer: StepTimer,
        sla: SlaConfig,
        *,
        tick_s: float = 5.0,
        consolidation_frac: float = 0.8,
        min_replicas: int = 1,
        max_replicas: int = 64,
    ) -> None:
        self.name = "dynamo"
        self.tick_s = tick_s
        self.timer = timer
        self.sla = sla
        self.consolidation_frac = consolidation_frac
        self.min_replicas = min_replicas
        self.max_replicas = max_replicas

    def make_sink(self) -> FpmSink | None:
        return None

    def attach(self, fleet: SimFleet) -> None:
        return None

    def _estimates_ms(
        self, fleet: SimFleet, engine_load: tuple[float, float, float], isl: float, scale: float
    ) -> tuple[float, float]:
        queued, n_dec, kv_dec = engine_load
        chunk = fleet.config.engine.max_num_batched_tokens
        n = int(n_dec * scale)
        kv = int(kv_dec * scale)
        ahead = queued * scale + isl
        step_s = self.timer.step_time_s(chunk, 0, n, kv)
        ttft_ms = math.ceil(ahead / chunk) * step_s * 1000.0
        itl_ms = self.timer.step_time_s(min(chunk, int(queued * scale)), 0, n, kv) * 1000.0
        return ttft_ms, itl_ms

    def tick(self, fleet: SimFleet, now: float, traffic: TickTraffic) -> None:
        isl = traffic.isl_tokens or 0.0
        for role in fleet.config.roles:
            current = fleet.desired(role)
            states = fleet.counts(role)
            if states[ReplicaState.STARTING]:
                continue  # a previous change has not settled
            reps = [r for r in fleet.replicas[role] if r.state is ReplicaState.READY]
            if not reps:
                continue
            loads = []
            for r in reps:
                n_dec, kv_dec, _ = r.engine.decode_kv_stats()
                loads.append((float(r.engine.queued_prefill_tokens()), float(n_dec), float(kv_dec)))
            est = [self._estimates_ms(fleet, load, isl, 1.0) for load in loads]
            if all(t > self.sla.ttft_ms or i > self.sla.itl_ms for t, i in est):
                if current < self.max_replicas:
                    fleet.scale(role, current + 1, now)
                continue
            if current <= self.min_replicas or len(reps) < 2:
                continue
            scale = len(reps) / (len(reps) - 1)
            limit_t = self.sla.ttft_ms * self.consolidation_frac
            limit_i = self.sla.itl_ms * self.consolidation_frac
            if all(
                t < limit_t and i < limit_i for t, i in (self._estimates_ms(fleet, load, isl, scale) for load in loads)
            ):
                fleet.scale(role, current - 1, now)


class OursPolicy:
    """The planner's decision core on real FPM (see module docstring). ``pass_traffic`` hands the core the
    traffic the service takes: from the FPM traffic extension of the samples stored, per role's service, over
    each role's ``traffic_window_s`` (:func:`planner.ingest.traffic.role_traffic`), not from the router; the
    ``traffic_window_s`` argument sets it for every role. ``decision_sink`` is handed every decision of every tick
    (:mod:`planner.sim.decision_log`; ``fpm-planner replay --decisions-jsonl``)."""

    def __init__(
        self,
        config: CoreConfig,
        *,
        tick_s: float = 5.0,
        ttl_s: float = 10.0,
        predictors: Mapping[Role, PerfPredictor] | None = None,
        pass_traffic: bool = True,
        traffic_window_s: float | None = None,
        decision_sink: DecisionSink | None = None,
    ) -> None:
        self.name = "ours"
        if traffic_window_s is not None:  # every role reads (and the core counts) the window asked for
            roles = {
                r: msgspec.structs.replace(rc, traffic_window_s=traffic_window_s) for r, rc in config.roles.items()
            }
            config = msgspec.structs.replace(config, roles=roles)
        self.traffic = TrafficWindows(window_s=config.traffic_window_s)
        self.tick_s = tick_s
        self.config = config
        self.store = FleetStore(ttl_s=ttl_s)
        self.state = CoreState()
        self.predictors = predictors
        self.pass_traffic = pass_traffic
        self.reasons: Counter[str] = Counter()
        self.modes: Counter[str] = Counter()
        self.last_decisions: tuple[Decision, ...] = ()
        self.decision_sink = decision_sink
        self._fleet: SimFleet | None = None

    def make_sink(self) -> FpmSink | None:
        return StoreSink(self.store, traffic=self.traffic)

    def attach(self, fleet: SimFleet) -> None:
        self._fleet = fleet
        fleet.on_workers_changed = self._workers_changed
        self.store.set_workers(fleet.workers())

    def _workers_changed(self) -> None:
        if self._fleet is not None:
            self.store.set_workers(self._fleet.workers())

    def observe(self, fleet: SimFleet, now: float, traffic: TickTraffic) -> Observation:
        deployments: dict[str, DeploymentStatus] = {}
        for role in fleet.config.roles:
            service = fleet.service_name(role)
            counts = fleet.counts(role)
            deployments[service] = DeploymentStatus(
                service=service, desired=fleet.desired(role), ready=counts[ReplicaState.READY]
            )
        traffic_by_role: dict[Role, Traffic] = {}
        if self.pass_traffic:  # from FPM, as the service takes it (the router's ``traffic`` is not used)
            services = {role: fleet.service_name(role) for role in fleet.config.roles}
            traffic_by_role = role_traffic(self.traffic, services, now, self.config)
        return Observation(
            workers=fleet.workers(), fleet=self.store.snapshot(now), deployments=deployments, traffic=traffic_by_role
        )

    def tick(self, fleet: SimFleet, now: float, traffic: TickTraffic) -> None:
        obs = self.observe(fleet, now, traffic)
        self.state, decisions = step(self.state, obs, now, self.config, predictors=self.predictors)
        self.last_decisions = decisions
        for decision in decisions:
            if self.decision_sink is not None:
                self.decision_sink(now, decision)
            self.modes[decision.mode] += 1
            for reason in decision.reasons:
                self.reasons[reason] += 1
            if decision.role in fleet.replicas and decision.final_replicas != fleet.desired(decision.role):
                fleet.scale(decision.role, decision.final_replicas, now)

"""One decision tick's logic: the observation the core sees, the core's step, and the records it leaves.

:class:`Decider` holds the core's configuration and state, the last observation and decisions, and the
traffic someone told it about. It is handed everything it needs (``now``, the snapshot, the status, the leader
flag, the wall time) by the runner; it reads no clock, awaits nothing and never imports the runner. The core
step (:meth:`Decider.decide`) is pure and may run in a worker thread; :meth:`Decider.commit` records its result.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from perf_model.api import PerfPredictor
from planner.actuators.base import ReplicaBounds, ScaleRequest, ServiceStatus
from planner.core import (
    Action,
    Bounds,
    CoreConfig,
    CoreState,
    Decision,
    DeploymentStatus,
    Observation,
    RoleBounds,
    Traffic,
    step,
)
from planner.discovery import Role, WorkerRecord
from planner.errors import ConfigError
from planner.ingest.store import FleetSnapshot
from planner.ingest.traffic import TrafficWindows, role_traffic
from planner.service.history import DecisionEntry, History
from planner.service.metrics import PlannerMetrics
from planner.service.schemas import BoundsResponse, RoleBoundsView

__all__ = ["Decider", "PlannedScale", "agree_bounds"]


class PlannedScale(msgspec.Struct, frozen=True, kw_only=True):
    """A scale request the tick wants sent, with the decision it comes from."""

    request: ScaleRequest
    role: str
    decision_id: int


class Decider:
    """The core's configuration and state, and what the last tick saw and decided."""

    def __init__(self, core_config: CoreConfig) -> None:
        self.core_config = core_config
        self.core_state = CoreState()
        self.last_observation: Observation | None = None
        self.last_decisions: dict[str, Decision] = {}
        self.traffic: dict[Role, Traffic] = {}  # set by whoever knows it (the demo's router); none by default
        # Traffic from FPM (issue 13): the runner sets ``store.traffic`` to these windows; each observation takes
        # its roles' traffic from them (what ``self.traffic`` gives explicitly overrides a role).
        self.fpm_traffic = TrafficWindows(window_s=core_config.traffic_window_s)
        self.last_fpm_traffic: dict[str, Traffic] = {}  # by service, as the last observation read it

    def observe(
        self,
        workers: Mapping[str, WorkerRecord],
        snapshot: FleetSnapshot,
        status: Mapping[str, ServiceStatus] | None,
        not_ready: set[str],
    ) -> Observation:
        by_service: dict[str, list[str]] = {}
        for wid in not_ready:
            by_service.setdefault(workers[wid].service, []).append(wid)
        deployments = (
            {}
            if status is None
            else {
                name: DeploymentStatus.from_service_status(
                    st, not_ready_workers=tuple(sorted(by_service.get(name, ())))
                )
                for name, st in status.items()
            }
        )
        services = {record.role: record.service for record in workers.values()}
        from_fpm = role_traffic(self.fpm_traffic, services, snapshot.now, self.core_config)
        self.last_fpm_traffic = {services[role]: t for role, t in from_fpm.items()}
        traffic = {**from_fpm, **self.traffic}
        return Observation(workers=dict(workers), fleet=snapshot, deployments=deployments, traffic=traffic)

    def decide(
        self, observation: Observation, now: float, predictors: Mapping[Role, PerfPredictor] | None
    ) -> tuple[CoreState, list[Decision]]:
        """The core's step on the current state; pure (nothing here changes until :meth:`commit`)."""
        state, decisions = step(self.core_state, observation, now, self.core_config, predictors=predictors)
        return state, list(decisions)

    def commit(
        self,
        state: CoreState,
        observation: Observation,
        decisions: Sequence[Decision],
        *,
        history: History,
        metrics: PlannerMetrics,
        tick: int,
        leader: bool,
        wall_s: float,
    ) -> list[PlannedScale]:
        """Keep the new state, record every decision, and return the scale requests to send (non-holds)."""
        self.core_state = state
        self.last_observation = observation
        self.last_decisions = {d.service: d for d in decisions}
        entries: list[DecisionEntry] = []
        for decision in decisions:
            entry = DecisionEntry(
                id=history.next_decision_id(),
                tick=tick,
                role=decision.role.value,
                service=decision.service,
                decided_at_s=wall_s,
                leader=leader,
                current=decision.current_replicas,
                recommended=decision.recommended_replicas,
                final=decision.final_replicas,
                action=decision.action.value,
                reasons=tuple(r.value for r in decision.reasons),
                summary=decision.summary,
                decision=decision,
                traffic=observation.traffic.get(decision.role),
            )
            history.add_decision(entry)
            entries.append(entry)
            metrics.observe_decision(
                decision.role.value,
                service=decision.service,
                coverage=decision.coverage,
                current=decision.current_replicas,
                recommended=decision.recommended_replicas,
                final=decision.final_replicas,
                reasons=entry.reasons,
                ttft_ms=decision.inputs.predicted_ttft_ms,
                itl_ms=decision.inputs.predicted_itl_ms,
            )
        for service, observed in self.last_fpm_traffic.items():
            metrics.observe_traffic(service, observed)
        history.set_latest(entries)
        planned = []
        for entry in entries:
            decision = entry.decision
            if decision.action != Action.HOLD:
                request = ScaleRequest(
                    service=decision.service,
                    replicas=decision.final_replicas,
                    reason=entry.reasons[0] if entry.reasons else decision.action.value,
                )
                planned.append(PlannedScale(request=request, role=decision.role.value, decision_id=entry.id))
        return planned

    # -- bounds --------------------------------------------------------------------------------------------

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


def agree_bounds(config: CoreConfig, by_service: Mapping[str, ReplicaBounds]) -> CoreConfig:
    """``config`` deciding within the actuator's hard bounds too: every role whose deployment service
    (``core.roles.<role>.service`` or ``services``) the actuator bounds gets them as its actuator bounds, so the
    core's effective bounds are the intersection (a count past the actuator's max is capped there,
    ``capped_by_actuator_bounds``; never refused every tick). Raises ConfigError when a role's bounds and its
    actuator's do not intersect: such a configuration is refused at start."""
    bounds: dict[Role, RoleBounds] = {}
    for role in Role:
        service = config.role(role).service
        hard = None if service is None else by_service.get(service)
        if hard is not None:
            bounds[role] = RoleBounds(min_replicas=hard.min_replicas, max_replicas=hard.max_replicas)
    try:
        return config.with_actuator_bounds(bounds)
    except ValueError as exc:
        raise ConfigError(f"bounds: the decision core's and the actuator's do not agree: {exc}") from exc


def _given(value: int | None, default: int) -> int:
    return default if value is None else value

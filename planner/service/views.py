"""Read models over a decision: explain (a decision with its stages and outcomes) and what-if (what the core
would decide under other traffic, load or SLA targets; nothing is applied or kept).

Pure functions of what the runner hands them (the history entry, the decider's state, an observation, ``now``);
they read no clock and never import the runner. :func:`what_if_decisions` runs the core and may be called in a
worker thread.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from perf_model.api import PerfPredictor
from planner.core import CoreConfig, CoreState, Decision, Observation, RoleLoad, Traffic, step
from planner.discovery import Role
from planner.errors import ConfigError
from planner.service.history import DecisionEntry, History
from planner.service.schemas import ExplainResponse

__all__ = ["explain", "measured_load", "what_if_decisions", "what_if_inputs"]


def explain(entry: DecisionEntry, history: History) -> ExplainResponse:
    """A decision with its inputs, the traffic window the core read, coverage, every pipeline stage (value and
    reason) and its outcomes."""
    decision = entry.decision
    outcomes = tuple(o for o in history.outcomes(limit=10_000) if o.decision_id == entry.id)
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
        traffic=entry.traffic,
    )


def measured_load(last_decisions: Mapping[str, Decision], role: Role) -> RoleLoad:
    """The load the last tick measured for ``role`` (zero when it decided nothing for it)."""
    for decision in last_decisions.values():
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


def what_if_inputs(
    observation: Observation,
    config: CoreConfig,
    last_decisions: Mapping[str, Decision],
    request: Mapping[str, Any],
) -> tuple[Observation, CoreConfig]:
    """The observation and configuration the what-if ``request`` describes. Raises ConfigError."""
    traffic = dict(observation.traffic)
    overrides: dict[Role, RoleLoad] = {}
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
            measured = measured_load(last_decisions, role)
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
    return msgspec.structs.replace(observation, traffic=traffic, load_override=overrides), config


def what_if_decisions(
    state: CoreState,
    observation: Observation,
    now: float,
    config: CoreConfig,
    predictors: Mapping[Role, PerfPredictor] | None,
) -> tuple[Decision, ...]:
    """The core's decisions under the what-if inputs; the state it would move to is thrown away."""
    _, decisions = step(state, observation, now, config, predictors=predictors)
    return tuple(decisions)

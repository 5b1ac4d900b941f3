"""One tick of the decision core: ``step(state, observation, now, config) -> (state, decisions)``.

Pure: ``now`` is an argument, no clock, no I/O, no threads. Groups the workers into services, reconciles them,
drafts each service's count through its pipeline (:mod:`planner.core.draft`: recommend -> SLA feedback ->
forecast floor -> bounds -> rate limit -> stabilize -> safety -> in flight), then applies the GPU budget across
services and builds one :class:`Decision` each. See docs/decision_core.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import msgspec

from perf_model.api import PerfPredictor
from planner.core.clamp import BudgetAsk, add_stage, apply_gpu_budget
from planner.core.config import CoreConfig
from planner.core.decision import Action, Decision, Reason, RoleInputs, Stage, StageResult
from planner.core.draft import Draft, draft_service
from planner.core.observation import Observation, ObservationError
from planner.core.reconcile import reconcile_services
from planner.core.startup import record_scale
from planner.core.state import CoreState, ServiceState
from planner.discovery import Role, WorkerRecord
from planner.ingest.store import DropReason

__all__ = ["group_services", "step"]

_ROLE_ORDER = {role: i for i, role in enumerate(Role)}


def group_services(
    workers: Mapping[str, WorkerRecord], config: CoreConfig
) -> dict[str, tuple[Role, list[WorkerRecord]]]:
    """Services to decide, with their role and workers: every discovered worker's ``service``, plus each
    role's configured ``service`` (decided even with no worker discovered). A service's role is that of its
    workers (the lowest worker id wins should they disagree)."""
    groups: dict[str, tuple[Role, list[WorkerRecord]]] = {}
    mixed: set[str] = set()
    for record in workers.values():
        group = groups.get(record.service)
        if group is None:
            groups[record.service] = (record.role, [record])
        else:
            group[1].append(record)
            if record.role != group[0]:
                mixed.add(record.service)
    for service in mixed:
        members = groups[service][1]
        groups[service] = (min(members, key=lambda w: w.worker_id).role, members)
    for role, role_config in config.roles.items():
        if role_config.service is not None and role_config.service not in groups:
            groups[role_config.service] = (role, [])
    return groups


def _inputs(d: Draft, overridden: bool) -> RoleInputs:
    recon, load = d.recon, d.load.finite()
    dp_engines = recon.engines_reporting
    kv_cap = recon.kv_capacity_tokens * dp_engines
    t = d.traffic
    return RoleInputs(
        current_replicas=d.current,
        ready_replicas=d.ready,
        engines_expected=recon.engines_expected,
        engines_reporting=recon.engines_reporting,
        queued_prefill_tokens=load.queued_prefill_tokens,
        scheduled_prefill_tokens=load.scheduled_prefill_tokens,
        prefill_token_budget=recon.max_num_batched_tokens * dp_engines,
        decode_requests=load.decode_requests,
        queued_decode_requests=load.queued_decode_requests,
        decode_seq_budget=recon.max_num_seqs * dp_engines,
        decode_kv_tokens=load.decode_kv_tokens,
        kv_capacity_tokens=kv_cap,
        kv_usage_frac=load.decode_kv_tokens / kv_cap if kv_cap > 0 else None,
        request_rate_per_s=t.request_rate_per_s if t is not None else None,
        isl_tokens=t.isl_tokens if t is not None else None,
        osl_tokens=t.osl_tokens if t is not None else None,
        forecast_rate_per_s=d.forecast_rate_per_s,
        predicted_ttft_ms=d.rec.predicted_ttft_ms,
        predicted_itl_ms=d.rec.predicted_itl_ms,
        overridden=overridden,
    )


def _summary(d: Draft, final: int, action: Action, stages: Sequence[StageResult]) -> str:
    head = {
        Action.SCALE_UP: f"scale up {d.current} -> {final}",
        Action.SCALE_DOWN: f"scale down {d.current} -> {final}",
        Action.HOLD: f"hold at {final}",
    }[action]
    why = [f"{s.stage.value}: {s.detail}" for s in stages if s.reason is not None and s.detail]
    return f"{d.role.value} {d.service!r}: {head}" + (" (" + "; ".join(why) + ")" if why else "")


def step(
    state: CoreState,
    observation: Observation,
    now: float,
    config: CoreConfig,
    *,
    predictors: Mapping[Role, PerfPredictor] | None = None,
) -> tuple[CoreState, tuple[Decision, ...]]:
    """Decide every service's replica count at ``now``.

    Returns the new state (pass it to the next call) and one :class:`Decision` per service, holds included,
    sorted by role then service. ``predictors`` (per role) enables SLA mode for roles whose config mode is
    ``sla`` or ``auto``; a missing or not-ready predictor falls back to threshold mode (reason
    ``perf_model_not_ready`` when one was asked for). To answer "what if" without acting, call ``step`` and
    discard the returned state.

    Raises :class:`planner.core.observation.ObservationError` when ``now`` is not finite or goes back in time.
    """
    if not math.isfinite(now):
        raise ObservationError(f"now must be a finite number of seconds, got {now!r}")
    if state.last_now is not None and now < state.last_now:
        raise ObservationError(f"now went backwards: {now} after {state.last_now}")
    for service, status in observation.deployments.items():
        for name in ("desired", "ready"):
            count = getattr(status, name)
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise ObservationError(f"deployment {service!r}: {name} must be an integer >= 0, got {count!r}")
    started_at = state.started_at if state.started_at is not None else now
    tick = state.tick + 1
    groups = group_services(observation.workers, config)
    ordered = sorted(groups.items(), key=lambda item: (_ROLE_ORDER[item[1][0]], item[0]))
    unknown_drops = observation.fleet.drops.get(DropReason.UNKNOWN_WORKER, 0)
    new_unknown = unknown_drops > state.unknown_worker_drops_seen

    reconciled = reconcile_services(groups, observation.fleet, observation.deployments)
    drafts: list[Draft] = []
    for service, (role, workers) in ordered:
        sstate = state.services.get(service) or ServiceState()
        predictor = predictors.get(role) if predictors else None
        drafts.append(
            draft_service(role, service, workers, observation, now, config, sstate, started_at, predictor, reconciled)
        )

    budget = apply_gpu_budget(
        [
            BudgetAsk(
                key=d.service,
                current=d.current,
                wanted=d.value,
                gpus_per_replica=d.role_config.gpus_per_replica,
            )
            for d in drafts
        ],
        config.max_total_gpus,
    )

    decisions: list[Decision] = []
    services: dict[str, ServiceState] = {}
    for d in drafts:
        final = add_stage(d.stages, d.reasons, Stage.GPU_BUDGET, budget[d.service])
        if new_unknown:
            d.reasons.append(Reason.UNKNOWN_WORKER_SAMPLES)
        if final > d.current:
            action, outcome = Action.SCALE_UP, Reason.SCALE_UP
        elif final < d.current:
            action, outcome = Action.SCALE_DOWN, Reason.SCALE_DOWN
        else:
            action, outcome = Action.HOLD, Reason.HOLD
        d.reasons.append(outcome)
        sstate = d.state
        capped = final < d.wanted
        if capped != sstate.feedback.capped:
            sstate = msgspec.structs.replace(sstate, feedback=msgspec.structs.replace(sstate.feedback, capped=capped))
        if final != d.current:
            sstate = msgspec.structs.replace(sstate, pending_scale=(now, d.current, final))
        rate = d.traffic.request_rate_per_s if d.traffic is not None else None
        sstate = record_scale(sstate, d.role_config, d.current, final, now, rate)
        if final > d.current:
            at = sstate.scale_up_at if sstate.scale_up_at is not None else now  # a raise keeps the start
            sstate = msgspec.structs.replace(sstate, scale_up_rate_per_s=rate, scale_up_at=at)
        services[d.service] = sstate
        stages = tuple(d.stages)
        decisions.append(
            Decision(
                id=f"{tick}-{d.service}",
                tick=tick,
                at=now,
                role=d.role,
                service=d.service,
                mode=d.rec.mode,
                current_replicas=d.current,
                recommended_replicas=d.rec.replicas,
                final_replicas=final,
                action=action,
                reasons=tuple(dict.fromkeys(d.reasons)),
                stages=stages,
                coverage=d.recon.coverage,
                inputs=_inputs(d, d.load is not d.recon.load),
                summary=_summary(d, final, action, stages),
                gpus_per_replica=d.role_config.gpus_per_replica,
            )
        )
    new_state = CoreState(
        tick=tick,
        started_at=started_at,
        last_now=now,
        services=services,
        unknown_worker_drops_seen=unknown_drops,
    )
    return new_state, tuple(decisions)

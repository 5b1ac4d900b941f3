"""One tick of the decision core: ``step(state, observation, now, config) -> (state, decisions)``.

Pure: ``now`` is an argument, no clock, no I/O, no threads. The pipeline per service:
reconcile -> recommend (SLA or threshold) -> forecast floor -> bounds -> rate limit -> stabilize -> safety
-> in flight, then the GPU budget across services. See docs/decision_core.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import msgspec

from perf_model.api import PerfPredictor
from planner.core.clamp import BudgetAsk, Clamped, apply_bounds, apply_gpu_budget, rate_limit, stabilize
from planner.core.config import CoreConfig, ForecastMethod, RoleConfig
from planner.core.decision import (
    Action,
    Decision,
    Mode,
    Reason,
    RoleInputs,
    Stage,
    StageResult,
)
from planner.core.feedback import update_feedback
from planner.core.forecast import ForecastState, derived_capacity, forecast_rate, update_forecast
from planner.core.observation import Observation, ObservationError, RoleLoad, Traffic
from planner.core.recommend import Recommendation, recommend_sla, recommend_threshold
from planner.core.reconcile import Reconciled, reconcile_services
from planner.core.safety import coverage_gate, hold_in_flight, next_coverage_since
from planner.core.startup import (
    effective_startup_s,
    in_flight_raise_to,
    measured_startup_s,
    record_scale,
    scale_down_window_s,
)
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


class _Draft(msgspec.Struct, kw_only=True):
    """One service's decision before the GPU budget (mutable scratch, never leaves this module)."""

    role: Role
    service: str
    role_config: RoleConfig
    current: int
    ready: int
    recon: Reconciled
    load: RoleLoad
    traffic: Traffic | None
    rec: Recommendation
    wanted: int  # recommend, feedback and forecast floor: what the load asks before any clamp
    forecast_rate_per_s: float | None
    stages: list[StageResult]
    reasons: list[Reason]
    value: int
    state: ServiceState


def _prune(entries: tuple[tuple[float, int], ...], now: float, keep_s: float) -> tuple[tuple[float, int], ...]:
    if not entries or entries[0][0] > now - keep_s:
        return entries
    return tuple(entry for entry in entries if entry[0] > now - keep_s)


def _stage(stages: list[StageResult], reasons: list[Reason], stage: Stage, clamped: Clamped) -> int:
    stages.append(StageResult(stage=stage, replicas=clamped.replicas, reason=clamped.reason, detail=clamped.detail))
    if clamped.reason is not None:
        reasons.append(clamped.reason)
    return clamped.replicas


def _recommend(
    role: Role,
    rc: RoleConfig,
    current: int,
    recon: Reconciled,
    load: RoleLoad,
    traffic: Traffic | None,
    predictor: PerfPredictor | None,
    corrections: tuple[float, float] = (0.0, 0.0),
    startup_s: float = 0.0,
    tail_may_raise: bool = True,
) -> tuple[Recommendation, tuple[Reason, ...]]:
    extra: tuple[Reason, ...] = ()
    if rc.mode != Mode.THRESHOLD and predictor is not None and predictor.ready:
        search_max = max(rc.max_replicas, current, 1) * 4
        return recommend_sla(
            role,
            current,
            recon,
            load,
            traffic,
            predictor,
            rc.sla,
            rc.headroom_frac,
            search_max,
            itl_headroom_frac=rc.itl_headroom_frac,
            default_max_num_batched_tokens=rc.default_max_num_batched_tokens,
            ttft_correction_frac=corrections[0],
            itl_correction_frac=corrections[1],
            startup_s=startup_s,
            attainment_goal=rc.sla_feedback.attainment_goal,
            min_samples=rc.sla_feedback.min_samples,
            tail_may_raise=tail_may_raise,
        ), extra
    if rc.mode == Mode.SLA or (rc.mode == Mode.AUTO and predictor is not None):
        extra = (Reason.PERF_MODEL_NOT_READY,)
    return recommend_threshold(role, current, recon, load, rc.threshold), extra


def _draft(
    role: Role,
    service: str,
    workers: Sequence[WorkerRecord],
    observation: Observation,
    now: float,
    config: CoreConfig,
    sstate: ServiceState,
    started_at: float,
    predictor: PerfPredictor | None,
    reconciled: Mapping[str, Reconciled],
) -> _Draft:
    rc = config.role(role)
    deployment = observation.deployments.get(service)
    recon = reconciled[service]
    coverage = recon.coverage
    if deployment is not None:
        current, ready = deployment.desired, deployment.ready
    else:
        current, ready = coverage.discovered - coverage.not_ready, coverage.healthy
    override = observation.load_override.get(role)
    load = override if override is not None else recon.load
    raw_traffic = observation.traffic.get(role)
    traffic = raw_traffic.clean() if raw_traffic is not None else None
    stages: list[StageResult] = []
    reasons: list[Reason] = []

    # start-up delay: measured from the deployment's desired -> ready transitions, else configured
    startup_s = effective_startup_s(rc, sstate)

    # the tail's observed misses add replicas only when capacity is not still coming (they predate it)
    settled = not (deployment is not None and deployment.in_flight) and not (
        sstate.feedback.hold_until is not None and now < sstate.feedback.hold_until
    )
    # recommend (never on a load it cannot trust: NaN, infinite, negative or a broken counter's 2^64 - 1)
    invalid = load.invalid_fields()
    if invalid:
        sla = rc.mode != Mode.THRESHOLD and predictor is not None and predictor.ready
        rec = Recommendation(
            replicas=current,
            reason=Reason.LOAD_INVALID,
            mode=Mode.SLA if sla else Mode.THRESHOLD,
            detail=f"{'given' if override is not None else 'measured'} load not usable ({', '.join(invalid)});"
            f" holding at {current}",
        )
        extra: tuple[Reason, ...] = ()
    else:
        rec, extra = _recommend(
            role, rc, current, recon, load, traffic, predictor, startup_s=startup_s, tail_may_raise=settled
        )
    stages.append(StageResult(stage=Stage.RECOMMEND, replicas=rec.replicas, reason=rec.reason, detail=rec.detail))
    reasons.append(rec.reason)
    reasons.extend(extra)
    if recon.engines_silent and override is None:
        reasons.append(Reason.SILENT_COUNTED_IDLE)
    if override is not None:
        reasons.append(Reason.LOAD_OVERRIDDEN)
    value = rec.replicas

    # sla feedback: the observed attainment corrects the headroom; recommend again with it (SLA mode only)
    feedback = update_feedback(
        sstate.feedback,
        traffic,
        now,
        rc.sla_feedback,
        in_flight=deployment is not None and deployment.in_flight,
    )
    if rec.mode == Mode.SLA and feedback.reason is not None and not invalid:
        corrections = (feedback.state.ttft_frac, feedback.state.itl_frac)
        if corrections != (0.0, 0.0):
            value = _recommend(role, rc, current, recon, load, traffic, predictor, corrections, startup_s, settled)[
                0
            ].replicas
        value = _stage(
            stages,
            reasons,
            Stage.SLA_FEEDBACK,
            Clamped(replicas=value, reason=feedback.reason, detail=f"{feedback.detail} -> {value} replicas"),
        )

    # forecast floor
    fstate: ForecastState = sstate.forecast
    predicted_rate: float | None = None
    fc = rc.forecast
    if fc.method != ForecastMethod.NONE:
        rate = traffic.request_rate_per_s if traffic is not None else None
        if rate is not None:
            fstate = update_forecast(fstate, rate, now, fc)
            predicted_rate = forecast_rate(fstate, fc)
        capacity = fc.replica_capacity_rps
        if capacity is None:
            fstate, capacity = derived_capacity(fstate, rate, value, now, fc)
        if predicted_rate is None or (capacity is None and predicted_rate > 0):
            value = _stage(
                stages,
                reasons,
                Stage.FORECAST,
                Clamped(
                    replicas=value,
                    reason=Reason.FORECAST_NO_DATA,
                    detail="no request rate to forecast from"
                    if predicted_rate is None
                    else "no per-replica capacity: set forecast.replica_capacity_rps",
                ),
            )
        else:
            need = predicted_rate / capacity if capacity and predicted_rate > 0 else 0.0
            floor = math.ceil(need - 1e-9) if math.isfinite(need) else rc.max_replicas
            detail = f"forecast {predicted_rate:.2f} req/s in {fc.horizon_s:g} s -> floor {floor}"
            if floor > value:
                value = _stage(
                    stages,
                    reasons,
                    Stage.FORECAST,
                    Clamped(replicas=floor, reason=Reason.FORECAST_FLOOR, detail=detail),
                )
            else:
                value = _stage(
                    stages,
                    reasons,
                    Stage.FORECAST,
                    Clamped(replicas=value, reason=Reason.FORECAST_BELOW_LOAD, detail=detail),
                )

    wanted = value
    # bounds
    value = _stage(
        stages, reasons, Stage.BOUNDS, apply_bounds(value, rc.min_replicas, rc.max_replicas, rc.actuator_bounds)
    )
    down_window_s = scale_down_window_s(rc, sstate, now)
    keep_recs_s = max(rc.scale_up.stabilization_window_s, down_window_s)
    recommendations = (*_prune(sstate.recommendations, now, keep_recs_s), (now, value))
    keep_events_s = max((p.period_s for p in (*rc.scale_up.policies, *rc.scale_down.policies)), default=0.0)
    events = sstate.scale_events
    if sstate.pending_scale is not None:
        at, before, after = sstate.pending_scale
        if current == after and after != before:
            events = (*events, (at, after - before))
    events = _prune(events, now, keep_events_s)

    # rate limit, stabilize
    value = _stage(
        stages, reasons, Stage.RATE_LIMIT, rate_limit(value, current, events, now, rc.scale_up, rc.scale_down)
    )
    value = _stage(
        stages,
        reasons,
        Stage.STABILIZE,
        stabilize(
            value,
            current,
            recommendations,
            now,
            rc.scale_up.stabilization_window_s,
            down_window_s,
        ),
    )

    # safety: no scale-down on incomplete coverage, nor before a full window of it
    since = next_coverage_since(coverage, sstate.coverage_complete_since, now)
    if value < current:
        allowed, why, detail = coverage_gate(coverage, since, started_at, now, down_window_s)
        if not allowed:
            stages.append(StageResult(stage=Stage.SAFETY, replicas=current, reason=why[0], detail=detail))
            reasons.extend(why)
            value = current
        else:
            stages.append(StageResult(stage=Stage.SAFETY, replicas=value))
    else:
        stages.append(StageResult(stage=Stage.SAFETY, replicas=value))

    # in flight
    in_flight = deployment is not None and deployment.in_flight
    in_flight_since = (sstate.in_flight_since if sstate.in_flight_since is not None else now) if in_flight else None
    startup_observed = measured_startup_s(sstate, in_flight, now)
    rate_now = traffic.request_rate_per_s if traffic is not None else None
    raise_to = in_flight_raise_to(rc, sstate, rate_now, in_flight, current)
    clamped, extra_in_flight = hold_in_flight(
        value, current, deployment, in_flight_since, now, rc.pending_timeout_s, raise_to, rec.arrivals_replicas
    )
    value = _stage(stages, reasons, Stage.IN_FLIGHT, clamped)
    reasons.extend(extra_in_flight)

    # min/max are hard limits: an operator's new bounds take effect now, whatever held the count above
    value = _stage(
        stages,
        reasons,
        Stage.BOUNDS_ENFORCED,
        apply_bounds(value, rc.min_replicas, rc.max_replicas, rc.actuator_bounds),
    )

    new_state = ServiceState(
        recommendations=recommendations,
        scale_events=events,
        coverage_complete_since=since,
        in_flight_since=in_flight_since,
        startup_s_observed=startup_observed,
        scale_up_at=sstate.scale_up_at if in_flight else None,
        scale_downs=sstate.scale_downs,
        rebuy_gaps=sstate.rebuy_gaps,
        scale_up_rate_per_s=sstate.scale_up_rate_per_s,
        forecast=fstate,
        feedback=feedback.state,
    )
    return _Draft(
        role=role,
        service=service,
        role_config=rc,
        current=current,
        ready=ready,
        recon=recon,
        load=load,
        traffic=traffic,
        rec=rec,
        wanted=wanted,
        forecast_rate_per_s=predicted_rate,
        stages=stages,
        reasons=reasons,
        value=value,
        state=new_state,
    )


def _inputs(d: _Draft, overridden: bool) -> RoleInputs:
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


def _summary(d: _Draft, final: int, action: Action, stages: Sequence[StageResult]) -> str:
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
    drafts: list[_Draft] = []
    for service, (role, workers) in ordered:
        sstate = state.services.get(service) or ServiceState()
        predictor = predictors.get(role) if predictors else None
        drafts.append(
            _draft(role, service, workers, observation, now, config, sstate, started_at, predictor, reconciled)
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
        final = _stage(d.stages, d.reasons, Stage.GPU_BUDGET, budget[d.service])
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
        sstate = record_scale(sstate, d.role_config, d.current, final, now)
        if final > d.current:
            rate = d.traffic.request_rate_per_s if d.traffic is not None else None
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

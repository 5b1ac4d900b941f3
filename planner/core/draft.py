"""One service's pipeline in a tick, before the fleet-wide GPU budget: reconcile's load -> recommend (SLA or
threshold) -> SLA feedback -> forecast floor -> bounds -> rate limit -> stabilize -> safety -> in flight.

Pure: ``now`` is an argument, no clock, no I/O. :func:`planner.core.step` drafts every service with
:func:`draft_service`, then applies the GPU budget across them and builds the decisions. See docs/decision_core.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import msgspec

from perf_model.api import PerfPredictor
from planner.core.clamp import Clamped, apply_bounds, rate_limit, stabilize
from planner.core.config import CoreConfig, ForecastMethod, RoleConfig
from planner.core.decision import Mode, Reason, Stage, StageResult
from planner.core.feedback import update_feedback
from planner.core.forecast import (
    ForecastState,
    checked_floor,
    damped_floor,
    derived_capacity,
    forecast_rate,
    noise_floor,
    rise_capped_rate,
    update_forecast,
)
from planner.core.observation import Observation, RoleLoad, Traffic
from planner.core.prompt_spread import service_cv2, update_log_var
from planner.core.recommend import recommend_sla
from planner.core.recommendation import Recommendation
from planner.core.reconcile import Reconciled
from planner.core.safety import coverage_gate, hold_in_flight, next_coverage_since
from planner.core.startup import (
    effective_startup_s,
    gap_hold,
    in_flight_raise_to,
    measured_startup_s,
    scale_down_window_s,
)
from planner.core.state import ServiceState
from planner.core.threshold import recommend_threshold
from planner.discovery import Role, WorkerRecord

__all__ = ["Draft", "add_stage", "draft_service"]


class Draft(msgspec.Struct, kw_only=True):
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


def prune(entries: tuple[tuple[float, int], ...], now: float, keep_s: float) -> tuple[tuple[float, int], ...]:
    if not entries or entries[0][0] > now - keep_s:
        return entries
    return tuple(entry for entry in entries if entry[0] > now - keep_s)


def add_stage(stages: list[StageResult], reasons: list[Reason], stage: Stage, clamped: Clamped) -> int:
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
    prompt_cv2: float = 0.0,
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
            prompt_cv2=prompt_cv2 if role is Role.PREFILL else 0.0,
        ), extra
    if rc.mode == Mode.SLA or (rc.mode == Mode.AUTO and predictor is not None):
        extra = (Reason.PERF_MODEL_NOT_READY,)
    return recommend_threshold(role, current, recon, load, rc.threshold), extra


def _floor_within_model(
    role: Role,
    rc: RoleConfig,
    current: int,
    recon: Reconciled,
    load: RoleLoad,
    traffic: Traffic | None,
    predictor: PerfPredictor | None,
    rec: Recommendation,
    value: int,
    predicted_rate: float,
    corrections: tuple[float, float],
    startup_s: float,
    settled: bool,
    prompt_cv2: float,
) -> int | None:
    """The count the model (with the closed loop's correction) asks at the forecast rate, for a prefill-only or
    decode-only role whose load-set count is at least two; None where the derived floor stands (see
    docs/decision_core.md, "The floor within the model's capacity")."""
    if role not in (Role.PREFILL, Role.DECODE) or value < 2 or traffic is None or rec.mode != Mode.SLA:
        return None
    if rec.reason in (Reason.SLA_UNREACHABLE, Reason.LOAD_INVALID, Reason.NO_LOAD):
        return None
    at_forecast = msgspec.structs.replace(traffic, request_rate_per_s=predicted_rate)
    ask, _ = _recommend(
        role, rc, current, recon, load, at_forecast, predictor, corrections, startup_s, settled, prompt_cv2
    )
    if ask.mode != Mode.SLA or ask.reason in (Reason.SLA_UNREACHABLE, Reason.LOAD_INVALID, Reason.NO_LOAD):
        return None
    return ask.replicas


def draft_service(
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
) -> Draft:
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

    # the prompt lengths' spread over a longer span than the window (prefill's queue wait, planner.core.prompt_spread)
    prompt_log_var, prompt_log_var_at = update_log_var(
        sstate.prompt_log_var, sstate.prompt_log_var_at, traffic, now, rc.prompt_spread_window_s
    )
    prompt_cv2 = service_cv2(prompt_log_var) if rc.prompt_spread_window_s > 0 else 0.0

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
            role,
            rc,
            current,
            recon,
            load,
            traffic,
            predictor,
            startup_s=startup_s,
            tail_may_raise=settled,
            prompt_cv2=prompt_cv2,
        )
    stages.append(StageResult(stage=Stage.RECOMMEND, replicas=rec.replicas, reason=rec.reason, detail=rec.detail))
    reasons.append(rec.reason)
    reasons.extend(extra)
    if recon.engines_silent and override is None:
        reasons.append(Reason.SILENT_COUNTED_IDLE)
    if override is not None:
        reasons.append(Reason.LOAD_OVERRIDDEN)
    value = rec.replicas
    # a count held at current, not set by the load (the floor's derived capacity does not learn from it)
    held = rec.reason in (Reason.SLA_UNREACHABLE, Reason.LOAD_INVALID)

    # sla feedback: the observed attainment corrects the headroom; recommend again with it (SLA mode only)
    feedback = update_feedback(
        sstate.feedback,
        traffic,
        now,
        rc.sla_feedback,
        in_flight=deployment is not None and deployment.in_flight,
        queued_prefill_tokens=None if invalid else load.queued_prefill_tokens,
        startup_s=startup_s,
        aggregated=role is Role.AGG,
    )
    feedback_corr = (0.0, 0.0)
    if rec.mode == Mode.SLA and feedback.reason is not None and not invalid:
        corrections = (feedback.ttft_frac, feedback.itl_frac)  # a relaxation scaled to the requests now
        feedback_corr = corrections
        if corrections != (0.0, 0.0):
            corrected = _recommend(
                role, rc, current, recon, load, traffic, predictor, corrections, startup_s, settled, prompt_cv2
            )[0]
            value = corrected.replicas
            held = held or corrected.reason == Reason.SLA_UNREACHABLE
        if feedback.wound and value > max(current, rec.replicas):  # planner.core.windup: hold the count it has
            value = max(current, rec.replicas)
            feedback = msgspec.structs.replace(
                feedback, reason=Reason.SLA_FEEDBACK_WINDUP, detail=feedback.detail + feedback.wound_detail
            )
        value = add_stage(
            stages,
            reasons,
            Stage.SLA_FEEDBACK,
            Clamped(replicas=value, reason=feedback.reason, detail=f"{feedback.detail} -> {value} replicas"),
        )

    held_value: int | None = None  # an undamped floor with its trend checked: what the hold across gaps remembers
    # forecast floor
    fstate: ForecastState = sstate.forecast
    predicted_rate: float | None = None
    fc = rc.forecast
    rise_note = ""
    if fc.method != ForecastMethod.NONE:
        rate = traffic.request_rate_per_s if traffic is not None else None
        if rate is not None:
            fstate = update_forecast(fstate, rate, now, fc)
            predicted_rate = forecast_rate(fstate, fc)
            if predicted_rate is not None and role is not Role.AGG:  # docs/decision_core.md, "The rise capped"
                predicted_rate, rise_note = rise_capped_rate(fstate, fc, predicted_rate)
                if rise_note:
                    reasons.append(Reason.FORECAST_RISE_CAPPED)
        capacity = fc.replica_capacity_rps
        if capacity is None:
            # a count raised only for max_num_seqs (decode_batch_limit) says nothing of a replica's throughput:
            # the capacity is derived from the count the step model accepts, one fewer
            basis = value
            if rec.reason == Reason.DECODE_BATCH_LIMIT and value == rec.replicas and value > 1:
                basis = value - 1
                reasons.append(Reason.FORECAST_CAPACITY_BEFORE_BATCH_LIMIT)
            if held and value == current:
                # a count held at current (the SLA unreachable, or a load it cannot trust) was not set by the load:
                # the capacity is derived from the count the hold began at, not from one the floor raised since
                anchor = min(fstate.held_count if fstate.held_count is not None else current, current)
                if anchor < basis:
                    basis = anchor
                    reasons.append(Reason.FORECAST_CAPACITY_HELD_COUNT)
                fstate = msgspec.structs.replace(fstate, held_count=anchor)
            elif fstate.held_count is not None:
                fstate = msgspec.structs.replace(fstate, held_count=None)
            fstate, capacity = derived_capacity(fstate, rate, basis, now, fc)
        if predicted_rate is None or (capacity is None and predicted_rate > 0):
            value = add_stage(
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
            detail = f"forecast {predicted_rate:.2f} req/s in {fc.horizon_s:g} s{rise_note} -> floor {floor}"
            noise = noise_floor(fstate, fc, floor, value, capacity, rc.traffic_window_s)
            damped = damped_floor(fstate, fc, floor, value, capacity) if noise is None else None
            if noise is not None:
                floor, noise_detail = noise
                value = add_stage(
                    stages,
                    reasons,
                    Stage.FORECAST,
                    Clamped(
                        replicas=max(floor, value),
                        reason=Reason.FORECAST_TREND_WITHIN_NOISE,
                        detail=f"{detail}; {noise_detail}",
                    ),
                )
            elif damped is not None:
                floor, damped_detail = damped
                value = add_stage(
                    stages,
                    reasons,
                    Stage.FORECAST,
                    Clamped(replicas=floor, reason=Reason.FORECAST_TREND_DAMPED, detail=f"{detail}; {damped_detail}"),
                )
            elif floor > value:
                held_value = checked_floor(fstate, fc, floor, value, capacity)
                capped = (
                    None
                    if held
                    else _floor_within_model(
                        role,
                        rc,
                        current,
                        recon,
                        load,
                        traffic,
                        predictor,
                        rec,
                        value,
                        predicted_rate,
                        feedback_corr,
                        startup_s,
                        settled,
                        prompt_cv2,
                    )
                )
                if capped is not None and capped < floor:
                    value = add_stage(
                        stages,
                        reasons,
                        Stage.FORECAST,
                        Clamped(
                            replicas=max(capped, value),
                            reason=Reason.FORECAST_WITHIN_MODEL_CAPACITY,
                            detail=f"{detail}; the model meets the SLA at {predicted_rate:.2f} req/s with"
                            f" {capped} replicas -> floor {max(capped, value)}",
                        ),
                    )
                else:
                    value = add_stage(
                        stages,
                        reasons,
                        Stage.FORECAST,
                        Clamped(replicas=floor, reason=Reason.FORECAST_FLOOR, detail=detail),
                    )
            else:
                value = add_stage(
                    stages,
                    reasons,
                    Stage.FORECAST,
                    Clamped(replicas=value, reason=Reason.FORECAST_BELOW_LOAD, detail=detail),
                )

    wanted = value
    # bounds
    value = add_stage(
        stages, reasons, Stage.BOUNDS, apply_bounds(value, rc.min_replicas, rc.max_replicas, rc.actuator_bounds)
    )
    down_window_s = scale_down_window_s(rc, sstate, now)
    hold = gap_hold(rc, sstate, now)
    keep_recs_s = max(rc.scale_up.stabilization_window_s, down_window_s, hold[0] if hold is not None else 0.0)
    recommendations = (*prune(sstate.recommendations, now, keep_recs_s), (now, value))
    if held_value is None or held_value >= value:
        checked = value
    else:
        checked = apply_bounds(held_value, rc.min_replicas, rc.max_replicas, rc.actuator_bounds).replicas
    checked_recommendations = (*prune(sstate.checked_recommendations, now, keep_recs_s), (now, checked))
    keep_events_s = max((p.period_s for p in (*rc.scale_up.policies, *rc.scale_down.policies)), default=0.0)
    events = sstate.scale_events
    if sstate.pending_scale is not None:
        at, before, after = sstate.pending_scale
        if current == after and after != before:
            events = (*events, (at, after - before))
    events = prune(events, now, keep_events_s)

    # rate limit, stabilize
    value = add_stage(
        stages, reasons, Stage.RATE_LIMIT, rate_limit(value, current, events, now, rc.scale_up, rc.scale_down)
    )
    value = add_stage(
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
            gap_hold=hold,
            held_recommendations=checked_recommendations,
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
    value = add_stage(stages, reasons, Stage.IN_FLIGHT, clamped)
    reasons.extend(extra_in_flight)

    # min/max are hard limits: an operator's new bounds take effect now, whatever held the count above
    value = add_stage(
        stages,
        reasons,
        Stage.BOUNDS_ENFORCED,
        apply_bounds(value, rc.min_replicas, rc.max_replicas, rc.actuator_bounds),
    )

    new_state = ServiceState(
        recommendations=recommendations,
        checked_recommendations=checked_recommendations,
        scale_events=events,
        coverage_complete_since=since,
        in_flight_since=in_flight_since,
        startup_s_observed=startup_observed,
        scale_up_at=sstate.scale_up_at if in_flight else None,
        scale_downs=sstate.scale_downs,
        rebuy_gaps=sstate.rebuy_gaps,
        rebuy_counts=sstate.rebuy_counts,
        scale_up_rate_per_s=sstate.scale_up_rate_per_s,
        forecast=fstate,
        feedback=feedback.state,
        prompt_log_var=prompt_log_var,
        prompt_log_var_at=prompt_log_var_at,
    )
    return Draft(
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

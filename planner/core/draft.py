"""One service's pipeline in a tick, before the fleet-wide GPU budget: reconcile's load -> recommend (SLA or
threshold) -> SLA feedback -> forecast floor -> bounds -> rate limit -> stabilize -> safety -> in flight.

Pure: ``now`` is an argument, no clock, no I/O. :func:`planner.core.step` drafts every service with
:func:`draft_service`, then applies the GPU budget across them and builds the decisions. See docs/decision_core.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from perf_model.api import PerfPredictor
from planner.core.clamp import Clamped, add_stage, apply_bounds, rate_limit, stabilize
from planner.core.config import CoreConfig, RoleConfig
from planner.core.decision import Mode, Reason, Stage, StageResult
from planner.core.feedback import update_feedback
from planner.core.floor_stage import FloorInputs, forecast_floor
from planner.core.newcomers import newcomer_count, newcomer_hold, only_newcomers_silent, update_reported
from planner.core.observation import Observation, RoleLoad, Traffic
from planner.core.observed_batch import update_demand
from planner.core.prompt_spread import service_cv2, update_log_var
from planner.core.recommend_role import recommend_role
from planner.core.recommendation import Recommendation
from planner.core.reconcile import Reconciled
from planner.core.refuted import counted, refuted_note, track_peaks
from planner.core.returned import capped_by_returns, remember_returns, returned_note
from planner.core.safety import coverage_gate, hold_in_flight, next_coverage_since
from planner.core.served import remember_asked, served, served_note
from planner.core.startup import (
    base_window_s,
    effective_startup_s,
    gap_hold,
    in_flight_raise_to,
    measured_startup_s,
    scale_down_window_s,
)
from planner.core.state import ServiceState
from planner.discovery import Role, WorkerRecord

__all__ = ["Draft", "draft_service"]


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
    # the output-token demand over a minute (the demonstrated decode batch's margin, planner.core.observed_batch)
    demand = update_demand(sstate.output_demand, traffic, now)

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
        rec, extra = recommend_role(
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
            demand=demand,
            ready=ready,
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
            corrected = recommend_role(
                role,
                rc,
                current,
                recon,
                load,
                traffic,
                predictor,
                corrections,
                startup_s,
                settled,
                prompt_cv2,
                demand,
                ready=ready,
            )[0]
            value = corrected.replicas
            held = held or corrected.reason == Reason.SLA_UNREACHABLE
            if corrected.itl_floor_ms is not None:  # planner.core.latency_floor
                feedback = msgspec.structs.replace(
                    feedback,
                    detail=f"{feedback.detail}; ITL tightening over the limit above the model's"
                    f" {corrected.itl_floor_ms:.1f} ms floor",
                )
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

    load_value = value
    # forecast floor (planner.core.floor_stage)
    value, fstate, predicted_rate, held_value = forecast_floor(
        FloorInputs(
            role=role,
            rc=rc,
            current=current,
            recon=recon,
            load=load,
            traffic=traffic,
            predictor=predictor,
            rec=rec,
            held=held,
            corrections=feedback_corr,
            startup_s=startup_s,
            settled=settled,
            prompt_cv2=prompt_cv2,
            ready=ready,
        ),
        value,
        sstate.forecast,
        now,
        stages,
        reasons,
    )

    wanted = value
    # bounds
    value = add_stage(
        stages, reasons, Stage.BOUNDS, apply_bounds(value, rc.min_replicas, rc.max_replicas, rc.actuator_bounds)
    )
    down_window_s = scale_down_window_s(rc, sstate, now)
    hold = gap_hold(rc, sstate, now)
    keep_recs_s = max(rc.scale_up.stabilization_window_s, down_window_s, hold[0] if hold is not None else 0.0)
    keep_recs_s = max(keep_recs_s, rc.hold_across_gaps_max_s or 0.0)  # a level's return (planner.core.returned)
    if sstate.first_report_at is not None:  # the new replicas' hold looks back one window before their first report
        keep_recs_s = max(keep_recs_s, min(now - sstate.first_report_at, down_window_s) + down_window_s)
    recommendations = (*prune(sstate.recommendations, now, keep_recs_s), (now, value))
    if held_value is None or held_value >= value:
        checked = value
    else:
        checked = apply_bounds(held_value, rc.min_replicas, rc.max_replicas, rc.actuator_bounds).replicas
    checked_recommendations = (*prune(sstate.checked_recommendations, now, keep_recs_s), (now, checked))
    # a floor's peak the rates refuted counts at the load's count + 1 in the holds (planner.core.refuted)
    came = apply_bounds(load_value + 1, rc.min_replicas, rc.max_replicas, rc.actuator_bounds).replicas
    rate_seen = traffic.request_rate_per_s if traffic is not None else None
    peaks = track_peaks(sstate.floor_peaks, recommendations, now, value, came, rate_seen, rc.traffic_window_s)
    # a count asked while capacity was coming counts at most what the ready fleet was asked (planner.core.served)
    # a forecast floor above the load's own count is a prediction, not what the fleet was asked at that rate: the
    # holds count it at most what the settled fleet was asked later at a rate not below it, as an unsettled ask
    load_count = apply_bounds(load_value, rc.min_replicas, rc.max_replicas, rc.actuator_bounds).replicas
    asked = remember_asked(sstate.asked, recommendations, now, rate_seen, settled, value > load_count)
    served_recs = served(recommendations, asked, rc.traffic_window_s, rc.forecast.horizon_s)
    served_checked = served(checked_recommendations, asked, rc.traffic_window_s, rc.forecast.horizon_s)
    refuted_recs = counted(served_recs, peaks)
    refuted_checked = counted(served_checked, peaks)
    # beyond the base window, while the traffic's falls and comebacks are remembered, only a level the
    # recommendations came back to is held (planner.core.returned)
    base_s = base_window_s(rc, sstate)
    span_s = max(down_window_s, hold[0]) if hold is not None else 0.0
    # a level came back only if it came back as counted across a gap as asked: lowering a count never makes a return
    returns = remember_returns(sstate.returns, refuted_recs, now, base_s, span_s, asked=recommendations)
    held_recs = capped_by_returns(refuted_recs, now, base_s, span_s, returns)
    held_checked = capped_by_returns(refuted_checked, now, base_s, span_s, returns)
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
    windows = (rc.scale_up.stabilization_window_s, down_window_s)
    stabilized = stabilize(
        value, current, refuted_recs, now, *windows, gap_hold=hold, held_recommendations=refuted_checked
    )
    if refuted_recs is not served_recs:
        as_decided = stabilize(
            value, current, served_recs, now, *windows, gap_hold=hold, held_recommendations=served_checked
        )
        if as_decided.replicas > stabilized.replicas:
            stabilized = refuted_note(stabilized, as_decided.replicas)
    if served_recs is not recommendations or served_checked is not checked_recommendations:
        as_asked = stabilize(
            value, current, recommendations, now, *windows, gap_hold=hold, held_recommendations=checked_recommendations
        )
        if as_asked.replicas > stabilized.replicas:
            stabilized = served_note(stabilized, as_asked.replicas)
    if held_recs is not refuted_recs or held_checked is not refuted_checked:
        capped = stabilize(value, current, held_recs, now, *windows, gap_hold=hold, held_recommendations=held_checked)
        if capped.replicas < stabilized.replicas:
            stabilized = returned_note(capped, stabilized.replicas, base_s, returns)
    value = add_stage(stages, reasons, Stage.STABILIZE, stabilized)

    # safety: no scale-down on incomplete coverage, nor before a full window of it
    # and a count held on a window of data from the count itself once its newest replica reports
    # (planner.core.newcomers)
    newcomers_only = only_newcomers_silent(coverage, sstate.reported_workers)
    reported, first_report = update_reported(coverage, workers, sstate.reported_workers)
    first_report_at = now if first_report else sstate.first_report_at
    since = next_coverage_since(coverage, sstate.coverage_complete_since, now, newcomers_only)
    safety = StageResult(stage=Stage.SAFETY, replicas=value)
    if value < current:
        allowed, why, detail = coverage_gate(coverage, since, started_at, now, down_window_s)
        if allowed:
            newcomers_held, detail = newcomer_hold(first_report_at, now, down_window_s)
            if newcomers_held and first_report_at is not None:
                count = newcomer_count(held_checked, first_report_at, down_window_s, value, current)
                if count >= current:
                    allowed, why = False, (Reason.NEW_REPLICAS_HELD, Reason.SCALE_DOWN_BLOCKED)
                elif count > value:
                    detail += f": held at {count}, the highest recommendation with its trend checked"
                    safety = StageResult(
                        stage=Stage.SAFETY, replicas=count, reason=Reason.NEW_REPLICAS_HELD, detail=detail
                    )
                    reasons.append(Reason.NEW_REPLICAS_HELD)
                    value = count
        if not allowed:
            safety = StageResult(stage=Stage.SAFETY, replicas=current, reason=why[0], detail=detail)
            reasons.extend(why)
            value = current
    stages.append(safety)

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
        floor_peaks=peaks,
        asked=asked,
        returns=returns,
        scale_events=events,
        coverage_complete_since=since,
        reported_workers=reported,
        first_report_at=first_report_at,
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
        output_demand=demand,
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

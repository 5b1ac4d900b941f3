"""The forecast floor stage: Holt's forecast of the request rate one horizon ahead, divided by one replica's
capacity, raises the load's count to what the forecast rate needs (``forecast_floor``), with its checks: the rise
capped at a new high, the trend within the counting noise or damped by what came, the floor within the model's
capacity (at the forecast rate; on a steady rate, at Holt's level on every role), the derived capacity's anchors.
Pure; see docs/decision_core.md ("The forecast floor" and after)."""

from __future__ import annotations

import math

import msgspec

from perf_model.api import PerfPredictor
from planner.core.clamp import Clamped, add_stage
from planner.core.config import ForecastConfig, ForecastMethod, RoleConfig
from planner.core.decision import Mode, Reason, Stage, StageResult
from planner.core.forecast import (
    RISE_SIGMAS,
    ForecastState,
    at_history_high,
    checked_floor,
    damped_floor,
    derived_capacity,
    forecast_rate,
    noise_floor,
    rise_beyond_noise,
    rise_capped_rate,
    update_forecast,
)
from planner.core.observation import RoleLoad, Traffic
from planner.core.observed_batch import at_rate
from planner.core.recommend_role import recommend_role
from planner.core.recommendation import Recommendation
from planner.core.reconcile import Reconciled
from planner.discovery import Role

__all__ = ["FloorInputs", "floor_within_model", "forecast_floor", "model_count_at_level", "steady_floor"]


class FloorInputs(msgspec.Struct, frozen=True, kw_only=True):
    """What the floor reads of the tick's earlier stages (recommend and the closed loop)."""

    role: Role
    rc: RoleConfig
    current: int
    recon: Reconciled
    load: RoleLoad
    traffic: Traffic | None
    predictor: PerfPredictor | None
    rec: Recommendation  # the recommend stage's answer to the load
    held: bool  # a count held at current, not set by the load (SLA unreachable, a load it cannot trust)
    corrections: tuple[float, float]  # the closed loop's TTFT / ITL corrections in force
    startup_s: float
    settled: bool  # no capacity still coming (the tail may raise)
    prompt_cv2: float
    ready: int | None = None  # how many of ``current`` serve (the backlog cap's draining replicas; None: all)


def floor_within_model(inputs: FloorInputs, value: int, predicted_rate: float) -> int | None:
    """The count the model (with the closed loop's correction) asks at the forecast rate, for a prefill-only or
    decode-only role whose load-set count is at least two; None where the derived floor stands (see
    docs/decision_core.md, "The floor within the model's capacity")."""
    if inputs.role not in (Role.PREFILL, Role.DECODE) or value < 2:
        return None
    return model_count_at_level(inputs, predicted_rate)


def model_count_at_level(inputs: FloorInputs, level_per_s: float) -> int | None:
    """The count the model (with the closed loop's correction) asks at the request rate ``level_per_s`` (Holt's
    level for :func:`steady_floor`, the forecast rate for :func:`floor_within_model`), on any role in SLA mode; None
    where the model gives no count for it (recommend's own answer or the model's there is not an SLA count)."""
    traffic, rec = inputs.traffic, inputs.rec
    if traffic is None or rec.mode != Mode.SLA:
        return None
    if rec.reason in (Reason.SLA_UNREACHABLE, Reason.LOAD_INVALID, Reason.NO_LOAD):
        return None
    ask, _ = recommend_role(
        inputs.role,
        inputs.rc,
        inputs.current,
        inputs.recon,
        inputs.load,
        at_rate(traffic, level_per_s),  # the engines' batch is evidence at the rate they were seen at
        inputs.predictor,
        inputs.corrections,
        inputs.startup_s,
        inputs.settled,
        inputs.prompt_cv2,
        ready=inputs.ready,
    )
    if ask.mode != Mode.SLA or ask.reason in (Reason.SLA_UNREACHABLE, Reason.LOAD_INVALID, Reason.NO_LOAD):
        return None
    return ask.replicas


def steady_floor(
    inputs: FloorInputs, fstate: ForecastState, fc: ForecastConfig, floor: int, value: int, capacity: float | None
) -> tuple[int, str] | None:
    """On a steady rate (its rise over ``horizon_s`` within the counting noise, and not at its history's high) and
    a load-set count of two or more, on any role in SLA mode, the floor asks no more than the model at Holt's level
    (no trend): the replica the derived capacity's rounding adds there is not a need the traffic shows. None where
    it does not bind (see docs/decision_core.md, "A steady rate's floor within the model's capacity")."""
    if fc.method != ForecastMethod.HOLT or value < 2 or floor <= value or not capacity or fstate.last_at is None:
        return None
    if rise_beyond_noise(fstate, fc.horizon_s, inputs.rc.traffic_window_s):
        return None
    if at_history_high(fstate):
        return None  # a rate the history has not shown: the derived floor's spare stands (a ramp runs ahead)
    level = max(fstate.holt_level, 0.0)
    need = level / capacity
    level_floor = math.ceil(need - 1e-9) if math.isfinite(need) else floor
    at_level = model_count_at_level(inputs, level)
    if at_level is None:
        return None
    capped = max(min(floor, level_floor, at_level), value)
    if capped >= floor:
        return None
    return capped, (
        f"the rate rose no more than {RISE_SIGMAS:g} sd of its windows' request counts over the last"
        f" {fc.horizon_s:g} s, and the model meets the SLA at its level {level:.2f} req/s with {at_level}"
        f" replicas -> floor {capped}"
    )


def forecast_floor(
    inputs: FloorInputs,
    value: int,
    fstate: ForecastState,
    now: float,
    stages: list[StageResult],
    reasons: list[Reason],
) -> tuple[int, ForecastState, float | None, int | None]:
    """The forecast stage on ``value`` (the count recommend and the closed loop ask): appends its stage and reasons
    and returns the count, the forecast's new state, the forecast rate (None: none) and what the hold across gaps
    remembers of a floor above the load (its trend checked; None: the count itself)."""
    role, rc, current, traffic, rec, held = (
        inputs.role,
        inputs.rc,
        inputs.current,
        inputs.traffic,
        inputs.rec,
        inputs.held,
    )
    held_value: int | None = None  # an undamped floor with its trend checked: what the hold across gaps remembers
    # forecast floor
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
            steady = None if held else steady_floor(inputs, fstate, fc, floor, value, capacity)
            within = steady or noise  # the steady rate's model check first, then the trend within the noise
            damped = damped_floor(fstate, fc, floor, value, capacity) if within is None else None
            if within is not None:
                floor, within_detail = within
                value = add_stage(
                    stages,
                    reasons,
                    Stage.FORECAST,
                    Clamped(
                        replicas=max(floor, value),
                        reason=Reason.FORECAST_STEADY_WITHIN_MODEL
                        if steady is not None
                        else Reason.FORECAST_TREND_WITHIN_NOISE,
                        detail=f"{detail}; {within_detail}",
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
                capped = None if held else floor_within_model(inputs, value, predicted_rate)
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

    return value, fstate, predicted_rate, held_value

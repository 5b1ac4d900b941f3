"""Clamps with Kubernetes HPA semantics: min/max bounds, rate limits (scaling policies per period),
stabilization windows in seconds, and the GPU budget across services. Pure functions; ``now`` is an argument.

Each returns the new value and a :class:`Clamped` saying what it did. Rate limits and stabilization only ever
move a value back toward the current count; the GPU budget only ever shrinks a scale-up (it never turns one
into a scale-down).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import msgspec

from planner.core.config import PolicyKind, RoleBounds, ScaleRules, SelectPolicy
from planner.core.decision import Reason, Stage, StageResult

__all__ = ["BudgetAsk", "Clamped", "apply_bounds", "apply_gpu_budget", "rate_limit", "stabilize"]


class Clamped(msgspec.Struct, frozen=True, kw_only=True):
    replicas: int
    reason: Reason | None = None
    detail: str = ""


def apply_bounds(value: int, min_replicas: int, max_replicas: int, actuator: RoleBounds | None = None) -> Clamped:
    """Clamp to ``[min_replicas, max_replicas]``, then to the actuator's hard bounds when given (the effective
    bounds are the intersection; a count the actuator would refuse is capped, reason
    ``capped_by_actuator_bounds``)."""
    own = _own_bounds(value, min_replicas, max_replicas)
    if actuator is None:
        return own
    if own.replicas > actuator.max_replicas or own.replicas < actuator.min_replicas:
        capped = min(max(own.replicas, actuator.min_replicas), actuator.max_replicas)
        return Clamped(
            replicas=capped,
            reason=Reason.CAPPED_BY_ACTUATOR_BOUNDS,
            detail=f"{value} capped to {capped} by the actuator's bounds"
            f" [{actuator.min_replicas}, {actuator.max_replicas}]",
        )
    return own


def _own_bounds(value: int, min_replicas: int, max_replicas: int) -> Clamped:
    if value < min_replicas:
        return Clamped(
            replicas=min_replicas,
            reason=Reason.CLAMPED_TO_MIN,
            detail=f"{value} raised to min_replicas {min_replicas}",
        )
    if value > max_replicas:
        return Clamped(
            replicas=max_replicas,
            reason=Reason.CLAMPED_TO_MAX,
            detail=f"{value} lowered to max_replicas {max_replicas}",
        )
    return Clamped(replicas=value)


def _scale_up_limit(current: int, events: Sequence[tuple[float, int]], now: float, rules: ScaleRules) -> int:
    if rules.select == SelectPolicy.DISABLED:
        return current
    limits: list[int] = []
    for policy in rules.policies:
        added = sum(delta for at, delta in events if delta > 0 and at > now - policy.period_s)
        start = current - added
        if policy.kind == PolicyKind.PERCENT:
            limit = math.ceil(start * (1.0 + policy.value / 100.0) - 1e-9)
        else:
            limit = start + math.floor(policy.value)
        limits.append(max(limit, 1) if start <= 0 else limit)  # from zero a percentage never grows: allow 1
    limit = max(limits) if rules.select == SelectPolicy.MAX else min(limits)
    return max(limit, current)


def _scale_down_limit(current: int, events: Sequence[tuple[float, int]], now: float, rules: ScaleRules) -> int:
    if rules.select == SelectPolicy.DISABLED:
        return current
    limits: list[int] = []
    for policy in rules.policies:
        removed = sum(-delta for at, delta in events if delta < 0 and at > now - policy.period_s)
        start = current + removed
        if policy.kind == PolicyKind.PERCENT:
            limit = math.floor(start * (1.0 - policy.value / 100.0) + 1e-9)
        else:
            limit = start - math.floor(policy.value)
        limits.append(max(limit, 0))
    # MAX selects the policy allowing the biggest change, i.e. the lowest floor.
    limit = min(limits) if rules.select == SelectPolicy.MAX else max(limits)
    return min(limit, current)


def rate_limit(
    value: int,
    current: int,
    events: Sequence[tuple[float, int]],
    now: float,
    up: ScaleRules,
    down: ScaleRules,
) -> Clamped:
    """HPA rate limits: the change already made inside each policy's period counts against it."""
    if value > current:
        limit = _scale_up_limit(current, events, now, up)
        if value > limit:
            return Clamped(
                replicas=limit,
                reason=Reason.SCALE_UP_RATE_LIMITED,
                detail=f"scale-up to {value} limited to {limit} by the scale-up policies",
            )
    elif value < current:
        limit = _scale_down_limit(current, events, now, down)
        if value < limit:
            return Clamped(
                replicas=limit,
                reason=Reason.SCALE_DOWN_RATE_LIMITED,
                detail=f"scale-down to {value} limited to {limit} by the scale-down policies",
            )
    return Clamped(replicas=value)


def stabilize(
    value: int,
    current: int,
    recommendations: Sequence[tuple[float, int]],
    now: float,
    up_window_s: float,
    down_window_s: float,
    gap_hold: tuple[float, int] | None = None,
    held_recommendations: Sequence[tuple[float, int]] | None = None,
) -> Clamped:
    """HPA stabilization over ``recommendations`` (which include this tick's): a scale-down goes no lower than
    the highest recommendation of the last ``down_window_s``; a scale-up no higher than the lowest of the last
    ``up_window_s``. Never past the current count. ``gap_hold`` ``(window_s, count)``
    (:func:`planner.core.startup.gap_hold`): a scale-down also goes no lower than the highest recommendation of
    the last ``window_s``, up to ``count`` (reason ``scale_down_held_across_gaps`` when that binds);
    ``held_recommendations``, when given, is the history that hold looks back over instead (the core passes the
    recommendations with a forecast floor's trend checked against what came,
    :func:`planner.core.forecast.checked_floor`)."""
    if value < current:
        highest = max((r for at, r in recommendations if at > now - down_window_s), default=value)
        floor = min(max(value, highest), current)
        if gap_hold is not None:
            window_s, count = gap_hold
            history = recommendations if held_recommendations is None else held_recommendations
            held_highest = max((r for at, r in history if at > now - window_s), default=value)
            held = min(held_highest, count, current)
            if held > floor:
                checked = "" if held_recommendations is None else " (forecast trends checked against what came)"
                return Clamped(
                    replicas=held,
                    reason=Reason.SCALE_DOWN_HELD_ACROSS_GAPS,
                    detail=f"highest recommendation{checked} in the last {window_s:g} s is {held_highest}, held up to"
                    f" {count}, the most the traffic bought back in the last 30 minutes",
                )
        if floor > value:
            return Clamped(
                replicas=floor,
                reason=Reason.SCALE_DOWN_STABILIZED,
                detail=f"highest recommendation in the last {down_window_s:g} s is {highest}",
            )
    elif value > current:
        lowest = min((r for at, r in recommendations if at > now - up_window_s), default=value)
        ceiling = max(min(value, lowest), current)
        if ceiling < value:
            return Clamped(
                replicas=ceiling,
                reason=Reason.SCALE_UP_STABILIZED,
                detail=f"lowest recommendation in the last {up_window_s:g} s is {lowest}",
            )
    return Clamped(replicas=value)


class BudgetAsk(msgspec.Struct, frozen=True, kw_only=True):
    """One service's ask of the GPU budget: ``current`` to ``wanted`` replicas of ``gpus_per_replica``."""

    key: str
    current: int
    wanted: int
    gpus_per_replica: int


def apply_gpu_budget(asks: Sequence[BudgetAsk], max_total_gpus: int | None) -> dict[str, Clamped]:
    """Fit every scale-up into ``max_total_gpus``. Scale-downs and holds count at their target; scale-ups
    start from their current count and get one replica at a time, in turn (in ``asks`` order), while GPUs
    remain. A scale-up is never turned into a scale-down, even when the fleet is already over budget."""
    out: dict[str, Clamped] = {ask.key: Clamped(replicas=ask.wanted) for ask in asks}
    if max_total_gpus is None:
        return out
    used = sum(ask.gpus_per_replica * (ask.wanted if ask.wanted <= ask.current else ask.current) for ask in asks)
    ups = [ask for ask in asks if ask.wanted > ask.current]
    granted = {ask.key: ask.current for ask in ups}
    progress = True
    while progress:
        progress = False
        for ask in ups:
            if granted[ask.key] < ask.wanted and used + ask.gpus_per_replica <= max_total_gpus:
                used += ask.gpus_per_replica
                granted[ask.key] += 1
                progress = True
    for ask in ups:
        got = granted[ask.key]
        if got >= ask.wanted:
            continue
        free = max(max_total_gpus - used, 0)
        if got == ask.current:
            out[ask.key] = Clamped(
                replicas=got,
                reason=Reason.GPU_BUDGET_EXHAUSTED,
                detail=f"GPU budget {max_total_gpus} exhausted ({free} free, {ask.gpus_per_replica}/replica):"
                f" holding at {got} instead of {ask.wanted}",
            )
        else:
            out[ask.key] = Clamped(
                replicas=got,
                reason=Reason.GPU_BUDGET_LIMITED,
                detail=f"GPU budget {max_total_gpus} allows {got} of the {ask.wanted} replicas asked",
            )
    return out


def add_stage(stages: list[StageResult], reasons: list[Reason], stage: Stage, clamped: Clamped) -> int:
    stages.append(StageResult(stage=stage, replicas=clamped.replicas, reason=clamped.reason, detail=clamped.detail))
    if clamped.reason is not None:
        reasons.append(clamped.reason)
    return clamped.replicas

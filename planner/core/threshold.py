"""Recommend, threshold mode (no perf model): for each metric, ``needed = total / (target per engine x engines per
replica)`` (HPA's ratio rule written over the role's total, so replicas still starting count as capacity and silent
engines count as idle); the largest wins; no change while every ratio to the current count is within the
tolerance. SLA mode is :mod:`planner.core.recommend`."""

from __future__ import annotations

import math

from planner.core.config import ThresholdConfig
from planner.core.decision import Mode, Reason
from planner.core.observation import RoleLoad
from planner.core.recommendation import MAX_SEARCH_REPLICAS, Recommendation
from planner.core.reconcile import Reconciled
from planner.discovery import Role

__all__ = ["recommend_threshold"]


def ceil_replicas(x: float) -> int:
    """ceil for a replica need; an unbounded (or NaN) need is capped far above any bound rather than raising."""
    if not x > 0:
        return 0
    return math.ceil(min(x, float(MAX_SEARCH_REPLICAS) ** 2) - 1e-9)


def recommend_threshold(
    role: Role, current: int, rec: Reconciled, load: RoleLoad, cfg: ThresholdConfig
) -> Recommendation:
    """Threshold mode. ``current`` is the deployment's desired count (in-flight replicas included). A load that
    is not a number holds ``current`` (``load_invalid``) rather than reading as no load."""
    dp = max(rec.dp_per_replica, 1)
    needs: list[tuple[float, str]] = []
    prefill = role in (Role.PREFILL, Role.AGG)
    decode = role in (Role.DECODE, Role.AGG)
    if prefill:
        needs.append(
            (
                load.queued_prefill_tokens / (cfg.queued_prefill_tokens_per_engine * dp),
                "queued prefill tokens",
            )
        )
        if rec.max_num_batched_tokens > 0:
            needs.append(
                (
                    load.scheduled_prefill_tokens / (cfg.prefill_budget_frac * rec.max_num_batched_tokens * dp),
                    "prefill token budget",
                )
            )
    if decode:
        if rec.kv_capacity_tokens > 0:
            needs.append((load.decode_kv_tokens / (cfg.kv_usage_frac * rec.kv_capacity_tokens * dp), "KV usage"))
        if rec.max_num_seqs > 0:
            needs.append((load.decode_requests / (cfg.decode_seq_frac * rec.max_num_seqs * dp), "decode batch"))
        needs.append(
            (
                load.queued_decode_requests / (cfg.queued_decode_requests_per_engine * dp),
                "queued decode requests",
            )
        )
    unusable = [metric for value, metric in needs if math.isnan(value)]
    if unusable:  # a load that is not a number is not zero: never scale on it (step holds on it before, too)
        return Recommendation(
            replicas=current,
            reason=Reason.LOAD_INVALID,
            mode=Mode.THRESHOLD,
            detail=f"{unusable[0]} is not a number: holding {current}",
        )
    need, metric = max(needs, key=lambda item: item[0]) if needs else (0.0, "none")
    if need <= 0:
        return Recommendation(
            replicas=0, reason=Reason.NO_LOAD, mode=Mode.THRESHOLD, detail="no load on any reporting engine"
        )
    detail = f"{metric} needs {need:.2f} replicas"
    if current > 0 and abs(need / current - 1.0) <= cfg.tolerance_frac:
        return Recommendation(
            replicas=current,
            reason=Reason.WITHIN_TOLERANCE,
            mode=Mode.THRESHOLD,
            detail=f"{detail}, within {cfg.tolerance_frac:.0%} of {current}",
        )
    replicas = ceil_replicas(need)
    if replicas > current:
        reason = Reason.LOAD_ABOVE_TARGET
    elif replicas < current:
        reason = Reason.LOAD_BELOW_TARGET
    else:
        reason = Reason.WITHIN_TOLERANCE
    return Recommendation(replicas=replicas, reason=reason, mode=Mode.THRESHOLD, detail=detail)

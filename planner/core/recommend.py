"""Recommend: how many replicas the current load needs, computed as a count (not +/-1 per tick).

Threshold mode (no model): for each metric, ``needed = total / (target per engine x engines per replica)``
(HPA's ratio rule written over the role's total, so replicas still starting count as capacity and silent
engines count as idle); the largest wins; no change while every ratio to the current count is within the
tolerance.

SLA mode (a :class:`perf_model.api.PerfPredictor`): the fewest replicas N whose predicted TTFT (prefill, agg)
and ITL (decode, agg), with the load spread over N replicas, stay within the targets using the model's upper
band. Found by bisection, then re-checked at N (the consolidation check: the remaining replicas meet the SLA
with the load redistributed) and walked up if the model is not monotone there.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import msgspec

from perf_model.api import PerfPredictor
from planner.core.config import SlaTargets, ThresholdConfig
from planner.core.decision import Mode, Reason
from planner.core.observation import RoleLoad, Traffic
from planner.core.reconcile import Reconciled
from planner.discovery import Role

__all__ = ["Recommendation", "recommend_sla", "recommend_threshold"]

# Bisection never searches past this many replicas (and says sla_unreachable when even that is not enough).
MAX_SEARCH_REPLICAS = 100_000


class Recommendation(msgspec.Struct, frozen=True, kw_only=True):
    replicas: int
    reason: Reason
    mode: Mode
    detail: str = ""
    predicted_ttft_ms: float | None = None
    predicted_itl_ms: float | None = None


def _ceil(x: float) -> int:
    return math.ceil(x - 1e-9) if x > 0 else 0


def recommend_threshold(
    role: Role, current: int, rec: Reconciled, load: RoleLoad, cfg: ThresholdConfig
) -> Recommendation:
    """Threshold mode. ``current`` is the deployment's desired count (in-flight replicas included)."""
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
    replicas = _ceil(need)
    if replicas > current:
        reason = Reason.LOAD_ABOVE_TARGET
    elif replicas < current:
        reason = Reason.LOAD_BELOW_TARGET
    else:
        reason = Reason.WITHIN_TOLERANCE
    return Recommendation(replicas=replicas, reason=reason, mode=Mode.THRESHOLD, detail=detail)


def _mdl_queue_requests(utilization: float) -> float:
    """Mean queue length (requests) of an M/D/1 queue at ``utilization`` < 1."""
    return utilization * utilization / (2.0 * (1.0 - utilization))


def recommend_sla(
    role: Role,
    current: int,
    rec: Reconciled,
    load: RoleLoad,
    traffic: Traffic | None,
    predictor: PerfPredictor,
    sla: SlaTargets,
    headroom_frac: float,
    search_max: int,
) -> Recommendation:
    """SLA mode: the fewest replicas meeting the targets at the current load (see module docstring)."""
    dp = max(rec.dp_per_replica, 1)
    mnbt = max(int(rec.max_num_batched_tokens), 1)
    rate = traffic.request_rate_per_s if traffic is not None else None
    isl = traffic.isl_tokens if traffic is not None and traffic.isl_tokens else None
    osl = traffic.osl_tokens if traffic is not None and traffic.osl_tokens else None
    if isl is None:
        tokens = load.queued_prefill_tokens + load.scheduled_prefill_tokens
        isl = tokens / rec.prefill_requests if rec.prefill_requests > 0 else float(mnbt) / 2
    if (
        not rate
        and load.queued_prefill_tokens <= 0
        and load.scheduled_prefill_tokens <= 0
        and load.decode_requests <= 0
        and load.queued_decode_requests <= 0
    ):
        return Recommendation(replicas=0, reason=Reason.NO_LOAD, mode=Mode.SLA, detail="no load and no traffic")
    check_ttft = role in (Role.PREFILL, Role.AGG)
    check_itl = role in (Role.DECODE, Role.AGG)
    ttft_limit = sla.ttft_ms * (1.0 - headroom_frac)
    itl_limit = sla.itl_ms * (1.0 - headroom_frac)
    kv_per_request = load.decode_kv_tokens / load.decode_requests if load.decode_requests > 0 else isl
    # Prefill throughput of one engine (tokens/s) from the time of one full chunk.
    chunk_ms = predictor.predict_ttft_ms(float(mnbt), 0.0, mnbt).value_ms if rate else 0.0
    tokens_per_s = mnbt / (chunk_ms / 1000.0) if chunk_ms > 0 else math.inf

    def evaluate(n: int) -> tuple[bool, float | None, float | None]:
        engines = n * dp
        ok = True
        ttft = itl = None
        if check_ttft:
            backlog = load.queued_prefill_tokens / engines
            if rate:
                utilization = rate * isl / engines / tokens_per_s
                if utilization >= 1.0:
                    return False, math.inf, None
                backlog = max(backlog, isl * _mdl_queue_requests(utilization))
            ttft = predictor.predict_ttft_ms(isl, backlog, mnbt).upper_ms
            ok = ttft <= ttft_limit
        if check_itl and ok:
            requests = load.decode_requests + load.queued_decode_requests
            itl = predictor.predict_itl_ms(requests / engines, requests * kv_per_request / engines).upper_ms
            if rate and osl:
                # Little's law: concurrency = rate x OSL x ITL; two fixed-point rounds from observed.
                for _ in range(2):
                    concurrency = max(requests, rate * osl * itl / 1000.0)
                    itl = predictor.predict_itl_ms(
                        concurrency / engines, concurrency * kv_per_request / engines
                    ).upper_ms
            ok = itl <= itl_limit
        return ok, ttft, itl

    def first_meeting(pred: Callable[[int], bool], lo: int, hi: int) -> int | None:
        if not pred(hi):
            return None
        while lo < hi:
            mid = (lo + hi) // 2
            if pred(mid):
                hi = mid
            else:
                lo = mid + 1
        return lo

    search_hi = max(min(search_max, MAX_SEARCH_REPLICAS), 1)
    n = first_meeting(lambda k: evaluate(k)[0], 1, search_hi)
    if n is None:
        _, ttft, itl = evaluate(search_hi)
        if evaluate(MAX_SEARCH_REPLICAS)[0]:
            return Recommendation(
                replicas=search_hi,
                reason=Reason.SLA_NEEDS_MORE,
                mode=Mode.SLA,
                detail=f"more than {search_hi} replicas needed",
                predicted_ttft_ms=_finite(ttft),
                predicted_itl_ms=_finite(itl),
            )
        # More replicas do not help (the latency floor of one request is above the target): hold.
        return Recommendation(
            replicas=current,
            reason=Reason.SLA_UNREACHABLE,
            mode=Mode.SLA,
            detail=f"even {search_hi} replicas miss the SLA; holding at {current}",
            predicted_ttft_ms=_finite(ttft),
            predicted_itl_ms=_finite(itl),
        )
    # Consolidation check: the chosen count must itself meet the SLA (bisection assumed monotone).
    ok, ttft, itl = evaluate(n)
    while not ok and n < search_hi:
        n += 1
        ok, ttft, itl = evaluate(n)
    if n > current:
        reason = Reason.SLA_NEEDS_MORE
    elif n < current:
        reason = Reason.SLA_ALLOWS_FEWER
    else:
        reason = Reason.SLA_MET
    parts = []
    if ttft is not None:
        parts.append(f"TTFT {ttft:.1f} ms <= {ttft_limit:.1f}")
    if itl is not None:
        parts.append(f"ITL {itl:.1f} ms <= {itl_limit:.1f}")
    return Recommendation(
        replicas=n,
        reason=reason,
        mode=Mode.SLA,
        detail=f"{n} replicas: " + ", ".join(parts),
        predicted_ttft_ms=_finite(ttft),
        predicted_itl_ms=_finite(itl),
    )


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None

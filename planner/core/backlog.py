"""The prefill backlog of a scale-up (issue 13, item 4), pure: how fast the engines drain a queue, and the
backlog-aware cap of a scale-up (a queued request stays on the engine that holds it, so replicas added for a queue
help only the arrivals, and replicas still starting hold none of it: the queue drains on the ready ones). Used by
:func:`planner.core.recommend.recommend_sla`."""

from __future__ import annotations

import math

from perf_model.api import StepPredictor
from planner.core.agg_latency import predict_agg_latency
from planner.core.decision import Reason

__all__ = ["backlog_cap", "served_prefill_tokens_per_s"]


def backlog_cap(
    searched: int | None,
    current: int,
    *,
    queued_tokens: float,
    arrival_tokens_per_s: float,
    capacity_tokens_per_s: float,
    startup_s: float,
    arrivals_need: int | None,
    ready: int | None = None,
) -> tuple[int, Reason, str] | None:
    """The backlog-aware cap of a scale-up (see :func:`planner.core.recommend.recommend_sla`): None when it does
    not bind (no scale-up asked, no queue, no rate, no start-up delay or no capacity up), else (count, reason,
    detail).
    ``searched`` is the search's answer (None: no count met the SLA); ``arrivals_need`` the fewest replicas
    meeting it for the arrivals alone, with no backlog (None: none). ``current`` is the desired count, ``ready``
    how many of them serve (None: all; the rest are starting), ``capacity_tokens_per_s`` the prefill rate of the
    ``current`` replicas. Only the ready replicas hold the queue and drain it, at their share of that rate, while
    the arrivals reach them; the starting ones take arrivals once up, so with the queue outlasting a start-up the
    count is the ready ones plus what the arrivals need (the starting ones among those), never below
    ``current``."""
    if searched is not None and searched <= current:
        return None
    if current <= 0 or queued_tokens <= 0 or arrival_tokens_per_s <= 0 or startup_s <= 0:
        return None
    if not math.isfinite(capacity_tokens_per_s) or capacity_tokens_per_s <= 0:
        return None
    need = arrivals_need
    if need is None:
        return None  # the arrivals alone cannot be served: the search's answer stands
    draining = current if ready is None else min(max(ready, 0), current)
    surplus = capacity_tokens_per_s * draining / current - arrival_tokens_per_s
    drain_s = queued_tokens / surplus if surplus > 0 else math.inf
    backlog = f"{queued_tokens:.0f} queued prefill tokens"
    on = f"on {current} replicas" if draining == current else f"on the {draining} ready of {current} replicas"
    if drain_s <= startup_s:
        count = max(need, current)
        if searched is not None and count >= searched:
            return None
        return (
            count,
            Reason.BACKLOG_DRAINS_BEFORE_STARTUP,
            f"{backlog} drain in {drain_s:.0f} s {on}, before a start-up ({startup_s:.0f} s): {count} for the arrivals",
        )
    count = max(draining + need, current)
    if searched is not None and count >= searched:
        return None
    drains = f"drain in {drain_s:.0f} s" if math.isfinite(drain_s) else "grow"
    return (
        count,
        Reason.BACKLOG_OUTLASTS_STARTUP,
        f"{backlog} {drains} {on}, past a start-up ({startup_s:.0f} s); queued requests stay"
        f" there: {draining} + {need} for the arrivals" + (f", {current} desired" if draining + need < current else ""),
    )


_SERVED_BISECTIONS = 12


def served_prefill_tokens_per_s(
    predictor: StepPredictor,
    *,
    isl_tokens: float,
    osl_tokens: float,
    kv_per_request_tokens: float,
    max_num_batched_tokens: int,
    decode_requests: float,
    max_num_seqs: float,
    kv_capacity_tokens: float,
    guess_tokens_per_s: float,
) -> float:
    """The prompt tokens per second one aggregated engine prefills at most: ``isl_tokens`` times the highest prompt
    rate :func:`predict_agg_latency` does not call saturated (decodes riding along, chunks attending to the earlier
    ones), found by bisection from ``guess_tokens_per_s`` (bounded work: at most 2 x 12 predictions)."""
    if isl_tokens <= 0 or not math.isfinite(guess_tokens_per_s) or guess_tokens_per_s <= 0:
        return guess_tokens_per_s

    def saturated(prompts_per_s: float) -> bool:
        agg = predict_agg_latency(
            predictor,
            rate_per_s=prompts_per_s,
            isl_tokens=isl_tokens,
            osl_tokens=osl_tokens,
            kv_per_request_tokens=kv_per_request_tokens,
            max_num_batched_tokens=max_num_batched_tokens,
            decode_requests=decode_requests,
            max_num_seqs=max_num_seqs,
            kv_capacity_tokens=kv_capacity_tokens,
        )
        return bool(agg.saturated) or not math.isfinite(agg.ttft_ms)

    lo, hi = 0.0, 2.0 * guess_tokens_per_s / isl_tokens
    if not saturated(hi):
        return guess_tokens_per_s  # the chunk estimate is the lower one
    for _ in range(_SERVED_BISECTIONS):
        mid = (lo + hi) / 2.0
        if saturated(mid):
            hi = mid
        else:
            lo = mid
    return lo * isl_tokens

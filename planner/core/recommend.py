"""Recommend, SLA mode: how many replicas the current load needs, computed as a count (not +/-1 per tick).
Threshold mode (no model) is :mod:`planner.core.threshold`; both return a
:class:`planner.core.recommendation.Recommendation`.

SLA mode (a :class:`perf_model.api.PerfPredictor`): the fewest replicas N whose predicted TTFT (prefill, agg)
and ITL (decode, agg), with the load spread over N replicas, stay within the targets using the model's upper
band. Found by bisection, then re-checked at N (the consolidation check: the remaining replicas meet the SLA
with the load redistributed) and walked up if the model is not monotone there.

Aggregated engines, when the predictor also predicts mixed steps (:class:`perf_model.api.StepPredictor`), are
judged on the steps they actually run (:func:`predict_agg_latency`): vLLM's scheduler gives each running decode
one token of the step budget first and fills the rest with prefill chunks, so a share of the steps carry a chunk
(long) and the rest only decodes (short); ITL is their time-weighted mean at the decode batch Little's law gives
(a fixed point); TTFT is the prompt's chunk steps, decode batch included, behind the M/D/1 queue of prompts.
Without ``predict_step_ms`` the decode-only ITL and prefill-only TTFT are used as before (they
under-predict an aggregated engine several-fold under load).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from perf_model.api import PerfPredictor, StepPredictor
from planner.core.agg_latency import AggLatency, mdl_queue_requests, predict_agg_latency
from planner.core.backlog import backlog_cap, served_prefill_tokens_per_s
from planner.core.config import SlaTargets
from planner.core.decision import Mode, Reason
from planner.core.latency_floor import corrected_limit_ms
from planner.core.observation import RoleLoad, Traffic
from planner.core.observed_batch import OutputDemand, demonstrated_batch
from planner.core.recommendation import MAX_SEARCH_REPLICAS, Recommendation
from planner.core.reconcile import Reconciled
from planner.core.tail import itl_miss_frac, osl_points, ttft_tail_isl
from planner.core.threshold import recommend_threshold
from planner.discovery import Role

__all__ = ["AggLatency", "Recommendation", "predict_agg_latency", "recommend_sla", "recommend_threshold"]

_MAX_PROMPT_CV2 = 10.0  # a spread past this is not a prompt-length distribution the queue model can use


# The consolidation walk above the bisection's answer (the model is monotone almost everywhere): at most this
# many single steps, then the bisection's own answer, which always meets the targets, stands.
_WALK_STEPS = 32
# The observed ITL attainment scales the tail model's predicted misses within these bounds.
_MIN_TAIL_SCALE = 0.01
_MAX_TAIL_SCALE = 10.0
_MAX_HEADROOM = 0.95  # configured headroom plus the closed loop's correction never leaves less than 5 % of a target


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
    itl_headroom_frac: float | None = None,
    default_max_num_batched_tokens: int = 8192,
    ttft_correction_frac: float = 0.0,
    itl_correction_frac: float = 0.0,
    startup_s: float = 0.0,
    attainment_goal: float = 0.99,
    min_samples: int = 20,
    tail_may_raise: bool = True,
    prompt_cv2: float = 0.0,
    demand: OutputDemand | None = None,
    ready: int | None = None,
) -> Recommendation:
    """SLA mode: the fewest replicas meeting the targets at the current load (see module docstring).

    The chunk size is the engines' reported ``max_num_batched_tokens``; with no engine reporting one (no
    worker discovered, e.g. a what-if on an empty role) ``default_max_num_batched_tokens`` (never 1 token: a
    1e9-token prompt would be a billion chunks).

    Start-up aware (``startup_s`` > 0, with a request rate): replicas added now serve only after one start-up, so
    a count above ``current`` is judged against the prefill backlog that will remain then — today's queue plus
    the arrivals meanwhile minus what the current engines prefill in that time — not against today's queue
    (which the current engines face, and which sized a surge's answer for a backlog gone by the time the
    replicas arrive).

    Backlog-aware cap: a queued request stays on the engine that holds it (vLLM does not move it; the router
    places only new arrivals), so replicas added for a backlog help only the arrivals, and replicas still starting
    hold none of it: the queue drains on the ``ready`` ones (None: all ``current``). When they drain today's
    queue within one start-up (arrivals counted at the longer of the traffic's mean prompt and the mean prompt in
    the engines now, which shows a shift to longer prompts before the traffic window does), a scale-up goes no
    further than what the arrivals need (``backlog_drains_before_startup``, a hold when the current count is
    enough); when the backlog outlasts a start-up, no further than the ready count plus what the arrivals need on
    the other replicas (starting or new) alone, while the ready engines drain it, and not below the current count
    (``backlog_outlasts_startup``). The drain (and the backlog left after a start-up) is counted at the lower of one
    chunk's prefill rate alone and, on aggregated engines with a step model, what an engine prefills with its
    decodes riding along at the prompt length the engines hold (long prompts: lower).

    Decode batch limit: a decode role's count is infeasible when its Little's-law batch per engine is past
    ``max_num_seqs`` (``decode_batch_limit`` when that rules out one replica fewer).

    Per-request tail (:mod:`planner.core.tail`): with the traffic's ISL/OSL percentiles, TTFT is checked for a
    p99 (else p90) prompt behind the queue, and on aggregated engines with a step model the share of requests
    whose own ITL misses the limit must stay within ``1 - attainment_goal``, that share scaled (within
    0.01 .. 10) from the observed ITL misses and the predicted ones at the current count: only when the traffic
    carries an ITL attainment resting on at least ``min_samples`` requests. With ``tail_may_raise`` false (capacity
    still coming: the observed misses predate it) the tail only keeps replicas, never adds them."""
    dp = max(rec.dp_per_replica, 1)
    reported = rec.max_num_batched_tokens if math.isfinite(rec.max_num_batched_tokens) else 0.0
    mnbt = int(reported) if reported >= 1 else max(int(default_max_num_batched_tokens), 1)
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
    # The closed loop's corrections (planner.core.feedback) add to the configured headroom; the total stays < 0.95.
    ttft_headroom = min(headroom_frac + ttft_correction_frac, _MAX_HEADROOM)
    itl_base_frac = headroom_frac if itl_headroom_frac is None else itl_headroom_frac
    itl_headroom = min(itl_base_frac + itl_correction_frac, _MAX_HEADROOM)
    ttft_limit = sla.ttft_ms * (1.0 - ttft_headroom)
    itl_limit = sla.itl_ms * (1.0 - itl_headroom)
    # The KV each decoding request holds; a request count below one (a sub-normal override: 1 token over 5e-324
    # requests) overflows the ratio, and inf x 0 requests reached the step model as an invalid load.
    kv_ratio = load.decode_kv_tokens / load.decode_requests if load.decode_requests > 0 else isl
    kv_per_request = kv_ratio if math.isfinite(kv_ratio) else isl
    decode_batch = load.decode_requests + load.queued_decode_requests  # a queued decode joins the next step
    # Prefill throughput of one engine (tokens/s) from the time of one full chunk.
    chunk_ms = predictor.predict_ttft_ms(float(mnbt), 0.0, mnbt).value_ms if rate else 0.0
    tokens_per_s = mnbt / (chunk_ms / 1000.0) if chunk_ms > 0 else math.inf
    # The prompts in the engines now (FPM: queued plus scheduled prefill tokens per prefill request) show a shift
    # to longer prompts before the traffic window does: the cap's drain counts the arrivals' prompt tokens at the
    # longer mean (the backlog left after a start-up keeps the traffic's: with it, prefill replicas were held for
    # queues that drained, output_shift disaggregated +0.15 GPU-h).
    in_engines = load.queued_prefill_tokens + load.scheduled_prefill_tokens
    engine_isl = in_engines / rec.prefill_requests if rec.prefill_requests > 0 else 0.0
    arrival_tokens_per_s = (rate or 0.0) * max(isl, engine_isl)
    mixed = predictor if role is Role.AGG and isinstance(predictor, StepPredictor) else None
    if mixed is not None and load.decode_requests <= 0:
        kv_per_request = isl + (osl or 0.0) / 2.0
    # A tightening of the ITL limit is taken over the span above the model's floor, one sequence decoding alone
    # (planner.core.latency_floor): no count goes below it.
    itl_floor_ms: float | None = None
    if check_itl and itl_headroom - itl_base_frac > 0:
        itl_floor_ms = (
            mixed.predict_step_ms(0.0, 0.0, 1.0, kv_per_request)
            if mixed is not None
            else predictor.predict_itl_ms(1.0, kv_per_request)
        ).upper_ms
        itl_limit = corrected_limit_ms(sla.itl_ms, itl_base_frac, itl_headroom - itl_base_frac, itl_floor_ms)
    floor_scaled = itl_floor_ms is not None and itl_limit != sla.itl_ms * (1.0 - itl_headroom)
    # The queue's drain is counted at the lower of two prefill throughputs: one full chunk alone, and (aggregated
    # engines with a step model) the prompts an engine prefills per second with its decodes riding along and each
    # chunk attending to the earlier ones, at the prompt length the engines hold now -- long prompts take
    # several-fold longer chunk steps than a chunk alone (prompt_shift: 42k tokens/s alone, 37k served).
    if (
        mixed is not None
        and rate
        and startup_s > 0
        and current > 0
        and load.queued_prefill_tokens > 0
        and math.isfinite(tokens_per_s)
    ):
        served = served_prefill_tokens_per_s(
            mixed,
            isl_tokens=max(isl, engine_isl),
            osl_tokens=osl or 1.0,
            kv_per_request_tokens=kv_per_request,
            max_num_batched_tokens=mnbt,
            decode_requests=decode_batch / (current * dp),
            max_num_seqs=rec.max_num_seqs,
            kv_capacity_tokens=rec.kv_capacity_tokens,
            guess_tokens_per_s=tokens_per_s,
        )
        tokens_per_s = min(tokens_per_s, served)
    backlog_later = load.queued_prefill_tokens
    if startup_s > 0 and rate and current > 0 and math.isfinite(tokens_per_s):
        net_tokens_per_s = rate * isl - tokens_per_s * current * dp
        backlog_later = max(0.0, load.queued_prefill_tokens + net_tokens_per_s * startup_s)

    def backlog_for(n: int, arrivals_only: bool) -> float:
        if arrivals_only:
            return 0.0
        return load.queued_prefill_tokens if n <= current else backlog_later

    # The per-request tail (planner.core.tail), from the traffic's ISL/OSL distribution when it has one.
    t = traffic
    osl_pts = (
        osl_points(None, t.osl_tokens_p50, t.osl_tokens_p90, t.osl_tokens_p99)
        if t is not None and t.osl_tokens_p50
        else ()
    )
    tail_isl = t.isl_tokens_p90 if t is not None and t.isl_tokens_p90 and t.isl_tokens_p90 > isl else isl
    ttft_isl = isl
    if t is not None and check_ttft:
        ttft_isl = ttft_tail_isl(
            isl,
            t.isl_tokens_p90,
            t.isl_tokens_p99,
            lambda tokens: predictor.predict_ttft_ms(tokens, 0.0, mnbt).upper_ms,
            ttft_limit,
        )
    miss_budget = max(1.0 - attainment_goal, 0.0)

    # What the engines demonstrably do at the count they run (planner.core.observed_batch): the model's
    # batch-limit refusal of that count is overridden when the observed batch stays within max_num_seqs with margin
    # and the observed attainment meets the goal.
    observed_batch = demonstrated_batch(
        traffic,
        load,
        current * dp,
        rec.max_num_seqs,
        attainment_goal,
        min_samples,
        judge_ttft=check_ttft,
        demand=demand,
    )
    shown: dict[int, float] = {}

    def evaluate_agg(
        n: int, step_predictor: StepPredictor, arrivals_only: bool
    ) -> tuple[bool, float | None, float | None]:
        engines = n * dp
        agg = predict_agg_latency(
            step_predictor,
            rate_per_s=(rate or 0.0) / engines,
            isl_tokens=isl,
            osl_tokens=osl or 1.0,
            kv_per_request_tokens=kv_per_request,
            max_num_batched_tokens=mnbt,
            decode_requests=decode_batch / engines,
            queued_prefill_tokens=backlog_for(n, arrivals_only) / engines,
            scheduled_prefill_tokens=0.0 if rate else load.scheduled_prefill_tokens / engines,
            max_num_seqs=rec.max_num_seqs,
            kv_capacity_tokens=rec.kv_capacity_tokens,
            tail_isl_tokens=tail_isl,
            ttft_isl_tokens=ttft_isl,
        )
        ttft = max(agg.ttft_ms, agg.ttft_tail_ms) if ttft_isl > isl else agg.ttft_ms
        ok = ttft <= ttft_limit and agg.itl_ms <= itl_limit
        if not ok and agg.saturated == "max_num_seqs" and n == current and observed_batch is not None:
            shown[n] = observed_batch
            return True, None, None
        if ok and miss_scale is not None and (n < current or tail_may_raise):
            ok = miss_scale * tail_miss(agg, engines) <= miss_budget
        return ok, ttft, agg.itl_ms

    def tail_miss(agg: AggLatency, engines: int) -> float:
        return itl_miss_frac(
            prompts_per_s=(rate or 0.0) / engines,
            chunk_steps_per_prompt=agg.prompt_chunk_steps,
            chunk_step_ms=agg.chunk_step_ms,
            last_chunk_step_ms=agg.last_chunk_step_ms,
            decode_step_ms=agg.decode_step_ms,
            itl_ms=agg.itl_ms,
            ttft_ms=agg.ttft_ms,
            limit_ms=itl_limit,
            osl=osl_pts,
        )

    # The tail's scale comes from what users felt (the model gives the shape, how the share of misses falls with
    # the count; the observed ITL attainment at the current count gives its scale), bounded, and only with enough
    # requests observed: without it (None) the mean's check stands. Prefix-cache hits, which the model does not
    # see, shorten the chunk steps: uncalibrated, it asked for ~110 replicas where ~13 meet 99 % (Mooncake).
    miss_scale: float | None = None
    observed = t.itl_attainment_frac if t is not None else None
    samples = (t.itl_samples_in_window or 0) if t is not None else 0
    if mixed is not None and osl_pts and observed is not None and samples >= min_samples and current > 0 and rate:
        now_agg = predict_agg_latency(
            mixed,
            rate_per_s=rate / (current * dp),
            isl_tokens=isl,
            osl_tokens=osl or 1.0,
            kv_per_request_tokens=kv_per_request,
            max_num_batched_tokens=mnbt,
            decode_requests=decode_batch / (current * dp),
            max_num_seqs=rec.max_num_seqs,
            kv_capacity_tokens=rec.kv_capacity_tokens,
            tail_isl_tokens=tail_isl,
        )
        # The allowed share at count N is the current one's times sqrt(budget / observed misses): at the goal the
        # current count stays; a shortfall asks for fewer misses by the square root of its ratio (damped: the
        # share falls slowly with the count, a full correction doubled the fleet for 2 % missed); all met (a
        # quarter of the budget counted) releases where the predicted share is at most twice today's.
        missed = max(1.0 - observed, miss_budget / 4.0)
        ratio = math.sqrt(miss_budget * missed) / max(tail_miss(now_agg, current * dp), 1e-9)
        miss_scale = min(max(ratio, _MIN_TAIL_SCALE), _MAX_TAIL_SCALE)

    # The prompts' service-time spread (Pollaczek-Khinchine: an M/G/1 waits 1 + CV^2 times the M/D/1), bounded.
    queue_cv2 = min(max(prompt_cv2, 0.0), _MAX_PROMPT_CV2) if math.isfinite(prompt_cv2) else 0.0

    # the counts the decode batch limit ruled out (a batch per engine past max_num_seqs, which met the ITL otherwise)
    batch_limited: dict[int, float] = {}

    def evaluate(n: int, arrivals_only: bool = False) -> tuple[bool, float | None, float | None]:
        if mixed is not None:
            return evaluate_agg(n, mixed, arrivals_only)
        engines = n * dp
        ok = True
        ttft = itl = None
        if check_ttft:
            backlog = backlog_for(n, arrivals_only) / engines
            if rate:
                utilization = rate * isl / engines / tokens_per_s
                if utilization >= 1.0:
                    return False, math.inf, None
                backlog = max(backlog, isl * mdl_queue_requests(utilization) * (1.0 + queue_cv2))
            ttft = predictor.predict_ttft_ms(isl, backlog, mnbt).upper_ms
            if ttft_isl > isl:
                ttft = max(ttft, predictor.predict_ttft_ms(ttft_isl, backlog, mnbt).upper_ms)
            ok = ttft <= ttft_limit
        if check_itl and ok:
            requests = decode_batch
            itl = predictor.predict_itl_ms(requests / engines, requests * kv_per_request / engines).upper_ms
            if rate and osl:
                # Little's law: concurrency = rate x OSL x ITL; two fixed-point rounds from observed.
                for _ in range(2):
                    concurrency = max(requests, rate * osl * itl / 1000.0)
                    itl = predictor.predict_itl_ms(
                        concurrency / engines, concurrency * kv_per_request / engines
                    ).upper_ms
                # An engine runs at most max_num_seqs requests: a concurrency past it waits between tokens, which
                # the step model at that batch does not see.
                if rec.max_num_seqs > 0 and concurrency / engines > rec.max_num_seqs:
                    if n == current and observed_batch is not None:
                        shown[n] = observed_batch
                        return True, ttft, None
                    if itl <= itl_limit:
                        batch_limited[n] = concurrency / engines
                    return False, ttft, math.inf
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
    arrivals: int | None = None
    if rate and (n is None or n > current):
        arrivals = first_meeting(lambda k: evaluate(k, True)[0], 1, search_hi)
    capped = backlog_cap(
        n,
        current,
        queued_tokens=load.queued_prefill_tokens,
        arrival_tokens_per_s=arrival_tokens_per_s,
        capacity_tokens_per_s=tokens_per_s * current * dp if current > 0 else 0.0,
        startup_s=startup_s,
        arrivals_need=arrivals,
        ready=ready,
    )
    if capped is not None:
        count, reason, why = capped
        _, ttft, itl = evaluate(count, True)
        return Recommendation(
            replicas=count,
            reason=reason,
            mode=Mode.SLA,
            detail=why,
            predicted_ttft_ms=_finite(ttft),
            predicted_itl_ms=_finite(itl),
            arrivals_replicas=arrivals,
        )
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
                arrivals_replicas=arrivals,
            )
        # More replicas do not help (the latency floor of one request is above the target): hold.
        return Recommendation(
            replicas=current,
            reason=Reason.SLA_UNREACHABLE,
            mode=Mode.SLA,
            detail=f"even {search_hi} replicas miss the SLA; holding at {current}",
            predicted_ttft_ms=_finite(ttft),
            predicted_itl_ms=_finite(itl),
            arrivals_replicas=arrivals,
        )
    # Consolidation check: the chosen count must itself meet the SLA (bisection assumed monotone).
    ok, ttft, itl = evaluate(n)
    walked = n
    for _ in range(_WALK_STEPS):
        if ok or walked >= search_hi:
            break
        walked += 1
        ok, ttft, itl = evaluate(walked)
    if ok:
        n = walked
    else:  # the bisection's invariant: its answer met the targets when it was evaluated
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
        if floor_scaled:
            parts.append(f"the ITL correction taken over the limit above the model's {itl_floor_ms:.1f} ms floor")
    if queue_cv2 > 0 and ttft is not None and rate:
        parts.append(f"queue wait x{1.0 + queue_cv2:.2f} for the prompts' spread (CV^2 {queue_cv2:.2f})")
    if n > 1 and mixed is None and check_itl and rate and osl and n - 1 not in batch_limited:
        evaluate(n - 1)
    if n in shown:
        reason = Reason.DECODE_BATCH_OBSERVED
        parts.append(
            f"the model's decode batch at {n} replicas is past max_num_seqs {rec.max_num_seqs:.0f}, but the engines"
            f" run it at {shown[n]:.0f} per engine (with margin) and meet the goal"
        )
    if n - 1 in batch_limited:
        # one replica fewer would meet the ITL by the step model, but its decode batch is past the engine's limit
        reason = Reason.DECODE_BATCH_LIMIT
        parts.append(
            f"{n - 1} replicas: a decode batch of {batch_limited[n - 1]:.0f} per engine, past max_num_seqs"
            f" {rec.max_num_seqs:.0f}"
        )
    return Recommendation(
        replicas=n,
        reason=reason,
        mode=Mode.SLA,
        detail=f"{n} replicas: " + ", ".join(parts),
        predicted_ttft_ms=_finite(ttft),
        predicted_itl_ms=_finite(itl),
        arrivals_replicas=arrivals,
        itl_floor_ms=itl_floor_ms if floor_scaled else None,
    )


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None

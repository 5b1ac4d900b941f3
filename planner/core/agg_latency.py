"""Aggregated engines' latency from the steps they run (:func:`predict_agg_latency`), pure: vLLM V1's scheduler
gives each running decode one token of the step budget first and fills the rest with prefill chunks, so a share
of the steps carry a chunk (long) and the rest only decodes (short). See docs/decision_core.md."""

from __future__ import annotations

import math

import msgspec

from perf_model.api import StepPredictor

__all__ = ["AggLatency", "mdl_queue_requests", "predict_agg_latency"]


def mdl_queue_requests(utilization: float) -> float:
    """Mean queue length (requests) of an M/D/1 queue at ``utilization`` < 1."""
    return utilization * utilization / (2.0 * (1.0 - utilization))


class AggLatency(msgspec.Struct, frozen=True, kw_only=True):
    """Predicted steady state of one aggregated engine (see :func:`predict_agg_latency`). ``itl_ms`` and
    ``ttft_ms`` are upper-band values, ``inf`` when the engine cannot keep up (``saturated`` names the limit)."""

    itl_ms: float
    ttft_ms: float
    decode_batch: float  # running decodes per step (Little's law at the predicted ITL)
    prefill_busy_frac: float  # share of the engine's time spent in steps carrying a prefill chunk
    prompt_prefill_ms: float  # the steps of one prompt's chunks, decode batch included
    saturated: str = ""  # "" | "token budget" | "engine time" | "max_num_seqs" | "KV capacity"
    # The per-request tail (planner.core.tail): the chunk steps of one prompt, the mean chunk step of a
    # ``tail_isl_tokens`` prompt, the decode-only step, and TTFT of a ``ttft_isl_tokens`` prompt (upper band).
    prompt_chunk_steps: int = 0
    chunk_step_ms: float = 0.0
    last_chunk_step_ms: float = 0.0
    decode_step_ms: float = 0.0
    ttft_tail_ms: float = math.inf


_BISECT_STEPS = 40
_BISECT_TOLERANCE_MS = 0.01
_SCAN_FACTOR = 1.25  # geometric grid for the first fixed point of the ITL
_SCAN_STEPS = 256  # 1.25^256 ~ 1e25: the grid never needs more from any positive start; bounded whatever happens
_MIN_STEP_MS = 1e-6  # a step predicted at 0 ms (a degenerate fit) is read as this, never divided by


def predict_agg_latency(
    predictor: StepPredictor,
    *,
    rate_per_s: float,
    isl_tokens: float,
    osl_tokens: float,
    kv_per_request_tokens: float,
    max_num_batched_tokens: int,
    decode_requests: float = 0.0,
    queued_prefill_tokens: float = 0.0,
    scheduled_prefill_tokens: float = 0.0,
    max_num_seqs: float = 0.0,
    kv_capacity_tokens: float = 0.0,
    tail_isl_tokens: float | None = None,
    ttft_isl_tokens: float | None = None,
) -> AggLatency:
    """Mean ITL and TTFT of ONE aggregated engine receiving ``rate_per_s`` requests/s of ``isl_tokens`` in and
    ``osl_tokens`` out, derived from how the engine schedules (vLLM V1, chunked prefill):

    - each step, every running decode takes one token of the ``max_num_batched_tokens`` budget first; a prompt
      is prefilled in the rest, in chunks of ``c = budget - B`` tokens (the last one partial), each chunk
      attending to the earlier ones. One prompt thus costs ``S = sum of its chunk steps`` (decode batch
      included) and ``k = ceil(ISL / c)`` steps;
    - per second, ``rate x k`` steps carry a chunk and take ``rate x S`` ms; the rest of the second is
      decode-only steps of ``T_d = predict_step_ms(0, 0, B, B x kv_per_request)``. Every running sequence gets
      one token per step, so ``ITL = 1000 / (rate x k + (1000 - rate x S) / T_d)``: the time-weighted mean step,
      long chunk steps counted as long (a mean-field step would under-count them: step time is convex in the
      chunk size);
    - ``B = max(decode_requests, rate x OSL x ITL / 1000)`` (Little's law), so ITL is a fixed point, found by
      bisection;
    - TTFT: the prompt's chunk steps behind the queue, ``queued_prefill_tokens`` or, when larger, the mean
      M/D/1 queue of prompts at prefill utilization ``rate x S / 1000``.

    Saturated (``inf``) when prefill alone fills the engine's time, the decode batch leaves no prefill budget,
    or ``B`` exceeds ``max_num_seqs`` or the KV capacity (either skipped when 0 = unknown). The chunk sum is
    computed in two calls, exact when the step time is linear in ``prefill_kv_tokens`` (perf_model's fit and
    profile timer both are). Without a rate, the observed per-engine batch and scheduled prefill tokens are
    one step's load. Arguments are per engine.

    The per-request tail (:mod:`planner.core.tail`) reads ``prompt_chunk_steps``, ``chunk_step_ms`` (the mean
    chunk step of a ``tail_isl_tokens`` prompt, default ``isl_tokens``), ``last_chunk_step_ms`` (its last) and
    ``decode_step_ms``; ``ttft_tail_ms`` is the TTFT of a ``ttft_isl_tokens`` prompt (default ``isl_tokens``)
    behind the same queue.
    """
    args = (
        rate_per_s,
        isl_tokens,
        osl_tokens,
        kv_per_request_tokens,
        decode_requests,
        queued_prefill_tokens,
        scheduled_prefill_tokens,
        max_num_seqs,
        kv_capacity_tokens,
    )
    if not all(math.isfinite(v) for v in args):
        return AggLatency(
            itl_ms=math.inf,
            ttft_ms=math.inf,
            decode_batch=0.0,
            prefill_busy_frac=1.0,
            prompt_prefill_ms=math.inf,
            saturated="non-finite input",
        )
    budget = float(max(max_num_batched_tokens, 1))
    rate = max(rate_per_s, 0.0)
    isl = max(isl_tokens, 1.0)
    osl = max(osl_tokens, 1.0)
    kv_per = max(kv_per_request_tokens, 0.0)
    observed_batch = max(decode_requests, 0.0)
    limit_batch = budget - 1.0
    if max_num_seqs > 0:
        limit_batch = min(limit_batch, float(max_num_seqs))
    if kv_capacity_tokens > 0 and kv_per > 0:
        limit_batch = min(limit_batch, kv_capacity_tokens / kv_per)

    def step(prefill: float, prefill_kv: float, batch: float) -> float:
        return predictor.predict_step_ms(prefill, prefill_kv, batch, batch * kv_per).upper_ms

    def prompt(batch: float, tokens: float = isl) -> tuple[float, int, float]:
        """(ms of one prompt's chunk steps, number of them, chunk size) with ``batch`` decodes riding along."""
        chunk = max(budget - batch, 1.0)
        full = math.floor(tokens / chunk + 1e-9)
        rest = tokens - full * chunk
        total = full * step(chunk, chunk * (full - 1) / 2.0, batch) if full else 0.0
        if rest > 1e-9:
            total += step(rest, full * chunk, batch)
        return total, full + (1 if rest > 1e-9 else 0), chunk

    def saturated(reason: str, batch: float) -> AggLatency:
        return AggLatency(
            itl_ms=math.inf,
            ttft_ms=math.inf,
            decode_batch=batch,
            prefill_busy_frac=1.0,
            prompt_prefill_ms=math.inf,
            saturated=reason,
        )

    if observed_batch > limit_batch:
        return saturated(_batch_limit(budget, max_num_seqs, kv_capacity_tokens, kv_per), observed_batch)

    def itl_given(assumed_ms: float) -> float:
        batch = max(observed_batch, rate * osl * assumed_ms / 1000.0)
        prompt_ms, steps, _ = prompt(batch)
        busy_ms = rate * prompt_ms
        if busy_ms >= 1000.0:
            return math.inf
        # A decode-only step exists only with a sequence decoding: at least one.
        return 1000.0 / (rate * steps + (1000.0 - busy_ms) / max(step(0.0, 0.0, max(batch, 1.0)), _MIN_STEP_MS))

    if rate <= 0:
        batch = observed_batch
        itl = step(max(scheduled_prefill_tokens, 0.0), 0.0, batch) if batch > 0 else math.nan
    else:
        top = 1000.0 * limit_batch / (rate * osl)  # the ITL at which Little's law fills the batch limit
        # itl_given(I) - I is positive at 0 and may cross zero twice (the decode batch's own cost grows with I):
        # the engine settles at the first crossing. Scan a geometric grid for it (bounded), then bisect.
        lo, hi = 0.0, math.nan
        probe = max(itl_given(0.0), _MIN_STEP_MS)
        for _ in range(_SCAN_STEPS):
            if not (math.isfinite(probe) and probe < top):
                break
            if itl_given(probe) <= probe:
                hi = probe
                break
            lo, probe = probe, probe * _SCAN_FACTOR
        if math.isnan(hi):
            if math.isfinite(probe) and itl_given(top) <= top:
                hi = top
        if math.isnan(hi):
            if math.isinf(itl_given(lo)):
                return saturated("engine time", max(observed_batch, rate * osl * lo / 1000.0))
            return saturated(_batch_limit(budget, max_num_seqs, kv_capacity_tokens, kv_per), limit_batch)
        for _ in range(_BISECT_STEPS):
            if hi - lo <= _BISECT_TOLERANCE_MS:
                break
            mid = (lo + hi) / 2.0
            if itl_given(mid) > mid:
                lo = mid
            else:
                hi = mid
        itl = hi
        batch = max(observed_batch, rate * osl * itl / 1000.0)
    prompt_ms, prompt_steps, chunk = prompt(batch)
    busy = rate * prompt_ms / 1000.0
    if busy >= 1.0:
        return saturated("engine time", batch)
    backlog = max(queued_prefill_tokens, 0.0)
    if rate > 0:
        backlog = max(backlog, isl * mdl_queue_requests(busy))

    def ttft_of(tokens: float) -> float:
        """Prefill-only TTFT in chunks of the budget left to prefill, plus the decode batch riding every step."""
        ttft = predictor.predict_ttft_ms(tokens, backlog, max(int(chunk), 1)).upper_ms
        if batch > 0:
            pkv = max(tokens - chunk, 0.0) / 2.0
            extra_ms = step(chunk, pkv, batch) - step(chunk, pkv, 0.0)
            ttft += math.ceil((backlog + tokens) / chunk - 1e-9) * max(extra_ms, 0.0)
        return ttft

    ttft = ttft_of(isl)
    tail_ttft = ttft if ttft_isl_tokens is None or ttft_isl_tokens <= isl else ttft_of(ttft_isl_tokens)
    decode_ms = max(step(0.0, 0.0, max(batch, 1.0)), _MIN_STEP_MS)
    chunk_ms = last_ms = 0.0
    if rate > 0 and prompt_steps > 0:
        tail_tokens = isl if tail_isl_tokens is None or not math.isfinite(tail_isl_tokens) else tail_isl_tokens
        tail_tokens = max(tail_tokens, 1.0)
        tail_ms, tail_steps, _ = prompt(batch, tail_tokens)
        chunk_ms = tail_ms / tail_steps if tail_steps else 0.0
        last_chunk = min(chunk, tail_tokens)
        last_ms = step(last_chunk, max(tail_tokens - last_chunk, 0.0), batch)
    if math.isnan(itl):
        itl = 0.0  # nothing decoding: no ITL to miss
    return AggLatency(
        itl_ms=itl,
        ttft_ms=ttft,
        decode_batch=batch,
        prefill_busy_frac=busy,
        prompt_prefill_ms=prompt_ms,
        prompt_chunk_steps=prompt_steps,
        chunk_step_ms=chunk_ms,
        last_chunk_step_ms=last_ms,
        decode_step_ms=decode_ms,
        ttft_tail_ms=tail_ttft,
    )


def _batch_limit(budget: float, max_num_seqs: float, kv_capacity_tokens: float, kv_per: float) -> str:
    """Which limit caps the decode batch (the smallest)."""
    limits = [(budget - 1.0, "token budget")]
    if max_num_seqs > 0:
        limits.append((max_num_seqs, "max_num_seqs"))
    if kv_capacity_tokens > 0 and kv_per > 0:
        limits.append((kv_capacity_tokens / kv_per, "KV capacity"))
    return min(limits)[1]

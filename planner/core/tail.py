"""The per-request tail model (issue 13, item 3a), pure: what the p99 request sees, from the traffic's ISL/OSL
distribution (``Traffic.isl_tokens_p50/p90/p99``, ``osl_tokens_p50/p90``, from FPM), not from the means alone.

The SLA is per request while the latency models predict the engine's mean. Two tails matter:

- **ITL**: on an aggregated engine a prompt is prefilled in ``k`` consecutive chunk steps (``T_c`` ms each)
  between decode-only steps (``T_d`` ms; a request with fewer intervals than ``k`` is charged up to the last,
  longest chunk step). A request with ``o`` output tokens averages its ``n = o - 1``
  intervals; each prompt prefilled while it decodes adds ``k`` chunk steps to them. It misses a limit ``L`` when
  more than ``m n / k`` prompts pass, ``m = (L - T_d) / (T_c - T_d)``. The prompts that pass are those that
  arrive during its own TTFT (queued behind it, they are prefilled right after it, while it decodes: the
  correlation that makes short requests after a busy prefill the ones that miss) and during its decode: a
  Poisson count of mean ``rate x (TTFT + n x ITL)``. The share of requests that miss is this
  probability averaged over the OSL distribution (a log-normal through the observed p50 and p90, at
  :data:`OSL_POINTS` equal-probability points), and must stay within the miss budget (``1 - attainment_goal``).
- **TTFT**: the prefill of a p99 prompt (else p90) behind the queue, when such a prompt alone takes at most
  :data:`TAIL_PREFILL_SHARE` of the limit (a prompt whose own prefill leaves no room for any queue is not one
  capacity can help).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from statistics import NormalDist

__all__ = [
    "OSL_POINTS",
    "TAIL_PREFILL_SHARE",
    "itl_miss_frac",
    "osl_points",
    "ttft_tail_isl",
]

OSL_POINTS = 16
TAIL_PREFILL_SHARE = 0.5
_Z90 = NormalDist().inv_cdf(0.9)
_Z_POINTS = tuple(NormalDist().inv_cdf((i + 0.5) / OSL_POINTS) for i in range(OSL_POINTS))
_EXACT_MAX_EPISODES = 200  # Poisson tail summed exactly up to this many terms, normal approximation above
_NORMAL = NormalDist()


def osl_points(
    osl_mean: float | None, p50: float | None = None, p90: float | None = None, p99: float | None = None
) -> tuple[float, ...]:
    """Output lengths at equal-probability points of the OSL distribution: a log-normal through ``p50`` and
    ``p90`` (capped at ``p99`` when known); with only a median or a mean, that one length."""
    if p50 is not None and p90 is not None and p90 > p50 >= 1:
        mu, sigma = math.log(p50), math.log(p90 / p50) / _Z90
        top = p99 if p99 is not None and p99 >= p90 else math.inf
        return tuple(max(min(math.exp(mu + sigma * z), top), 1.0) for z in _Z_POINTS)
    single = p50 if p50 is not None and p50 >= 1 else osl_mean
    return (max(single, 1.0),) if single is not None and math.isfinite(single) else ()


def _poisson_tail(mean: float, k_max: int) -> float:
    """P(N > k_max) for N ~ Poisson(mean); a normal approximation past :data:`_EXACT_MAX_EPISODES` terms."""
    if k_max < 0:
        return 1.0
    if mean <= 0.0:
        return 0.0
    if k_max > _EXACT_MAX_EPISODES:
        return 1.0 - _NORMAL.cdf((k_max + 0.5 - mean) / math.sqrt(mean))
    term = math.exp(-mean)
    below = 0.0
    for k in range(k_max + 1):
        below += term
        term *= mean / (k + 1)
    return min(max(1.0 - below, 0.0), 1.0)


def itl_miss_frac(
    *,
    prompts_per_s: float,
    chunk_steps_per_prompt: float,
    chunk_step_ms: float,
    decode_step_ms: float,
    itl_ms: float,
    ttft_ms: float,
    limit_ms: float,
    osl: tuple[float, ...],
    last_chunk_step_ms: float | None = None,
) -> float:
    """The share of requests whose own mean ITL exceeds ``limit_ms`` (see the module docstring), on one engine
    receiving ``prompts_per_s`` prompts of ``chunk_steps_per_prompt`` chunk steps each. Requests with one output
    token have no ITL and never miss it. Bounded work: :data:`OSL_POINTS` points, each an exact sum of at most
    :data:`_EXACT_MAX_EPISODES` terms or one normal CDF."""
    if not osl:
        return 0.0
    last_ms = chunk_step_ms if last_chunk_step_ms is None else max(last_chunk_step_ms, chunk_step_ms)
    values = (prompts_per_s, chunk_steps_per_prompt, chunk_step_ms, last_ms, decode_step_ms, itl_ms, ttft_ms, limit_ms)
    if not all(math.isfinite(v) for v in values):
        return 1.0
    if decode_step_ms > limit_ms:
        return 1.0
    if last_ms <= limit_ms or prompts_per_s <= 0.0 or chunk_steps_per_prompt <= 0.0:
        return 0.0
    total = 0.0
    for o in osl:
        intervals = round(o) - 1
        if intervals < 1:
            continue
        # fewer intervals than a prompt has chunks: the request may see only its longest (last) chunk steps
        covered = min(intervals / chunk_steps_per_prompt, 1.0)
        step_ms = last_ms - (last_ms - chunk_step_ms) * covered
        if step_ms <= limit_ms:
            continue
        share = (limit_ms - decode_step_ms) / (step_ms - decode_step_ms)  # in [0, 1)
        tolerated = math.floor(share * intervals / chunk_steps_per_prompt + 1e-9)  # prompts it can decode through
        # prompts that arrive during its TTFT (queued behind it: prefilled while it decodes) and its decode
        span_ms = max(ttft_ms, 0.0) + intervals * max(itl_ms, decode_step_ms)
        total += _poisson_tail(prompts_per_s * span_ms / 1000.0, tolerated)
    return total / len(osl)


def ttft_tail_isl(
    isl_tokens: float,
    p90: float | None,
    p99: float | None,
    prefill_ms: Callable[[float], float],
    limit_ms: float,
) -> float:
    """The prompt length the TTFT check is made for: the p99 prompt, else the p90 one, when longer than
    ``isl_tokens`` and its own prefill on an idle engine (``prefill_ms``) takes at most
    :data:`TAIL_PREFILL_SHARE` of ``limit_ms``; else ``isl_tokens``."""
    for quantile in (p99, p90):
        if quantile is not None and quantile > isl_tokens and prefill_ms(quantile) <= TAIL_PREFILL_SHARE * limit_ms:
            return quantile
    return isl_tokens

"""What the engines demonstrably do, against the model's decode batch limit (issue 13, item 3), pure.

The step model's upper band can find no decode-batch fixed point within ``max_num_seqs`` at a count the fleet
runs at and serves within the SLA (``output_shift`` aggregated: 10 req/s per engine of 709-token outputs, the
band's +10 % has no fixed point where the engines run a mean batch of 188 of 256 at 100 %). Near saturation the
fixed point is that sensitive to the band, so the observation decides for the count the fleet runs at only;
a count below it still needs the model's yes. See docs/decision_core.md, "The decode batch the engines show".

The output-token demand (rate x OSL) is smoothed over :data:`DEMAND_WINDOW_S` in the core's state
(:class:`OutputDemand`): the counting-noise margin then rests on the requests of that longer span, not of one
traffic window, so one window's chance excess does not read as a rise (docs/decision_core.md, "The demand the
batch rests on").
"""

from __future__ import annotations

import math

import msgspec

from planner.core.forecast import RISE_SIGMAS
from planner.core.observation import RoleLoad, Traffic

__all__ = ["DEMAND_WINDOW_S", "RATE_NOISE_SD", "OutputDemand", "at_rate", "demonstrated_batch", "update_demand"]

RATE_NOISE_SD = RISE_SIGMAS  # a rate rise hidden in the window's Poisson count: the forecast's 3 standard deviations
# The output-token demand's time constant: one cold start (60 s). Its 3-sigma counting margin at the ~10 req/s an
# engine's full batch serves is 3 / sqrt(600) = 12 % per engine (21 % over one 10 s window of 200 requests), and a
# shift in the demand is followed within a start-up (the window's own point estimate sees it at once meanwhile).
DEMAND_WINDOW_S = 60.0


class OutputDemand(msgspec.Struct, frozen=True, kw_only=True):
    """The output-token demand over a longer span than one traffic window: a time-weighted EWMA (time constant
    :data:`DEMAND_WINDOW_S`) of the windows' rate x OSL and of their request rate, fed at ``at``; ``span_s`` is
    the span it rests on (the time since it was first fed, plus that first window, at most the time constant)."""

    tokens_per_s: float
    requests_per_s: float
    span_s: float
    at: float


def update_demand(
    previous: OutputDemand | None, traffic: Traffic | None, now: float, window_s: float = DEMAND_WINDOW_S
) -> OutputDemand | None:
    """The demand after this tick: each window with a rate and an OSL weighs ``1 - exp(-dt / window_s)`` for the
    ``dt`` seconds since the last one (the first one, or one after a gap of ``window_s`` or more, sets it)."""
    if traffic is None or not traffic.request_rate_per_s or not traffic.osl_tokens or window_s <= 0:
        return previous
    rate, tokens = traffic.request_rate_per_s, traffic.request_rate_per_s * traffic.osl_tokens
    first_span = min(max(traffic.window_s or 0.0, 0.0), window_s)
    if previous is None or not math.isfinite(previous.tokens_per_s) or now - previous.at >= window_s:
        return OutputDemand(tokens_per_s=tokens, requests_per_s=rate, span_s=first_span, at=now)
    dt = max(now - previous.at, 0.0)
    weight = -math.expm1(-dt / window_s)
    return OutputDemand(
        tokens_per_s=previous.tokens_per_s + weight * (tokens - previous.tokens_per_s),
        requests_per_s=previous.requests_per_s + weight * (rate - previous.requests_per_s),
        span_s=min(previous.span_s + dt, window_s),
        at=now,
    )


def demonstrated_batch(
    traffic: Traffic | None,
    load: RoleLoad,
    engines: int,
    max_num_seqs: float,
    attainment_goal: float,
    min_samples: int,
    judge_ttft: bool = True,
    demand: OutputDemand | None = None,
) -> float | None:
    """The decode batch per engine the fleet demonstrably runs within ``max_num_seqs`` with margin, or None.

    Little's law on what was observed over the traffic window, ``rate x OSL x ITL`` per engine (the observed
    median of the requests' mean ITL), scaled up by :data:`RATE_NOISE_SD` standard deviations of the window's
    Poisson request count (a rise the window's mean hides), and the batch the engines run now, must both stay
    within ``max_num_seqs``; the observed ITL attainment (and TTFT's, with ``judge_ttft``: a role whose count TTFT
    also judges) must meet ``attainment_goal``, each over at least ``min_samples`` requests. With a smoothed
    ``demand`` the margin rests on its span's requests instead (Little's law on the smoothed demand, scaled by
    1 + 3 / sqrt(requests over its span)), and the window's own figures count without a margin. Returns the
    largest of the batches (for the detail) or None."""
    if traffic is None or engines <= 0 or max_num_seqs <= 0 or not math.isfinite(max_num_seqs):
        return None
    rate, osl, itl_ms = traffic.request_rate_per_s, traffic.osl_tokens, traffic.itl_ms_p50
    requests = traffic.requests_in_window or 0
    if not rate or not osl or not itl_ms or requests < min_samples:
        return None
    judged = [(traffic.itl_attainment_frac, traffic.itl_samples_in_window)]
    if judge_ttft:
        judged.append((traffic.ttft_attainment_frac, traffic.ttft_samples_in_window))
    for frac, samples in judged:
        if frac is None or (samples or 0) < min_samples or frac < attainment_goal:
            return None
    window = rate / engines * osl * itl_ms / 1000.0
    if demand is not None and demand.tokens_per_s > 0 and math.isfinite(demand.tokens_per_s):
        counted = max(float(requests), demand.requests_per_s * demand.span_s)
        smoothed = demand.tokens_per_s / engines * itl_ms / 1000.0 * (1.0 + RATE_NOISE_SD / math.sqrt(counted))
        little = max(window, smoothed)
    else:
        little = window * (1.0 + RATE_NOISE_SD / math.sqrt(requests))
    now = (load.decode_requests + load.queued_decode_requests) / engines
    batch = max(little, now)
    return batch if math.isfinite(batch) and batch <= max_num_seqs else None


def at_rate(traffic: Traffic, rate_per_s: float) -> Traffic:
    """The window's figures as a call at ``rate_per_s`` sees them (the forecast floor's call of the model at the
    forecast rate): the rate replaced, and the observed TTFT / ITL attainment (what makes a batch demonstrated,
    :func:`demonstrated_batch`) kept only while ``rate_per_s`` is within the window's rate plus :data:`RATE_NOISE_SD`
    standard deviations of its Poisson request count (1 + 3 / sqrt(requests)): past it the engines were not seen
    at that rate, and the model's answer stands alone."""
    observed, requests = traffic.request_rate_per_s, traffic.requests_in_window or 0
    at = msgspec.structs.replace(traffic, request_rate_per_s=rate_per_s)
    if observed is not None and requests > 0 and rate_per_s <= observed * (1.0 + RATE_NOISE_SD / math.sqrt(requests)):
        return at
    return msgspec.structs.replace(
        at,
        ttft_attainment_frac=None,
        itl_attainment_frac=None,
        ttft_samples_in_window=None,
        itl_samples_in_window=None,
    )

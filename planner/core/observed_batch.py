"""What the engines demonstrably do, against the model's decode batch limit (issue 13, item 3), pure.

The step model's upper band can find no decode-batch fixed point within ``max_num_seqs`` at a count the fleet
runs at and serves within the SLA (``output_shift`` aggregated: 10 req/s per engine of 709-token outputs, the
band's +10 % has no fixed point where the engines run a mean batch of 188 of 256 at 100 %). Near saturation the
fixed point is that sensitive to the band, so the observation decides for the count the fleet runs at only;
a count below it still needs the model's yes. See docs/decision_core.md, "The decode batch the engines show".
"""

from __future__ import annotations

import math

from planner.core.forecast import RISE_SIGMAS
from planner.core.observation import RoleLoad, Traffic

__all__ = ["RATE_NOISE_SD", "demonstrated_batch"]

RATE_NOISE_SD = RISE_SIGMAS  # a rate rise hidden in the window's Poisson count: the forecast's 3 standard deviations


def demonstrated_batch(
    traffic: Traffic | None,
    load: RoleLoad,
    engines: int,
    max_num_seqs: float,
    attainment_goal: float,
    min_samples: int,
    judge_ttft: bool = True,
) -> float | None:
    """The decode batch per engine the fleet demonstrably runs within ``max_num_seqs`` with margin, or None.

    Little's law on what was observed over the traffic window, ``rate x OSL x ITL`` per engine (the observed
    median of the requests' mean ITL), scaled up by :data:`RATE_NOISE_SD` standard deviations of the window's
    Poisson request count (a rise the window's mean hides), and the batch the engines run now, must both stay
    within ``max_num_seqs``; the observed ITL attainment (and TTFT's, with ``judge_ttft``: a role whose count TTFT
    also judges) must meet ``attainment_goal``, each over at least ``min_samples`` requests. Returns the larger of
    the two batches (for the detail) or None."""
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
    little = rate / engines * osl * itl_ms / 1000.0 * (1.0 + RATE_NOISE_SD / math.sqrt(requests))
    now = (load.decode_requests + load.queued_decode_requests) / engines
    batch = max(little, now)
    return batch if math.isfinite(batch) and batch <= max_num_seqs else None

"""The spread of prompt lengths over a longer span than one traffic window, for the prefill queue's wait.

A prefill engine is a single-server queue whose service time grows with the prompt: its mean wait is the
Pollaczek-Khinchine one, the M/D/1 wait times ``1 + CV^2`` of the service time (prompt length). Prompt lengths are
right-skewed (a log-normal is the usual fit: Mooncake's mean 15.3k tokens, p50 11.6k, p90 38.6k); the spread of
one window's prompts is read from its p50 and p90 as a log-normal's ``sigma^2 = (ln(p90 / p50) / z90)^2``. One
window holds few prompts and its p90 jumps (a 10 s window's CV^2 took a prefill fleet 7 -> 35 -> 113 replicas), so
the core keeps a time-weighted EWMA of sigma^2 (time constant ``prompt_spread_window_s``, 120 s: a dozen windows,
short enough to follow a shift in the prompt mix within two start-ups) in its state and sizes with that.
"""

from __future__ import annotations

import math

from planner.core.observation import Traffic

_Z90 = 1.2815515655446004  # the standard normal's 90th percentile
# sigma^2 past this (CV^2 = e^sigma^2 - 1 ~ 6.4: a p90 over 10x the p50) is a window of a few prompts, not a shape.
_MAX_LOG_VAR = 2.0


def window_log_var(traffic: Traffic | None) -> float | None:
    """The log-normal sigma^2 of one window's prompt lengths from its p50 and p90 (None: not both known)."""
    if traffic is None or not traffic.isl_tokens_p50 or not traffic.isl_tokens_p90:
        return None
    p50, p90 = traffic.isl_tokens_p50, traffic.isl_tokens_p90
    if p50 <= 0 or p90 < p50:
        return None
    return min((math.log(p90 / p50) / _Z90) ** 2, _MAX_LOG_VAR)


def update_log_var(
    previous: float | None, previous_at: float | None, traffic: Traffic | None, now: float, window_s: float
) -> tuple[float | None, float | None]:
    """The EWMA of sigma^2 after this tick, and when it was last fed: each window weighs ``1 - exp(-dt / window_s)``
    for the ``dt`` seconds since the last window that had one (the first one sets it)."""
    sample = window_log_var(traffic)
    if sample is None:
        return previous, previous_at
    if previous is None or previous_at is None or window_s <= 0:
        return sample, now
    dt = max(now - previous_at, 0.0)
    weight = -math.expm1(-dt / window_s)
    return previous + weight * (sample - previous), now


def service_cv2(log_var: float | None) -> float:
    """The squared coefficient of variation of a log-normal with ``log_var`` (0.0: unknown, the M/D/1 wait)."""
    if log_var is None or not math.isfinite(log_var) or log_var <= 0:
        return 0.0
    return math.expm1(min(log_var, _MAX_LOG_VAR))

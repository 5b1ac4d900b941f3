"""The closed loop's ITL misses of requests that decoded before the capacity came (stale misses; pure).

A window's observed ITL attainment is that of the requests that *finished* in it, each judged on its mean ITL over
its whole decode. A request that began decoding while the fleet was smaller (or while a backlog built then was
draining) and finishes after the new capacity is ready is counted in the window that judges the new count, though
most of its tokens came at the old one: read as a shortfall of the new count, its misses tighten the correction
(held-out ``flash_crowd`` on the launch-bound profile, aggregated: 20 replicas ready from ~755 s, and at 775-780 s
the loop wound the ITL correction from -0.14 to its +0.6 bound on 65-74 % attainment of requests that had decoded
at ~95 ms a token through the crowd; 5 s later the window held 96-100 %).

A miss is a request whose mean ITL is above the target, so a stale one decoded for ``(OSL - 1) x ITL``, longer than
the time since the capacity came. The window's own percentiles bound how long its requests decoded: the slowest
per-request ITL it shows times the longest output it shows, ``(OSL p99 - 1) x ITL p99`` (falling back to the p90,
then the mean / the p50, when a percentile is not known). The p99 because the loop judges the 1 % tail
(``attainment_goal`` 0.99): a few stale requests are enough to be all of the shortfall it acts on. While the time
since the last action in flight settled is shorter than that lifetime, the requests reported may have decoded
before the capacity came, and they judge the count they ran at, not the new one: the ITL correction may take back
a relaxation on them (the model, relaxed, was optimistic at the old count: held-out ``slow_drift`` on the KV-bound
profile, disaggregated, a decode fleet relaxed to -0.3 missed while the drifting load outgrew it, and ignoring those
misses kept the relaxation, which released the count bought 100 s later and lost 1.7 points), but does not tighten
past 0, the model's own (``sla_feedback_tightened`` up to 0, then ``sla_feedback_frozen``; the detail says so).
Relaxing is never held, and the TTFT keeps its own rule (a TTFT longer than the time since,
:mod:`planner.core.feedback`). The lifetime is read from each window, so the hold ends as soon as the slow requests
have left it (their ITL p99 falls), and a real shortfall at the new count still tightens one lifetime after the
capacity came: by then the window's requests decoded at the new count only.
"""

from __future__ import annotations

from planner.core.observation import Traffic

__all__ = ["decode_lifetime_s", "itl_misses_may_predate"]


def _first(*values: float | None) -> float | None:
    return next((v for v in values if v is not None), None)


def decode_lifetime_s(traffic: Traffic) -> float | None:
    """How long the window's longest requests decoded at its slowest per-request ITL, in seconds:
    ``(OSL p99 - 1) x ITL p99`` (p90, then the mean / p50 when not known); None when either is unknown."""
    osl = _first(traffic.osl_tokens_p99, traffic.osl_tokens_p90, traffic.osl_tokens)
    itl_ms = _first(traffic.itl_ms_p99, traffic.itl_ms_p90, traffic.itl_ms_p50)
    if osl is None or itl_ms is None:
        return None
    return max(osl - 1.0, 0.0) * itl_ms / 1000.0


def itl_misses_may_predate(traffic: Traffic, since_s: float | None) -> float | None:
    """The decode lifetime of the window's requests when it is longer than ``since_s``, the time since the last
    action in flight settled (its requests may have decoded before the capacity came); None otherwise (no action
    seen, or an unknown lifetime)."""
    if since_s is None:
        return None
    lifetime_s = decode_lifetime_s(traffic)
    if lifetime_s is None or lifetime_s <= since_s:
        return None
    return lifetime_s

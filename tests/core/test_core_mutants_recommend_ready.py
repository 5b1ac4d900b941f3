"""Rows for planner/core/recommend.py's ``recommend_sla`` after 787fb07 (docs/testing.md, mutation testing): the
hold "even N replicas miss the SLA" still tells how many replicas the arrivals alone need (``arrivals_replicas``,
what the in-flight stage raises a target to), as every other SLA answer does.

The prefill service of tests/core/test_core_backlog_ready.py (the analytic predictor, 2048-token chunks: one engine
prefills 40,188 tokens/s), with no start-up delay (the backlog cap does not bind) and a queue no count drains."""

from __future__ import annotations

from planner.core import Reason, RoleLoad, Traffic
from planner.core.recommend import recommend_sla
from planner.discovery import Role
from tests.core.analytic_perf import AnalyticPerf
from tests.core.fleetkit import reconciled
from tests.core.test_core_backlog_ready import SLA


def test_the_unreachable_hold_names_what_the_arrivals_alone_need() -> None:
    # 1e12 prompt tokens queued: even 24 replicas hold 4e10 each, far past the 500 ms TTFT, and so would 100,000.
    # The 160,000 tokens/s arriving alone are met by 5 replicas (4 would run at 99.5 % of their prefill rate).
    out = recommend_sla(
        Role.PREFILL,
        6,
        reconciled(Role.PREFILL, 6, prefill_requests=5e8),
        RoleLoad(queued_prefill_tokens=1e12),
        Traffic(request_rate_per_s=80.0, isl_tokens=2000.0, osl_tokens=100.0),
        AnalyticPerf(),
        SLA,
        0.0,
        24,
    )
    assert (out.replicas, out.reason) == (6, Reason.SLA_UNREACHABLE)
    assert out.detail == "even 24 replicas miss the SLA; holding at 6"
    assert out.arrivals_replicas == 5

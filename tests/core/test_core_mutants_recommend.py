"""SLA mode (planner.core.recommend) on two edges the older rows left open, with the analytic predictor of
tests/core/analytic_perf.py (a prefill of T tokens: ``ceil(T / chunk) x 10 + 0.02 T`` ms; a decode step
``8 + 0.1 R + 0.0001 KV`` ms; upper band x1.1) and the H200 engine's capacities (a 2048-token chunk, 256 sequences):
an engine running exactly ``max_num_seqs`` decodes is within its batch limit, and one replica holding a backlog
it drains before a start-up keeps the backlog-aware cap. Written for the mutants docs/mutation-results.md listed
as surviving in recommend.py."""

from __future__ import annotations

from planner.core import Reason, RoleLoad, SlaTargets, Traffic
from planner.core.recommend import recommend_sla
from planner.discovery import Role
from tests.core.analytic_perf import AnalyticPerf
from tests.core.fleetkit import reconciled

SLA = SlaTargets(ttft_ms=500.0, itl_ms=50.0)


def test_an_engine_at_exactly_its_sequence_limit_is_within_it() -> None:
    # 1024 decoding requests on 4 replicas: 256 per engine, max_num_seqs; ITL 1.1 x (8 + 25.6) = 37 ms <= 50 ms.
    # On 3 replicas (341 per engine) the batch limit rules the count out, so 4 is the fewest.
    out = recommend_sla(
        Role.DECODE,
        4,
        reconciled(Role.DECODE, 4, prefill_requests=0.0),
        RoleLoad(decode_requests=1024.0),
        Traffic(request_rate_per_s=0.001, osl_tokens=1.0),
        AnalyticPerf(),
        SLA,
        0.0,
        64,
    )
    assert out.replicas == 4
    assert out.predicted_itl_ms is not None and 36.9 < out.predicted_itl_ms < 37.0


def test_one_replica_that_drains_its_backlog_before_a_start_up_is_not_scaled_up_for_it() -> None:
    # One engine prefills 2048 / 50.96 ms = 40,188 tokens/s; 10 prompts/s of 2000 tokens bring 20,000: 100,000
    # queued tokens drain in ~5 s, before a 60 s start-up. The one replica misses the TTFT behind the queue today
    # (1.1 x (130 + 2040) ms), and 2 would meet it, but a new replica would arrive after the queue is gone and the
    # arrivals alone need 1: the cap holds at 1.
    out = recommend_sla(
        Role.PREFILL,
        1,
        reconciled(Role.PREFILL, 1, prefill_requests=50.0),
        RoleLoad(queued_prefill_tokens=100_000.0),
        Traffic(request_rate_per_s=10.0, isl_tokens=2000.0, osl_tokens=100.0),
        AnalyticPerf(),
        SLA,
        0.0,
        64,
        startup_s=60.0,
    )
    assert (out.replicas, out.reason) == (1, Reason.BACKLOG_DRAINS_BEFORE_STARTUP)
    assert out.detail.startswith("100000 queued prefill tokens drain in 5 s on 1 replicas, before a start-up (60 s)")

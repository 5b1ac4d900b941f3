"""SLA mode (planner.core.recommend) on the edges the rows of test_core_mutants_recommend.py left open: replicas of
several DP ranks drain a backlog with every rank, a prefill engine exactly at its capacity, a chunk faster than a
millisecond, what a capped scale-up and a search past ``search_max`` report, and the ITL tail's scale (how many
requests it rests on, the decode batch it is taken at, the OSL p99 that caps the longest outputs).

Prefill rows use the analytic predictor of tests/core/analytic_perf.py (a prefill of T tokens: ``ceil(T / chunk)
x 10 + 0.02 T`` ms, upper band x1.1) with the H200 engine's capacities (a 2048-token chunk: 50.96 ms, so one
engine prefills 2048 / 0.05096 = 40,188 tokens/s); aggregated rows use the perf model bootstrapped from the
measured H200 profile. Written for the mutants docs/mutation-results.md listed as surviving in recommend.py."""

from __future__ import annotations

import re

import msgspec
import pytest

from perf_model.model import PerfModel
from perf_model.step_timer import ProfileStepTimer
from planner.core import Reason, RoleLoad, SlaTargets, Traffic
from planner.core.recommend import recommend_sla
from planner.core.recommendation import Recommendation
from planner.core.reconcile import Reconciled
from planner.discovery import Role
from tests.core.analytic_perf import AnalyticPerf
from tests.core.fleetkit import H200_PROFILE, reconciled

SLA = SlaTargets(ttft_ms=500.0, itl_ms=50.0)


def dp2_prefill(replicas: int, queued_tokens: float, isl: float) -> Reconciled:
    """``replicas`` prefill replicas of 2 DP ranks each, holding ``queued_tokens`` in prompts of ``isl`` tokens."""
    rec = reconciled(Role.PREFILL, 2 * replicas, prefill_requests=queued_tokens / isl)
    return msgspec.structs.replace(rec, dp_per_replica=2)


def test_a_dp_replica_drains_its_backlog_with_every_rank() -> None:
    # 2 replicas x 2 ranks x 40,188 tokens/s = 160,753 tokens/s against 40 x 2000 = 80,000 arriving: 1M queued
    # tokens drain in 1e6 / 80,753 = 12 s, before a 60 s start-up; counted per replica (80,376 tokens/s, less than
    # the arrivals) the queue would grow, and the search's 3 would stand.
    out = recommend_sla(
        Role.PREFILL,
        2,
        dp2_prefill(2, 1_000_000.0, 2000.0),
        RoleLoad(queued_prefill_tokens=1_000_000.0),
        Traffic(request_rate_per_s=40.0, isl_tokens=2000.0, osl_tokens=100.0),
        AnalyticPerf(),
        SLA,
        0.0,
        64,
        startup_s=60.0,
    )
    assert (out.replicas, out.reason) == (2, Reason.BACKLOG_DRAINS_BEFORE_STARTUP)
    assert out.detail.startswith("1000000 queued prefill tokens drain in 12 s on 2 replicas, before a start-up")


def test_the_backlog_left_after_a_start_up_counts_every_rank_of_the_replicas_up() -> None:
    # 5M queued tokens, 60 x 2000 = 120,000 arriving, 2 replicas x 2 ranks prefill 160,753: after the 120 s
    # start-up 5e6 - 40,753 x 120 = 109,576 tokens are left. At 4 replicas (8 engines) each holds 13,697 behind a
    # 2000-token prompt (the M/D/1 queue at utilization 0.373 is smaller: 222 tokens): 15,697 tokens, 8 chunks,
    # 1.1 x (80 + 313.9) = 433.3 ms <= 500; at 3 replicas 10 chunks, 555.8 ms. The cap (2 + 2 for the arrivals)
    # does not bind below 4. Counted per replica the backlog would have grown, and the cap would have bound.
    out = recommend_sla(
        Role.PREFILL,
        2,
        dp2_prefill(2, 5_000_000.0, 2000.0),
        RoleLoad(queued_prefill_tokens=5_000_000.0),
        Traffic(request_rate_per_s=60.0, isl_tokens=2000.0, osl_tokens=100.0),
        AnalyticPerf(),
        SLA,
        0.0,
        64,
        startup_s=120.0,
    )
    assert (out.replicas, out.reason) == (4, Reason.SLA_NEEDS_MORE)
    assert out.predicted_ttft_ms == pytest.approx(433.34, abs=0.01)


def prefill_one(perf: AnalyticPerf, rate: float, isl: float) -> Recommendation:
    return recommend_sla(
        Role.PREFILL,
        1,
        reconciled(Role.PREFILL, 1, prefill_requests=0.0),
        RoleLoad(),
        Traffic(request_rate_per_s=rate, isl_tokens=isl, osl_tokens=10.0),
        perf,
        SLA,
        0.0,
        64,
    )


def test_a_prefill_engine_at_exactly_its_capacity_is_saturated() -> None:
    # A 2048-token chunk takes 125 ms: 16,384 tokens/s, and 16 prompts/s of 1024 tokens bring exactly that to one
    # engine (utilization 1: its queue never empties). Two replicas: utilization 0.5, an M/D/1 queue of 0.25
    # prompts (256 tokens) ahead of the prompt's 1024, one chunk: 1.1 x 125 = 137.5 ms.
    out = prefill_one(AnalyticPerf(prefill_base_ms=125.0, prefill_ms_per_token=0.0), 16.0, 1024.0)
    assert (out.replicas, out.reason) == (2, Reason.SLA_NEEDS_MORE)
    assert out.predicted_ttft_ms == pytest.approx(137.5)


def test_a_chunk_faster_than_a_millisecond_still_has_a_finite_throughput() -> None:
    # A 2048-token chunk in 0.1 + 0.2048 = 0.3048 ms: 6.72M tokens/s per engine. 10,000 prompts/s of 1000 tokens
    # (10M tokens/s) saturate one engine (utilization 1.49), not two (0.74): the TTFT is still tiny, but one
    # replica cannot keep up.
    out = prefill_one(AnalyticPerf(prefill_base_ms=0.1, prefill_ms_per_token=0.0001), 10_000.0, 1000.0)
    assert (out.replicas, out.reason, out.arrivals_replicas) == (2, Reason.SLA_NEEDS_MORE, 2)


def test_a_capped_scale_up_reports_the_ttft_of_the_arrivals_alone() -> None:
    # One replica holds 100,000 queued tokens it drains in ~2.5 s, before a 60 s start-up; 0.01 prompts/s of 2000
    # tokens are all that arrives (their M/D/1 queue: 2.5e-4 tokens). The count stays at 1 for the arrivals, and
    # the TTFT reported is the arrivals' alone: 1.1 x (10 + 0.02 x 2000) = 55.0 ms, one chunk -- not the queued
    # prompts' (2794 ms), nor one more token's.
    out = recommend_sla(
        Role.PREFILL,
        1,
        reconciled(Role.PREFILL, 1, prefill_requests=50.0),
        RoleLoad(queued_prefill_tokens=100_000.0),
        Traffic(request_rate_per_s=0.01, isl_tokens=2000.0, osl_tokens=100.0),
        AnalyticPerf(),
        SLA,
        0.0,
        64,
        startup_s=60.0,
    )
    assert (out.replicas, out.reason) == (1, Reason.BACKLOG_DRAINS_BEFORE_STARTUP)
    assert out.predicted_ttft_ms == pytest.approx(55.0, abs=1e-4)


def test_a_search_past_search_max_still_says_what_the_arrivals_alone_need() -> None:
    # 100,000 queued tokens: 2 replicas (50,000 each) miss the 500 ms TTFT (1.1 x (260 + 1040) = 1430 ms), and
    # search_max is 2; 1 prompt/s of 2000 tokens alone needs one replica. No start-up delay: no backlog cap.
    out = recommend_sla(
        Role.PREFILL,
        1,
        reconciled(Role.PREFILL, 1, prefill_requests=50.0),
        RoleLoad(queued_prefill_tokens=100_000.0),
        Traffic(request_rate_per_s=1.0, isl_tokens=2000.0, osl_tokens=100.0),
        AnalyticPerf(),
        SLA,
        0.0,
        2,
    )
    assert (out.replicas, out.reason, out.detail) == (2, Reason.SLA_NEEDS_MORE, "more than 2 replicas needed")
    assert out.predicted_ttft_ms == pytest.approx(1430.0)
    assert out.arrivals_replicas == 1


# Aggregated engines with the step model of the measured H200 profile.

AGG_SLA = SlaTargets(ttft_ms=2000, itl_ms=50)
MOONCAKE: dict[str, float] = {  # the Mooncake-like traffic of test_core_tail.py: 15k-token prompts, short outputs
    "request_rate_per_s": 19.0,
    "isl_tokens": 15325.0,
    "osl_tokens": 149.0,
    "isl_tokens_p50": 11587.0,
    "isl_tokens_p90": 38611.0,
    "isl_tokens_p99": 66456.0,
    "osl_tokens_p50": 69.0,
    "osl_tokens_p90": 389.0,
    "osl_tokens_p99": 768.0,
}


@pytest.fixture(scope="module")
def model() -> PerfModel:
    return PerfModel(Role.AGG, bootstrap=ProfileStepTimer.from_dir(H200_PROFILE))


NO_LOAD = RoleLoad()


def agg24(model: PerfModel, load: RoleLoad = NO_LOAD, min_samples: int = 20, **traffic: float | None) -> int:
    """The count for 24 aggregated replicas under the Mooncake-like traffic with ``traffic`` over it."""
    fields = {**MOONCAKE, **traffic}
    return recommend_sla(
        Role.AGG,
        24,
        reconciled(Role.AGG, 24, prefill_requests=96.0),
        load,
        Traffic(**fields),  # type: ignore[arg-type]
        model,
        AGG_SLA,
        0.0,
        256,
        min_samples=min_samples,
    ).replicas


def test_the_tail_scale_rests_on_at_least_min_samples_requests(model: PerfModel) -> None:
    mean_only = agg24(model)  # no attainment observed: the mean's check
    assert mean_only < 24
    # 2 % missed on exactly min_samples (20) requests is enough to scale the tail: more than today's 24
    assert agg24(model, itl_attainment_frac=0.98, itl_samples_in_window=20) > 24
    assert agg24(model, itl_attainment_frac=0.98, itl_samples_in_window=19) == mean_only
    # an attainment without its request count rests on no known number of requests, even with min_samples 1
    assert agg24(model, min_samples=1, itl_attainment_frac=0.98) == mean_only


def test_an_attainment_above_the_goal_scaled_at_the_decode_batch_running_now_never_adds(model: PerfModel) -> None:
    # 99.5 % met against a 99 % goal: the tail's scale, taken at today's count with the decodes running now (50
    # per engine, 16k tokens of KV each), allows at least today's share there, so the tail never asks for more
    # than the 24 running.
    load = RoleLoad(decode_requests=50.0 * 24, decode_kv_tokens=50.0 * 24 * 16_000)
    assert agg24(model, load, itl_attainment_frac=0.995, itl_samples_in_window=500) <= 24


def test_the_osl_p99_caps_the_longest_outputs_the_tail_counts(model: PerfModel) -> None:
    # Very short outputs (median 3 tokens, p90 10): the log-normal through them puts its two top points (of 16) at
    # 10.3 and 17.3 tokens. A p99 of 10 caps them there (an eighth of the requests decode fewer tokens through the
    # chunk steps), which changes the tail's answer; a p99 above the top point caps nothing.
    def capped_at(p99: float | None) -> int:
        return agg24(
            model,
            osl_tokens_p50=3.0,
            osl_tokens_p90=10.0,
            osl_tokens_p99=p99,
            itl_attainment_frac=0.995,
            itl_samples_in_window=500,
        )

    uncapped = capped_at(None)
    assert capped_at(1e6) == uncapped
    assert capped_at(10.0) != uncapped


def test_the_drain_is_counted_at_the_served_prefill_rate_whatever_the_start_up(model: PerfModel) -> None:
    # 20k-token prompts on 4 aggregated replicas with decodes riding along: an engine prefills them well below a
    # chunk alone's rate (planner.core.backlog.served_prefill_tokens_per_s). The queue's drain time is the same
    # after a 1 s start-up as after a 60 s one.
    def drain_s(startup_s: float) -> int:
        out = recommend_sla(
            Role.AGG,
            4,
            reconciled(Role.AGG, 4, prefill_requests=100.0),
            RoleLoad(queued_prefill_tokens=2_000_000.0, decode_requests=40.0, decode_kv_tokens=800_000.0),
            Traffic(request_rate_per_s=4.0, isl_tokens=20_000.0, osl_tokens=100.0),
            model,
            AGG_SLA,
            0.0,
            256,
            startup_s=startup_s,
        )
        assert out.reason in (Reason.BACKLOG_DRAINS_BEFORE_STARTUP, Reason.BACKLOG_OUTLASTS_STARTUP)
        found = re.match(r"2000000 queued prefill tokens drain in (\d+) s on 4 replicas", out.detail)
        assert found is not None, out.detail
        return int(found[1])

    assert drain_s(1.0) == drain_s(60.0)


DECODES_2 = RoleLoad(decode_requests=2.0 * 24, decode_kv_tokens=2.0 * 24 * 16_000)  # 2 decodes per engine now


def test_a_shortfall_seen_with_decodes_running_adds_replicas(model: PerfModel) -> None:
    # 2 % missed against a 99 % goal, today's share predicted at the decode batch the 24 engines run now.
    assert agg24(model, DECODES_2, itl_attainment_frac=0.98, itl_samples_in_window=500) > 24


def test_all_met_counts_as_a_quarter_of_the_budget_missed(model: PerfModel) -> None:
    # Every request met its ITL: the release goes as far as with 0.25 % missed (a quarter of the 1 % budget).
    released = agg24(model, DECODES_2, itl_attainment_frac=1.0, itl_samples_in_window=500)
    assert released < 24
    assert agg24(model, DECODES_2, itl_attainment_frac=0.9975, itl_samples_in_window=500) == released


def test_a_capped_scale_up_reports_the_itl_of_its_count() -> None:
    # An aggregated role judged by TTFT and ITL alone (no mixed steps): the backlog cap holds at 1, and the ITL
    # reported is the 10 decodes' (1000 KV tokens each) at 1 replica: 1.1 x (8 + 1 + 1) = 11 ms.
    out = recommend_sla(
        Role.AGG,
        1,
        reconciled(Role.AGG, 1, prefill_requests=50.0),
        RoleLoad(queued_prefill_tokens=100_000.0, decode_requests=10.0, decode_kv_tokens=10_000.0),
        Traffic(request_rate_per_s=0.01, isl_tokens=2000.0, osl_tokens=100.0),
        AnalyticPerf(),
        SLA,
        0.0,
        64,
        startup_s=60.0,
    )
    assert (out.replicas, out.reason) == (1, Reason.BACKLOG_DRAINS_BEFORE_STARTUP)
    assert out.predicted_itl_ms == pytest.approx(11.0)

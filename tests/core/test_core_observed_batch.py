"""Issue 13, item 3: what the engines demonstrably do beats what the model predicts, for the count they run at
(planner.core.observed_batch). output_shift aggregated: at 10 req/s per engine of ~700-token outputs the step
model's upper band finds no decode-batch fixed point within max_num_seqs 256, so it asked for 3 replicas where 2
run a mean batch of ~190 at 100 %."""

from __future__ import annotations

import math

import msgspec
import pytest

from perf_model.model import PerfModel
from perf_model.step_timer import ProfileStepTimer
from planner.core import CoreConfig, CoreState, Reason, RoleConfig, RoleLoad, SlaTargets, Stage, Traffic
from planner.core.observed_batch import (
    DEMAND_WINDOW_S,
    RATE_NOISE_SD,
    OutputDemand,
    demonstrated_batch,
    update_demand,
)
from planner.core.recommend import recommend_sla
from planner.discovery import EngineCapacity, Role
from tests.core.fleetkit import H200_PROFILE, Fleet, Load, reconciled

SLA = SlaTargets(ttft_ms=2000, itl_ms=50)


@pytest.fixture(scope="module")
def agg_model() -> PerfModel:
    return PerfModel(Role.AGG, bootstrap=ProfileStepTimer.from_dir(H200_PROFILE))


# output_shift after the shift, 2 engines: 20 req/s of ~1150-token prompts and ~700-token outputs
SHIFTED = Traffic(
    request_rate_per_s=20.0,
    isl_tokens=1150.0,
    osl_tokens=700.0,
    itl_ms_p50=25.0,
    ttft_attainment_frac=1.0,
    itl_attainment_frac=1.0,
    ttft_samples_in_window=200,
    itl_samples_in_window=190,
    requests_in_window=200,
    window_s=10.0,
)
LOAD = RoleLoad(decode_requests=380, decode_kv_tokens=380 * 1500)


def _recommend(model: PerfModel, current: int, traffic: Traffic, load: RoleLoad = LOAD) -> tuple[int, str, str]:
    rec = recommend_sla(
        Role.AGG, current, reconciled(Role.AGG, current, prefill_requests=2.0), load, traffic, model, SLA, 0.0, 256
    )
    return rec.replicas, rec.reason, rec.detail


def test_the_count_the_fleet_runs_at_within_the_goal_is_kept_against_the_models_batch_limit(
    agg_model: PerfModel,
) -> None:
    """2 engines run 190 per engine (Little's law on the window: 10 x 700 x 25 ms = 175, x (1 + 3 / sqrt(200))
    = 212) within 256, every request met: the model's refusal of 2 (no fixed point within max_num_seqs) is
    overridden for 2 (decode_batch_observed). Before, 2 asked for 3."""
    replicas, reason, detail = _recommend(agg_model, 2, SHIFTED)
    assert (replicas, reason) == (2, Reason.DECODE_BATCH_OBSERVED)
    assert "the model's decode batch at 2 replicas is past max_num_seqs 256, but the engines run it at 212" in detail


def test_without_the_observation_the_model_refuses_the_count(agg_model: PerfModel) -> None:
    """The same load with the goal missed, too few requests, no observed ITL, or a batch the margin puts past
    max_num_seqs: the model's refusal stands (3 replicas)."""
    for traffic in (
        msgspec.structs.replace(SHIFTED, itl_attainment_frac=0.98),
        msgspec.structs.replace(SHIFTED, ttft_attainment_frac=0.98),
        msgspec.structs.replace(SHIFTED, itl_samples_in_window=5),
        msgspec.structs.replace(SHIFTED, itl_ms_p50=None),
        msgspec.structs.replace(SHIFTED, itl_ms_p50=33.0),  # 10 x 700 x 33 ms = 231, x 1.21 = 280 > 256
    ):
        replicas, reason, _ = _recommend(agg_model, 2, traffic)
        assert replicas == 3, traffic
        assert reason == Reason.SLA_NEEDS_MORE
    # the batch the engines run now past max_num_seqs: refused whatever the window says
    replicas, _, _ = _recommend(agg_model, 2, SHIFTED, RoleLoad(decode_requests=520, decode_kv_tokens=520 * 1500))
    assert replicas == 3


def test_a_count_below_the_one_the_fleet_runs_at_still_needs_the_models_yes(agg_model: PerfModel) -> None:
    """3 engines run the load at ~60 per engine and meet the goal: that says nothing of 2 engines' batch, so 3
    stays (the observation overrides the refusal of the count the fleet runs at, never of fewer)."""
    at_three = RoleLoad(decode_requests=180, decode_kv_tokens=180 * 1500)
    observed = msgspec.structs.replace(SHIFTED, itl_ms_p50=13.0)
    replicas, reason, _ = _recommend(agg_model, 3, observed, at_three)
    assert (replicas, reason) == (3, Reason.SLA_MET)


def test_the_demonstrated_batch_is_littles_law_on_the_window_with_a_rate_rise_margin() -> None:
    batch = demonstrated_batch(SHIFTED, LOAD, 2, 256.0, 0.99, 20)
    assert batch == pytest.approx(10.0 * 700.0 * 0.025 * (1.0 + RATE_NOISE_SD / math.sqrt(200)))
    # the batch the engines run now counts when larger
    busy = RoleLoad(decode_requests=480)
    assert demonstrated_batch(SHIFTED, busy, 2, 256.0, 0.99, 20) == 240.0
    # a queued decode is part of the batch the engines must hold
    queued = RoleLoad(decode_requests=400, queued_decode_requests=120)
    assert demonstrated_batch(SHIFTED, queued, 2, 256.0, 0.99, 20) is None
    # exactly at max_num_seqs is within it
    assert demonstrated_batch(SHIFTED, RoleLoad(decode_requests=512), 2, 256.0, 0.99, 20) == 256.0
    # fewer requests in the window: a wider margin
    few = msgspec.structs.replace(SHIFTED, requests_in_window=25, itl_ms_p50=20.0)
    assert demonstrated_batch(few, LOAD, 2, 256.0, 0.99, 20) == pytest.approx(140.0 * (1.0 + 3.0 / 5.0))
    assert demonstrated_batch(msgspec.structs.replace(few, itl_ms_p50=25.0), LOAD, 2, 256.0, 0.99, 20) is None
    assert demonstrated_batch(msgspec.structs.replace(few, requests_in_window=19), LOAD, 2, 256.0, 0.99, 20) is None
    # nothing to go on
    assert demonstrated_batch(None, LOAD, 2, 256.0, 0.99, 20) is None
    assert demonstrated_batch(SHIFTED, LOAD, 0, 256.0, 0.99, 20) is None
    assert demonstrated_batch(SHIFTED, LOAD, 2, 0.0, 0.99, 20) is None
    assert demonstrated_batch(SHIFTED, LOAD, 2, math.inf, 0.99, 20) is None
    assert demonstrated_batch(msgspec.structs.replace(SHIFTED, osl_tokens=None), LOAD, 2, 256.0, 0.99, 20) is None
    assert demonstrated_batch(msgspec.structs.replace(SHIFTED, request_rate_per_s=0.0), LOAD, 2, 256, 0.99, 20) is None
    # the goal itself is met at exactly the goal
    at_goal = msgspec.structs.replace(SHIFTED, itl_attainment_frac=0.99, ttft_attainment_frac=0.99)
    assert demonstrated_batch(at_goal, LOAD, 2, 256.0, 0.99, 20) is not None
    no_ttft = msgspec.structs.replace(SHIFTED, ttft_samples_in_window=None)
    assert demonstrated_batch(no_ttft, LOAD, 2, 256.0, 0.99, 20) is None
    # a decode-only role is judged on its ITL alone
    assert demonstrated_batch(no_ttft, LOAD, 2, 256.0, 0.99, 20, judge_ttft=False) is not None
    no_itl = msgspec.structs.replace(SHIFTED, itl_samples_in_window=19)
    assert demonstrated_batch(no_itl, LOAD, 2, 256.0, 0.99, 20, judge_ttft=False) is None


def test_a_decode_role_keeps_the_count_it_runs_at_on_its_observed_itl_alone() -> None:
    """A decode-only role (no step model): 65 req/s of 182-token outputs on one engine; the model's Little's-law
    batch (277 at its predicted ITL) is past max_num_seqs, but the engine runs 65 x 182 x 15 ms = 177, x 1.15 for
    400 requests = 204, every ITL met (no TTFT judged on a decode role): 1 is kept (decode_batch_observed). At 2,
    the observation says nothing of 1 engine's batch: decode_batch_limit, as before."""
    model = PerfModel(Role.DECODE, bootstrap=ProfileStepTimer.from_dir(H200_PROFILE))
    traffic = Traffic(
        request_rate_per_s=65.0,
        isl_tokens=1180.0,
        osl_tokens=181.6,
        itl_ms_p50=15.0,
        itl_attainment_frac=1.0,
        itl_samples_in_window=300,
        requests_in_window=400,
    )
    load = RoleLoad(decode_requests=150, decode_kv_tokens=150 * 1300)

    def rec(current: int, observed: Traffic) -> tuple[int, str, str]:
        r = recommend_sla(
            Role.DECODE,
            current,
            reconciled(Role.DECODE, current, prefill_requests=0.0),
            load,
            observed,
            model,
            SLA,
            0.0,
            256,
        )
        return r.replicas, r.reason, r.detail

    replicas, reason, detail = rec(1, traffic)
    assert (replicas, reason) == (1, Reason.DECODE_BATCH_OBSERVED)
    assert "the engines run it at 204 per engine (with margin) and meet the goal" in detail
    assert rec(1, msgspec.structs.replace(traffic, itl_attainment_frac=0.9))[:2] == (2, Reason.DECODE_BATCH_LIMIT)
    assert rec(2, traffic)[:2] == (2, Reason.DECODE_BATCH_LIMIT)


H200_ENGINE = EngineCapacity(
    max_num_batched_tokens=2048, max_num_seqs=256, max_model_len=8192, kv_capacity_tokens=945_029
)


def _window(rate: float, itl_ms: float) -> Traffic:
    """One 10 s traffic window of output_shift after the shift at ``rate`` req/s, every request met."""
    count = round(rate * 10.0)
    return msgspec.structs.replace(
        SHIFTED, request_rate_per_s=rate, itl_ms_p50=itl_ms, requests_in_window=count, ttft_samples_in_window=count
    )


def _hold_two(agg_model: PerfModel, windows: list[Traffic]) -> list[tuple[int, Reason]]:
    """Two aggregated engines running ~200 decodes each, one decision every 5 s over ``windows``: (the final
    count, the recommend stage's reason) of each tick; the fleet is kept at 2."""
    fleet = Fleet()
    for i in range(2):
        fleet.add(f"agg-{i}", Role.AGG, capacity=H200_ENGINE)
    fleet.deploy("agg", 2)
    config = CoreConfig(roles={Role.AGG: RoleConfig(sla=SLA)})
    state = CoreState()
    out: list[tuple[int, Reason]] = []
    for i, window in enumerate(windows):
        now = 5.0 * i
        fleet.publish_all(now, Load(decode=400, kv=400 * 1500))
        state, decisions = fleet.tick(state, now, config, {Role.AGG: window}, predictors={Role.AGG: agg_model})
        recommend = decisions["agg"].stage(Stage.RECOMMEND)
        assert recommend is not None and recommend.reason is not None
        out.append((decisions["agg"].final_replicas, recommend.reason))
    return out


def test_one_windows_chance_excess_does_not_move_a_fleet_the_minutes_demand_fits(agg_model: PerfModel) -> None:
    """output_shift aggregated at 1,215 s: a minute of 20 req/s windows on 2 engines (10 x 700 x 27.6 ms = 193
    per engine), then one window of 22.1 req/s, +1.5 sd of its 221 requests: Little's law on that window alone is
    213, x (1 + 3 / sqrt(221)) = 256.7 past max_num_seqs, and the fleet went to 3 for good. The margin now rests on
    the minute's smoothed demand (~20.2 req/s over ~600 requests: 195 x 1.12 = 219) and the window counts at its
    own 213: 2 stays (decode_batch_observed). Before: 3 at the last tick."""
    steady = [_window(20.0, 27.6)] * 13
    decisions = _hold_two(agg_model, [*steady, _window(22.1, 27.6)])
    assert decisions, "no tick decided"
    assert decisions[-2] == (2, Reason.DECODE_BATCH_OBSERVED)
    assert decisions[-1] == (2, Reason.DECODE_BATCH_OBSERVED)


def test_a_window_past_the_limit_on_its_own_figures_still_trips_the_smoothed_margin(agg_model: PerfModel) -> None:
    """The window's own Little's law counts without a margin, but it counts: a window of 27 req/s after the same
    minute (13.5 x 700 x 27.6 ms = 261 per engine) is past 256 whatever the minute says, and the model's refusal
    stands: the model's own count for 27 req/s (4)."""
    steady = [_window(20.0, 27.6)] * 13
    decisions = _hold_two(agg_model, [*steady, _window(27.0, 27.6)])
    assert decisions[-2] == (2, Reason.DECODE_BATCH_OBSERVED)
    assert decisions[-1] == (4, Reason.SLA_NEEDS_MORE)


def test_the_output_demand_is_a_time_weighted_ewma_over_a_minute() -> None:
    first = update_demand(None, _window(20.0, 25.0), 0.0)
    assert first == OutputDemand(tokens_per_s=14_000.0, requests_per_s=20.0, span_s=10.0, at=0.0)
    second = update_demand(first, _window(30.0, 25.0), 5.0)
    weight = -math.expm1(-5.0 / DEMAND_WINDOW_S)
    assert second is not None
    assert second.tokens_per_s == pytest.approx(14_000.0 + weight * 7_000.0)
    assert second.requests_per_s == pytest.approx(20.0 + weight * 10.0)
    assert (second.span_s, second.at) == (15.0, 5.0)
    # the span it rests on grows to the time constant, no further
    later = second
    for i in range(2, 30):
        later = update_demand(later, _window(20.0, 25.0), 5.0 * i)
    assert later is not None and later.span_s == DEMAND_WINDOW_S
    # a window without a rate or an OSL leaves it as it was; a gap of a time constant starts it afresh
    assert update_demand(second, None, 10.0) is second
    assert update_demand(second, msgspec.structs.replace(SHIFTED, osl_tokens=None), 10.0) is second
    fresh = update_demand(second, _window(10.0, 25.0), 5.0 + DEMAND_WINDOW_S)
    assert fresh == OutputDemand(tokens_per_s=7_000.0, requests_per_s=10.0, span_s=10.0, at=5.0 + DEMAND_WINDOW_S)


def test_the_smoothed_margin_rests_on_the_requests_of_its_span() -> None:
    """With a demand, the window's own Little's law counts without a margin and the demand's with 3 sd of its
    span's requests: 20 req/s over 60 s is 1,200 requests, 1 + 3 / sqrt(1200)."""
    demand = OutputDemand(tokens_per_s=14_000.0, requests_per_s=20.0, span_s=60.0, at=0.0)
    batch = demonstrated_batch(SHIFTED, LOAD, 2, 256.0, 0.99, 20, demand=demand)
    assert batch == pytest.approx(7_000.0 * 0.025 * (1.0 + RATE_NOISE_SD / math.sqrt(1200.0)))
    # a window above the demand counts at its own figures: 12 x 700 x 25 ms = 210
    high = msgspec.structs.replace(SHIFTED, request_rate_per_s=24.0)
    assert demonstrated_batch(high, LOAD, 2, 256.0, 0.99, 20, demand=demand) == pytest.approx(210.0)
    # a span shorter than the window rests on the window's requests (200), not fewer
    young = msgspec.structs.replace(demand, span_s=5.0)
    assert demonstrated_batch(SHIFTED, LOAD, 2, 256.0, 0.99, 20, demand=young) == pytest.approx(
        175.0 * (1.0 + RATE_NOISE_SD / math.sqrt(200.0))
    )
    # a demand with nothing in it is no demand: the window's margin
    empty = msgspec.structs.replace(demand, tokens_per_s=0.0)
    assert demonstrated_batch(SHIFTED, LOAD, 2, 256.0, 0.99, 20, demand=empty) == pytest.approx(
        175.0 * (1.0 + RATE_NOISE_SD / math.sqrt(200.0))
    )

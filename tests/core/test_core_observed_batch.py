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
from planner.core import Reason, RoleLoad, SlaTargets, Traffic
from planner.core.observed_batch import RATE_NOISE_SD, demonstrated_batch
from planner.core.recommend import recommend_sla
from planner.discovery import Role
from tests.core.fleetkit import H200_PROFILE, reconciled

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

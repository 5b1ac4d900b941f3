"""The batch the engines show is evidence at the rate they were seen at (planner.core.observed_batch, the forecast
floor's call in planner.core.floor_stage). Held-out flash_crowd on a slow engine, disaggregated: 2 decode engines
ran 233 requests each at 80 req/s within the goal, and the forecast floor's call of the model at the forecast's
151.6 req/s kept 2 on that observation (Little's law on the ITL measured at today's smaller batch put the forecast's
batch at 224 <= 256), lowering the forecast's floor of 4 to 2; at 117.9 req/s the batch was 512 + 248 queued."""

from __future__ import annotations

import math

import msgspec
import pytest

from perf_model.model import PerfModel
from perf_model.step_timer import ProfileStepTimer
from planner.core import Mode, RoleLoad, SlaTargets, Traffic
from planner.core.floor_stage import FloorInputs, floor_within_model, model_count_at_level
from planner.core.observed_batch import RATE_NOISE_SD, at_rate, demonstrated_batch
from planner.core.recommend import recommend_sla
from planner.discovery import Role
from tests.core.fleetkit import H200_PROFILE, hpa_role, reconciled

SLA = SlaTargets(ttft_ms=2000, itl_ms=50)

# 2 decode engines at 80 req/s of 164-token outputs, 400 requests in the window, every ITL met (median 18 ms),
# 233 requests running on each engine now
SEEN = Traffic(
    request_rate_per_s=80.0,
    isl_tokens=1200.0,
    osl_tokens=164.0,
    itl_ms_p50=18.0,
    itl_attainment_frac=1.0,
    itl_samples_in_window=400,
    requests_in_window=400,
    window_s=10.0,
)
LOAD = RoleLoad(decode_requests=466, decode_kv_tokens=466 * 1300)


@pytest.fixture(scope="module")
def decode_model() -> PerfModel:
    return PerfModel(Role.DECODE, bootstrap=ProfileStepTimer.from_dir(H200_PROFILE))


def floor_inputs(model: PerfModel) -> FloorInputs:
    recon = reconciled(Role.DECODE, 2, prefill_requests=0.0)
    rec = recommend_sla(Role.DECODE, 2, recon, LOAD, SEEN, model, SLA, 0.0, 256)
    return FloorInputs(
        role=Role.DECODE,
        rc=hpa_role(mode=Mode.SLA, sla=SLA),
        current=2,
        recon=recon,
        load=LOAD,
        traffic=SEEN,
        predictor=model,
        rec=rec,
        held=False,
        corrections=(0.0, 0.0),
        startup_s=0.0,
        settled=True,
        prompt_cv2=0.0,
    )


def test_the_forecast_floor_does_not_keep_the_count_on_a_batch_shown_at_a_lower_rate(decode_model: PerfModel) -> None:
    """At the forecast's 128 req/s (1.6 x the 80 seen, far past its counting noise of 1 + 3 / sqrt(400) = 15 %) the
    model's Little's-law batch at 2 is past max_num_seqs; the engines' 233 were shown at 80 req/s, so they do not
    override it: the floor within the model is 3. Before, the observation kept 2 at any forecast rate."""
    inputs = floor_inputs(decode_model)
    assert inputs.rec.replicas == 2  # the load itself is met at 2
    assert floor_within_model(inputs, 2, 128.0) == 3


def test_the_observed_attainment_goes_with_the_rate_within_its_counting_noise() -> None:
    """A call at another rate keeps the window's attainment up to the window's rate plus 3 sigma of its count (the
    rise the window's mean hides: 80 x (1 + 3 / sqrt(400)) = 92 req/s) and the batch shown counts; past it no
    attainment goes with the rate and no batch is shown."""
    within = 80.0 * (1.0 + RATE_NOISE_SD / math.sqrt(400))
    seen = at_rate(SEEN, within)
    assert seen == msgspec.structs.replace(SEEN, request_rate_per_s=within)
    # Little's law at 92 req/s: 46 x 164 x 18 ms = 136 per engine (156 with the margin): the live 233 rules
    assert demonstrated_batch(seen, LOAD, 2, 256.0, 0.99, 20, judge_ttft=False) == 233.0
    unseen = at_rate(SEEN, within * 1.001)
    assert unseen.request_rate_per_s == within * 1.001
    assert (unseen.ttft_attainment_frac, unseen.itl_attainment_frac) == (None, None)
    assert (unseen.ttft_samples_in_window, unseen.itl_samples_in_window) == (None, None)
    assert (unseen.osl_tokens, unseen.itl_ms_p50, unseen.requests_in_window) == (164.0, 18.0, 400)
    assert demonstrated_batch(unseen, LOAD, 2, 256.0, 0.99, 20, judge_ttft=False) is None
    # a lower rate keeps it; a window with no requests counted or no rate shows nothing at another rate
    assert at_rate(SEEN, 40.0).itl_attainment_frac == 1.0
    assert at_rate(msgspec.structs.replace(SEEN, requests_in_window=None), 80.0).itl_attainment_frac is None
    assert at_rate(msgspec.structs.replace(SEEN, request_rate_per_s=None), 80.0).itl_attainment_frac is None


def test_a_forecast_within_the_noise_of_the_rate_seen_keeps_the_override(decode_model: PerfModel) -> None:
    """The model refuses 2 engines at 140 req/s (its batch past max_num_seqs) where the engines show 233 each
    within the goal (median ITL 15 ms) at 130 req/s: a forecast of 140 is within the window's counting noise
    (130 x 1.15 = 149.5) and the floor within the model stays 2 on the observation; at 150 it is 3."""
    seen = msgspec.structs.replace(SEEN, request_rate_per_s=130.0, itl_ms_p50=15.0)
    inputs = msgspec.structs.replace(floor_inputs(decode_model), traffic=seen)
    assert floor_within_model(inputs, 2, 140.0) == 2
    assert floor_within_model(inputs, 2, 150.0) == 3
    # the model alone refuses 2 at 140: it is the observation that keeps it
    alone = msgspec.structs.replace(inputs, traffic=msgspec.structs.replace(seen, itl_attainment_frac=None))
    assert floor_within_model(alone, 2, 140.0) == 3


def test_the_steady_rates_count_at_holts_level_reads_the_observation_alike(decode_model: PerfModel) -> None:
    """The steady-rate check asks the model at Holt's level: a level within the window's noise keeps the batch the
    engines show (2), one past it does not (3 at 128 req/s, the model's batch at 2 past max_num_seqs)."""
    inputs = floor_inputs(decode_model)
    assert model_count_at_level(inputs, 80.0) == 2
    assert model_count_at_level(inputs, 128.0) == 3

"""Issue 13 item 4 (the core's side), from the scenario suite's misses: the drain of a prefill backlog counted at
what the engines actually prefill (long prompts with decodes riding along), a decode batch past the engine's
max_num_seqs, and the closed loop holding while a backlog left from before a scale-up drains."""

from __future__ import annotations

import msgspec
import pytest

from perf_model.model import PerfModel
from perf_model.step_timer import ProfileStepTimer
from planner.core import (
    CoreConfig,
    CoreState,
    ForecastConfig,
    ForecastMethod,
    Mode,
    Reason,
    RoleConfig,
    RoleLoad,
    SlaTargets,
    Stage,
    Traffic,
)
from planner.core.config import SlaFeedbackConfig
from planner.core.feedback import FeedbackState, update_feedback
from planner.core.recommend import recommend_sla
from planner.discovery import EngineCapacity, Role
from tests.core.fleetkit import H200_PROFILE, Fleet, Load, reconciled

SLA = SlaTargets(ttft_ms=2000, itl_ms=50)
H200_ENGINE = EngineCapacity(
    max_num_batched_tokens=2048, max_num_seqs=256, max_model_len=131_072, kv_capacity_tokens=945_029
)


@pytest.fixture(scope="module")
def timer() -> ProfileStepTimer:
    return ProfileStepTimer.from_dir(H200_PROFILE)


@pytest.fixture(scope="module")
def agg_model(timer: ProfileStepTimer) -> PerfModel:
    return PerfModel(Role.AGG, bootstrap=timer)


@pytest.fixture(scope="module")
def decode_model(timer: ProfileStepTimer) -> PerfModel:
    return PerfModel(Role.DECODE, bootstrap=timer)


def test_a_long_prompt_backlog_drains_at_what_the_engines_prefill_with_decodes_riding_along(
    agg_model: PerfModel,
) -> None:
    """prompt_shift, cold, the first tick after prompts went from 300 to ~4400 tokens at 19 req/s: 69k prompt
    tokens queued on 2 engines. One 2048-token chunk alone prefills ~42k tokens/s, so 2 engines seemed to keep up
    with the 84k tokens/s arriving (a backlog of 89k after a start-up: 3 replicas, which left the queue growing on
    the 2 ready ones for a start-up and then draining for another minute: 93.35 %). With the decodes riding along
    and each chunk attending to the earlier ones, an engine prefills ~37k tokens/s of such prompts (the simulated
    engine served 37-39k): the queue grows on 2, outlasts a start-up, and the scale-up is the current count plus
    what the arrivals need (backlog_outlasts_startup) at once."""
    traffic = Traffic(
        request_rate_per_s=19.1,
        isl_tokens=4394.0,
        osl_tokens=143.6,
        isl_tokens_p50=3872.0,
        isl_tokens_p90=7999.0,
        isl_tokens_p99=13245.0,
        osl_tokens_p50=122.6,
        osl_tokens_p90=240.9,
        osl_tokens_p99=451.2,
    )
    load = RoleLoad(
        queued_prefill_tokens=68_523, scheduled_prefill_tokens=4000, decode_requests=96, decode_kv_tokens=442_049
    )
    queued = reconciled(Role.AGG, 2, prefill_requests=19.0)
    rec = recommend_sla(Role.AGG, 2, queued, load, traffic, agg_model, SLA, 0.0, 256, startup_s=60.0)
    assert rec.reason == Reason.BACKLOG_OUTLASTS_STARTUP
    assert rec.arrivals_replicas is not None
    assert rec.replicas == 2 + rec.arrivals_replicas
    assert rec.replicas >= 5
    # short prompts at the same token rate: an engine prefills them faster than one chunk alone says, and the
    # backlog is sized as before (the lower of the two throughputs counts)
    short = Traffic(request_rate_per_s=40.0, isl_tokens=1000.0, osl_tokens=143.6)
    many = reconciled(Role.AGG, 2, prefill_requests=72.0)
    before = recommend_sla(Role.AGG, 2, many, load, short, agg_model, SLA, 0.0, 256, startup_s=60.0)
    assert before.reason != Reason.BACKLOG_OUTLASTS_STARTUP


def test_a_decode_batch_past_max_num_seqs_is_not_a_count_that_meets_the_itl(decode_model: PerfModel) -> None:
    """flash_crowd, disaggregated, restore: 78 req/s of 182-token outputs. On one decode engine Little's law puts
    ~540 requests in the batch at the predicted 38 ms ITL, but the engine runs at most 256 (max_num_seqs): the rest
    wait between tokens. Before: 1 replica met the ITL (38 ms <= 50), the core scaled 2 -> 1 and 709 requests missed
    their ITL (97.44 %). Now one engine is infeasible there, and the count stays at 2 (decode_batch_limit)."""
    traffic = Traffic(request_rate_per_s=78.4, isl_tokens=1180.0, osl_tokens=181.6)
    load = RoleLoad(decode_requests=144, decode_kv_tokens=144 * 1300)
    rec = recommend_sla(
        Role.DECODE, 2, reconciled(Role.DECODE, 2, prefill_requests=0.0), load, traffic, decode_model, SLA, 0.0, 256
    )
    assert rec.replicas == 2
    assert rec.reason == Reason.DECODE_BATCH_LIMIT
    assert "1 replicas: a decode batch of" in rec.detail
    # under the batch limit the ITL alone decides, as before: a quarter of the rate fits one engine
    light = msgspec.structs.replace(traffic, request_rate_per_s=78.4 / 4)
    rec = recommend_sla(
        Role.DECODE, 2, reconciled(Role.DECODE, 2, prefill_requests=0.0), load, light, decode_model, SLA, 0.0, 256
    )
    assert rec.replicas == 1
    assert rec.reason == Reason.SLA_ALLOWS_FEWER


def _window(ttft: float, itl: float) -> Traffic:
    return Traffic(
        request_rate_per_s=20.0,
        ttft_attainment_frac=ttft,
        itl_attainment_frac=itl,
        ttft_samples_in_window=350,
        itl_samples_in_window=250,
        ttft_ms_p50=1500.0,
        ttft_ms_p90=9000.0,
        ttft_ms_p99=14_000.0,
        window_s=10.0,
    )


def test_the_loop_holds_while_a_backlog_from_before_the_scale_up_drains() -> None:
    """prompt_shift, cold: 5 replicas all up at 970 s, the 1.4M-token backlog queued before they came falls 1.0M ->
    0.66M tokens in 5 s (gone in ~9 s). The window's requests (57 % within TTFT, 39 % within ITL) queued behind it,
    or decoded through its prompts' chunks: capacity decided now would come after it drained. Before: the ITL
    correction went to its bound in one tick (5 -> 8 replicas). Now it holds (sla_feedback_frozen); a queue that
    grows, or one that drains slower than a start-up, tightens as before."""
    cfg = SlaFeedbackConfig()
    state = FeedbackState(
        ttft_frac=-0.27, itl_frac=-0.27, last_at=975.0, in_flight_at=965.0, queued_prefill_tokens=1_020_000
    )
    traffic = _window(0.569, 0.392)
    held = update_feedback(state, traffic, 980.0, cfg, in_flight=False, queued_prefill_tokens=659_000, startup_s=60.0)
    assert held.reason == Reason.SLA_FEEDBACK_FROZEN
    assert (held.state.ttft_frac, held.state.itl_frac) == (-0.27, -0.27)
    assert "drains in 9 s" in held.detail
    assert held.state.queued_prefill_tokens == 659_000
    grows = update_feedback(
        state, traffic, 980.0, cfg, in_flight=False, queued_prefill_tokens=1_100_000, startup_s=60.0
    )
    assert grows.state.itl_frac > -0.27
    slow = update_feedback(state, traffic, 980.0, cfg, in_flight=False, queued_prefill_tokens=1_000_000, startup_s=60.0)
    assert slow.state.itl_frac > -0.27  # 20k tokens in 5 s: 250 s to drain, past a start-up
    late = msgspec.structs.replace(state, in_flight_at=900.0)  # the capacity came more than a start-up ago
    assert (
        update_feedback(
            late, traffic, 980.0, cfg, in_flight=False, queued_prefill_tokens=659_000, startup_s=60.0
        ).state.itl_frac
        > -0.27
    )


def test_a_queue_that_fell_by_too_little_to_give_a_rate_does_not_crash_the_loop() -> None:
    """Found by the reliability property (hypothesis, in a mutation run): a queue of 1e-300 tokens that fell to 0
    over 1e30 s gives a drain rate that underflows to 0, and the drain time divided by it (ZeroDivisionError: the
    whole tick lost). A rate that is not positive says nothing about when the queue is gone: no freeze from it."""
    cfg = SlaFeedbackConfig()
    state = FeedbackState(last_at=0.0, in_flight_at=0.0, queued_prefill_tokens=1e-300)
    out = update_feedback(
        state, _window(0.5, 0.5), 1e30, cfg, in_flight=False, queued_prefill_tokens=0.0, startup_s=1e31
    )
    assert out.reason != Reason.SLA_FEEDBACK_FROZEN and "drains in" not in out.detail
    assert out.state.queued_prefill_tokens == 0.0


def test_a_count_raised_for_max_num_seqs_does_not_lower_the_forecasts_capacity(decode_model: PerfModel) -> None:
    """output_shift, disaggregated: the decode count raised one above what the step model accepts only because one
    fewer engine's batch would pass max_num_seqs (decode_batch_limit). The forecast floor's per-replica capacity was
    rate / that count, so it fell as the count became honest, and every forecast spike then asked a third replica
    (2.00 -> 2.16 GPU-h, above fixed peak's 2.02). Now it is derived from the count the step model accepts."""
    fleet = Fleet()
    fleet.add_many(2, Role.DECODE)
    fleet.deploy("decode", 2)
    config = CoreConfig(
        roles={
            Role.DECODE: RoleConfig(
                mode=Mode.SLA,
                sla=SLA,
                max_replicas=8,
                headroom_frac=0.0,
                itl_headroom_frac=0.0,
                forecast=ForecastConfig(method=ForecastMethod.HOLT),
            )
        }
    )
    traffic = {Role.DECODE: Traffic(request_rate_per_s=78.4, isl_tokens=1180.0, osl_tokens=181.6)}
    fleet.publish_all(0.0, Load(decode=144, kv=144 * 1300))
    state, decisions = fleet.tick(CoreState(), 0.0, config, traffic, predictors={Role.DECODE: decode_model})
    decision = decisions["decode"]
    stage = decision.stage(Stage.RECOMMEND)
    assert stage is not None and stage.reason == Reason.DECODE_BATCH_LIMIT and stage.replicas == 2
    assert Reason.FORECAST_CAPACITY_BEFORE_BATCH_LIMIT in decision.reasons
    assert state.services["decode"].forecast.capacity_rps == pytest.approx(78.4)  # before: 39.2 (78.4 / 2)

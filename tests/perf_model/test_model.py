from __future__ import annotations

import math

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perf_model.errors import InvalidLoadError, ModelNotReadyError
from perf_model.model import ModelSource, PerfModel, PerfModelConfig, fit_step_time
from perf_model.samples import SampleVerdict
from perf_model.step_timer import ProfileStepTimer
from perf_model.synthetic import synthetic_loads, timed_samples
from planner.discovery import Role
from planner.errors import ConfigError, PlannerError
from worker_shim.fpm import ForwardPassMetrics, ScheduledRequests


def trained(timer: ProfileStepTimer, role: Role, n: int = 2000, *, seed: int = 7, bootstrap: bool = True) -> PerfModel:
    rng = np.random.default_rng(seed)
    model = PerfModel(role, bootstrap=timer if bootstrap else None)
    for sample in timed_samples(timer, synthetic_loads(role, n, rng), rng):
        model.observe(sample, now=0.0)
    assert model.maybe_refit(now=0.0)
    return model


@pytest.fixture(scope="module")
def models(h200_timer: ProfileStepTimer) -> dict[Role, PerfModel]:
    return {role: trained(h200_timer, role) for role in Role}


def test_without_data_or_profile_it_says_so_and_refuses_to_guess() -> None:
    model = PerfModel(Role.DECODE)
    assert not model.ready
    status = model.status()
    assert status.source is ModelSource.NONE
    assert "0 accepted samples, need 64" in status.not_ready_because
    with pytest.raises(ModelNotReadyError, match="not ready") as info:
        model.predict_itl_ms(8, 8000)
    assert isinstance(info.value, PlannerError)
    with pytest.raises(ModelNotReadyError):
        model.predict_ttft_ms(1000, 0, 8192)


def test_a_profile_makes_it_ready_before_live_data(h200_timer: ProfileStepTimer) -> None:
    model = PerfModel(Role.DECODE, bootstrap=h200_timer)
    assert model.ready
    assert model.status().source is ModelSource.PROFILE
    point = h200_timer.profile.decode[10]
    estimate = model.predict_itl_ms(point.decode_requests, point.decode_kv_tokens)
    assert estimate.value_ms == pytest.approx(point.itl_ms)
    assert estimate.upper_ms == pytest.approx(point.itl_ms * 1.1)


def test_live_samples_take_over_and_the_switch_shows(h200_timer: ProfileStepTimer) -> None:
    model = trained(h200_timer, Role.DECODE, n=400)
    status = model.status()
    assert status.source is ModelSource.LIVE
    assert status.live_ready and status.not_ready_because == ()
    assert status.profile == "h200_llama31_8b_fp8_tp1"
    assert status.fit is not None and status.fit.columns == ("one", "decode", "decode_kv")


def test_samples_at_one_load_level_never_make_it_live(h200_timer: ProfileStepTimer) -> None:
    model = PerfModel(Role.DECODE, config=PerfModelConfig(warmup_steps=0))
    for counter in range(1, 500):
        load = ScheduledRequests(num_decode_requests=32, sum_decode_kv_tokens=32 * 2000)
        wall_s = h200_timer.step_time_s(0, 0, 32, 32 * 2000)
        model.observe(
            ForwardPassMetrics(worker_id="w", dp_rank=0, counter_id=counter, wall_time=wall_s, scheduled_requests=load),
            now=float(counter),
        )
    model.refit(now=500.0)
    status = model.status()
    assert status.accepted == 499
    assert not model.ready
    assert any("decode_requests spans 1 half-octave bins" in gap for gap in status.not_ready_because)


@pytest.mark.parametrize("role", list(Role))
def test_held_out_step_times_within_five_percent(
    h200_timer: ProfileStepTimer, models: dict[Role, PerfModel], role: Role
) -> None:
    rng = np.random.default_rng(99)
    loads = synthetic_loads(role, 1000, rng)
    observed = timed_samples(h200_timer, loads, rng, outlier_frac=0.0, cold_steps=0)
    errors = [
        abs(models[role].predict_step_ms(*load).value_ms - s.wall_time * 1000.0) / (s.wall_time * 1000.0)
        for load, s in zip(loads, observed, strict=True)
    ]
    assert models[role].status().source is ModelSource.LIVE
    assert float(np.mean(errors)) <= 0.05


@pytest.mark.parametrize("role", [Role.PREFILL, Role.AGG])
def test_profile_ttft_points_within_ten_percent(
    h200_timer: ProfileStepTimer, models: dict[Role, PerfModel], role: Role
) -> None:
    errors = [
        abs(models[role].predict_ttft_ms(p.isl_tokens, 0, 16384).value_ms - p.ttft_ms) / p.ttft_ms
        for p in h200_timer.profile.prefill
    ]
    assert float(np.mean(errors)) <= 0.10


@pytest.mark.parametrize("role", [Role.DECODE, Role.AGG])
def test_profile_itl_points_within_ten_percent(
    h200_timer: ProfileStepTimer, models: dict[Role, PerfModel], role: Role
) -> None:
    errors = [
        abs(models[role].predict_itl_ms(d.decode_requests, d.decode_kv_tokens).value_ms - d.itl_ms) / d.itl_ms
        for d in h200_timer.profile.decode
    ]
    assert float(np.mean(errors)) <= 0.10


def test_cold_start_and_slow_steps_are_filtered(h200_timer: ProfileStepTimer) -> None:
    rng = np.random.default_rng(3)
    model = PerfModel(Role.AGG, bootstrap=h200_timer)
    loads = synthetic_loads(Role.AGG, 3000, rng)
    samples = timed_samples(h200_timer, loads, rng, cold_steps=8, engines=4, outlier_frac=0.03)
    model.observe_many(samples[:1500], now=0.0)
    model.refit(now=0.0)  # live from here: later slow steps are judged against the fit
    model.observe_many(samples[1500:], now=60.0)
    model.refit(now=60.0)
    status = model.status()
    assert status.verdicts[SampleVerdict.WARMUP] == 4 * 16
    assert status.verdicts[SampleVerdict.OUTLIER] > 0
    assert status.fit is not None and status.fit.trimmed > 0 and status.fit.mape < 0.05
    assert not status.drifting


def scaled(samples: list[ForwardPassMetrics], factor: float, counter_offset: int = 0) -> list[ForwardPassMetrics]:
    """The same steps ``factor`` times slower; ``counter_offset`` continues an earlier stream (no restart)."""
    return [
        ForwardPassMetrics(
            worker_id=s.worker_id,
            dp_rank=s.dp_rank,
            counter_id=s.counter_id + counter_offset,
            wall_time=s.wall_time * factor,
            scheduled_requests=s.scheduled_requests,
        )
        for s in samples
    ]


def test_a_fleet_four_times_slower_than_its_profile_still_learns(h200_timer: ProfileStepTimer) -> None:
    rng = np.random.default_rng(4)
    model = PerfModel(Role.DECODE, bootstrap=h200_timer)
    samples = scaled(timed_samples(h200_timer, synthetic_loads(Role.DECODE, 600, rng), rng), 4.0)
    model.observe_many(samples, now=0.0)
    model.refit(now=0.0)
    assert model.status().source is ModelSource.LIVE
    point = h200_timer.profile.decode[20]
    assert model.predict_itl_ms(point.decode_requests, point.decode_kv_tokens).value_ms == pytest.approx(
        4.0 * point.itl_ms, rel=0.2
    )


def test_when_the_engines_change_speed_the_model_follows(h200_timer: ProfileStepTimer) -> None:
    rng = np.random.default_rng(6)
    model = PerfModel(Role.DECODE, config=PerfModelConfig(refit_interval_s=30.0))
    before = timed_samples(h200_timer, synthetic_loads(Role.DECODE, 800, rng), rng, cold_steps=0)
    model.observe_many(before, now=0.0)
    model.refit(now=0.0)
    fresh = timed_samples(h200_timer, synthetic_loads(Role.DECODE, 3000, rng), rng, cold_steps=0)
    after = scaled(fresh, 3.5, counter_offset=len(before))
    verdicts = [model.observe(s, now=10.0) for s in after[:40]]
    assert verdicts[:31] == [SampleVerdict.OUTLIER] * 31  # a few far samples are outliers...
    assert model.status().drifting  # ...most of them means the engines changed
    model.observe_many(after[40:], now=20.0)
    model.refit(now=30.0)
    point = h200_timer.profile.decode[20]
    assert model.predict_itl_ms(point.decode_requests, point.decode_kv_tokens).value_ms == pytest.approx(
        3.5 * point.itl_ms, rel=0.2
    )


def test_refits_on_a_cadence_and_only_with_new_samples(h200_timer: ProfileStepTimer) -> None:
    rng = np.random.default_rng(5)
    model = PerfModel(Role.DECODE, config=PerfModelConfig(refit_interval_s=30.0, warmup_steps=0))
    samples = timed_samples(h200_timer, synthetic_loads(Role.DECODE, 200, rng), rng, cold_steps=0)
    model.observe_many(samples[:100], now=0.0)
    assert model.maybe_refit(now=0.0)
    assert not model.maybe_refit(now=100.0)  # nothing new
    model.observe_many(samples[100:], now=10.0)
    assert not model.maybe_refit(now=10.0)  # too soon
    assert model.maybe_refit(now=30.0)
    assert model.status().fits == 2


@settings(max_examples=200, deadline=None)
@given(
    p=st.floats(0, 1e6),
    pkv=st.floats(0, 1e7),
    b=st.floats(0, 1e5),
    k=st.floats(0, 1e9),
    role=st.sampled_from(list(Role)),
)
def test_predictions_are_never_negative_or_non_finite(
    models: dict[Role, PerfModel], p: float, pkv: float, b: float, k: float, role: Role
) -> None:
    model = models[role]
    for estimate in (
        model.predict_step_ms(p, pkv, b, k),
        model.predict_itl_ms(b, k),
        model.predict_ttft_ms(p, pkv, 8192),
    ):
        assert math.isfinite(estimate.value_ms) and math.isfinite(estimate.upper_ms)
        assert 0.0 <= estimate.value_ms <= estimate.upper_ms


def test_predictions_are_monotone_in_load(models: dict[Role, PerfModel]) -> None:
    agg = models[Role.AGG]
    itl = [agg.predict_itl_ms(b, b * 3000).value_ms for b in (1, 2, 8, 64, 256, 1024)]
    assert itl == sorted(itl) and itl[0] < itl[-1]
    ttft_isl = [agg.predict_ttft_ms(isl, 0, 8192).upper_ms for isl in (1, 100, 1000, 8192, 8193, 30000)]
    assert ttft_isl == sorted(ttft_isl) and ttft_isl[0] < ttft_isl[-1]
    ttft_queue = [agg.predict_ttft_ms(1000, q, 8192).upper_ms for q in (0, 100, 7000, 8192, 50000, 1e6)]
    assert ttft_queue == sorted(ttft_queue) and ttft_queue[0] < ttft_queue[-1]


def test_bad_loads_raise(models: dict[Role, PerfModel]) -> None:
    with pytest.raises(InvalidLoadError):
        models[Role.DECODE].predict_itl_ms(-1, 0)
    with pytest.raises(InvalidLoadError):
        models[Role.PREFILL].predict_ttft_ms(math.nan, 0, 8192)
    with pytest.raises(InvalidLoadError):
        models[Role.PREFILL].predict_ttft_ms(100, 0, 0)


def test_capacity_follows_the_targets(models: dict[Role, PerfModel]) -> None:
    decode = models[Role.DECODE]
    tight = decode.capacity(
        isl_tokens=3000, osl_tokens=300, ttft_target_ms=500, itl_target_ms=15, max_num_batched_tokens=8192
    )
    loose = decode.capacity(
        isl_tokens=3000, osl_tokens=300, ttft_target_ms=500, itl_target_ms=40, max_num_batched_tokens=8192
    )
    assert 0 < tight.decode_rps < loose.decode_rps and tight.rps == tight.decode_rps
    assert decode.predict_itl_ms(tight.decode_batch, tight.decode_batch * 3150).upper_ms <= 15
    assert decode.predict_itl_ms(tight.decode_batch + 1, (tight.decode_batch + 1) * 3150).upper_ms > 15
    kv_bound = decode.capacity(
        isl_tokens=3000,
        osl_tokens=300,
        ttft_target_ms=500,
        itl_target_ms=40,
        max_num_batched_tokens=8192,
        max_kv_tokens=33000,
    )
    assert kv_bound.decode_batch == 10
    impossible = decode.capacity(
        isl_tokens=3000, osl_tokens=300, ttft_target_ms=500, itl_target_ms=1, max_num_batched_tokens=8192
    )
    assert impossible.rps == 0.0

    prefill = models[Role.PREFILL]
    fast = prefill.capacity(
        isl_tokens=2000, osl_tokens=100, ttft_target_ms=300, itl_target_ms=20, max_num_batched_tokens=8192
    )
    slow = prefill.capacity(
        isl_tokens=2000, osl_tokens=100, ttft_target_ms=80, itl_target_ms=20, max_num_batched_tokens=8192
    )
    assert 0 < slow.prefill_rps < fast.prefill_rps and fast.decode_rps == 0.0
    assert (
        prefill.capacity(
            isl_tokens=2000, osl_tokens=100, ttft_target_ms=10, itl_target_ms=20, max_num_batched_tokens=8192
        ).rps
        == 0.0
    )

    agg = models[Role.AGG].capacity(
        isl_tokens=2000, osl_tokens=200, ttft_target_ms=300, itl_target_ms=30, max_num_batched_tokens=8192
    )
    assert 0 < agg.rps < min(agg.prefill_rps, agg.decode_rps)


def test_fit_keeps_coefficients_non_negative_when_data_point_the_other_way() -> None:
    loads = [(0.0, 0.0, float(b), float(b) * 100) for b in range(1, 50)]
    wall_ms = [50.0 - b * 0.5 for b in range(1, 50)]  # faster with more load: no engine does that
    fit = fit_step_time(Role.DECODE, loads, wall_ms)
    assert fit.coef_ms and all(c >= 0 for c in fit.coef_ms)
    # The best non-negative model of falling times is flat, inside the observed range (clipping a fit made
    # without the constraint keeps its intercept of ~50 ms: above every observation).
    assert all(min(wall_ms) <= fit.step_ms(load) <= max(wall_ms) for load in loads)


def test_a_role_asked_about_the_other_phase_answers_from_the_profile(
    h200_timer: ProfileStepTimer, models: dict[Role, PerfModel]
) -> None:
    # The decision core asks a decode model for one chunk's TTFT (prefill throughput) too: it must not fail, and
    # a live decode fit knows nothing of prefill, so the profile answers.
    decode = models[Role.DECODE]
    assert decode.status().source is ModelSource.LIVE
    assert decode.predict_ttft_ms(8192, 0, 8192).value_ms == pytest.approx(h200_timer.ttft_ms(8192, 8192))
    prefill = models[Role.PREFILL]
    point = h200_timer.profile.decode[5]
    assert prefill.predict_itl_ms(point.decode_requests, point.decode_kv_tokens).value_ms == pytest.approx(point.itl_ms)
    # Without a profile the live fit's floor is all it has: finite, never an error.
    rng = np.random.default_rng(8)
    bare = PerfModel(Role.DECODE)
    bare.observe_many(timed_samples(h200_timer, synthetic_loads(Role.DECODE, 400, rng), rng), now=0.0)
    bare.refit(now=0.0)
    estimate = bare.predict_ttft_ms(8192, 0, 8192)
    assert bare.ready and math.isfinite(estimate.upper_ms) and estimate.value_ms > 0


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("min_samples", 1),
        ("outlier_factor", 1.0),
        ("band_quantile", 1.0),
        ("ttft_overhead_ms", -1.0),
        ("max_samples", 0),
    ],
)
def test_bad_config_is_a_config_error_naming_the_field(field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=field):
        msgspec.structs.replace(PerfModelConfig(), **{field: value})


def test_fit_refuses_bad_input() -> None:
    with pytest.raises(InvalidLoadError):
        fit_step_time(Role.DECODE, [(0.0, 0.0, 1.0, 10.0)], [5.0])
    with pytest.raises(InvalidLoadError):
        fit_step_time(Role.DECODE, [(0.0, 0.0, 1.0, 10.0)] * 2, [5.0, math.nan])

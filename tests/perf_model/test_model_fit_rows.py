"""``fit_step_time`` and ``PerfModel`` row by row against docs/perf_model.md, with scipy's NNLS as an independent
oracle: the fit is the non-negative least squares in relative error (``sample_weight = 1/y^2``), scale-free, and
works when a role's column is all zero; hinge selection keeps a hinge only when it cuts the mean capped relative
error of that fit by 15 %; predictions answer from the profile for the phase the live role does not run, ITL is
the decode-only step, TTFT is every chunk's step plus the overhead; readiness gaps name the load term."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import nnls

from perf_model.features import HINGE_VARIABLES, Hinge, StepLoad, feature_row
from perf_model.model import ModelSource, PerfModel, PerfModelConfig, fit_step_time
from perf_model.step_timer import ProfileStepTimer
from perf_model.synthetic import synthetic_loads, timed_samples
from planner.discovery import Role
from worker_shim.fpm import ForwardPassMetrics, ScheduledRequests

QUANTILES = (0.2, 0.4, 0.6, 0.8)


def decode_loads() -> list[StepLoad]:
    return [(0.0, 0.0, float(b), float(b) * c) for b in np.geomspace(1, 1024, 60) for c in (300.0, 3000.0)]


def oracle_coef(loads: list[StepLoad], y: np.ndarray, role: Role, hinges: tuple[Hinge, ...] = ()) -> np.ndarray:
    """Non-negative least squares in relative error, by scipy: minimise sum(((x.c - y) / y)^2), c >= 0."""
    x = np.asarray([feature_row(role, load, hinges) for load in loads], dtype=float)
    scale = np.max(np.abs(x), axis=0)
    scale[scale == 0.0] = 1.0
    coef, _ = nnls(x / scale / y[:, None], np.ones(len(y)))
    return np.asarray(coef / scale)


def capped_error(loads: list[StepLoad], y: np.ndarray, role: Role, hinges: tuple[Hinge, ...]) -> float:
    x = np.asarray([feature_row(role, load, hinges) for load in loads], dtype=float)
    rel = np.abs(y - np.maximum(x @ oracle_coef(loads, y, role, hinges), 1e-9)) / y
    return float(np.mean(np.minimum(rel, 0.5)))


def oracle_hinges(loads: list[StepLoad], y: np.ndarray, role: Role) -> tuple[Hinge, ...]:
    """The documented selection: knots at the 20/40/60/80 % quantiles, greedy, a hinge kept only when it cuts
    the mean capped relative error by 15 %, at most two."""
    arr = np.asarray(loads, dtype=float)
    candidates: list[Hinge] = []
    for index in HINGE_VARIABLES[role]:
        values = arr[:, index][arr[:, index] > 0]
        candidates.extend((index, k) for k in sorted({float(np.quantile(values, q)) for q in QUANTILES}))
    chosen: tuple[Hinge, ...] = ()
    best = capped_error(loads, y, role, chosen)
    for _ in range(2):
        err, hinge = min((capped_error(loads, y, role, (*chosen, h)), h) for h in candidates if h not in chosen)
        if err > best * 0.85:
            break
        chosen, best = (*chosen, hinge), err
    return chosen


def curved(load: StepLoad) -> float:
    return 4.0 + 0.5 * float(np.sqrt(load[2])) + 2e-5 * load[3]


def test_fit_is_the_non_negative_least_squares_in_relative_error() -> None:
    loads = decode_loads()
    y = np.array([curved(load) for load in loads])
    fit = fit_step_time(Role.DECODE, loads, list(y), shape=False)
    assert fit.trimmed == 0
    assert fit.coef_ms == pytest.approx(tuple(oracle_coef(loads, y, Role.DECODE)), rel=1e-6, abs=1e-12)
    # an unweighted fit would serve the long steps: the floor's relative error shows the difference
    unweighted, _ = nnls(np.asarray([feature_row(Role.DECODE, load, ()) for load in loads]), y)
    assert abs(unweighted[0] - fit.coef_ms[0]) > 0.1


def test_fit_is_scale_free_also_for_integer_wall_times() -> None:
    loads = decode_loads()
    y = np.array([curved(load) for load in loads])
    fit = fit_step_time(Role.DECODE, loads, list(y))
    big = fit_step_time(Role.DECODE, loads, [round(v * 1e9) for v in y])
    assert big.hinges == fit.hinges
    assert big.coef_ms == pytest.approx(tuple(c * 1e9 for c in fit.coef_ms), rel=1e-6, abs=1e-3)
    assert big.mape == pytest.approx(fit.mape, rel=1e-3)


def test_aggregated_fit_on_decode_only_steps_leaves_the_prefill_columns_at_zero() -> None:
    loads = decode_loads()
    y = np.array([curved(load) for load in loads])
    fit = fit_step_time(Role.AGG, loads, list(y), shape=False)
    assert fit.columns == ("one", "prefill", "prefill_attn", "decode", "decode_kv")
    assert fit.coef_ms[1:3] == (0.0, 0.0)
    assert fit.coef_ms == pytest.approx(tuple(oracle_coef(loads, y, Role.AGG)), rel=1e-6, abs=1e-12)
    assert np.isfinite(fit.coef_ms).all() and fit.mape < 0.1


SHAPES = {
    "launch-bound floor": lambda load: max(10.0, 0.1 * load[2]) + 1e-5 * load[3],
    "attention bending at 300k KV tokens": lambda load: (
        5.0 + 0.02 * load[2] + 1e-5 * load[3] + 4e-4 * max(0.0, load[3] - 3e5)
    ),
    "linear": lambda load: 4.0 + 0.03 * load[2] + 2e-5 * load[3],
}


@pytest.mark.parametrize("name", list(SHAPES))
def test_hinges_are_those_the_documented_selection_keeps(name: str) -> None:
    loads = decode_loads()
    jitter = np.random.default_rng(5).lognormal(0.0, 0.02, len(loads))  # 2 % noise: no shape is exact
    y = np.array([SHAPES[name](load) for load in loads]) * jitter
    fit = fit_step_time(Role.DECODE, loads, list(y))
    expected = oracle_hinges(loads, y, Role.DECODE)
    assert [i for i, _ in fit.hinges] == [i for i, _ in expected]
    assert [k for _, k in fit.hinges] == pytest.approx([k for _, k in expected])
    assert len(fit.columns) == 3 + len(expected)
    if name == "linear":
        assert fit.hinges == ()
    else:
        assert fit.hinges and fit.mape < 0.04


def live_decode_model(timer: ProfileStepTimer) -> PerfModel:
    rng = np.random.default_rng(7)
    model = PerfModel(Role.DECODE, bootstrap=timer)
    model.observe_many(timed_samples(timer, synthetic_loads(Role.DECODE, 400, rng), rng), now=0.0)
    assert model.maybe_refit(now=0.0)
    assert model.source is ModelSource.LIVE
    return model


@pytest.mark.parametrize("load", [(512.0, 0.0, 0.0, 0.0), (2048.0, 1000.0, 16.0, 16.0 * 2000)])
def test_live_decode_model_prices_prefill_work_from_the_profile(
    h200_dir: Path, load: tuple[float, float, float, float]
) -> None:
    timer = ProfileStepTimer.from_dir(h200_dir)
    model = live_decode_model(timer)
    estimate = model.predict_step_ms(*load)
    assert estimate.value_ms == pytest.approx(timer.step_time_ms(*load), rel=1e-9)
    assert estimate.upper_ms == pytest.approx(estimate.value_ms * 1.1, rel=1e-9)


@pytest.mark.parametrize("role", list(Role))
@pytest.mark.parametrize(("batch", "kv"), [(0.0, 0.0), (1.0, 3000.0), (1.0, 0.0), (2.0, 500.0), (64.0, 64 * 3000.0)])
def test_itl_from_the_profile_is_the_decode_only_step(h200_dir: Path, role: Role, batch: float, kv: float) -> None:
    timer = ProfileStepTimer.from_dir(h200_dir)
    estimate = PerfModel(role, bootstrap=timer).predict_itl_ms(batch, kv)
    assert estimate.value_ms == pytest.approx(timer.step_time_ms(0.0, 0.0, max(batch, 1.0), kv), rel=1e-12)


def loop_ttft_ms(timer: ProfileStepTimer, isl: float, queued: float, chunk: float) -> float:
    return timer.ttft_overhead_ms + loop_steps_ms(lambda load: timer.step_time_ms(*load), isl, queued, chunk)


def loop_steps_ms(step: Callable[[StepLoad], float], isl: float, queued: float, chunk: float) -> float:
    """Every step by a plain loop: the queue's full chunks, then the request's, each own chunk reading the
    request's earlier chunks."""
    total = 0.0
    queue, done = queued, 0.0
    while done < isl:
        from_queue = min(queue, chunk)
        queue -= from_queue
        own = min(chunk - from_queue, isl - done)
        if own <= 0:
            total += step((from_queue, 0.0, 0.0, 0.0))
            continue
        if from_queue > 0:  # the chunk where the queue ends holds both
            total += step((from_queue + own, 0.0, 0.0, 0.0))
        else:
            total += step((own, done, 0.0, 0.0))
        done += own
    return total


@pytest.mark.parametrize("role", [Role.PREFILL, Role.AGG, Role.DECODE])
@pytest.mark.parametrize(("isl", "queued"), [(3000.0, 0.0), (9000.0, 0.0), (20_000.0, 0.0), (9000.0, 5000.0)])
def test_ttft_from_the_profile_is_every_chunk_step(h200_dir: Path, role: Role, isl: float, queued: float) -> None:
    timer = ProfileStepTimer.from_dir(h200_dir)
    estimate = PerfModel(role, bootstrap=timer).predict_ttft_ms(isl, queued, 2048)
    assert estimate.value_ms == pytest.approx(loop_ttft_ms(timer, isl, queued, 2048.0), rel=1e-9)


def test_prefill_model_at_one_load_level_names_the_prefill_tokens_gap() -> None:
    model = PerfModel(Role.PREFILL, config=PerfModelConfig(warmup_steps=0, min_samples=8))
    for counter in range(1, 41):
        load = ScheduledRequests(num_prefill_requests=1, sum_prefill_tokens=1000)
        sample = ForwardPassMetrics(
            worker_id="w", dp_rank=0, counter_id=counter, wall_time=0.05, scheduled_requests=load
        )
        model.observe(sample, now=float(counter))
    model.refit(now=50.0)
    assert model.status().not_ready_because == ("prefill_tokens spans 1 half-octave bins, need 4",)


def test_live_aggregated_prefill_capacity_follows_the_documented_queue(h200_dir: Path) -> None:
    model = live_agg_model(ProfileStepTimer.from_dir(h200_dir))
    isl, chunk = 2000.0, 8192
    # a prompt shorter than the chunk: its own prefill-only step, sharing the floor with the chunk's others
    alone = model.predict_ttft_ms(isl, 0.0, chunk).upper_ms
    floor_ms = model.predict_step_ms(1.0, 0.0, 0.0, 0.0).upper_ms
    service_ms = model.predict_step_ms(isl, 0.0, 0.0, 0.0).upper_ms - floor_ms + floor_ms * isl / chunk
    ttft_target_ms = alone + service_ms  # M/D/1: 2w / (S + 2w) = 2/3, under the 0.95 cap
    got = model.capacity(
        isl_tokens=isl,
        osl_tokens=200.0,
        ttft_target_ms=ttft_target_ms,
        itl_target_ms=30.0,
        max_num_batched_tokens=chunk,
    )
    wait_ms = ttft_target_ms - alone
    rho = min(0.95, 2.0 * wait_ms / (service_ms + 2.0 * wait_ms))
    assert rho == pytest.approx(2.0 / 3.0)
    assert got.prefill_rps == pytest.approx(rho / service_ms * 1000.0, rel=1e-12)


def live_agg_model(timer: ProfileStepTimer) -> PerfModel:
    rng = np.random.default_rng(11)
    model = PerfModel(Role.AGG, bootstrap=timer)
    model.observe_many(timed_samples(timer, synthetic_loads(Role.AGG, 1500, rng), rng), now=0.0)
    assert model.maybe_refit(now=0.0)
    assert model.source is ModelSource.LIVE
    return model


@pytest.mark.parametrize(("isl", "queued"), [(9000.0, 0.0), (20_000.0, 0.0), (9000.0, 5000.0)])
def test_live_aggregated_ttft_is_every_prefill_only_chunk_step(h200_dir: Path, isl: float, queued: float) -> None:
    model = live_agg_model(ProfileStepTimer.from_dir(h200_dir))
    fit = model.status().fit
    assert fit is not None and fit.coef_ms[fit.columns.index("decode")] > 0
    estimate = model.predict_ttft_ms(isl, queued, 2048)
    steps_ms = loop_steps_ms(fit.step_ms, isl, queued, 2048.0)
    assert estimate.value_ms == pytest.approx(model.ttft_overhead_ms + steps_ms, rel=1e-9)
    assert estimate.upper_ms == pytest.approx(model.ttft_overhead_ms + steps_ms * fit.band_ratio, rel=1e-9)

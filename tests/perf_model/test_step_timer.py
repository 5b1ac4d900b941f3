from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest

from perf_model.errors import InvalidLoadError
from perf_model.step_timer import ProfileStepTimer


def test_reproduces_the_measured_ttft_points(h200_timer: ProfileStepTimer) -> None:
    for point in h200_timer.profile.prefill:
        assert h200_timer.ttft_ms(point.isl_tokens, 1 << 20) == pytest.approx(point.ttft_ms, rel=1e-9)


def test_reproduces_the_measured_itl_points(h200_timer: ProfileStepTimer) -> None:
    # Exact, except where a measured ITL dips below a smaller batch's (made non-decreasing): never below.
    errors = []
    for d in h200_timer.profile.decode:
        got = h200_timer.step_time_ms(0, 0, d.decode_requests, d.decode_kv_tokens)
        assert got >= d.itl_ms - 1e-9
        errors.append((got - d.itl_ms) / d.itl_ms)
    assert max(errors) < 0.05
    assert sum(e < 1e-9 for e in errors) >= len(errors) - 2


def test_nothing_scheduled_takes_no_time(h200_timer: ProfileStepTimer) -> None:
    assert h200_timer.step_time_s(0, 0, 0, 0) == 0.0
    assert h200_timer.step_time_s(0, 5000, 0, 0) == 0.0


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_impossible_loads_raise(h200_timer: ProfileStepTimer, bad: float) -> None:
    for args in ((bad, 0, 1, 10), (1, bad, 1, 10), (1, 0, bad, 10), (1, 0, 1, bad)):
        with pytest.raises(InvalidLoadError):
            h200_timer.step_time_s(*args)
    with pytest.raises(ValueError):  # also a ValueError for callers that catch that
        h200_timer.step_time_s(bad, 0, 0, 0)


PREFILL_GRID = [0, 1, 50, 100, 700, 1117, 4000, 8192, 16372, 20000, 65536]
CONTEXT_GRID = [0, 100, 350, 1000, 2997, 7000, 13585, 30000]
BATCH_GRID = [0, 1, 2, 10, 40, 100, 256, 500, 800, 900, 1500, 4096]


def test_monotone_in_every_term_inside_and_outside_the_profile(h200_timer: ProfileStepTimer) -> None:
    t = h200_timer
    for ctx in CONTEXT_GRID:
        times = [t.step_time_ms(0, 0, b, b * ctx) for b in BATCH_GRID]
        assert times == sorted(times), f"decode not monotone in batch at context {ctx}: {times}"
    for b in BATCH_GRID[1:]:
        times = [t.step_time_ms(0, 0, b, b * ctx) for ctx in CONTEXT_GRID]
        assert times == sorted(times), f"decode not monotone in context at batch {b}: {times}"
    for kv in (0, 4096, 100_000):
        times = [t.step_time_ms(p, kv, 64, 64 * 2000) for p in PREFILL_GRID]
        assert times == sorted(times), f"mixed step not monotone in prefill tokens at kv {kv}"
    for p in (1, 512, 8192):
        times = [t.step_time_ms(p, kv, 0, 0) for kv in (0, 1000, 16_000, 200_000)]
        assert times == sorted(times)
        assert times[0] < times[-1]


def test_extrapolates_along_the_fitted_slope(h200_timer: ProfileStepTimer) -> None:
    t = h200_timer
    last = t.params.max_measured_isl_tokens
    at_edge = t.step_time_ms(last, 0, 0, 0)
    beyond = t.step_time_ms(2 * last, 0, 0, 0)
    # Linear + quadratic growth: more than double, at most four times (the quadratic bound), never flat.
    assert 2 * at_edge < beyond < 4 * at_edge
    b_max = t.params.max_measured_decode_requests
    edge = t.step_time_ms(0, 0, b_max, b_max * 350)
    far = t.step_time_ms(0, 0, 4 * b_max, 4 * b_max * 350)
    assert 2 * edge < far < 4 * edge
    assert all(math.isfinite(t.step_time_ms(1e7, 1e7, 1e6, 1e9)) for _ in range(1))


def test_chunked_prefill_pays_for_context(h200_timer: ProfileStepTimer) -> None:
    whole = h200_timer.ttft_ms(16000, 16384)
    chunked = h200_timer.ttft_ms(16000, 2048)
    # Eight chunks pay the step floor eight times and read earlier chunks; never cheaper than one step.
    assert chunked > whole
    assert h200_timer.ttft_ms(16000, 16384) == h200_timer.ttft_ms(16000, 1 << 20)


def test_mixed_step_costs_more_than_either_part(h200_timer: ProfileStepTimer) -> None:
    t = h200_timer
    mixed = t.step_time_ms(2048, 0, 128, 128 * 3000)
    assert mixed > t.step_time_ms(2048, 0, 0, 0)
    assert mixed > t.step_time_ms(0, 0, 128, 128 * 3000)
    assert mixed < t.step_time_ms(2048, 0, 0, 0) + t.step_time_ms(0, 0, 128, 128 * 3000)  # one shared floor


def test_any_profile_directory_calibrates_a_timer(tmp_path: Path, write_profile: Callable[..., Path]) -> None:
    root = write_profile(
        tmp_path / "toy",
        "isl_tokens,ttft_ms\n100,12\n1000,30\n4000,120\n",
        "kv_usage_fraction,context_length_tokens,itl_ms\n0.01,100,5\n0.1,100,8\n0.5,100,20\n0.1,1000,6\n0.8,1000,15\n",
        "max_kv_tokens = 10000",
    )
    timer = ProfileStepTimer.from_dir(root)
    assert timer.max_kv_tokens == 10000
    for point in timer.profile.prefill:
        assert timer.ttft_ms(point.isl_tokens, 8192) == pytest.approx(point.ttft_ms)
    for d in timer.profile.decode:
        assert timer.step_time_ms(0, 0, d.decode_requests, d.decode_kv_tokens) == pytest.approx(d.itl_ms)
    assert timer.params.base_ms > 0

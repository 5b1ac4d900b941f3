"""``ProfileStepTimer`` row by row against docs/perf_model.md: TTFT is every chunk's step plus the request-path
overhead (checked against a plain per-chunk loop), seconds are milliseconds / 1000, the prefill curve carries on
past the last measured ISL at the fitted linear + quadratic slope, a decode context below the lowest measured one
keeps that level's residual, equal decode batches keep the larger time, and ``params`` names the measured range.
Every timer is built inside its test (a profile fixture shared by the session would hide construction)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest

from perf_model.step_timer import ProfileStepTimer

DECODE_HEADER = "kv_usage_fraction,context_length_tokens,itl_ms,throughput_tokens_per_s_per_gpu\n"


def loop_ttft_ms(timer: ProfileStepTimer, isl: float, chunk: int) -> float:
    """The documented TTFT by a plain loop: overhead + one prefill-only step per chunk, each reading the
    request's earlier chunks."""
    total = timer.ttft_overhead_ms
    done = 0.0
    while done < isl:
        size = min(float(chunk), isl - done)
        total += timer.step_time_ms(size, done, 0.0, 0.0)
        done += size
    return total


@pytest.mark.parametrize(
    ("isl", "chunk"),
    [(0.5, 8192), (1.0, 8192), (2.0, 8192), (3000.0, 8192), (8192.0, 2048), (9000.0, 2048), (20_000.0, 4096)],
)
def test_ttft_is_overhead_plus_every_chunk_step(h200_dir: Path, isl: float, chunk: int) -> None:
    timer = ProfileStepTimer.from_dir(h200_dir)
    got = timer.ttft_ms(isl, chunk)
    assert got > timer.ttft_overhead_ms
    assert got == pytest.approx(loop_ttft_ms(timer, isl, chunk), rel=1e-9)


def test_ttft_of_an_empty_prompt_is_the_overhead_alone(h200_dir: Path) -> None:
    timer = ProfileStepTimer.from_dir(h200_dir)
    assert timer.ttft_ms(0.0, 8192) == timer.ttft_overhead_ms


@pytest.mark.parametrize("load", [(512.0, 0.0, 0.0, 0.0), (0.0, 0.0, 64.0, 64.0 * 3000), (2048.0, 4096.0, 32.0, 1e5)])
def test_step_time_s_is_step_time_ms_in_seconds(h200_dir: Path, load: tuple[float, float, float, float]) -> None:
    timer = ProfileStepTimer.from_dir(h200_dir)
    assert timer.step_time_s(*load) * 1000.0 == pytest.approx(timer.step_time_ms(*load), rel=1e-12)


@pytest.mark.parametrize("beyond", [1.0, 1000.0, 50_000.0])
def test_prefill_past_the_last_measured_isl_grows_at_the_fitted_slope(h200_dir: Path, beyond: float) -> None:
    timer = ProfileStepTimer.from_dir(h200_dir)
    last = timer.params.max_measured_isl_tokens
    p = last + beyond
    edge = timer.prefill_only_ms(last)
    a = timer.params.prefill_ms_per_token
    q = timer.params.attention_ms_per_token_pair / 2.0
    assert timer.prefill_only_ms(p) == pytest.approx(edge + a * (p - last) + q * (p * p - last * last), rel=1e-9)


def test_params_name_the_measured_range(h200_dir: Path) -> None:
    timer = ProfileStepTimer.from_dir(h200_dir)
    params = timer.params
    assert params.max_measured_isl_tokens == max(p.isl_tokens for p in timer.profile.prefill)
    assert params.max_measured_decode_requests == max(d.decode_requests for d in timer.profile.decode)
    assert params.max_measured_decode_kv_tokens == max(d.decode_kv_tokens for d in timer.profile.decode)


PREFILL = "isl_tokens,ttft_ms\n100,20\n1000,40\n4000,150\n"
# Two context lengths; B = throughput * ITL / 1000: ctx 1000 -> B 4, 16, 64; ctx 4000 -> B 2, 8, 32.
TWO_LEVELS = (
    DECODE_HEADER
    + "0.1,1000,10,400\n0.2,1000,12,1333.3333333333333\n0.5,1000,20,3200\n"
    + "0.1,4000,11,181.8181818181818\n0.2,4000,15,533.3333333333334\n0.5,4000,30,1066.6666666666667\n"
)


@pytest.mark.parametrize("ctx", [100.0, 500.0, 999.0])
def test_decode_below_the_lowest_context_keeps_its_residual(
    tmp_path: Path, write_profile: Callable[..., Path], ctx: float
) -> None:
    timer = ProfileStepTimer.from_dir(write_profile(tmp_path / "p", PREFILL, TWO_LEVELS))
    for point in (d for d in timer.profile.decode if d.context_length_tokens == 1000):
        b = point.decode_requests
        # the measured time at the lowest context, carried down by the fitted KV slope
        expected = point.itl_ms + timer.dec_k_ms * b * (ctx - 1000.0)
        assert timer.decode_only_ms(b, b * ctx) == pytest.approx(max(timer.base_ms, expected), rel=1e-9)


def test_decode_at_a_measured_point_is_the_measured_time(tmp_path: Path, write_profile: Callable[..., Path]) -> None:
    timer = ProfileStepTimer.from_dir(write_profile(tmp_path / "p", PREFILL, TWO_LEVELS))
    for point in timer.profile.decode:
        got = timer.decode_only_ms(point.decode_requests, point.decode_kv_tokens)
        assert got == pytest.approx(point.itl_ms, rel=1e-9)


def test_equal_decode_batches_keep_the_larger_time(tmp_path: Path, write_profile: Callable[..., Path]) -> None:
    # ctx 1000: B = 20 * 4000 / 1000 = 80 and B = 25 * 3200 / 1000 = 80: one batch measured twice.
    decode = DECODE_HEADER + "0.1,1000,10,400\n0.5,1000,20,4000\n0.5,1000,25,3200\n0.9,1000,40,4000\n"
    timer = ProfileStepTimer.from_dir(write_profile(tmp_path / "p", PREFILL, decode))
    batches = [d.decode_requests for d in timer.profile.decode]
    assert batches.count(80.0) == 2
    assert timer.decode_only_ms(80.0, 80.0 * 1000) == pytest.approx(25.0, rel=1e-9)
    assert math.isfinite(timer.step_time_ms(0.0, 0.0, 80.0, 80.0 * 1000))

"""An aggregated engine's latency (planner.core.agg_latency) on the rows the older tests left open: which limit a
saturated engine names (the smallest; a tie names the sequence limit; at the limit is not past it), what the
per-request tail is handed (no chunk steps without arrivals; one-chunk prompts; a longer tail prompt's chunk
steps and TTFT). The measured H200 profile times the steps. Written for the mutants docs/mutation-results.md
listed as surviving in agg_latency.py."""

from __future__ import annotations

import math

import pytest

from perf_model.model import PerfModel
from perf_model.step_timer import ProfileStepTimer
from planner.core.agg_latency import AggLatency, predict_agg_latency
from planner.discovery import Role
from tests.core.fleetkit import H200_PROFILE


@pytest.fixture(scope="module")
def model() -> PerfModel:
    return PerfModel(Role.AGG, bootstrap=ProfileStepTimer.from_dir(H200_PROFILE))


def agg(model: PerfModel, **over: float | None) -> AggLatency:
    kwargs: dict[str, float | None] = {
        "rate_per_s": 2.0,
        "isl_tokens": 2000.0,
        "osl_tokens": 100.0,
        "kv_per_request_tokens": 2050.0,
        "max_num_batched_tokens": 2048,
        "max_num_seqs": 256.0,
        "kv_capacity_tokens": 945_029.0,
        **over,
    }
    return predict_agg_latency(model, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("case", "over", "limit"),
    [
        ("the sequence limit is the smallest", {"max_num_seqs": 16.0, "decode_requests": 17.0}, "max_num_seqs"),
        ("one sequence", {"max_num_seqs": 1.0, "decode_requests": 2.0}, "max_num_seqs"),
        (
            "the token budget is the smallest",
            {"max_num_batched_tokens": 17, "max_num_seqs": 18.0, "decode_requests": 17.0},
            "token budget",
        ),
        (
            "a tie between the budget and the sequences",
            {"max_num_batched_tokens": 17, "max_num_seqs": 16.0, "decode_requests": 17.0},
            "max_num_seqs",
        ),
        (
            "the KV capacity is the smallest",
            {"kv_capacity_tokens": 20_500.0, "decode_requests": 11.0},
            "KV capacity",
        ),
        (
            "requests holding no KV leave the KV capacity out",
            {"kv_per_request_tokens": 0.0, "max_num_seqs": 16.0, "decode_requests": 17.0},
            "max_num_seqs",
        ),
    ],
)
def test_an_observed_batch_past_a_limit_saturates_the_engine_and_names_the_smallest(
    model: PerfModel, case: str, over: dict[str, float], limit: str
) -> None:
    out = agg(model, rate_per_s=0.0, **over)
    assert (out.saturated, out.itl_ms, out.ttft_ms) == (limit, math.inf, math.inf), case


def test_an_observed_batch_at_the_limit_is_not_past_it(model: PerfModel) -> None:
    out = agg(model, rate_per_s=0.0, max_num_seqs=16.0, decode_requests=16.0)
    assert out.saturated == ""
    assert math.isfinite(out.itl_ms)
    assert out.decode_batch == 16.0


def test_without_arrivals_the_tail_sees_no_chunk_steps(model: PerfModel) -> None:
    out = agg(model, rate_per_s=0.0, decode_requests=8.0)
    assert out.saturated == ""
    assert (out.chunk_step_ms, out.last_chunk_step_ms) == (0.0, 0.0)
    assert out.decode_step_ms > 0.0


def test_a_prompt_of_one_chunk_hands_the_tail_that_chunk_step(model: PerfModel) -> None:
    out = agg(model, isl_tokens=1000.0, kv_per_request_tokens=1050.0)
    assert out.saturated == ""
    assert out.prompt_chunk_steps == 1
    assert out.chunk_step_ms == out.last_chunk_step_ms
    assert out.chunk_step_ms > out.decode_step_ms > 0.0


def test_a_longer_tail_prompt_has_longer_chunk_steps_and_a_longer_ttft(model: PerfModel) -> None:
    mean = agg(model)
    tail = agg(model, tail_isl_tokens=16_000.0, ttft_isl_tokens=16_000.0)
    # the mean prompt's own figures do not change
    assert (tail.itl_ms, tail.ttft_ms, tail.prompt_chunk_steps) == (mean.itl_ms, mean.ttft_ms, mean.prompt_chunk_steps)
    # its later chunks attend to more of the prompt: a longer mean and last chunk step
    assert tail.chunk_step_ms > mean.chunk_step_ms
    assert tail.last_chunk_step_ms > mean.last_chunk_step_ms
    assert tail.ttft_tail_ms > mean.ttft_tail_ms == mean.ttft_ms
    # an unknown tail length is the mean prompt's
    unknown = agg(model, tail_isl_tokens=math.inf)
    assert (unknown.chunk_step_ms, unknown.last_chunk_step_ms) == (mean.chunk_step_ms, mean.last_chunk_step_ms)

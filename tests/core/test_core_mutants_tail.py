"""The per-request tail model (planner.core.tail) at its edges: the OSL points a request mix is averaged over, the
share of requests that miss the ITL limit (against the Poisson counts it is defined by, worked by hand or summed
here exactly), and the prompt length the TTFT check is made for. Each row pins an outcome the SLA search sizes a
fleet with; they were written for the mutants docs/mutation-results.md listed as surviving in tail.py."""

from __future__ import annotations

import math

import pytest

from planner.core.tail import OSL_POINTS, TAIL_PREFILL_SHARE, itl_miss_frac, osl_points, ttft_tail_isl


def poisson_more_than(k: int, mean: float) -> float:
    """P(N > k), N ~ Poisson(mean), summed exactly in log space (the reference the model is checked against)."""
    below = sum(math.exp(-mean + j * math.log(mean) - math.lgamma(j + 1)) for j in range(k + 1))
    return 1.0 - below


# An engine whose decode-only step takes 20 ms and whose chunked-prefill step takes 100 ms; a 60 ms ITL limit is
# met by a request that decodes through one chunk step per two intervals ((100 + 20) / 2 = 60 ms, exactly).
DECODE_MS, CHUNK_MS = 20.0, 100.0


def miss(osl: tuple[float, ...], **over: float | None) -> float:
    kwargs: dict[str, float | None] = {
        "prompts_per_s": 10.0,
        "chunk_steps_per_prompt": 1.0,
        "chunk_step_ms": CHUNK_MS,
        "decode_step_ms": DECODE_MS,
        "itl_ms": DECODE_MS,
        "ttft_ms": 0.0,
        "limit_ms": 50.0,
        **over,
    }
    return itl_miss_frac(osl=osl, **kwargs)  # type: ignore[arg-type]


# --- osl_points ---------------------------------------------------------------------------------------------------


def test_a_spread_of_output_lengths_gives_equal_probability_points_centred_on_the_median() -> None:
    points = osl_points(150.0, p50=100.0, p90=400.0)
    assert len(points) == OSL_POINTS
    assert list(points) == sorted(points)  # shortest first
    # the two middle points sit symmetrically (in log) about the median
    assert math.sqrt(points[OSL_POINTS // 2 - 1] * points[OSL_POINTS // 2]) == pytest.approx(100.0)
    # 14 of the 16 equal-probability points lie below the 90th percentile, 2 above it
    assert sum(p > 400.0 for p in points) == 2


def test_the_p99_caps_the_longest_points_and_a_p99_equal_to_the_p90_is_still_a_cap() -> None:
    assert max(osl_points(150.0, p50=100.0, p90=400.0)) > 500.0
    assert max(osl_points(150.0, p50=100.0, p90=400.0, p99=500.0)) == 500.0
    assert max(osl_points(150.0, p50=100.0, p90=400.0, p99=400.0)) == 400.0
    # a p99 below the p90 is inconsistent and ignored
    assert max(osl_points(150.0, p50=100.0, p90=400.0, p99=300.0)) > 500.0


def test_a_one_token_median_still_spreads_and_no_point_is_shorter_than_one_token() -> None:
    points = osl_points(2.0, p50=1.0, p90=3.0)
    assert len(points) == OSL_POINTS
    assert min(points) == 1.0
    assert max(points) > 3.0


def test_without_a_spread_the_median_else_the_mean_is_the_one_length() -> None:
    assert osl_points(150.0, p50=100.0, p90=100.0) == (100.0,)  # no spread: one point, not 16 equal ones
    assert osl_points(150.0, p50=100.0) == (100.0,)
    assert osl_points(150.0, p50=1.0) == (1.0,)
    assert osl_points(150.0, p50=0.5) == (150.0,)  # a sub-token median is no median
    assert osl_points(150.0) == (150.0,)
    assert osl_points(0.4) == (1.0,)  # never shorter than one token
    assert osl_points(None) == ()
    assert osl_points(math.inf) == ()
    assert osl_points(math.nan) == ()


# --- itl_miss_frac ------------------------------------------------------------------------------------------------


def test_no_output_lengths_no_miss_and_non_finite_timings_are_a_certain_miss() -> None:
    assert miss(()) == 0.0
    assert miss((100.0,), chunk_step_ms=math.nan) == 1.0
    assert miss((100.0,), ttft_ms=math.inf) == 1.0
    assert miss((100.0,), decode_step_ms=60.0) == 1.0  # a decode step alone over the limit


def test_a_two_token_request_misses_when_a_prompt_arrives_during_its_one_interval() -> None:
    # one interval of 20 ms at 10 prompts/s: a prompt arrives in it with probability 1 - e^-0.2, and its 100 ms
    # chunk step makes that interval's ITL 100 ms > 50 ms; the last chunk step defaults to the chunk step
    assert miss((2.0,)) == pytest.approx(1.0 - math.exp(-0.2), rel=1e-12)
    assert miss((2.0,), last_chunk_step_ms=None) == miss((2.0,), last_chunk_step_ms=CHUNK_MS)
    # a prompt arriving during its TTFT is prefilled while it decodes: 30 ms of TTFT makes the span 50 ms
    assert miss((2.0,), ttft_ms=30.0) == pytest.approx(1.0 - math.exp(-0.5), rel=1e-12)
    assert miss((1.0,)) == 0.0  # one output token: no interval, no ITL to miss


def test_a_request_whose_mean_itl_equals_the_limit_does_not_miss_it() -> None:
    # three tokens, two intervals, a 60 ms limit: it decodes through one chunk step ((100 + 20) / 2 = 60 ms) and
    # misses only when two or more prompts arrive during its 40 ms
    assert miss((3.0,), limit_ms=60.0) == pytest.approx(poisson_more_than(1, 0.4), rel=1e-12)


def test_a_decode_step_at_the_limit_is_not_a_miss_by_itself() -> None:
    assert miss((2.0,), decode_step_ms=50.0, itl_ms=50.0) == pytest.approx(1.0 - math.exp(-0.5), rel=1e-12)


def test_no_miss_when_no_chunk_step_exceeds_the_limit_or_no_prompt_arrives() -> None:
    assert miss((2.0,), chunk_step_ms=50.0) == 0.0  # a chunk step at the limit
    assert miss((2.0,), prompts_per_s=0.0) == 0.0
    assert miss((2.0,), chunk_steps_per_prompt=0.0) == 0.0
    # nothing takes any time, so nothing arrives meanwhile
    assert miss((2.0,), decode_step_ms=0.0, itl_ms=0.0) == 0.0


def test_a_request_covering_every_chunk_of_a_prompt_sees_their_mean_step() -> None:
    # chunk steps average 50 ms (the limit) but the last one takes 100 ms: a request with two intervals and
    # prompts of two chunks sees the mean (no miss); one with a single interval may see only the last step
    long_only = miss((3.0,), chunk_step_ms=50.0, last_chunk_step_ms=100.0, chunk_steps_per_prompt=2.0)
    short_only = miss((2.0,), chunk_step_ms=50.0, last_chunk_step_ms=100.0, chunk_steps_per_prompt=2.0)
    assert long_only == 0.0
    assert short_only == pytest.approx(1.0 - math.exp(-0.2), rel=1e-12)
    # the share of the mix is the mean over its points, whatever their order
    both = (3.0, 2.0)
    mixed = miss(both, chunk_step_ms=50.0, last_chunk_step_ms=100.0, chunk_steps_per_prompt=2.0)
    assert mixed == pytest.approx(short_only / 2.0, rel=1e-12)
    assert mixed == miss(both[::-1], chunk_step_ms=50.0, last_chunk_step_ms=100.0, chunk_steps_per_prompt=2.0)


def test_long_requests_use_the_exact_poisson_tail_up_to_200_prompts_and_a_close_normal_one_past_it() -> None:
    # 401 tokens, 400 intervals of 25 ms at 20 prompts/s: 200 prompts expected, 200 tolerated (60 ms limit)
    exact = miss((401.0,), prompts_per_s=20.0, itl_ms=25.0, limit_ms=60.0)
    assert exact == pytest.approx(poisson_more_than(200, 200.0), rel=1e-9)
    # 2001 tokens: 1000 expected, 1000 tolerated; the normal approximation is within 0.005 of the exact tail
    approx = miss((2001.0,), prompts_per_s=20.0, itl_ms=25.0, limit_ms=60.0)
    assert approx == pytest.approx(poisson_more_than(1000, 1000.0), abs=0.005)
    lighter = miss((2001.0,), prompts_per_s=19.6, itl_ms=25.0, limit_ms=60.0)
    assert lighter == pytest.approx(poisson_more_than(1000, 980.0), abs=0.005)


# --- ttft_tail_isl ------------------------------------------------------------------------------------------------


def test_the_ttft_check_takes_the_p99_prompt_when_its_prefill_is_at_most_half_the_limit() -> None:
    def prefill_ms(tokens: float) -> float:
        return tokens / 10.0  # 10 tokens per ms

    limit_ms = 2000.0
    at_share = TAIL_PREFILL_SHARE * limit_ms * 10.0  # 10,000 tokens: exactly half the limit
    assert ttft_tail_isl(3000.0, 8000.0, at_share, prefill_ms, limit_ms) == at_share
    assert ttft_tail_isl(3000.0, 8000.0, at_share + 10.0, prefill_ms, limit_ms) == 8000.0  # falls back to the p90
    assert ttft_tail_isl(3000.0, 2000.0, 2500.0, prefill_ms, limit_ms) == 3000.0  # neither is longer
    assert ttft_tail_isl(3000.0, None, None, prefill_ms, limit_ms) == 3000.0

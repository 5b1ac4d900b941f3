"""Rows for planner/core/observed_batch.py's survivors (docs/testing.md, mutation testing): the batch the engines
demonstrably run, the output demand it rests on, and the window's figures as a call at another rate sees them.
Each row states a documented result a decision relies on; each fails on the mutant it was written for."""

from __future__ import annotations

import math

import msgspec
import pytest

from planner.core import RoleLoad, Traffic
from planner.core.observed_batch import (
    DEMAND_WINDOW_S,
    RATE_NOISE_SD,
    OutputDemand,
    at_rate,
    demonstrated_batch,
    update_demand,
)

# two engines at 2 req/s of 100-token outputs, 10 ms median ITL, 20 requests in a 10 s window, every one met:
# Little's law gives 1 x 100 x 0.010 = 1.0 sequence per engine
LIGHT = Traffic(
    request_rate_per_s=2.0,
    osl_tokens=100.0,
    itl_ms_p50=10.0,
    ttft_attainment_frac=1.0,
    itl_attainment_frac=1.0,
    ttft_samples_in_window=20,
    itl_samples_in_window=20,
    requests_in_window=20,
    window_s=10.0,
)
IDLE = RoleLoad()
WINDOW_MARGIN = 1.0 + RATE_NOISE_SD / math.sqrt(20.0)


def test_a_call_past_the_windows_noise_sees_no_attainment_at_all() -> None:
    """Past the window's rate plus its counting noise the engines were not seen: every attainment figure and the
    counts they rest on are dropped (TTFT's too, not only ITL's), and the rate is the one asked."""
    past = at_rate(LIGHT, 10.0)
    assert past.request_rate_per_s == 10.0
    dropped = (
        past.ttft_attainment_frac,
        past.itl_attainment_frac,
        past.ttft_samples_in_window,
        past.itl_samples_in_window,
    )
    assert dropped == (None, None, None, None)
    assert (past.osl_tokens, past.itl_ms_p50, past.requests_in_window) == (100.0, 10.0, 20)
    # so no batch is demonstrated at that rate, whichever figures the role is judged on
    assert demonstrated_batch(past, IDLE, 2, 256.0, 0.99, 1) is None
    assert demonstrated_batch(past, IDLE, 2, 256.0, 0.99, 1, judge_ttft=False) is None


def test_one_request_in_the_window_keeps_its_figures_within_its_wide_margin() -> None:
    """One request counted: 3 sd of a Poisson count of 1 is 3, so a call up to 4x the window's rate keeps what
    was seen, and past it drops it."""
    single = msgspec.structs.replace(LIGHT, request_rate_per_s=0.1, requests_in_window=1)
    within = at_rate(single, 0.39)
    assert (within.itl_attainment_frac, within.itl_samples_in_window) == (1.0, 20)
    assert (within.ttft_attainment_frac, within.ttft_samples_in_window) == (1.0, 20)
    assert at_rate(single, 0.41).itl_attainment_frac is None


def test_an_engine_that_runs_one_sequence_at_a_time_demonstrates_its_batch_of_one() -> None:
    """max_num_seqs 1: two engines each running one sequence, the window's Little's law 1.0 x its margin within
    one, so the batch the engines run (1) is demonstrated."""
    low = msgspec.structs.replace(LIGHT, request_rate_per_s=1.0)  # 0.5 x 100 x 0.010 = 0.5 per engine
    running = RoleLoad(decode_requests=2)
    assert demonstrated_batch(low, running, 2, 1.0, 0.99, 20) == 1.0
    assert 0.5 * WINDOW_MARGIN <= 1.0  # the margin's part fits too


def test_exactly_min_samples_requests_or_judged_samples_are_enough() -> None:
    assert demonstrated_batch(LIGHT, IDLE, 2, 256.0, 0.99, 20) == pytest.approx(WINDOW_MARGIN)
    # the window's requests at exactly min_samples, its judged samples above
    more_samples = msgspec.structs.replace(LIGHT, ttft_samples_in_window=25, itl_samples_in_window=25)
    assert demonstrated_batch(more_samples, IDLE, 2, 256.0, 0.99, 20) == pytest.approx(WINDOW_MARGIN)
    # the judged samples at exactly min_samples, the window's requests above (a wider count, a narrower margin)
    more_requests = msgspec.structs.replace(LIGHT, requests_in_window=25)
    assert demonstrated_batch(more_requests, IDLE, 2, 256.0, 0.99, 20) == pytest.approx(
        1.0 + RATE_NOISE_SD / math.sqrt(25.0)
    )


def test_a_window_with_no_count_is_not_evidence() -> None:
    """No request count, or an attainment with no sample count: nothing to rest on, even at min_samples 1."""
    uncounted = msgspec.structs.replace(LIGHT, requests_in_window=None)
    assert demonstrated_batch(uncounted, IDLE, 2, 256.0, 0.99, 1) is None
    unsampled = msgspec.structs.replace(LIGHT, itl_samples_in_window=None)
    assert demonstrated_batch(unsampled, IDLE, 2, 256.0, 0.99, 1, judge_ttft=False) is None
    assert demonstrated_batch(LIGHT, IDLE, 2, 256.0, 0.99, 1, judge_ttft=False) == pytest.approx(WINDOW_MARGIN)


def test_a_small_demand_still_takes_the_margin_off_the_window() -> None:
    """A demand of half a token a second (a fleet seeing a request every few minutes) is a demand: the window
    counts at its own figures (1.0), the demand's Little's law far below it, and no window margin."""
    demand = OutputDemand(tokens_per_s=0.5, requests_per_s=0.005, span_s=DEMAND_WINDOW_S, at=0.0)
    assert demonstrated_batch(LIGHT, IDLE, 2, 256.0, 0.99, 20, demand=demand) == pytest.approx(1.0)


def test_a_zero_time_constant_keeps_no_demand_and_a_short_one_does() -> None:
    assert update_demand(None, LIGHT, 0.0, window_s=0.0) is None
    kept = OutputDemand(tokens_per_s=100.0, requests_per_s=1.0, span_s=30.0, at=0.0)
    assert update_demand(kept, LIGHT, 5.0, window_s=0.0) is kept
    short = update_demand(None, LIGHT, 0.0, window_s=1.0)
    assert short == OutputDemand(tokens_per_s=200.0, requests_per_s=2.0, span_s=1.0, at=0.0)


def test_a_window_of_unknown_span_adds_no_span() -> None:
    first = update_demand(None, msgspec.structs.replace(LIGHT, window_s=None), 0.0)
    assert first == OutputDemand(tokens_per_s=200.0, requests_per_s=2.0, span_s=0.0, at=0.0)


def test_the_demand_weighs_a_window_by_the_time_since_the_last_one() -> None:
    """Fed at 100 s and again at 105 s: the second window weighs 1 - exp(-5 / 60), whatever the clock reads;
    fed twice at the same instant, the second weighs nothing."""
    first = update_demand(None, LIGHT, 100.0)
    assert first is not None
    doubled = msgspec.structs.replace(LIGHT, request_rate_per_s=4.0)
    second = update_demand(first, doubled, 105.0)
    weight = -math.expm1(-5.0 / DEMAND_WINDOW_S)
    assert second is not None
    assert second.tokens_per_s == pytest.approx(200.0 + weight * 200.0)
    assert second.requests_per_s == pytest.approx(2.0 + weight * 2.0)
    assert (second.span_s, second.at) == (15.0, 105.0)
    again = update_demand(first, doubled, 100.0)
    assert again == OutputDemand(tokens_per_s=200.0, requests_per_s=2.0, span_s=10.0, at=100.0)

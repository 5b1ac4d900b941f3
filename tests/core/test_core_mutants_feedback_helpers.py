"""Rows for two of planner/core/feedback.py's pure helpers (docs/testing.md, mutation testing), against their
docstrings: ``_share_arrived_before`` (a lower bound on the share of the window's requests older than an age, from
the TTFT percentiles: 0.5 past the p50, 0.1 past the p90, 0.01 past the p99) and ``_backlog_drains_in_s`` (when the
prefill queue is gone at the rate it fell since the last update; None when it did not fall, or a figure is not
known), and ``_window_spread_tokens`` (how far the p90 prompt plus the p90 output reach past the mean work, each
p90 falling back to its mean). Each fails on the mutant it was written for."""

from __future__ import annotations

import math

import pytest

from planner.core import Traffic
from planner.core.feedback import FeedbackState, _backlog_drains_in_s, _share_arrived_before, _window_spread_tokens


def test_the_share_older_than_an_age_is_read_from_the_first_percentile_past_it() -> None:
    ttft = Traffic(ttft_ms_p50=700.0, ttft_ms_p90=1500.0, ttft_ms_p99=4000.0)
    assert _share_arrived_before(ttft, 0.5) == 0.5  # 500 ms: past the p50's 700 ms
    assert _share_arrived_before(ttft, 1.0) == 0.1  # 1000 ms: only the p90 is past it
    assert _share_arrived_before(ttft, 3.0) == 0.01
    assert _share_arrived_before(ttft, 4.0) == 0.0  # exactly the p99: none is known older
    assert _share_arrived_before(ttft, -5.0) == 0.5  # a negative age is 0
    assert _share_arrived_before(Traffic(ttft_ms_p50=1000.5), 1.0) == 0.5  # seconds to milliseconds exactly


def state(queued_tokens: float, last_at: float | None) -> FeedbackState:
    return FeedbackState(queued_prefill_tokens=queued_tokens, last_at=last_at)


def test_the_queue_drains_at_the_rate_it_fell_since_the_last_update() -> None:
    assert _backlog_drains_in_s(state(100.0, 99.5), 50.0, 100.0, 0.5) == pytest.approx(0.5)  # 100 tokens/s
    assert _backlog_drains_in_s(state(100.0, 99.0), 99.5, 100.0, 1.0) == pytest.approx(199.0)  # 0.5 token/s


def test_no_drain_time_without_a_fall_or_a_figure() -> None:
    assert _backlog_drains_in_s(state(100.0, None), 50.0, 100.0, 1.0) is None  # no last update
    assert _backlog_drains_in_s(state(100.0, 99.0), 50.0, 100.0, 0.0) is None  # no time passed
    assert _backlog_drains_in_s(state(math.inf, 99.0), 50.0, 100.0, 1.0) is None
    assert _backlog_drains_in_s(state(100.0, 99.0), 100.0, 100.0, 1.0) is None  # no fall


def test_the_spread_is_the_p90_request_past_the_mean_work_each_p90_falling_back_to_its_mean() -> None:
    assert _window_spread_tokens(Traffic(isl_tokens=1000.0, osl_tokens=100.0), 500.0) == 600.0  # both means
    assert _window_spread_tokens(Traffic(isl_tokens_p90=2000.0, osl_tokens=100.0), 1000.0) == 1100.0
    assert _window_spread_tokens(Traffic(osl_tokens_p90=500.0), 100.0) == 400.0  # no prompt figure adds nothing
    assert _window_spread_tokens(Traffic(isl_tokens_p90=500.0), 100.0) == 400.0  # no output figure adds nothing
    assert _window_spread_tokens(Traffic(isl_tokens_p90=500.0, osl_tokens_p90=0.0), 100.0) == 400.0
    assert _window_spread_tokens(Traffic(isl_tokens_p90=50.0), 100.0) == 0.0  # never below 0

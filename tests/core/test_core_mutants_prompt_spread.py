"""The prompts' spread (planner.core.prompt_spread) at its edges: which windows give a spread, and how the EWMA
moves with the time between windows (none between two windows at the same instant, a one-second time constant
still averaging). Written for the mutants docs/mutation-results.md listed as surviving in prompt_spread.py."""

from __future__ import annotations

import math

import pytest

from planner.core import Traffic
from planner.core.prompt_spread import update_log_var, window_log_var

Z90 = 1.2815515655446004  # the standard normal's 90th percentile


def spread(p50: float | None, p90: float | None) -> Traffic:
    return Traffic(request_rate_per_s=5.0, isl_tokens=1000.0, isl_tokens_p50=p50, isl_tokens_p90=p90)


def test_a_window_needs_both_a_median_and_a_p90_and_a_positive_median() -> None:
    assert window_log_var(spread(1000.0, None)) is None
    assert window_log_var(spread(None, 4000.0)) is None
    assert window_log_var(spread(-5.0, 4000.0)) is None
    assert window_log_var(spread(1000.0, 500.0)) is None  # a p90 below the median is no shape
    # a one-token median is a median: prompts of 1 and 2 tokens spread like any others
    assert window_log_var(spread(1.0, 2.0)) == pytest.approx((math.log(2.0) / Z90) ** 2, rel=1e-12)


def test_the_first_window_sets_the_spread_even_when_an_older_one_has_no_time() -> None:
    sample = window_log_var(spread(1000.0, 2000.0))
    assert sample is not None
    assert update_log_var(None, None, spread(1000.0, 2000.0), 50.0, 120.0) == (sample, 50.0)
    # a spread kept without the time it was fed (state written before that was kept) is replaced, not aged
    assert update_log_var(0.5, None, spread(1000.0, 2000.0), 50.0, 120.0) == (sample, 50.0)


def test_a_second_window_at_the_same_instant_does_not_move_the_spread() -> None:
    assert update_log_var(0.5, 50.0, spread(1000.0, 8000.0), 50.0, 120.0) == (0.5, 50.0)
    # nor one stamped before the last (a clock that stepped back)
    assert update_log_var(0.5, 50.0, spread(1000.0, 8000.0), 40.0, 120.0) == (0.5, 40.0)


def test_a_one_second_time_constant_still_averages() -> None:
    sample = window_log_var(spread(1000.0, 2000.0))
    assert sample is not None
    value, at = update_log_var(0.5, 50.0, spread(1000.0, 2000.0), 50.5, 1.0)
    weight = 1.0 - math.exp(-0.5)
    assert (value, at) == (pytest.approx(0.5 + weight * (sample - 0.5), rel=1e-12), 50.5)

"""Rows for planner/core/forecast.py's survivors (docs/testing.md, mutation testing): the checked and damped floors
keep the load's count + 1 (the floor's granularity) and no more, the derived capacity is not decayed at the tick it
was derived, the rise cap counts the rise from the latest rate a horizon old, the trend's gain sums every predicted
rise that fell due, a numerically lost filter restarts from the observation and keeps what is not the filters',
the two-window counting-noise test's floor of one request, and which earlier rate a rise is measured from. Each
fails on the mutant it was written for."""

from __future__ import annotations

import math

import pytest

from planner.core import ForecastConfig
from planner.core.forecast import (
    ForecastState,
    beyond_counting_noise,
    checked_floor,
    damped_floor,
    derived_capacity,
    rise_beyond_noise,
    rise_capped_rate,
    trend_gain,
    update_forecast,
)

CONFIG = ForecastConfig()  # Holt, 60 s ahead, 600 s of history


def steady_at(rate_per_s: float, history: tuple[tuple[float, float], ...]) -> ForecastState:
    """Holt at ``rate_per_s`` with no trend (its forecast is the rate), over ``history``."""
    return ForecastState(history=history, last_at=history[-1][0], holt_level=rate_per_s)


def test_a_checked_floor_keeps_the_loads_count_plus_one_not_more() -> None:
    """The trend checked asks 10 req/s = 1 replica of 10 req/s: the floor of 5 over a load of 2 is remembered as 3."""
    assert checked_floor(steady_at(10.0, ((0.0, 10.0),)), CONFIG, 5, 2, 10.0) == 3


def test_a_damped_floor_two_above_the_load_comes_down_to_the_loads_count_plus_one() -> None:
    """Off the history's high (20 then 10 req/s), Holt at 10 req/s needs one replica of 10: a floor of 4 over a load
    of 2 is damped to 3."""
    damped = damped_floor(steady_at(10.0, ((0.0, 20.0), (10.0, 10.0))), CONFIG, 4, 2, 10.0)
    assert damped is not None
    assert damped[0] == 3


def test_a_capacity_derived_at_this_tick_is_not_decayed_at_it() -> None:
    """A second derivation at the tick the capacity was derived at (a lower rate per replica) keeps it whole."""
    state = ForecastState(capacity_rps=10.0, capacity_at=100.0)
    kept_state, capacity = derived_capacity(state, 5.0, 1, 100.0, CONFIG)
    assert capacity == 10.0
    assert kept_state is state
    # a minute later it has decayed by exp(-60 / 600)
    _, later = derived_capacity(state, 5.0, 1, 160.0, CONFIG)
    assert later == pytest.approx(10.0 * math.exp(-0.1))


def test_the_rise_cap_counts_the_rise_from_the_latest_rate_a_horizon_old() -> None:
    """At 90 s the latest entry at least 60 s old is 30 s's 20 req/s (not 0 s's 10): the cap is 40 + 20 = 60."""
    state = steady_at(40.0, ((0.0, 10.0), (30.0, 20.0), (60.0, 30.0), (90.0, 40.0)))
    capped, note = rise_capped_rate(state, CONFIG, 100.0)
    assert capped == 60.0
    assert "plus its rise 20.00" in note


def test_the_trend_gain_sums_every_predicted_rise_that_fell_due() -> None:
    """6 req/s predicted (3 came) before, then a rise of 4 falls due and 2 of it come: the gain is the decayed
    sums' ratio, (3 d + 2) / (6 d + 4), not the last rise's alone."""
    state = ForecastState(
        history=((0.0, 10.0),),
        last_at=0.0,
        holt_level=10.0,
        kalman_level=10.0,
        pending_rises=((5.0, 10.0, 4.0),),
        rise_predicted=6.0,
        rise_realized=3.0,
    )
    new = update_forecast(state, 12.0, 10.0, CONFIG)
    decay = math.exp(-10.0 / 600.0)
    assert new.rise_predicted == pytest.approx(6.0 * decay + 4.0)
    assert new.rise_realized == pytest.approx(3.0 * decay + 2.0)
    assert trend_gain(new) == pytest.approx((3.0 * decay + 2.0) / (6.0 * decay + 4.0))


def test_a_numerically_lost_filter_restarts_from_the_observation_and_keeps_the_rest() -> None:
    """A rate of 1e200 overflows the Kalman covariance: both filters restart at it, at this tick, and the derived
    capacity and the hold's anchor (not the filters') are kept; a later observation at the same tick is ignored."""
    state = update_forecast(ForecastState(capacity_rps=5.0, capacity_at=0.0, held_count=3), 1.0, 0.0, CONFIG)
    lost = update_forecast(state, 1e200, 10.0, CONFIG)
    assert (lost.holt_level, lost.holt_trend_per_s, lost.kalman_level, lost.kalman_slope_per_s) == (
        1e200,
        0.0,
        1e200,
        0.0,
    )
    assert lost.last_at == 10.0
    assert (lost.capacity_rps, lost.capacity_at, lost.held_count) == (5.0, 0.0, 3)
    assert update_forecast(lost, 2.0, 10.0, CONFIG) is lost


def test_the_counting_noise_is_at_least_one_requests() -> None:
    """At 1 sd: 1.4 requests over none is beyond the noise of 1.4 counted (sd 1.18) ..."""
    assert beyond_counting_noise(0.14, 0.0, 10.0, sigmas=1.0)
    # ... and 0.9 over none is within one request's sd (the floor; sqrt(0.9) = 0.95 would say the same), 1.1 is not
    assert not beyond_counting_noise(0.09, 0.0, 10.0, sigmas=1.0)
    assert beyond_counting_noise(0.11, 0.0, 10.0, sigmas=1.0)


def history_of(*entries: tuple[float, float]) -> ForecastState:
    return ForecastState(history=entries, last_at=entries[-1][0], holt_level=entries[-1][1])


def test_a_rise_is_measured_from_the_latest_rate_at_least_a_span_old() -> None:
    """At 90 s over a 60 s span the rate 30 s ago at exactly the span's age (50 req/s, as now) is the reference: no
    rise. The older 10 req/s would be one."""
    assert not rise_beyond_noise(history_of((20.0, 10.0), (30.0, 50.0), (90.0, 50.0)), 60.0, 10.0)
    assert rise_beyond_noise(history_of((20.0, 10.0), (30.0, 10.0), (90.0, 50.0)), 60.0, 10.0)


def test_without_an_entry_a_span_old_a_rise_is_measured_from_one_a_window_old() -> None:
    """A 600 s span with 10 s of history: the entry exactly a window (10 s) old is the reference."""
    assert not rise_beyond_noise(history_of((80.0, 50.0), (90.0, 50.0)), 600.0, 10.0)
    assert rise_beyond_noise(history_of((80.0, 10.0), (90.0, 50.0)), 600.0, 10.0) is True
    # nothing a window old (nor an empty history): nothing says it is noise
    assert rise_beyond_noise(history_of((85.0, 50.0), (90.0, 50.0)), 600.0, 10.0) is True
    assert rise_beyond_noise(ForecastState(), 60.0, 10.0) is True


def test_a_rise_is_judged_at_the_standard_deviations_asked() -> None:
    """10 -> 12 req/s over 10 s windows: 20 requests against an sd of sqrt(220) = 14.8: beyond 1 sd, not 3."""
    rising = history_of((0.0, 10.0), (60.0, 12.0))
    assert rise_beyond_noise(rising, 60.0, 10.0, sigmas=1.0)
    assert not rise_beyond_noise(rising, 60.0, 10.0)

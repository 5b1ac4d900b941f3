"""Request-rate forecasts: every method follows a steady rate; the trend methods extrapolate a ramp."""

from __future__ import annotations

import math

import pytest

from planner.core import ForecastConfig, ForecastMethod
from planner.core.forecast import ForecastState, derived_capacity, forecast_rate, update_forecast


def feed(method: ForecastMethod, rates: list[float], interval_s: float = 5.0) -> float | None:
    config = ForecastConfig(method=method, horizon_s=60.0, history_s=300.0)
    state = ForecastState()
    for i, rate in enumerate(rates):
        state = update_forecast(state, rate, i * interval_s, config)
    return forecast_rate(state, config)


TRENDED = [ForecastMethod.LINEAR, ForecastMethod.HOLT, ForecastMethod.KALMAN]


@pytest.mark.parametrize("method", [ForecastMethod.CONSTANT, *TRENDED])
def test_a_steady_rate_forecasts_itself(method: ForecastMethod) -> None:
    value = feed(method, [20.0] * 60)
    assert value is not None and value == pytest.approx(20.0, rel=0.02)


@pytest.mark.parametrize("method", TRENDED)
def test_a_ramp_is_extrapolated_by_the_trend_methods(method: ForecastMethod) -> None:
    # 0.1 req/s per second: 60 s after the last point (at 295 s, rate 29.5) the rate is 35.5.
    value = feed(method, [0.1 * 5 * i for i in range(60)])
    assert value is not None and value == pytest.approx(35.5, rel=0.05)


def test_the_constant_method_does_not_extrapolate() -> None:
    assert feed(ForecastMethod.CONSTANT, [0.1 * 5 * i for i in range(60)]) == pytest.approx(29.5)


def test_a_falling_rate_never_forecasts_below_zero() -> None:
    for method in TRENDED:
        value = feed(method, [max(0.0, 50.0 - 5.0 * i) for i in range(15)])
        assert value is not None and value >= 0 and math.isfinite(value)


def test_bad_samples_and_repeated_times_leave_the_state_unchanged() -> None:
    config = ForecastConfig(method=ForecastMethod.KALMAN)
    state = update_forecast(ForecastState(), 10.0, 0.0, config)
    for rate, at in ((math.nan, 5.0), (-1.0, 5.0), (math.inf, 5.0), (12.0, 0.0), (12.0, -5.0)):
        assert update_forecast(state, rate, at, config) == state


def test_no_method_or_no_data_means_no_forecast() -> None:
    assert forecast_rate(ForecastState(), ForecastConfig(method=ForecastMethod.HOLT)) is None
    state = update_forecast(ForecastState(), 10.0, 0.0, ForecastConfig())
    assert forecast_rate(state, ForecastConfig(method=ForecastMethod.NONE)) is None


def test_history_is_bounded_by_history_s() -> None:
    config = ForecastConfig(method=ForecastMethod.LINEAR, history_s=60.0)
    state = ForecastState()
    for i in range(1000):
        state = update_forecast(state, 1.0, i * 5.0, config)
    assert len(state.history) == 12


def test_derived_capacity_keeps_the_highest_rate_per_replica_seen() -> None:
    """A surge's tail: 60 req/s on 6 replicas said 10 req/s per replica; a trickle of 0.2 req/s on the one replica
    min holds says nothing of capacity. Derived from this tick alone the floor multiplied a 6 req/s forecast into
    30 replicas (a surge from idle ended at 32 replicas held to the end of the replay)."""

    config = ForecastConfig(method=ForecastMethod.HOLT, history_s=600.0)
    state, capacity = derived_capacity(ForecastState(), 60.0, 6, 0.0, config)
    assert capacity == 10.0
    state, capacity = derived_capacity(state, 0.2, 1, 60.0, config)
    assert capacity is not None and capacity == pytest.approx(10.0 * math.exp(-0.1))
    state, capacity = derived_capacity(state, 24.0, 2, 120.0, config)  # a higher figure replaces it
    assert capacity == 12.0
    assert derived_capacity(ForecastState(), None, 3, 0.0, config)[1] is None

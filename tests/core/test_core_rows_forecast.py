"""The forecast's filters against their textbook forms (an independent matrix write-up of the local linear trend
Kalman filter, Holt's equations), over an irregular sequence of observations, and the first observation's state."""

from __future__ import annotations

import numpy as np
import pytest

from planner.core import ForecastConfig
from planner.core.forecast import ForecastState, update_forecast

OBSERVATIONS = [(0.0, 10.0), (2.0, 14.0), (5.0, 13.0), (5.5, 20.0), (9.0, 0.5), (15.0, 31.0)]


def test_the_first_observation_starts_both_filters_at_it() -> None:
    state = update_forecast(ForecastState(capacity_rps=3.0, capacity_at=-1.0), 12.0, 0.0, ForecastConfig())
    assert state == ForecastState(
        capacity_rps=3.0,
        capacity_at=-1.0,
        history=((0.0, 12.0),),
        last_at=0.0,
        holt_level=12.0,
        kalman_level=12.0,
        kalman_p=(144.0, 0.0, 0.0, 1.0),
    )
    small = update_forecast(ForecastState(), 0.5, 0.0, ForecastConfig())
    assert small.kalman_p == (1.0, 0.0, 0.0, 1.0)


def test_holt_and_kalman_follow_their_textbook_equations() -> None:
    config = ForecastConfig(alpha=0.4, beta=0.2, process_noise=0.05, measurement_noise=0.2)
    state = ForecastState()
    level = trend = 0.0
    x = np.zeros(2)
    p = np.eye(2)
    last = None
    for at, z in OBSERVATIONS:
        state = update_forecast(state, z, at, config)
        if last is None:
            level, trend = z, 0.0
            x, p = np.array([z, 0.0]), np.array([[max(z, 1.0) ** 2, 0.0], [0.0, 1.0]])
        else:
            dt = at - last
            new_level = config.alpha * z + (1 - config.alpha) * (level + trend * dt)
            trend = config.beta * (new_level - level) / dt + (1 - config.beta) * trend
            level = new_level
            scale = max(abs(x[0]), abs(z), 1.0) ** 2
            q, r = config.process_noise * scale, config.measurement_noise * scale
            f = np.array([[1.0, dt], [0.0, 1.0]])
            noise = q * np.array([[dt**3 / 3, dt**2 / 2], [dt**2 / 2, dt]])
            x = f @ x
            p = f @ p @ f.T + noise
            gain = p[:, 0] / (p[0, 0] + r)
            x = x + gain * (z - x[0])
            p = p - np.outer(gain, p[0, :])
        last = at
        assert (state.holt_level, state.holt_trend_per_s) == pytest.approx((level, trend), rel=1e-12)
        assert (state.kalman_level, state.kalman_slope_per_s) == pytest.approx(tuple(x), rel=1e-9)
        assert state.kalman_p == pytest.approx(tuple(p.flatten()), rel=1e-9)
        assert state.last_at == at


def test_observations_that_cannot_be_used_leave_the_state_alone() -> None:
    config = ForecastConfig(history_s=4.0)
    state = update_forecast(update_forecast(ForecastState(), 5.0, 0.0, config), 6.0, 3.0, config)
    for rate, at in ((float("nan"), 9.0), (-0.5, 9.0), (7.0, 3.0), (7.0, 2.0)):
        assert update_forecast(state, rate, at, config) is state
    assert update_forecast(state, 0.0, 9.0, config).history == ((9.0, 0.0),)  # older than history_s: dropped
    assert update_forecast(state, 1.0, 6.0, config).history == ((3.0, 6.0), (6.0, 1.0))

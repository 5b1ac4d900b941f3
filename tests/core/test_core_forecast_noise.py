"""The forecast floor does not extrapolate a trend fitted to noise (issue 13, the cost of small fleets): when the
rate has not risen over the last ``horizon_s`` beyond the Poisson noise of its traffic windows' request counts,
Holt's trend is noise, and the floor above a load of two or more replicas is taken at Holt's level (reason
``forecast_trend_within_noise``). A load of one replica keeps the floor as it was: it is that service's only spare.
"""

from __future__ import annotations

import numpy as np

from planner.core import CoreConfig, CoreState, ForecastConfig, ForecastMethod, Reason, Stage, Traffic, step
from planner.core.forecast import ForecastState, noise_floor, rise_beyond_noise, update_forecast
from planner.discovery import Role
from tests.core.fleetkit import Fleet, Load, hpa_role

WINDOW_S = 10.0
CONFIG = ForecastConfig(method=ForecastMethod.HOLT, horizon_s=60.0, history_s=600.0, replica_capacity_rps=20.0)


def poisson_rates(mean_per_s: float, ticks: int, seed: int = 7) -> list[float]:
    """One rate every 5 s: a Poisson request count over a 10 s window, as the traffic window reads it."""
    rng = np.random.default_rng(seed)
    return [float(c) / WINDOW_S for c in rng.poisson(mean_per_s * WINDOW_S, ticks)]


def feed(rates: list[float]) -> ForecastState:
    state = ForecastState()
    for i, rate in enumerate(rates):
        state = update_forecast(state, rate, 5.0 * i, CONFIG)
    return state


def test_a_rise_within_the_counting_noise_is_not_beyond_it() -> None:
    # 50 -> 53 req/s over a minute: 30 requests more in a 10 s window of ~515, sd ~32
    assert not rise_beyond_noise(feed([50.0] * 12 + [53.0]), 60.0, WINDOW_S)
    # 50 -> 70 req/s: 200 more, six sd
    assert rise_beyond_noise(feed([50.0] * 12 + [70.0]), 60.0, WINDOW_S)
    # a trickle: 0 -> 0.3 req/s is 3 requests, within 3 sd of sqrt(3)
    assert not rise_beyond_noise(feed([0.0] * 12 + [0.3]), 60.0, WINDOW_S)
    # nothing a window old to compare with: not called noise
    assert rise_beyond_noise(feed([50.0]), 60.0, WINDOW_S)


def test_the_noise_floor_leaves_a_single_load_replica_and_a_real_rise_alone() -> None:
    noisy = feed([50.0, 48.0, 52.0, 49.0, 51.0, 47.0, 50.0, 53.0, 49.0, 50.0, 52.0, 54.0, 56.0])
    assert noisy.holt_trend_per_s > 0
    result = noise_floor(noisy, CONFIG, 4, 3, 20.0, WINDOW_S)
    assert result is not None and result[0] == 3
    assert "the trend is noise -> level" in result[1] and "floor 3" in result[1]
    assert noise_floor(noisy, CONFIG, 2, 1, 20.0, WINDOW_S) is None  # one load replica: its only spare
    ramp = feed([30.0 + 2.5 * i for i in range(13)])  # 30 -> 60 req/s in a minute
    assert noise_floor(ramp, CONFIG, 5, 3, 20.0, WINDOW_S) is None


def _run(rates: list[float], replicas: int, decodes: int) -> tuple[list[int], list[Reason]]:
    fleet = Fleet()
    fleet.add_many(replicas, Role.DECODE)
    fleet.deploy("decode", replicas)
    config = CoreConfig(roles={Role.DECODE: hpa_role(forecast=CONFIG)})
    state = CoreState()
    floors: list[int] = []
    reasons: list[Reason] = []
    for i, rate in enumerate(rates):
        t = 5.0 * i
        fleet.publish_all(t, Load(decode=decodes))
        state, decisions = step(state, fleet.observe(t, {Role.DECODE: Traffic(request_rate_per_s=rate)}), t, config)
        stage = decisions[0].stage(Stage.FORECAST)
        assert stage is not None and stage.reason is not None
        floors.append(stage.replicas)
        reasons.append(stage.reason)
    return floors, reasons


def test_a_steady_noisy_rate_does_not_raise_a_three_replica_load() -> None:
    """Ten minutes of Poisson counts at 50 req/s (20 req/s a replica: the level asks 3) on a load of 3 replicas:
    Holt's trend on the noise forecast up to ~60 req/s a minute ahead, a floor of 4 the scale-down window would
    hold; the floor stays at 3. Before: 4 on many ticks."""
    floors, reasons = _run(poisson_rates(50.0, 120), replicas=3, decodes=600)
    assert max(floors) == 3
    assert Reason.FORECAST_TREND_WITHIN_NOISE in reasons


def test_a_rise_beyond_the_noise_keeps_the_trend() -> None:
    rates = [*poisson_rates(50.0, 60), *[50.0 + 2.5 * (k + 1) for k in range(12)]]  # then +30 req/s in a minute
    floors, reasons = _run(rates, replicas=3, decodes=600)
    assert reasons[-1] == Reason.FORECAST_FLOOR
    assert floors[-1] >= 5  # Holt's trend a minute ahead of 80 req/s


def test_a_single_load_replica_keeps_its_noise_floor() -> None:
    """The same noise at 15 req/s on a load of one replica: the floor still adds the spare on some ticks."""
    floors, reasons = _run(poisson_rates(15.0, 120), replicas=1, decodes=100)
    assert max(floors) == 2
    assert Reason.FORECAST_TREND_WITHIN_NOISE not in reasons

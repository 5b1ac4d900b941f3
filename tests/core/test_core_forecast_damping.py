"""The forecast floor's trend, checked against what came (issue 13): Holt's trend one start-up ahead is scaled by
the share of its predicted rises that came true (``trend_gain``), when the rate is below its history's high and
the floor asks more than one replica above the load (reason ``forecast_trend_damped``)."""

from __future__ import annotations

import math

from planner.core import CoreConfig, CoreState, ForecastConfig, ForecastMethod, Reason, Stage, Traffic, step
from planner.core.forecast import (
    ForecastState,
    checked_floor,
    damped_floor,
    forecast_rate,
    trend_gain,
    update_forecast,
)
from planner.discovery import Role
from tests.core.fleetkit import Fleet, Load, hpa_role

CONFIG = ForecastConfig(method=ForecastMethod.HOLT, horizon_s=60.0, history_s=600.0, replica_capacity_rps=10.0)


def bursts(peaks: list[float], base: float = 10.0) -> list[float]:
    """One rate every 5 s: per peak, 60 s at ``base``, a 20 s ramp to the peak, 10 s there, then back."""
    rates: list[float] = []
    for peak in peaks:
        rates += [base] * 12
        rates += [base + (peak - base) * (k + 1) / 4 for k in range(4)]
        rates += [peak] * 2
    return rates


def feed(rates: list[float], state: ForecastState | None = None, start_s: float = 0.0) -> ForecastState:
    state = state if state is not None else ForecastState()
    for i, rate in enumerate(rates):
        state = update_forecast(state, rate, start_s + 5.0 * i, CONFIG)
    return state


def test_rises_that_do_not_come_earn_a_small_trend_gain() -> None:
    state = feed(bursts([100.0] * 6))
    assert trend_gain(state) < 0.5


def test_a_ramp_that_holds_keeps_a_trend_gain_near_one() -> None:
    state = feed([10.0 + 0.5 * i for i in range(120)])
    assert trend_gain(state) > 0.9


def test_before_any_prediction_falls_due_the_trend_is_trusted() -> None:
    assert trend_gain(feed([10.0, 20.0, 30.0])) == 1.0


def test_the_damped_floor_is_never_below_the_load_plus_one_and_leaves_small_floors_alone() -> None:
    state = feed([*bursts([100.0] * 6), 10.0, 40.0, 70.0])
    assert damped_floor(state, CONFIG, 3, 2, 10.0) is None  # one replica above the load: left as it is
    damped = damped_floor(state, CONFIG, 20, 7, 10.0)
    assert damped is not None and 8 <= damped[0] < 20


def _run(rates: list[float]) -> tuple[int, Reason, int]:
    fleet = Fleet()
    fleet.add_many(2, Role.DECODE)
    fleet.deploy("decode", 2)
    config = CoreConfig(roles={Role.DECODE: hpa_role(forecast=CONFIG)})
    state = CoreState()
    decision = None
    for i, rate in enumerate(rates):
        t = 5.0 * i
        fleet.publish_all(t, Load(decode=300))  # 2 replicas by load
        state, decisions = step(state, fleet.observe(t, {Role.DECODE: Traffic(request_rate_per_s=rate)}), t, config)
        decision = decisions[0]
    assert decision is not None
    stage = decision.stage(Stage.FORECAST)
    assert stage is not None and stage.reason is not None
    return stage.replicas, stage.reason, decision.recommended_replicas


def test_a_rate_above_its_history_high_keeps_the_whole_trend() -> None:
    floor, reason, _ = _run(bursts([100.0] * 5 + [160.0])[:-2])
    assert reason == Reason.FORECAST_FLOOR
    # rising 30 req/s per 5 s to 160: far more than 16 replicas of 10 req/s a minute ahead
    assert floor > 16


def test_a_burst_below_the_history_high_gets_a_damped_floor() -> None:
    # Five bursts to 100 req/s that stop after 10 s; the sixth ramps to 70: Holt extrapolates it a minute ahead
    # past 100 req/s, the bursts before say such rises do not come.
    rates = bursts([100.0] * 5 + [70.0])[:-2]
    state = feed(rates)
    undamped = (state.holt_level + state.holt_trend_per_s * CONFIG.horizon_s) / 10.0
    floor, reason, load = _run(rates)
    assert reason == Reason.FORECAST_TREND_DAMPED
    assert load == 2 and load + 1 <= floor < undamped - 1


def test_the_checked_floor_scales_the_trend_also_at_a_new_high() -> None:
    """What the hold across gaps remembers of a floor: at a new high the live floor keeps the whole trend, the
    checked one scales it by what came of the rises before (never below the load + 1, never above the floor)."""
    high = feed(bursts([100.0] * 5 + [160.0])[:-2])
    assert damped_floor(high, CONFIG, 40, 7, 10.0) is None  # at the history's high: the live floor is whole
    checked = checked_floor(high, CONFIG, 40, 7, 10.0)
    assert 8 <= checked < 40
    assert checked_floor(high, CONFIG, 8, 7, 10.0) == 8  # one replica above the load: left as it is
    trusted = feed([10.0, 20.0, 30.0])  # no prediction fell due yet: the trend is trusted
    rate = forecast_rate(trusted, CONFIG)
    assert rate is not None
    floor = math.ceil(rate / 10.0)
    assert floor > 3 and checked_floor(trusted, CONFIG, floor, 2, 10.0) == floor


def test_the_hold_remembers_a_new_high_floor_with_its_trend_checked() -> None:
    """Step: at a new high the decision keeps the floor's whole trend, and the state's checked recommendations
    (what the hold across gaps looks back over) keep the checked floor, lower."""
    fleet = Fleet()
    fleet.add_many(2, Role.DECODE)
    fleet.deploy("decode", 2)
    config = CoreConfig(roles={Role.DECODE: hpa_role(forecast=CONFIG)})
    state = CoreState()
    decision = None
    for i, rate in enumerate(bursts([100.0] * 5 + [160.0])[:-2]):
        t = 5.0 * i
        fleet.publish_all(t, Load(decode=300))
        state, decisions = step(state, fleet.observe(t, {Role.DECODE: Traffic(request_rate_per_s=rate)}), t, config)
        decision = decisions[0]
    assert decision is not None
    stage = decision.stage(Stage.FORECAST)
    assert stage is not None and stage.reason == Reason.FORECAST_FLOOR
    service = state.services["decode"]
    assert service.recommendations[-1][1] == stage.replicas > 16
    assert 2 < service.checked_recommendations[-1][1] < stage.replicas

"""The forecast floor's stage in one service's pipeline (planner.core.draft), as an operator reads it in a decision:
a floor at or below what the load asks for says so (``forecast_below_load``) with the forecast and the floor it
gave; only a floor above it raises the count (``forecast_floor``). Written for the mutants docs/mutation-results.md
listed as surviving in draft.py."""

from __future__ import annotations

import pytest

from planner.core import CoreConfig, CoreState, Reason, RoleBounds, Stage, Traffic, step
from planner.core.config import ForecastConfig, ForecastMethod
from planner.discovery import Role
from tests.core.fleetkit import Fleet, Load, hpa_role

RATE_RPS = 12.0


def forecast_stage(capacity_rps: float | None) -> tuple[int, int, Reason | None, str]:
    """(the recommend stage's count, the forecast stage's count, its reason, its detail) for a decode fleet of 4
    under a steady 12 req/s, the floor sized with ``capacity_rps`` per replica (None: no forecast)."""
    fleet = Fleet()
    fleet.add_many(4, Role.DECODE)
    fleet.deploy("decode", 4)
    method = ForecastMethod.NONE if capacity_rps is None else ForecastMethod.CONSTANT
    forecast = ForecastConfig(method=method, replica_capacity_rps=capacity_rps)
    config = CoreConfig(roles={Role.DECODE: hpa_role(forecast=forecast)})
    fleet.publish_all(0.0, Load(decode=300))
    _, decisions = step(
        CoreState(), fleet.observe(0.0, {Role.DECODE: Traffic(request_rate_per_s=RATE_RPS)}), 0.0, config
    )
    (d,) = decisions
    recommend = d.stage(Stage.RECOMMEND)
    assert recommend is not None
    stage = d.stage(Stage.FORECAST)
    if stage is None:
        return recommend.replicas, recommend.replicas, None, ""
    return recommend.replicas, stage.replicas, stage.reason, stage.detail or ""


@pytest.fixture(scope="module")
def by_load() -> int:
    replicas, _, reason, _ = forecast_stage(None)
    assert reason is None  # no forecast stage without a method
    assert replicas >= 2
    return replicas


def test_a_floor_equal_to_the_load_count_is_below_load_not_a_floor(by_load: int) -> None:
    capacity = RATE_RPS / by_load  # floor = ceil(12 / capacity) = the load's count
    recommended, replicas, reason, detail = forecast_stage(capacity)
    assert (recommended, replicas, reason) == (by_load, by_load, Reason.FORECAST_BELOW_LOAD)
    assert detail == f"forecast {RATE_RPS:.2f} req/s in 60 s -> floor {by_load}"


def test_a_floor_under_the_load_count_says_so_and_keeps_the_count(by_load: int) -> None:
    capacity = RATE_RPS / (by_load - 1)
    _, replicas, reason, detail = forecast_stage(capacity)
    assert (replicas, reason) == (by_load, Reason.FORECAST_BELOW_LOAD)
    assert detail == f"forecast {RATE_RPS:.2f} req/s in 60 s -> floor {by_load - 1}"


def test_a_floor_above_the_load_count_raises_it(by_load: int) -> None:
    capacity = RATE_RPS / (by_load + 2)
    _, replicas, reason, detail = forecast_stage(capacity)
    assert (replicas, reason) == (by_load + 2, Reason.FORECAST_FLOOR)
    assert detail == f"forecast {RATE_RPS:.2f} req/s in 60 s -> floor {by_load + 2}"


def test_requests_arriving_at_a_fleet_with_no_load_give_no_capacity_to_size_a_floor_with() -> None:
    fleet = Fleet()
    fleet.add_many(4, Role.DECODE)
    fleet.deploy("decode", 4)
    config = CoreConfig(roles={Role.DECODE: hpa_role(forecast=ForecastConfig(method=ForecastMethod.CONSTANT))})
    fleet.publish_all(0.0, Load())
    observation = fleet.observe(0.0, {Role.DECODE: Traffic(request_rate_per_s=RATE_RPS)})
    _, (d,) = step(CoreState(), observation, 0.0, config)
    stage = d.stage(Stage.FORECAST)
    assert stage is not None
    assert (stage.reason, stage.detail) == (
        Reason.FORECAST_NO_DATA,
        "no per-replica capacity: set forecast.replica_capacity_rps",
    )
    assert d.inputs.forecast_rate_per_s == RATE_RPS


def test_a_damped_floor_says_what_it_forecast_and_why_it_asks_less() -> None:
    # five bursts to 100 req/s that stopped after 10 s, then a ramp to 70: Holt's trend one start-up ahead is
    # scaled by the share of its predicted rises that came (forecast_trend_damped), and the stage says both
    rates: list[float] = []
    for peak in [100.0] * 5 + [70.0]:
        rates += [10.0] * 12 + [10.0 + (peak - 10.0) * (k + 1) / 4 for k in range(4)] + [peak] * 2
    rates = rates[:-2]
    fleet = Fleet()
    fleet.add_many(2, Role.DECODE)
    fleet.deploy("decode", 2)
    forecast = ForecastConfig(method=ForecastMethod.HOLT, horizon_s=60.0, history_s=600.0, replica_capacity_rps=10.0)
    config = CoreConfig(roles={Role.DECODE: hpa_role(forecast=forecast)})
    state = CoreState()
    stage = None
    for i, rate in enumerate(rates):
        fleet.publish_all(5.0 * i, Load(decode=300))
        observation = fleet.observe(5.0 * i, {Role.DECODE: Traffic(request_rate_per_s=rate)})
        state, (d,) = step(state, observation, 5.0 * i, config)
        stage = d.stage(Stage.FORECAST)
    assert stage is not None and stage.detail is not None
    assert stage.reason == Reason.FORECAST_TREND_DAMPED
    forecast_part, damped_part = stage.detail.split("; ")
    assert forecast_part.startswith("forecast ") and " req/s in 60 s -> floor " in forecast_part
    assert damped_part.startswith("trend gain ") and damped_part.endswith(f"-> floor {stage.replicas}")


def test_the_actuators_bounds_are_enforced_last_whatever_held_the_count_above_them() -> None:
    # 6 replicas deployed; the actuator now allows at most 4. The safety rule holds a scale-down until coverage has
    # been complete for a window, but the enforced bounds (the actuator's included) take effect now.
    fleet = Fleet()
    fleet.add_many(6, Role.DECODE)
    fleet.deploy("decode", 6)
    config = CoreConfig(roles={Role.DECODE: hpa_role()}).with_actuator_bounds(
        {Role.DECODE: RoleBounds(min_replicas=1, max_replicas=4)}
    )
    fleet.publish_all(0.0, Load(decode=300))
    _, (d,) = step(CoreState(), fleet.observe(0.0), 0.0, config)
    enforced = d.stage(Stage.BOUNDS_ENFORCED)
    assert enforced is not None
    assert (enforced.replicas, enforced.reason) == (4, Reason.CAPPED_BY_ACTUATOR_BOUNDS)
    assert d.final_replicas == 4

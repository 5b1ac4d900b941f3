"""The forecast floor within the model's capacity (planner.core.floor_stage.floor_within_model): the count the model
asks at the forecast rate is asked with everything the load's own recommendation used -- the prompts' spread
among it -- and a forecast rate no count can serve leaves the derived floor standing; a forecast of no requests
asks no floor, and half a request a second on an idle fleet gives no capacity to size one with. Written for the
mutants of floor_stage.py that survived the suite (docs/mutation-results.md).

The analytic predictor of tests/core/analytic_perf.py with the H200 engine's 2048-token chunk: 50.96 ms a chunk,
40,188 prompt tokens/s per engine; a prefill of T tokens ``1.1 x (ceil(T / 2048) x 10 + 0.02 T)`` ms."""

from __future__ import annotations

import msgspec

from planner.core import CoreConfig, CoreState, Mode, Reason, RoleLoad, SlaTargets, Stage, Traffic, step
from planner.core.config import ForecastConfig, ForecastMethod
from planner.core.decision import StageResult
from planner.core.floor_stage import FloorInputs, floor_within_model, forecast_floor
from planner.core.forecast import ForecastState
from planner.core.recommendation import Recommendation
from planner.discovery import Role
from tests.core.analytic_perf import AnalyticPerf
from tests.core.fleetkit import Fleet, Load, hpa_role, reconciled


def inputs(prompt_cv2: float) -> FloorInputs:
    """A prefill role of 2 replicas the load keeps at 2 (sla_met), 30 prompts/s of 2000 tokens, a 150 ms TTFT."""
    return FloorInputs(
        role=Role.PREFILL,
        rc=hpa_role(mode=Mode.SLA, sla=SlaTargets(ttft_ms=150.0, itl_ms=50.0)),
        current=2,
        recon=reconciled(Role.PREFILL, 2, prefill_requests=0.0),
        load=RoleLoad(),
        traffic=Traffic(request_rate_per_s=30.0, isl_tokens=2000.0, osl_tokens=100.0),
        predictor=AnalyticPerf(),
        rec=Recommendation(replicas=2, reason=Reason.SLA_MET, mode=Mode.SLA),
        held=False,
        corrections=(0.0, 0.0),
        startup_s=0.0,  # no start-up: the count is judged against the arrivals alone
        settled=True,
        prompt_cv2=prompt_cv2,
    )


def test_the_floor_within_the_model_keeps_the_prompts_spread() -> None:
    # At a forecast of 60 prompts/s (120,000 tokens/s): 4 engines at utilization 0.746 queue 1.10 prompts (2194
    # tokens) ahead of a prompt: 4194 tokens, 3 chunks, 125 ms. A spread of CV^2 1.42 waits 2.42 times as long:
    # 7310 tokens, 4 chunks, 205 ms, past 150; 5 engines (utilization 0.597, 0.44 prompts: 2140 tokens
    # with the spread) give 124 ms.
    assert floor_within_model(inputs(0.0), 2, 60.0) == 4
    assert floor_within_model(inputs(1.42), 2, 60.0) == 5


def test_a_forecast_rate_no_count_can_serve_leaves_the_derived_floor() -> None:
    # 10M prompts/s of 2000 tokens need 500,000 engines, past the search's 100,000: the model's answer at that rate
    # is a hold (sla_unreachable), not a count to cap the floor at.
    assert floor_within_model(inputs(0.0), 2, 10_000_000.0) is None


def forecast_stage(rate_rps: float, capacity_rps: float | None) -> tuple[Reason | None, str]:
    """The forecast stage (reason, detail) of an idle decode fleet of 4 receiving ``rate_rps`` requests/s, with a
    constant forecast and ``capacity_rps`` per replica (None: derived from the load's count)."""
    fleet = Fleet()
    fleet.add_many(4, Role.DECODE)
    fleet.deploy("decode", 4)
    forecast = ForecastConfig(method=ForecastMethod.CONSTANT, replica_capacity_rps=capacity_rps)
    config = CoreConfig(roles={Role.DECODE: hpa_role(forecast=forecast)})
    fleet.publish_all(0.0, Load())
    _, (decision,) = step(
        CoreState(), fleet.observe(0.0, {Role.DECODE: Traffic(request_rate_per_s=rate_rps)}), 0.0, config
    )
    stage = decision.stage(Stage.FORECAST)
    assert stage is not None and stage.detail is not None
    return stage.reason, stage.detail


def test_half_a_request_a_second_on_an_idle_fleet_gives_no_capacity_to_size_a_floor_with() -> None:
    assert forecast_stage(0.5, None) == (
        Reason.FORECAST_NO_DATA,
        "no per-replica capacity: set forecast.replica_capacity_rps",
    )


def test_a_forecast_of_no_requests_asks_no_floor() -> None:
    assert forecast_stage(0.0, 10.0) == (Reason.FORECAST_BELOW_LOAD, "forecast 0.00 req/s in 60 s -> floor 0")


def test_an_aggregated_roles_forecast_says_what_it_forecast_and_nothing_else() -> None:
    # The rise cap is a prefill/decode check: an aggregated role's stage has no note of it.
    fleet = Fleet()
    fleet.add_many(2, Role.AGG)
    fleet.deploy("agg", 2)
    forecast = ForecastConfig(method=ForecastMethod.CONSTANT, replica_capacity_rps=2.0)
    config = CoreConfig(roles={Role.AGG: hpa_role(forecast=forecast)})
    fleet.publish_all(0.0, Load())
    _, (decision,) = step(CoreState(), fleet.observe(0.0, {Role.AGG: Traffic(request_rate_per_s=6.0)}), 0.0, config)
    stage = decision.stage(Stage.FORECAST)
    assert stage is not None
    assert (stage.reason, stage.replicas) == (Reason.FORECAST_FLOOR, 3)
    assert stage.detail == "forecast 6.00 req/s in 60 s -> floor 3"


def test_a_floor_the_model_agrees_with_is_the_forecast_floor() -> None:
    # 60 prompts/s forecast (constant) at 15 per replica: a floor of 4 above the load's 2, and the model at 60
    # prompts/s asks 4 as well (the first row above): the floor stands as the forecast's, not capped by the model.
    rc = hpa_role(
        mode=Mode.SLA,
        sla=SlaTargets(ttft_ms=150.0, itl_ms=50.0),
        forecast=ForecastConfig(method=ForecastMethod.CONSTANT, replica_capacity_rps=15.0),
    )
    traffic = Traffic(request_rate_per_s=60.0, isl_tokens=2000.0, osl_tokens=100.0)
    at_rate = msgspec.structs.replace(inputs(0.0), rc=rc, traffic=traffic)
    stages: list[StageResult] = []
    value = forecast_floor(at_rate, 2, ForecastState(), 0.0, stages, [])[0]
    assert value == 4
    assert (stages[-1].reason, stages[-1].detail) == (Reason.FORECAST_FLOOR, "forecast 60.00 req/s in 60 s -> floor 4")

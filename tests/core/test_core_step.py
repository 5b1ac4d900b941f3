"""``step`` as its callers use it: JSON records, what-if, bounds changed between ticks, bad input, SLA mode,
the predictive floor, services without workers."""

from __future__ import annotations

import math

import msgspec
import pytest

from planner.core import (
    Action,
    Bounds,
    CoreConfig,
    CoreState,
    Decision,
    ForecastConfig,
    ForecastMethod,
    Mode,
    Observation,
    Reason,
    RoleBounds,
    RoleLoad,
    SlaTargets,
    Stage,
    Traffic,
    step,
)
from planner.core.observation import ObservationError
from planner.discovery import Role
from tests.core.analytic_perf import AnalyticPerf
from tests.core.fleetkit import Fleet, Load, hpa_config, hpa_role


def decode_fleet(n: int = 4) -> Fleet:
    fleet = Fleet()
    fleet.add_many(n, Role.DECODE)
    fleet.deploy("decode", n)
    return fleet


def only(decisions: tuple[Decision, ...], service: str = "decode") -> Decision:
    return next(d for d in decisions if d.service == service)


def test_a_decision_encodes_to_json_with_every_stage_and_reason() -> None:
    fleet = decode_fleet()
    fleet.publish_all(0.0, Load(decode=160, kv=16_000))
    _, decisions = step(CoreState(), fleet.observe(0.0), 0.0, hpa_config())
    doc = msgspec.json.decode(msgspec.json.encode(only(decisions)))
    assert doc["id"] == "1-decode" and doc["role"] == "decode" and doc["action"] == "hold"
    assert [s["stage"] for s in doc["stages"]] == [
        "recommend",
        "bounds",
        "rate_limit",
        "stabilize",
        "safety",
        "in_flight",
        "bounds_enforced",
        "gpu_budget",
    ]
    assert doc["reasons"] == ["load_below_target", "startup_window", "scale_down_blocked", "hold"]
    assert doc["coverage"]["healthy"] == 4 and doc["coverage"]["complete"] is True
    assert doc["inputs"]["decode_requests"] == 160 and doc["inputs"]["kv_usage_frac"] == pytest.approx(0.04)
    assert only(decisions).stage(Stage.SAFETY) is not None and only(decisions).stage(Stage.FORECAST) is None


def test_what_if_decides_under_a_given_load_and_leaves_the_state_alone() -> None:
    fleet = decode_fleet()
    fleet.publish_all(0.0, Load(decode=160, kv=16_000))
    state, _ = step(CoreState(), fleet.observe(0.0), 0.0, hpa_config())
    observation = msgspec.structs.replace(
        fleet.observe(5.0), load_override={Role.DECODE: RoleLoad(queued_decode_requests=10)}
    )
    what_if_state, decisions = step(state, observation, 5.0, hpa_config())
    d = only(decisions)
    assert d.recommended_replicas == 10 and d.final_replicas == 8
    assert Reason.LOAD_OVERRIDDEN in d.reasons and d.inputs.overridden
    assert state.tick == 1 and what_if_state.tick == 2  # the caller keeps ``state`` and drops ``what_if_state``


def test_bounds_replaced_between_ticks_apply_on_the_next_tick() -> None:
    fleet = decode_fleet()
    config = hpa_config()
    state = CoreState()
    fleet.publish_all(0.0, Load(decode=50, queued_decode=8))
    state, decisions = step(state, fleet.observe(0.0), 0.0, config)
    assert only(decisions).final_replicas == 8
    fleet.apply(only(decisions))
    config = config.with_bounds(Bounds(roles={Role.DECODE: RoleBounds(min_replicas=1, max_replicas=5)}))
    _, decisions = step(state, fleet.observe(5.0), 5.0, config)
    d = only(decisions)
    # The scale-down to the new max happens at once: neither the startup window nor stabilization hold it.
    assert d.current_replicas == 8 and d.final_replicas == 5 and Reason.CLAMPED_TO_MAX in d.reasons
    assert d.stage(Stage.SAFETY).replicas == 8  # type: ignore[union-attr]
    assert d.stage(Stage.BOUNDS_ENFORCED).replicas == 5  # type: ignore[union-attr]


@pytest.mark.parametrize("now", [math.nan, math.inf, -math.inf])
def test_a_non_finite_now_is_refused(now: float) -> None:
    with pytest.raises(ObservationError, match="finite"):
        step(CoreState(), decode_fleet().observe(0.0), now, hpa_config())


def test_time_going_backwards_is_refused() -> None:
    fleet = decode_fleet()
    state, _ = step(CoreState(), fleet.observe(10.0), 10.0, hpa_config())
    with pytest.raises(ObservationError, match="backwards"):
        step(state, fleet.observe(5.0), 5.0, hpa_config())


def test_without_deployment_status_nothing_scales_down_but_a_scale_up_proceeds() -> None:
    fleet = decode_fleet()
    fleet.deployments.clear()
    state = CoreState()
    for t in range(0, 400, 5):
        fleet.publish_all(float(t), Load(decode=10))
        state, decisions = step(state, fleet.observe(float(t)), float(t), hpa_config())
        assert only(decisions).action == Action.HOLD
    assert Reason.DEPLOYMENT_STATUS_MISSING in only(decisions).reasons
    fleet.publish_all(400.0, Load(decode=10, queued_decode=6))
    _, decisions = step(state, fleet.observe(400.0), 400.0, hpa_config())
    assert only(decisions).action == Action.SCALE_UP and only(decisions).current_replicas == 4


def test_a_configured_service_with_no_worker_discovered_still_gets_a_decision() -> None:
    fleet = Fleet()
    fleet.deploy("vllm-decode", 2)
    config = CoreConfig(roles={Role.DECODE: hpa_role(service="vllm-decode")})
    state = CoreState()
    for t in range(0, 400, 5):
        state, decisions = step(state, fleet.observe(float(t)), float(t), config)
    d = only(decisions, "vllm-decode")
    assert d.role == Role.DECODE and d.action == Action.HOLD and d.final_replicas == 2
    assert Reason.READY_REPLICAS_UNDISCOVERED in d.reasons and Reason.NO_WORKERS_DISCOVERED in d.reasons


def test_two_services_of_one_role_are_decided_apart() -> None:
    fleet = Fleet()
    fleet.add_many(2, Role.DECODE, "decode-a", prefix="a")
    fleet.add_many(2, Role.DECODE, "decode-b", prefix="b")
    fleet.deploy("decode-a", 2)
    fleet.deploy("decode-b", 2)
    for wid in fleet.workers:
        fleet.publish(wid, 0.0, Load(decode=10, queued_decode=3) if wid.startswith("a") else Load(decode=10))
    _, decisions = step(CoreState(), fleet.observe(0.0), 0.0, hpa_config())
    assert [d.service for d in decisions] == ["decode-a", "decode-b"]
    assert only(decisions, "decode-a").final_replicas == 6 and only(decisions, "decode-b").final_replicas == 2


# ------------------------------------------------------------------------------------------------ SLA mode
def sla_config(role: Role = Role.DECODE, **kw: object) -> CoreConfig:
    return CoreConfig(roles={role: hpa_role(mode=Mode.SLA, sla=SlaTargets(ttft_ms=500, itl_ms=50), **kw)})


def test_sla_mode_consolidates_only_to_a_count_that_still_meets_the_sla() -> None:
    fleet = decode_fleet(6)
    fleet.publish_all(0.0, Load(decode=600))
    perf = AnalyticPerf(decode_ms_per_kv_token=0.0)
    _, decisions = step(CoreState(), fleet.observe(0.0), 0.0, sla_config(), predictors={Role.DECODE: perf})
    d = only(decisions)
    # ITL(N) = 1.1 x (8 + 0.1 x 600 / N): 2 replicas -> 41.8 ms meets 50 ms; 1 replica -> 74.8 ms does not.
    assert d.recommended_replicas == 2 and Reason.SLA_ALLOWS_FEWER in d.reasons
    assert d.inputs.predicted_itl_ms == pytest.approx(41.8)
    assert perf.predict_itl_ms(600, 0).upper_ms > 50


def test_sla_mode_holds_when_no_replica_count_can_meet_the_target() -> None:
    fleet = decode_fleet(3)
    fleet.publish_all(0.0, Load(decode=30))
    perf = AnalyticPerf(decode_base_ms=60.0)
    _, decisions = step(CoreState(), fleet.observe(0.0), 0.0, sla_config(), predictors={Role.DECODE: perf})
    d = only(decisions)
    assert d.recommended_replicas == 3 and Reason.SLA_UNREACHABLE in d.reasons


def test_sla_mode_with_no_load_recommends_zero_and_min_holds() -> None:
    fleet = decode_fleet(3)
    fleet.publish_all(0.0, Load())
    _, decisions = step(CoreState(), fleet.observe(0.0), 0.0, sla_config(), predictors={Role.DECODE: AnalyticPerf()})
    d = only(decisions)
    assert d.recommended_replicas == 0 and Reason.NO_LOAD in d.reasons
    assert d.stage(Stage.BOUNDS) is not None and d.stage(Stage.BOUNDS).replicas == 1  # type: ignore[union-attr]


def prefill_recommendation(rate: float) -> int:
    fleet = Fleet()
    fleet.add_many(2, Role.PREFILL)
    fleet.deploy("prefill", 2)
    fleet.publish_all(0.0, Load(prefill=4000))
    traffic = {Role.PREFILL: Traffic(request_rate_per_s=rate, isl_tokens=2000, osl_tokens=100)}
    config = sla_config(Role.PREFILL, max_replicas=1000)
    _, decisions = step(
        CoreState(), fleet.observe(0.0, traffic), 0.0, config, predictors={Role.PREFILL: AnalyticPerf()}
    )
    d = only(decisions, "prefill")
    assert d.mode == Mode.SLA
    return d.recommended_replicas


def test_sla_mode_prefill_needs_more_replicas_as_the_request_rate_grows() -> None:
    # One engine prefills 8192 tokens in 10 + 164 ms: ~47k tokens/s; 400 x 2000 tokens/s needs 17+ engines.
    counts = [prefill_recommendation(rate) for rate in (1.0, 20.0, 100.0, 400.0)]
    assert counts == sorted(counts) and counts[0] == 1 and counts[-1] >= 18


# ------------------------------------------------------------------------------------------------ forecast
def test_a_rising_forecast_sets_a_floor_above_the_load() -> None:
    fleet = decode_fleet(2)
    config = CoreConfig(
        roles={
            Role.DECODE: hpa_role(
                forecast=ForecastConfig(method=ForecastMethod.LINEAR, horizon_s=60, replica_capacity_rps=10.0)
            )
        }
    )
    state = CoreState()
    for i in range(12):
        t = i * 5.0
        fleet.publish_all(t, Load(decode=300))  # 2 replicas by load
        traffic = {Role.DECODE: Traffic(request_rate_per_s=10.0 + 2.0 * i)}
        state, decisions = step(state, fleet.observe(t, traffic), t, config)
    d = only(decisions)
    # Rate 32 req/s at 55 s, rising 0.4 req/s per second: 56 req/s in 60 s -> 6 replicas of 10 req/s.
    assert d.inputs.forecast_rate_per_s == pytest.approx(56.0)
    assert Reason.FORECAST_FLOOR in d.reasons and d.stage(Stage.FORECAST).replicas == 6  # type: ignore[union-attr]


def test_a_forecast_without_traffic_says_so_and_changes_nothing() -> None:
    fleet = decode_fleet(2)
    config = CoreConfig(roles={Role.DECODE: hpa_role(forecast=ForecastConfig(method=ForecastMethod.HOLT))})
    fleet.publish_all(0.0, Load(decode=300))
    _, decisions = step(CoreState(), fleet.observe(0.0), 0.0, config)
    d = only(decisions)
    assert Reason.FORECAST_NO_DATA in d.reasons
    assert d.stage(Stage.FORECAST).replicas == d.recommended_replicas  # type: ignore[union-attr]


def test_observation_is_cheap_to_build_and_round_trips() -> None:
    fleet = decode_fleet(2)
    fleet.publish_all(0.0, Load(decode=5))
    obs = fleet.observe(0.0, {Role.DECODE: Traffic(request_rate_per_s=float("nan"))})
    assert isinstance(obs, Observation)
    assert Traffic(request_rate_per_s=float("nan"), isl_tokens=-3).clean() == Traffic()
    _, decisions = step(CoreState(), obs, 0.0, hpa_config())
    assert only(decisions).inputs.request_rate_per_s is None


def test_a_service_whose_workers_disagree_on_the_role_takes_the_lowest_worker_ids_role() -> None:
    fleet = Fleet()
    fleet.add("z-worker", Role.PREFILL, "mixed")
    fleet.add("a-worker", Role.DECODE, "mixed")
    fleet.deploy("mixed", 2)
    _, decisions = step(CoreState(), fleet.observe(0.0), 0.0, hpa_config())
    assert only(decisions, "mixed").role == Role.DECODE


def test_an_action_the_deployment_never_took_does_not_count_against_the_rate_limits() -> None:
    # Advisory mode (or a failed write): the deployment stays at 4; every tick still advises 4 -> 8.
    fleet = decode_fleet()
    state = CoreState()
    finals = []
    for t in (0.0, 5.0, 10.0):
        fleet.publish_all(t, Load(decode=50, queued_decode=8))
        state, decisions = step(state, fleet.observe(t), t, hpa_config())
        finals.append((only(decisions).action, only(decisions).final_replicas))
    assert finals == [(Action.SCALE_UP, 8)] * 3


def test_an_action_the_deployment_took_counts_against_the_rate_limits() -> None:
    fleet = decode_fleet(2)
    state = CoreState()
    fleet.publish_all(0.0, Load(decode=50, queued_decode=20))
    state, decisions = step(state, fleet.observe(0.0), 0.0, hpa_config())
    assert only(decisions).final_replicas == 6
    fleet.deploy("decode", 6)
    fleet.publish_all(5.0, Load(decode=50, queued_decode=20))
    _, decisions = step(state, fleet.observe(5.0), 5.0, hpa_config())
    d = only(decisions)
    assert d.final_replicas == 6 and Reason.SCALE_UP_RATE_LIMITED in d.reasons

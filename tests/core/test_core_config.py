"""Decision-core configuration: HPA defaults, validation when built, exact errors, bounds replaced at run time."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from planner.core import (
    Bounds,
    CoreConfig,
    CoreConfigError,
    ForecastConfig,
    ForecastMethod,
    PolicyKind,
    RoleBounds,
    RoleConfig,
    ScalingPolicy,
    SlaTargets,
    ThresholdConfig,
    load_config,
)
from planner.core.config import hpa_scale_down, hpa_scale_up
from planner.discovery import Role
from planner.errors import ConfigError


def test_defaults_are_the_shipped_configuration() -> None:
    """One shipped default (issue 13 item 6): what the replay's "ours", the service and the demo run with."""
    rc = CoreConfig().role(Role.DECODE)
    assert rc.scale_up.stabilization_window_s == 0
    assert [(p.kind, p.value, p.period_s) for p in rc.scale_up.policies] == [(PolicyKind.PERCENT, 900.0, 15.0)]
    assert rc.scale_down.stabilization_window_s == 120 and rc.scale_down_window_startups == 2.0
    assert [(p.kind, p.value, p.period_s) for p in rc.scale_down.policies] == [(PolicyKind.PERCENT, 100.0, 15.0)]
    assert rc.forecast.method == ForecastMethod.HOLT and rc.forecast.horizon_s == 60.0
    assert rc.itl_headroom_frac is None and rc.headroom_frac == 0.0 and rc.sla_feedback.enabled
    assert rc.startup_s == 60.0
    assert set(CoreConfig().roles) == set(Role)


def test_hpa_behaviour_stays_available() -> None:
    up, down = hpa_scale_up(), hpa_scale_down()
    assert {(p.kind, p.value, p.period_s) for p in up.policies} == {
        (PolicyKind.PERCENT, 100.0, 15.0),
        (PolicyKind.REPLICAS, 4.0, 15.0),
    }
    assert down.stabilization_window_s == 300


BAD: list[tuple[str, dict[str, Any], str]] = [
    ("min above max", {"roles": {"decode": {"min_replicas": 5, "max_replicas": 2}}}, "min_replicas"),
    ("negative gpus", {"roles": {"prefill": {"gpus_per_replica": -1}}}, "gpus_per_replica"),
    ("unknown field", {"roles": {"decode": {"max_replica": 3}}}, "max_replica"),
    ("unknown top-level field", {"gpu_budget": 3}, "gpu_budget"),
    ("unknown role", {"roles": {"encode": {}}}, "encode"),
    ("zero ttft target", {"roles": {"agg": {"sla": {"ttft_ms": 0}}}}, "ttft_ms"),
    ("NaN threshold", {"roles": {"agg": {"threshold": {"kv_usage_frac": float("nan")}}}}, "kv_usage_frac"),
    ("tolerance of 1", {"roles": {"agg": {"threshold": {"tolerance_frac": 1.0}}}}, "tolerance_frac"),
    (
        "negative window",
        {"roles": {"agg": {"scale_down": {"stabilization_window_s": -1, "policies": []}}}},
        "stabilization_window_s",
    ),
    ("empty policies", {"roles": {"agg": {"scale_up": {"stabilization_window_s": 0, "policies": []}}}}, "policies"),
    (
        "zero period",
        {
            "roles": {
                "agg": {
                    "scale_up": {
                        "stabilization_window_s": 0,
                        "policies": [{"kind": "percent", "value": 100, "period_s": 0}],
                    }
                }
            }
        },
        "period_s",
    ),
    ("unknown forecast method", {"roles": {"agg": {"forecast": {"method": "prophet"}}}}, "prophet"),
    ("negative budget", {"max_total_gpus": -1}, "max_total_gpus"),
    ("string for a number", {"roles": {"decode": {"min_replicas": "two"}}}, "min_replicas"),
]


@pytest.mark.parametrize(("name", "data", "needle"), BAD, ids=[b[0] for b in BAD])
def test_bad_config_is_refused_naming_the_field(name: str, data: dict[str, Any], needle: str) -> None:
    with pytest.raises(CoreConfigError) as info:
        load_config(data)
    assert needle in str(info.value)
    assert isinstance(info.value, ConfigError)


def test_structs_validate_when_built_directly() -> None:
    for build in (
        lambda: RoleConfig(min_replicas=-1),
        lambda: SlaTargets(itl_ms=float("inf")),
        lambda: ThresholdConfig(queued_prefill_tokens_per_engine=0),
        lambda: ScalingPolicy(kind=PolicyKind.PERCENT, value=-5, period_s=15),
        lambda: ForecastConfig(alpha=0),
        lambda: RoleBounds(min_replicas=3, max_replicas=1),
        lambda: CoreConfig(max_total_gpus=-2),
    ):
        with pytest.raises(CoreConfigError):
            build()


def test_a_valid_config_round_trips_through_json() -> None:
    config = load_config(
        {
            "roles": {"decode": {"min_replicas": 2, "max_replicas": 9, "mode": "sla", "forecast": {"method": "holt"}}},
            "max_total_gpus": 16,
        }
    )
    assert config.role(Role.DECODE).min_replicas == 2 and config.max_total_gpus == 16
    assert config.role(Role.PREFILL) == RoleConfig()
    again = msgspec.json.decode(msgspec.json.encode(config), type=CoreConfig)
    assert again == config


def test_bounds_are_replaced_between_ticks_without_touching_the_rest() -> None:
    config = load_config({"roles": {"decode": {"max_replicas": 9, "gpus_per_replica": 2}}})
    bounds = config.bounds()
    assert bounds.roles[Role.DECODE] == RoleBounds(min_replicas=1, max_replicas=9)
    new = config.with_bounds(Bounds(roles={Role.DECODE: RoleBounds(min_replicas=3, max_replicas=4)}, max_total_gpus=12))
    assert new.role(Role.DECODE).min_replicas == 3 and new.role(Role.DECODE).max_replicas == 4
    assert new.role(Role.DECODE).gpus_per_replica == 2
    assert new.role(Role.PREFILL) == config.role(Role.PREFILL)
    assert new.max_total_gpus == 12 and config.max_total_gpus is None
    assert msgspec.json.decode(msgspec.json.encode(new.bounds()), type=Bounds) == new.bounds()


def test_building_a_config_leaves_the_callers_dict_alone() -> None:
    roles = {Role.DECODE: RoleConfig(max_replicas=3)}
    config = CoreConfig(roles=roles)
    assert list(roles) == [Role.DECODE]
    assert set(config.roles) == set(Role) and config.role(Role.DECODE).max_replicas == 3

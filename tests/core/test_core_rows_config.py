"""Config validation at its edges, one row per field: the last value accepted and the first refused on each side
(the mutation run showed ``>`` / ``>=`` swaps surviving where only far-off values were tried)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pytest

from planner.core import (
    Bounds,
    CoreConfig,
    CoreConfigError,
    ForecastConfig,
    PolicyKind,
    RoleBounds,
    RoleConfig,
    ScaleRules,
    ScalingPolicy,
    SelectPolicy,
    SlaTargets,
    ThresholdConfig,
)
from planner.core.config import SlaFeedbackConfig, hpa_scale_down, hpa_scale_up
from planner.discovery import Role

INF, NAN = math.inf, math.nan
POLICY = {"kind": PolicyKind.PERCENT, "value": 50.0, "period_s": 15.0}
ONE_POLICY = (ScalingPolicy(kind=PolicyKind.REPLICAS, value=1.0, period_s=15.0),)


@dataclass
class Row:
    build: type[Any]
    field: str
    accepted: tuple[Any, ...]
    refused: tuple[Any, ...]
    base: dict[str, Any] | None = None

    @property
    def name(self) -> str:
        return f"{self.build.__name__}.{self.field}"


ROWS = [
    Row(ScalingPolicy, "value", (1e-9, 1.0), (0.0, -1.0, INF, NAN), POLICY),
    Row(ScalingPolicy, "period_s", (1e-9,), (0.0, -1.0, INF, NAN), POLICY),
    Row(ScaleRules, "stabilization_window_s", (0.0, 1e-9), (-1e-9, INF, NAN), {"policies": ONE_POLICY}),
    Row(SlaTargets, "ttft_ms", (1e-9,), (0.0, -1.0, INF, NAN)),
    Row(SlaTargets, "itl_ms", (1e-9,), (0.0, -1.0, INF, NAN)),
    Row(ThresholdConfig, "queued_prefill_tokens_per_engine", (1e-9,), (0.0, INF, NAN)),
    Row(ThresholdConfig, "prefill_budget_frac", (1e-9,), (0.0, INF, NAN)),
    Row(ThresholdConfig, "kv_usage_frac", (1e-9,), (0.0, INF, NAN)),
    Row(ThresholdConfig, "decode_seq_frac", (1e-9,), (0.0, INF, NAN)),
    Row(ThresholdConfig, "queued_decode_requests_per_engine", (1e-9,), (0.0, INF, NAN)),
    Row(ThresholdConfig, "tolerance_frac", (0.0, 0.999), (-1e-9, 1.0)),
    Row(ForecastConfig, "horizon_s", (0.0,), (-1e-9, INF, NAN)),
    Row(ForecastConfig, "history_s", (1e-9,), (0.0, INF, NAN)),
    Row(ForecastConfig, "alpha", (1e-9, 1.0), (0.0, 1.0 + 1e-9)),
    Row(ForecastConfig, "beta", (0.0, 1.0), (-1e-9, 1.0 + 1e-9)),
    Row(ForecastConfig, "process_noise", (1e-9,), (0.0, INF, NAN)),
    Row(ForecastConfig, "measurement_noise", (1e-9,), (0.0, INF, NAN)),
    Row(ForecastConfig, "replica_capacity_rps", (None, 1e-9), (0.0, INF, NAN)),
    Row(SlaFeedbackConfig, "attainment_goal", (1e-9, 1.0), (0.0, 1.0 + 1e-9)),
    Row(SlaFeedbackConfig, "gain_per_s", (0.0,), (-1e-9, INF, NAN)),
    Row(SlaFeedbackConfig, "relax_gain_ratio", (0.0, 1.0), (-1e-9, 1.0 + 1e-9)),
    Row(SlaFeedbackConfig, "min_samples", (1,), (0,)),
    Row(SlaFeedbackConfig, "max_tighten_frac", (0.0, 0.999), (-1e-9, 1.0)),
    Row(SlaFeedbackConfig, "max_relax_frac", (0.0, 0.999), (-1e-9, 1.0)),
    Row(SlaFeedbackConfig, "decay_s", (1e-9,), (0.0, INF, NAN)),
    Row(SlaFeedbackConfig, "max_step_s", (1e-9,), (0.0, INF, NAN)),
    Row(RoleBounds, "min_replicas", (0, 64), (-1, 65)),
    Row(RoleBounds, "max_replicas", (1, 10**6), (0,)),
    Row(Bounds, "max_total_gpus", (None, 0, 8), (-1,)),
    Row(CoreConfig, "max_total_gpus", (None, 0, 8), (-1,)),
    Row(RoleConfig, "min_replicas", (0, 64), (-1, 65)),
    Row(RoleConfig, "gpus_per_replica", (0, 8), (-1,)),
    Row(RoleConfig, "pending_timeout_s", (0.0,), (-1e-9, INF, NAN)),
    Row(RoleConfig, "headroom_frac", (0.0, 0.999), (-1e-9, 1.0)),
    Row(RoleConfig, "itl_headroom_frac", (None, 0.0, 0.999), (-1e-9, 1.0)),
    Row(RoleConfig, "default_max_num_batched_tokens", (1,), (0,)),
    Row(RoleConfig, "scale_down_window_startups", (None, 0.0), (-1e-9, INF, NAN)),
    Row(RoleConfig, "hold_across_gaps_max_s", (None, 0.0), (-1e-9, INF, NAN)),
    Row(RoleConfig, "in_flight_raise_rate_growth_frac", (None, 1e-9), (0.0, INF, NAN)),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_field_edges(row: Row) -> None:
    base = row.base or {}
    for value in row.accepted:
        assert getattr(row.build(**{**base, row.field: value}), row.field) == value
    for value in row.refused:
        with pytest.raises(CoreConfigError, match=row.field):  # the message names the field
            row.build(**{**base, row.field: value})


@pytest.mark.parametrize(
    ("actuator", "ok"),
    [((5, 9), True), ((6, 9), False), ((0, 2), True), ((0, 1), False), ((3, 4), True)],
    ids=["touching above", "above", "touching below", "below", "inside"],
)
def test_actuator_bounds_must_intersect_the_own_ones(actuator: tuple[int, int], ok: bool) -> None:
    bounds = RoleBounds(min_replicas=actuator[0], max_replicas=actuator[1])
    if ok:
        config = RoleConfig(min_replicas=2, max_replicas=5, actuator_bounds=bounds)
        effective = config.effective_bounds
        assert (effective.min_replicas, effective.max_replicas) == (max(2, actuator[0]), min(5, actuator[1]))
    else:
        message = rf"bounds \[2, 5\] do not intersect the actuator's \[{actuator[0]}, {actuator[1]}\]"
        with pytest.raises(CoreConfigError, match=message):
            RoleConfig(min_replicas=2, max_replicas=5, actuator_bounds=bounds)


def test_a_direction_without_policies_must_be_disabled() -> None:
    assert ScaleRules(stabilization_window_s=0.0, policies=(), select=SelectPolicy.DISABLED).policies == ()
    for select in (SelectPolicy.MAX, SelectPolicy.MIN):
        with pytest.raises(CoreConfigError, match="policies must not be empty"):
            ScaleRules(stabilization_window_s=0.0, policies=(), select=select)


def test_with_bounds_replaces_only_the_roles_it_names() -> None:
    config = CoreConfig(roles={Role.DECODE: RoleConfig(min_replicas=2, max_replicas=9, gpus_per_replica=4)})
    changed = config.with_bounds(
        Bounds(roles={Role.DECODE: RoleBounds(min_replicas=3, max_replicas=4)}, max_total_gpus=16)
    )
    assert (changed.role(Role.DECODE).min_replicas, changed.role(Role.DECODE).max_replicas) == (3, 4)
    assert changed.role(Role.DECODE).gpus_per_replica == 4
    assert changed.role(Role.PREFILL) == config.role(Role.PREFILL)
    assert changed.max_total_gpus == 16
    assert changed.bounds().roles[Role.DECODE] == RoleBounds(min_replicas=3, max_replicas=4)


def test_hpa_defaults_and_roles_left_out() -> None:
    assert hpa_scale_up() == ScaleRules(
        stabilization_window_s=0.0,
        policies=(
            ScalingPolicy(kind=PolicyKind.PERCENT, value=100.0, period_s=15.0),
            ScalingPolicy(kind=PolicyKind.REPLICAS, value=4.0, period_s=15.0),
        ),
    )
    assert hpa_scale_down() == ScaleRules(
        stabilization_window_s=300.0, policies=(ScalingPolicy(kind=PolicyKind.PERCENT, value=100.0, period_s=15.0),)
    )
    assert set(CoreConfig(roles={}).roles) == set(Role)
    assert set(CoreConfig(roles={Role.DECODE: RoleConfig(max_replicas=3)}).roles) == set(Role)

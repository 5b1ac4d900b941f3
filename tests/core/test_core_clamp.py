"""HPA semantics of the clamps, one row per case: bounds, rate limits, stabilization windows, GPU budget."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from planner.core import PolicyKind, Reason, ScaleRules, ScalingPolicy, SelectPolicy
from planner.core.clamp import BudgetAsk, apply_bounds, apply_gpu_budget, rate_limit, stabilize
from planner.core.config import hpa_scale_down, hpa_scale_up

UP = hpa_scale_up()  # max(+100%, +4) per 15 s
DOWN = hpa_scale_down()  # -100% per 15 s, 300 s window


@dataclass
class RateRow:
    name: str
    value: int
    current: int
    events: tuple[tuple[float, int], ...]
    expected: int
    reason: Reason | None
    up: ScaleRules = UP
    down: ScaleRules = DOWN


RATE_ROWS = [
    RateRow("scale up from 2 is limited to +4 (more than +100%)", 20, 2, (), 6, Reason.SCALE_UP_RATE_LIMITED),
    RateRow("scale up from 10 is limited to +100%", 50, 10, (), 20, Reason.SCALE_UP_RATE_LIMITED),
    RateRow("scale up inside the limit passes", 5, 3, (), 5, None),
    RateRow(
        "a scale-up 10 s ago uses up this period (2 -> 6 already)", 20, 6, ((95.0, 4),), 6, Reason.SCALE_UP_RATE_LIMITED
    ),
    RateRow(
        "a scale-up exactly one period ago no longer counts", 20, 6, ((85.0, 4),), 12, Reason.SCALE_UP_RATE_LIMITED
    ),
    RateRow(
        "scale up from zero is allowed even with a percent-only policy",
        3,
        0,
        (),
        1,
        Reason.SCALE_UP_RATE_LIMITED,
        up=ScaleRules(
            stabilization_window_s=0, policies=(ScalingPolicy(kind=PolicyKind.PERCENT, value=100, period_s=15),)
        ),
    ),
    RateRow("scale down by 100% per period may go straight to the target", 1, 10, (), 1, None),
    RateRow(
        "a scale-down policy of 2 replicas per 60 s limits the step",
        1,
        10,
        (),
        8,
        Reason.SCALE_DOWN_RATE_LIMITED,
        down=ScaleRules(
            stabilization_window_s=0, policies=(ScalingPolicy(kind=PolicyKind.REPLICAS, value=2, period_s=60),)
        ),
    ),
    RateRow(
        "a scale-down already made this period counts against it",
        1,
        8,
        ((70.0, -2),),
        8,
        Reason.SCALE_DOWN_RATE_LIMITED,
        down=ScaleRules(
            stabilization_window_s=0, policies=(ScalingPolicy(kind=PolicyKind.REPLICAS, value=2, period_s=60),)
        ),
    ),
    RateRow(
        "select min picks the smaller change",
        50,
        10,
        (),
        14,
        Reason.SCALE_UP_RATE_LIMITED,
        up=ScaleRules(stabilization_window_s=0, policies=UP.policies, select=SelectPolicy.MIN),
    ),
    RateRow(
        "a disabled direction never moves",
        50,
        10,
        (),
        10,
        Reason.SCALE_UP_RATE_LIMITED,
        up=ScaleRules(stabilization_window_s=0, policies=(), select=SelectPolicy.DISABLED),
    ),
]


@pytest.mark.parametrize("row", RATE_ROWS, ids=[r.name for r in RATE_ROWS])
def test_rate_limit(row: RateRow) -> None:
    out = rate_limit(row.value, row.current, row.events, 100.0, row.up, row.down)
    assert (out.replicas, out.reason) == (row.expected, row.reason)


@dataclass
class StabilizeRow:
    name: str
    value: int
    current: int
    recommendations: tuple[tuple[float, int], ...]
    expected: int
    up_window_s: float = 0.0
    down_window_s: float = 300.0


STABILIZE_ROWS = [
    StabilizeRow(
        "scale down waits for the highest recommendation of the window", 2, 8, ((0.0, 9), (200.0, 6), (400.0, 2)), 6
    ),
    StabilizeRow(
        "a recommendation older than the window no longer holds it", 2, 8, ((0.0, 9), (100.0, 6), (400.0, 2)), 2
    ),
    StabilizeRow("stabilization never raises past the current count", 2, 5, ((200.0, 9), (400.0, 2)), 5),
    StabilizeRow("scale up is immediate with the default 0 s window", 9, 5, ((390.0, 3), (400.0, 9)), 9),
    StabilizeRow(
        "a scale-up window takes the lowest recommendation in it",
        9,
        5,
        ((350.0, 7), (390.0, 8), (400.0, 9)),
        7,
        up_window_s=60,
    ),
    StabilizeRow("holding stays holding", 5, 5, ((300.0, 9), (400.0, 5)), 5),
]


@pytest.mark.parametrize("row", STABILIZE_ROWS, ids=[r.name for r in STABILIZE_ROWS])
def test_stabilize(row: StabilizeRow) -> None:
    out = stabilize(row.value, row.current, row.recommendations, 400.0, row.up_window_s, row.down_window_s)
    assert out.replicas == row.expected
    assert (out.reason is not None) == (row.expected != row.value)


def test_bounds_raise_to_min_and_lower_to_max() -> None:
    assert apply_bounds(0, 2, 10).replicas == 2 and apply_bounds(0, 2, 10).reason == Reason.CLAMPED_TO_MIN
    assert apply_bounds(11, 2, 10).replicas == 10 and apply_bounds(11, 2, 10).reason == Reason.CLAMPED_TO_MAX
    assert apply_bounds(5, 2, 10).reason is None


@dataclass
class BudgetRow:
    name: str
    asks: tuple[BudgetAsk, ...]
    budget: int | None
    expected: dict[str, int]
    reasons: dict[str, Reason | None]


def ask(key: str, current: int, wanted: int, gpus: int = 1) -> BudgetAsk:
    return BudgetAsk(key=key, current=current, wanted=wanted, gpus_per_replica=gpus)


BUDGET_ROWS = [
    BudgetRow("no budget: everything passes", (ask("a", 2, 9),), None, {"a": 9}, {"a": None}),
    BudgetRow(
        "a full budget holds a scale-up where it is",
        (ask("a", 2, 4, 2), ask("b", 4, 8)),
        8,
        {"a": 2, "b": 4},
        {"a": Reason.GPU_BUDGET_EXHAUSTED, "b": Reason.GPU_BUDGET_EXHAUSTED},
    ),
    BudgetRow(
        "two scale-ups share what is left, one replica at a time",
        (ask("a", 2, 9), ask("b", 2, 9)),
        8,
        {"a": 4, "b": 4},
        {"a": Reason.GPU_BUDGET_LIMITED, "b": Reason.GPU_BUDGET_LIMITED},
    ),
    BudgetRow(
        "a scale-down elsewhere frees GPUs in the same tick",
        (ask("a", 6, 2), ask("b", 2, 6)),
        8,
        {"a": 2, "b": 6},
        {"a": None, "b": None},
    ),
    BudgetRow(
        "over budget already: a scale-up becomes a hold, never a scale-down",
        (ask("a", 10, 12),),
        4,
        {"a": 10},
        {"a": Reason.GPU_BUDGET_EXHAUSTED},
    ),
    BudgetRow("over budget already: a scale-down still happens", (ask("a", 10, 7),), 4, {"a": 7}, {"a": None}),
    BudgetRow("replicas without GPUs are not limited", (ask("a", 1, 5, 0),), 0, {"a": 5}, {"a": None}),
]


@pytest.mark.parametrize("row", BUDGET_ROWS, ids=[r.name for r in BUDGET_ROWS])
def test_gpu_budget(row: BudgetRow) -> None:
    out = apply_gpu_budget(row.asks, row.budget)
    assert {k: v.replicas for k, v in out.items()} == row.expected
    assert {k: v.reason for k, v in out.items()} == row.reasons

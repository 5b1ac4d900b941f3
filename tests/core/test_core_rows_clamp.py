"""Clamp rows the mutation run showed missing: several scale-down policies with MAX / MIN / disabled selection,
percent policies whose result is not a whole number (floor down, ceil up), events at the period edge, the
stabilization windows' edges in both directions, and the actuator's bounds."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from planner.core import PolicyKind, Reason, RoleBounds, ScaleRules, ScalingPolicy, SelectPolicy
from planner.core.clamp import BudgetAsk, apply_bounds, apply_gpu_budget, rate_limit, stabilize
from planner.core.config import hpa_scale_down, hpa_scale_up

NOW = 100.0
UP = hpa_scale_up()  # max(+100 %, +4) per 15 s
DOWN = hpa_scale_down()  # -100 % per 15 s, 300 s window


def rules(*policies: tuple[PolicyKind, float, float], select: SelectPolicy = SelectPolicy.MAX) -> ScaleRules:
    return ScaleRules(
        stabilization_window_s=0.0,
        policies=tuple(ScalingPolicy(kind=k, value=v, period_s=p) for k, v, p in policies),
        select=select,
    )


PCT, REP = PolicyKind.PERCENT, PolicyKind.REPLICAS
HALF_OR_ONE = ((PCT, 50.0, 60.0), (REP, 1.0, 60.0))  # -50 % or -1 replica per 60 s


@dataclass
class Row:
    name: str
    value: int
    current: int
    events: tuple[tuple[float, int], ...]
    expected: int
    reason: Reason | None
    up: ScaleRules = UP
    down: ScaleRules = DOWN


DOWN_ROWS = [
    Row(
        "scale down, two policies, select max: the policy allowing the larger drop wins (10 -> 5, not 9)",
        1,
        10,
        (),
        5,
        Reason.SCALE_DOWN_RATE_LIMITED,
        down=rules(*HALF_OR_ONE),
    ),
    Row(
        "scale down, two policies, select min: the policy allowing the smaller drop wins (10 -> 9)",
        1,
        10,
        (),
        9,
        Reason.SCALE_DOWN_RATE_LIMITED,
        down=rules(*HALF_OR_ONE, select=SelectPolicy.MIN),
    ),
    Row(
        "scale down disabled: the count holds whatever the policies say",
        1,
        10,
        (),
        10,
        Reason.SCALE_DOWN_RATE_LIMITED,
        down=rules(*HALF_OR_ONE, select=SelectPolicy.DISABLED),
    ),
    Row(
        "scale down by 50 % from 5 floors to 2 (never rounds the limit up to 3)",
        1,
        5,
        (),
        2,
        Reason.SCALE_DOWN_RATE_LIMITED,
        down=rules((PCT, 50.0, 60.0)),
    ),
    Row(
        "scale down by 30 % from 7 floors to 4",
        0,
        7,
        (),
        4,
        Reason.SCALE_DOWN_RATE_LIMITED,
        down=rules((PCT, 30.0, 60.0)),
    ),
    Row(
        "a percent scale-down counts from the start of its period (10), not from now (6)",
        1,
        6,
        ((70.0, -4),),
        5,
        Reason.SCALE_DOWN_RATE_LIMITED,
        down=rules((PCT, 50.0, 60.0)),
    ),
    Row(
        "a scale-down exactly one period ago no longer counts",
        1,
        6,
        ((40.0, -4),),
        3,
        Reason.SCALE_DOWN_RATE_LIMITED,
        down=rules((PCT, 50.0, 60.0)),
    ),
    Row(
        "scale-ups in the period do not count as removed replicas",
        1,
        10,
        ((80.0, 3), (90.0, -1)),
        7,
        Reason.SCALE_DOWN_RATE_LIMITED,
        down=rules((REP, 4.0, 60.0)),
    ),
    Row(
        "a spent period holds a scale-down at the current count, never raises it (limit 5 > current 2)",
        1,
        2,
        ((90.0, -8),),
        2,
        Reason.SCALE_DOWN_RATE_LIMITED,
        down=rules((PCT, 50.0, 60.0)),
    ),
    Row(
        "a replicas policy larger than the fleet lets it reach zero",
        0,
        10,
        (),
        0,
        None,
        down=rules((REP, 20.0, 60.0)),
    ),
    Row(
        "a fractional replicas value floors (2.9 allows 2)",
        0,
        10,
        (),
        8,
        Reason.SCALE_DOWN_RATE_LIMITED,
        down=rules((REP, 2.9, 60.0)),
    ),
    Row(
        "scale down by 60 % from 200 is exactly 80",
        0,
        200,
        (),
        80,
        Reason.SCALE_DOWN_RATE_LIMITED,
        down=rules((PCT, 60.0, 60.0)),
    ),
    Row("a scale-down inside the limit passes with no reason", 6, 10, (), 6, None, down=rules(*HALF_OR_ONE)),
    Row("a scale-down exactly to the limit passes with no reason", 5, 10, (), 5, None, down=rules(*HALF_OR_ONE)),
]

UP_ROWS = [
    Row(
        "scale up by 50 % from 5 ceils to 8 (never rounds the limit down to 7)",
        20,
        5,
        (),
        8,
        Reason.SCALE_UP_RATE_LIMITED,
        up=rules((PCT, 50.0, 60.0)),
    ),
    Row(
        "scale up, two policies, select max: +100 % of 3 beats +1",
        20,
        3,
        (),
        6,
        Reason.SCALE_UP_RATE_LIMITED,
        up=rules((PCT, 100.0, 60.0), (REP, 1.0, 60.0)),
    ),
    Row(
        "scale up, two policies, select min: +1 beats +100 % of 3",
        20,
        3,
        (),
        4,
        Reason.SCALE_UP_RATE_LIMITED,
        up=rules((PCT, 100.0, 60.0), (REP, 1.0, 60.0), select=SelectPolicy.MIN),
    ),
    Row(
        "a percent scale-up counts from the start of its period (4), not from now (6)",
        20,
        6,
        ((70.0, 2),),
        8,
        Reason.SCALE_UP_RATE_LIMITED,
        up=rules((PCT, 100.0, 60.0)),
    ),
    Row(
        "scale-downs in the period do not count as added replicas",
        20,
        6,
        ((70.0, -2), (80.0, 1)),
        7,
        Reason.SCALE_UP_RATE_LIMITED,
        up=rules((REP, 2.0, 60.0)),
    ),
    Row(
        "a scale-up exactly one period ago no longer counts",
        20,
        6,
        ((40.0, 2),),
        8,
        Reason.SCALE_UP_RATE_LIMITED,
        up=rules((REP, 2.0, 60.0)),
    ),
    Row(
        "a spent period holds a scale-up at the current count, never lowers it",
        20,
        6,
        ((90.0, 5),),
        6,
        Reason.SCALE_UP_RATE_LIMITED,
        up=rules((REP, 2.0, 60.0)),
    ),
    Row(
        "from zero a percent policy still allows one replica, a replicas policy its value",
        9,
        0,
        (),
        3,
        Reason.SCALE_UP_RATE_LIMITED,
        up=rules((PCT, 50.0, 60.0), (REP, 3.0, 60.0)),
    ),
    Row(
        "from zero, select min: the percent policy's one replica",
        9,
        0,
        (),
        1,
        Reason.SCALE_UP_RATE_LIMITED,
        up=rules((PCT, 50.0, 60.0), (REP, 3.0, 60.0), select=SelectPolicy.MIN),
    ),
    Row(
        "scale up by 200 % from 100 is exactly 300",
        1000,
        100,
        (),
        300,
        Reason.SCALE_UP_RATE_LIMITED,
        up=rules((PCT, 200.0, 60.0)),
    ),
    Row("a scale-up exactly to the limit passes with no reason", 8, 4, (), 8, None),
    Row("holding is never rate limited", 4, 4, ((99.0, 4), (99.5, -4)), 4, None),
]


@pytest.mark.parametrize("row", DOWN_ROWS + UP_ROWS, ids=[r.name for r in DOWN_ROWS + UP_ROWS])
def test_rate_limit_rows(row: Row) -> None:
    out = rate_limit(row.value, row.current, row.events, NOW, row.up, row.down)
    assert (out.replicas, out.reason) == (row.expected, row.reason)
    direction = "scale-up" if row.value > row.current else "scale-down"
    assert out.detail == (
        f"{direction} to {row.value} limited to {row.expected} by the {direction} policies" if row.reason else ""
    )


@dataclass
class StabilizeRow:
    name: str
    value: int
    current: int
    recommendations: tuple[tuple[float, int], ...]
    expected: int
    reason: Reason | None
    up_window_s: float = 60.0
    down_window_s: float = 60.0


STABILIZE_ROWS = [
    StabilizeRow(
        "a scale-up recommendation exactly one up-window old no longer caps it", 9, 5, ((340.0, 6), (400.0, 9)), 9, None
    ),
    StabilizeRow(
        "a scale-up recommendation just inside the up-window caps it",
        9,
        5,
        ((340.5, 6), (400.0, 9)),
        6,
        Reason.SCALE_UP_STABILIZED,
    ),
    StabilizeRow(
        "a scale-up is never stabilized below the current count",
        9,
        5,
        ((390.0, 3), (400.0, 9)),
        5,
        Reason.SCALE_UP_STABILIZED,
    ),
    StabilizeRow(
        "a scale-down recommendation exactly one down-window old no longer holds it",
        2,
        8,
        ((340.0, 7), (400.0, 2)),
        2,
        None,
    ),
    StabilizeRow(
        "a scale-down recommendation just inside the down-window holds it",
        2,
        8,
        ((340.5, 7), (400.0, 2)),
        7,
        Reason.SCALE_DOWN_STABILIZED,
    ),
    StabilizeRow(
        "the up-window applies to scale-ups only (a long down-window does not cap one)",
        9,
        5,
        ((100.0, 6), (400.0, 9)),
        9,
        None,
        up_window_s=60.0,
        down_window_s=600.0,
    ),
    StabilizeRow(
        "the down-window applies to scale-downs only (a long up-window does not hold one)",
        2,
        8,
        ((100.0, 7), (400.0, 2)),
        2,
        None,
        up_window_s=600.0,
        down_window_s=60.0,
    ),
    StabilizeRow("no recommendation in the window: the value passes", 2, 8, (), 2, None),
]


@pytest.mark.parametrize("row", STABILIZE_ROWS, ids=[r.name for r in STABILIZE_ROWS])
def test_stabilize_rows(row: StabilizeRow) -> None:
    out = stabilize(row.value, row.current, row.recommendations, 400.0, row.up_window_s, row.down_window_s)
    assert (out.replicas, out.reason) == (row.expected, row.reason)


def test_stabilize_details_name_the_window_and_the_recommendation() -> None:
    down = stabilize(2, 8, ((390.0, 7), (400.0, 2)), 400.0, 0.0, 300.0)
    up = stabilize(9, 5, ((390.0, 6), (400.0, 9)), 400.0, 120.0, 0.0)
    assert down.detail == "highest recommendation in the last 300 s is 7"
    assert up.detail == "lowest recommendation in the last 120 s is 6"


def test_the_hold_across_gaps_names_its_window_the_highest_recommendation_and_the_count_bought_back() -> None:
    # the 120 s window's highest is 3; over the 600 s hold the highest is 9, held up to the 6 bought back
    out = stabilize(2, 8, ((100.0, 9), (390.0, 3), (400.0, 2)), 400.0, 0.0, 120.0, gap_hold=(600.0, 6))
    assert (out.replicas, out.reason) == (6, Reason.SCALE_DOWN_HELD_ACROSS_GAPS)
    assert out.detail == (
        "highest recommendation in the last 600 s is 9, held up to 6, the most the traffic bought back in the last"
        " 30 minutes"
    )


def test_the_hold_across_gaps_looks_back_over_the_checked_recommendations_when_given() -> None:
    # the recommendations peaked at 9 (a floor's whole trend at a new high); checked against what came, at 5
    recs = ((100.0, 9), (390.0, 3), (400.0, 2))
    checked = ((100.0, 5), (390.0, 3), (400.0, 2))
    out = stabilize(2, 8, recs, 400.0, 0.0, 120.0, gap_hold=(600.0, 6), held_recommendations=checked)
    assert (out.replicas, out.reason) == (5, Reason.SCALE_DOWN_HELD_ACROSS_GAPS)
    assert out.detail == (
        "highest recommendation (forecast trends checked against what came) in the last 600 s is 5, held up to 6,"
        " the most the traffic bought back in the last 30 minutes"
    )


@dataclass
class BoundsRow:
    name: str
    value: int
    actuator: RoleBounds | None
    expected: int
    reason: Reason | None


BOUNDS_ROWS = [
    BoundsRow("inside both bounds passes", 5, RoleBounds(min_replicas=1, max_replicas=8), 5, None),
    BoundsRow(
        "above the actuator's max is capped to it",
        9,
        RoleBounds(min_replicas=1, max_replicas=8),
        8,
        Reason.CAPPED_BY_ACTUATOR_BOUNDS,
    ),
    BoundsRow(
        "below the actuator's min is raised to it",
        3,
        RoleBounds(min_replicas=4, max_replicas=8),
        4,
        Reason.CAPPED_BY_ACTUATOR_BOUNDS,
    ),
    BoundsRow("exactly the actuator's max passes", 8, RoleBounds(min_replicas=1, max_replicas=8), 8, None),
    BoundsRow("exactly the actuator's min passes", 4, RoleBounds(min_replicas=4, max_replicas=8), 4, None),
    BoundsRow("above the own max is lowered to it first", 30, None, 20, Reason.CLAMPED_TO_MAX),
    BoundsRow("exactly the own min passes", 2, None, 2, None),
    BoundsRow("exactly the own max passes", 20, None, 20, None),
    BoundsRow(
        "the own max, then the actuator's (20 -> 12)",
        30,
        RoleBounds(min_replicas=0, max_replicas=12),
        12,
        Reason.CAPPED_BY_ACTUATOR_BOUNDS,
    ),
]


@pytest.mark.parametrize("row", BOUNDS_ROWS, ids=[r.name for r in BOUNDS_ROWS])
def test_bounds_rows(row: BoundsRow) -> None:
    out = apply_bounds(row.value, 2, 20, row.actuator)
    assert (out.replicas, out.reason) == (row.expected, row.reason)


def test_bounds_details_say_what_moved_and_why() -> None:
    assert apply_bounds(0, 2, 20).detail == "0 raised to min_replicas 2"
    assert apply_bounds(30, 2, 20).detail == "30 lowered to max_replicas 20"
    capped = apply_bounds(30, 2, 20, RoleBounds(min_replicas=0, max_replicas=12))
    assert capped.detail == "30 capped to 12 by the actuator's bounds [0, 12]"


def ask(key: str, current: int, wanted: int, gpus: int = 1) -> BudgetAsk:
    return BudgetAsk(key=key, current=current, wanted=wanted, gpus_per_replica=gpus)


@dataclass
class BudgetRow:
    name: str
    asks: tuple[BudgetAsk, ...]
    budget: int
    expected: dict[str, tuple[int, Reason | None, str]]


BUDGET_ROWS = [
    BudgetRow(
        "a scale-up that is met stops taking GPUs; the next one gets the rest",
        (ask("a", 2, 3), ask("b", 2, 9)),
        10,
        {
            "a": (3, None, ""),
            "b": (7, Reason.GPU_BUDGET_LIMITED, "GPU budget 10 allows 7 of the 9 replicas asked"),
        },
    ),
    BudgetRow(
        "a met scale-up first in the list does not end the accounting of the others",
        (ask("a", 1, 2), ask("b", 1, 2), ask("c", 1, 5)),
        6,
        {
            "a": (2, None, ""),
            "b": (2, None, ""),
            "c": (2, Reason.GPU_BUDGET_LIMITED, "GPU budget 6 allows 2 of the 5 replicas asked"),
        },
    ),
    BudgetRow(
        "exhausted with a GPU left over that one replica cannot use",
        (ask("a", 4, 6, 2),),
        9,
        {
            "a": (
                4,
                Reason.GPU_BUDGET_EXHAUSTED,
                "GPU budget 9 exhausted (1 free, 2/replica): holding at 4 instead of 6",
            )
        },
    ),
    BudgetRow(
        "over budget already: nothing free",
        (ask("a", 10, 12),),
        4,
        {
            "a": (
                10,
                Reason.GPU_BUDGET_EXHAUSTED,
                "GPU budget 4 exhausted (0 free, 1/replica): holding at 10 instead of 12",
            )
        },
    ),
    BudgetRow(
        "holds and scale-downs count at their target, scale-ups at their current count",
        (ask("hold", 3, 3, 2), ask("down", 5, 2, 2), ask("up", 1, 4, 2)),
        16,
        {
            "hold": (3, None, ""),
            "down": (2, None, ""),
            "up": (3, Reason.GPU_BUDGET_LIMITED, "GPU budget 16 allows 3 of the 4 replicas asked"),
        },
    ),
]


@pytest.mark.parametrize("row", BUDGET_ROWS, ids=[r.name for r in BUDGET_ROWS])
def test_gpu_budget_rows(row: BudgetRow) -> None:
    out = apply_gpu_budget(row.asks, row.budget)
    assert {k: (v.replicas, v.reason, v.detail) for k, v in out.items()} == row.expected

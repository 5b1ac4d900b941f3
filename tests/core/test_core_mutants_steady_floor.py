"""Rows for planner/core/floor_stage.py's ``steady_floor`` (docs/testing.md, mutation testing): on a steady rate
the floor asks no more than the lowest of the forecast's floor, Holt's level over the derived capacity (rounded up)
and the model's count at the level, never below the load's count, and stands aside where that is the floor itself.

The decode service of tests/core/test_core_observed_batch_rate (2 H200 engines, 466 decodes running, 80 req/s seen
within the SLA): the model asks 3 replicas at Holt's level of 128 req/s (the Little's-law batch at 2 is past
max_num_seqs there). The rate was 130 req/s a minute ago, 128 now: within the noise, below its history's high."""

from __future__ import annotations

import pytest

from perf_model.model import PerfModel
from perf_model.step_timer import ProfileStepTimer
from planner.core.config import ForecastConfig
from planner.core.floor_stage import FloorInputs, model_count_at_level, steady_floor
from planner.core.forecast import ForecastState
from planner.discovery import Role
from tests.core.fleetkit import H200_PROFILE
from tests.core.test_core_observed_batch_rate import floor_inputs

LEVEL = 128.0
STEADY = ForecastState(history=((0.0, 130.0), (60.0, LEVEL)), last_at=60.0, holt_level=LEVEL)
HOLT = ForecastConfig()


@pytest.fixture(scope="module")
def inputs() -> FloorInputs:
    found = floor_inputs(PerfModel(Role.DECODE, bootstrap=ProfileStepTimer.from_dir(H200_PROFILE)))
    assert model_count_at_level(found, LEVEL) == 3
    return found


def test_the_level_over_the_capacity_caps_the_floor_below_the_models_count(inputs: FloorInputs) -> None:
    """Capacity 64 req/s a replica: the level needs exactly 2.0 replicas (2, not 3: an exact need is not rounded
    up a whole replica), below the model's 3: the floor of 4 is capped at 2, the load's count."""
    capped = steady_floor(inputs, STEADY, HOLT, 4, 2, LEVEL / 2.0)
    assert capped is not None
    assert capped[0] == 2
    assert capped[1] == (
        "the rate rose no more than 3 sd of its windows' request counts over the last 60 s, and the model meets"
        " the SLA at its level 128.00 req/s with 3 replicas -> floor 2"
    )


def test_the_models_count_caps_the_floor_where_the_capacity_asks_more(inputs: FloorInputs) -> None:
    """Capacity 32 req/s a replica: the level needs 4, the model 3: the floor of 5 is capped at 3."""
    capped = steady_floor(inputs, STEADY, HOLT, 5, 2, LEVEL / 4.0)
    assert capped is not None and capped[0] == 3


def test_no_cap_where_the_level_and_the_model_both_ask_the_floor(inputs: FloorInputs) -> None:
    """Capacity 32 req/s (the level needs 4), the model 3, the forecast's floor 3: nothing to lower, the steady
    rule stands aside (the derived floor's own stage names it)."""
    assert steady_floor(inputs, STEADY, HOLT, 3, 2, LEVEL / 4.0) is None

"""The forecast floor on a steady rate (issue 13, the cost of small fleets): when the rate has not risen over the
last ``horizon_s`` beyond the counting noise of its traffic windows and the load sets two replicas or more, the
floor asks no more than the model (with the closed loop's correction) asks at Holt's level, on every role
(reason ``forecast_steady_within_model``). The derived capacity (the highest rate / the load's count, decayed)
reads a count rounded up to a whole replica as a full one, so a level near the rate's recent high rounded the floor
one replica above the load, and the scale-down window held it: `surge_from_idle` aggregated ran 4 replicas through
its plateau where the load (and 3 replicas, measured) served 100 %."""

from __future__ import annotations

import re

import numpy as np
import pytest

from perf_model.model import PerfModel
from perf_model.step_timer import ProfileStepTimer
from planner.core import (
    CoreConfig,
    ForecastConfig,
    ForecastMethod,
    Mode,
    Reason,
    RoleConfig,
    SlaTargets,
    Traffic,
)
from planner.discovery import Role
from tests.core.fleetkit import H200_PROFILE, Fleet, Load

WINDOW_S = 10.0


@pytest.fixture(scope="module")
def agg_model() -> PerfModel:
    return PerfModel(Role.AGG, bootstrap=ProfileStepTimer.from_dir(H200_PROFILE))


def _poisson(mean_per_s: float, ticks: int, seed: int = 7) -> list[float]:
    """One rate every 5 s: a Poisson request count over a 10 s window, as the traffic window reads it."""
    rng = np.random.default_rng(seed)
    return [float(c) / WINDOW_S for c in rng.poisson(mean_per_s * WINDOW_S, ticks)]


def _run(
    model: PerfModel, rates: list[float], start: int, decodes: int
) -> tuple[list[int], list[int], list[tuple[Reason, ...]], list[str]]:
    """An aggregated service of ``start`` replicas on 1,200-token prompts and 180-token outputs: per tick, the final
    count, the load's count (recommend), the reasons and the forecast stage's detail."""
    fleet = Fleet()
    fleet.add_many(start, Role.AGG)
    fleet.deploy("agg", start)
    config = CoreConfig(
        roles={
            Role.AGG: RoleConfig(
                mode=Mode.SLA,
                sla=SlaTargets(ttft_ms=2000.0, itl_ms=50.0),
                max_replicas=64,
                forecast=ForecastConfig(method=ForecastMethod.HOLT),
            )
        }
    )
    traffics = [{Role.AGG: Traffic(request_rate_per_s=rate, isl_tokens=1200.0, osl_tokens=180.0)} for rate in rates]
    load = Load(prefill=1, decode=decodes, kv=decodes * 1290)
    run = fleet.drive(config, "agg", traffics, load, predictors={Role.AGG: model})
    return run.counts, run.loads, run.reasons, run.details


def test_a_steady_rate_is_not_raised_past_the_models_count_at_its_level(agg_model: PerfModel) -> None:
    """Ten minutes of Poisson counts at 46 req/s on an aggregated service the model sizes at 2-3 replicas. Before:
    a level near the rate's recent high rounded the derived floor to 4, and the scale-down window held 4 for 43 of
    the last 90 ticks. The model at Holt's level asks 3, and the count stays at 3."""
    counts, loads, reasons, details = _run(agg_model, _poisson(46.0, 120), 3, 60)
    assert max(loads[24:]) == 3  # the load never asks 4
    assert max(counts[30:]) == 3  # before: 4 on 43 ticks
    steady = [d for r, d in zip(reasons, details, strict=True) if Reason.FORECAST_STEADY_WITHIN_MODEL in r]
    assert steady  # the floor the derived capacity asked is named, then the model's count at the level
    assert all(
        re.search(
            r"-> floor \d+; the rate rose no more than 3 sd of its windows' request counts over the last 60 s, and"
            r" the model meets the SLA at its level [\d.]+ req/s with [23] replicas -> floor [23]$",
            d,
        )
        for d in steady
    )


def test_a_rise_beyond_the_noise_keeps_the_derived_floor(agg_model: PerfModel) -> None:
    """The same 46 req/s for five minutes, then +30 req/s within a minute: the rise is beyond the noise, the floor
    keeps Holt's trend over the derived capacity and runs ahead of the load's count."""
    rates = [*_poisson(46.0, 60), *[46.0 + 2.5 * (k + 1) for k in range(12)]]
    counts, loads, reasons, _ = _run(agg_model, rates, 3, 60)
    assert Reason.FORECAST_FLOOR in reasons[-1]
    assert Reason.FORECAST_STEADY_WITHIN_MODEL not in reasons[-1]
    assert counts[-1] > loads[-1]


def test_a_single_load_replica_keeps_its_spare(agg_model: PerfModel) -> None:
    """12 req/s, one replica by the model: the derived floor's spare stays (what serves an onset from low load,
    docs/decision_core.md), and the steady rule never applies."""
    counts, loads, reasons, _ = _run(agg_model, _poisson(12.0, 120), 1, 15)
    assert set(loads[24:]) == {1}
    assert max(counts[24:]) == 2
    assert not any(Reason.FORECAST_STEADY_WITHIN_MODEL in r for r in reasons)


def test_a_ramp_within_the_noise_at_new_highs_keeps_the_derived_floor(agg_model: PerfModel) -> None:
    """A rate climbing 30 -> 75 req/s over seven and a half minutes (6 req/s a minute, within the counting noise of
    one horizon): each tick is a rate the history has not shown, the derived floor stands, and the count reaches
    each new load ahead of the load's count."""
    rates = [30.0 + 45.0 * min(tick / 90.0, 1.0) for tick in range(100)]
    counts, loads, _, _ = _run(agg_model, rates, 2, 40)
    first_load_4 = next(i for i, n in enumerate(loads) if n >= 4)
    first_count_4 = next(i for i, n in enumerate(counts) if n >= 4)
    assert first_count_4 < first_load_4

"""The forecast floor's derived per-replica capacity does not learn from a count the floor itself raised while the
recommendation holds at current (issue 13, Mooncake x5 disaggregated restore: the prefill's closed loop at its
bound holds the count; rate / held count fell with every replica the floor added, so every forecast a little
above the rate raised the floor one replica more, which the hold then kept: a ratchet, 17 -> 46 prefill replicas
on a steady rate)."""

from __future__ import annotations

import pytest

from perf_model.model import PerfModel
from planner.core import (
    CoreConfig,
    CoreState,
    ForecastConfig,
    ForecastMethod,
    Mode,
    Reason,
    RoleConfig,
    SlaTargets,
    Stage,
    Traffic,
)
from planner.discovery import Role
from tests.core.fleetkit import Fleet, Load


def _config() -> CoreConfig:
    return CoreConfig(
        roles={
            Role.PREFILL: RoleConfig(
                mode=Mode.SLA,
                sla=SlaTargets(ttft_ms=1.0, itl_ms=50.0),  # no count meets it: the recommendation holds at current
                max_replicas=64,
                forecast=ForecastConfig(method=ForecastMethod.HOLT),
            )
        }
    )


def _run(prefill_model: PerfModel, rates: list[float]) -> tuple[list[int], CoreState, list[tuple[Reason, ...]]]:
    fleet = Fleet()
    fleet.add_many(10, Role.PREFILL)
    fleet.deploy("prefill", 10)
    config = _config()
    state = CoreState()
    counts: list[int] = []
    reasons: list[tuple[Reason, ...]] = []
    for tick, rate in enumerate(rates):
        now = 5.0 * tick
        fleet.publish_all(now, Load(prefill=4))
        state, decisions = fleet.tick(
            state,
            now,
            config,
            {Role.PREFILL: Traffic(request_rate_per_s=rate, isl_tokens=4000.0, osl_tokens=200.0)},
            predictors={Role.PREFILL: prefill_model},
        )
        decision = decisions["prefill"]
        recommend = decision.stage(Stage.RECOMMEND)
        assert recommend is not None and recommend.reason == Reason.SLA_UNREACHABLE
        fleet.apply(decision)
        counts.append(decision.final_replicas)
        reasons.append(decision.reasons)
    return counts, state, reasons


def test_a_held_count_the_floor_raised_does_not_ratchet_the_floor(prefill_model: PerfModel) -> None:
    """10 prefill replicas held at current, 20 +- 1 req/s for ten minutes. The floor covers Holt's overshoot at
    rate / 10 a replica (the count the hold began at) and the count stays there. Before: rate / the held count,
    so every overshoot raised the floor one replica above the count the last one left (10 -> 29 on a steady
    rate)."""
    rates = [20.0 + (1.0 if tick % 4 in (1, 2) else -1.0) for tick in range(121)]  # Holt overshoots half the time
    counts, state, reasons = _run(prefill_model, rates)
    # before: 29, one replica every 20-40 s; 13 before forecast_trend_within_noise (the first minute's overshoot,
    # with no minute-old rate to call it noise, was the floor's: 12; capped at a new high by the rate plus its rise,
    # forecast_rise_capped, it is 11)
    assert max(counts) == counts[-1] == 11
    assert Reason.FORECAST_CAPACITY_HELD_COUNT in reasons[-1]
    forecast = state.services["prefill"].forecast
    assert forecast.held_count == 10
    assert forecast.capacity_rps == pytest.approx(2.1)  # the highest rate / 10 (before: 20 / 29 = 0.66)

"""The forecast's rise capped at a new high (issue 13): on prefill-only and decode-only roles, Holt's forecast at a
rate the history has not shown is no more than the latest rate plus its rise over the last ``horizon_s``. At an
onset Holt's trend is one tick's jump over one tick, extrapolated a start-up ahead: a surge from idle at 63 req/s
was forecast at 175-208 and the prefill went to 6 where the load asked 2-3, held by the scale-down window."""

from __future__ import annotations

import re

import pytest

from perf_model.model import PerfModel
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
from planner.core.forecast import ForecastState, rise_capped_rate, update_forecast
from planner.discovery import Role
from tests.core.fleetkit import Fleet, Load

HOLT = ForecastConfig(method=ForecastMethod.HOLT)


def _run(
    prefill_model: PerfModel, rates: list[float], role: Role
) -> tuple[list[int], list[tuple[Reason, ...]], list[str]]:
    name = "prefill" if role is Role.PREFILL else "agg"
    fleet = Fleet()
    fleet.add_many(1, role)
    fleet.deploy(name, 1)
    config = CoreConfig(
        roles={
            role: RoleConfig(
                mode=Mode.SLA,
                sla=SlaTargets(ttft_ms=2000.0, itl_ms=50.0),
                max_replicas=64,
                forecast=ForecastConfig(method=ForecastMethod.HOLT, replica_capacity_rps=20.0),
            )
        }
    )
    traffics = [{role: Traffic(request_rate_per_s=rate, isl_tokens=1000.0, osl_tokens=150.0)} for rate in rates]
    load = Load(prefill=1) if role is Role.PREFILL else Load()
    predictors = {role: prefill_model} if role is Role.PREFILL else None
    run = fleet.drive(config, name, traffics, load, predictors=predictors)
    return run.counts, run.reasons, run.details


_FORECAST = re.compile(r"^forecast ([\d.]+) req/s in 60 s")
_ONSET = [2.0] * 60 + [60.0] * 12  # five minutes of a trickle, then 30x


def test_an_onsets_forecast_is_capped_at_the_rate_plus_its_rise(prefill_model: PerfModel) -> None:
    """2 req/s for five minutes, then 60: Holt forecast the onset's first ticks at 135-199 req/s (before); capped,
    no tick's forecast exceeds 60 + 58 req/s, and the detail says so."""
    _, reasons, details = _run(prefill_model, _ONSET, Role.PREFILL)
    onset = details[60:]
    rates = [float(m.group(1)) for d in onset if (m := _FORECAST.match(d))]
    assert len(rates) == len(onset)
    assert max(rates) <= 118.0 + 1e-6  # before: 198.87 at the onset's third tick
    capped = [d for r, d in zip(reasons[60:], onset, strict=True) if Reason.FORECAST_RISE_CAPPED in r]
    assert capped
    assert all(
        re.search(
            r"; at a new high, Holt's [\d.]+ req/s capped at the rate 60\.00 plus its rise 58\.00 over the last 60 s"
            r" -> floor \d+",
            d,
        )
        for d in capped
    )
    assert not any(Reason.FORECAST_RISE_CAPPED in r for r in reasons[:60])  # a steady trickle is not capped


def test_an_aggregated_role_keeps_holts_forecast_at_an_onset(prefill_model: PerfModel) -> None:
    """The same onset on an aggregated engine: no cap (its overshoot is what serves the onset's prompts mixed into
    the decodes' steps: surge_from_idle agg cold lost 5.74 points with it, docs/benchmarks.md)."""
    _, reasons, details = _run(prefill_model, _ONSET, Role.AGG)
    assert not any(Reason.FORECAST_RISE_CAPPED in r for r in reasons)
    rates = [float(m.group(1)) for d in details[60:] if (m := _FORECAST.match(d))]
    assert max(rates) > 118.0


def _state(rates: list[float]) -> ForecastState:
    state = ForecastState()
    for tick, rate in enumerate(rates):
        state = update_forecast(state, rate, 5.0 * tick, HOLT)
    return state


def test_the_cap_binds_only_at_a_new_high_and_only_above_the_last_horizons_rise() -> None:
    """Below the history's high the forecast is left as it is (the damped floor's case); at a high, the cap is the
    rate plus its rise from the entry one horizon back (10 -> 40 req/s: at most 70)."""
    falling = _state([10.0] * 12 + [40.0] * 3 + [30.0])
    assert rise_capped_rate(falling, HOLT, 500.0) == (500.0, "")
    rising = _state([10.0] * 12 + [40.0] * 3)
    rate, note = rise_capped_rate(rising, HOLT, 500.0)
    assert rate == pytest.approx(70.0)
    assert note.startswith("; at a new high, Holt's 500.00 req/s capped at the rate 40.00 plus its rise 30.00")
    assert rise_capped_rate(rising, HOLT, 60.0) == (60.0, "")
    assert rise_capped_rate(_state([5.0]), HOLT, 50.0) == (50.0, "")  # one entry: nothing to cap against

"""Decision-pipeline rows the mutation run showed missing: which mode a role decides in (auto with and without a
ready perf model), the SLA settings reaching the recommendation, and the one-line summary."""

from __future__ import annotations

import pytest

from planner.core import CoreConfig, CoreState, Mode, Reason, RoleConfig, SlaTargets
from planner.core.step import step
from planner.discovery import Role
from tests.core.analytic_perf import AnalyticPerf
from tests.core.fleetkit import Fleet, Load

NOW = 1000.0


def decode_fleet() -> Fleet:
    fleet = Fleet()
    fleet.add_many(4, Role.DECODE)
    fleet.deploy("decode", 4)
    fleet.publish_all(NOW - 1, Load(decode=400, kv=400_000))
    return fleet


@pytest.mark.parametrize(
    ("mode", "predictor", "decided"),
    [
        (Mode.AUTO, AnalyticPerf(), Mode.SLA),
        (Mode.AUTO, AnalyticPerf(ready=False), Mode.THRESHOLD),
        (Mode.AUTO, None, Mode.THRESHOLD),
        (Mode.THRESHOLD, AnalyticPerf(), Mode.THRESHOLD),
        (Mode.SLA, AnalyticPerf(), Mode.SLA),
    ],
    ids=["auto, model ready", "auto, model not ready", "auto, no model", "threshold", "sla"],
)
def test_the_mode_a_role_decides_in(mode: Mode, predictor: AnalyticPerf | None, decided: Mode) -> None:
    config = CoreConfig(roles={Role.DECODE: RoleConfig(mode=mode, sla=SlaTargets(itl_ms=20.0))})
    predictors = {Role.DECODE: predictor} if predictor is not None else None
    _, (decision,) = step(CoreState(), decode_fleet().observe(NOW), NOW, config, predictors=predictors)
    assert decision.mode == decided


@pytest.mark.parametrize(
    ("headroom", "itl_headroom", "recommended"),
    [(0.0, None, 8), (0.1, None, 10), (0.1, 0.0, 8), (0.0, 0.1, 10)],
)
def test_sla_headrooms_reach_the_recommendation(headroom: float, itl_headroom: float | None, recommended: int) -> None:
    """tests/core/test_core_rows_sla.py works these counts out: ITL 1.1 x (8 + 80/N) within 20 ms, or 18 ms."""
    role = RoleConfig(
        mode=Mode.SLA, sla=SlaTargets(itl_ms=20.0), headroom_frac=headroom, itl_headroom_frac=itl_headroom
    )
    config = CoreConfig(roles={Role.DECODE: role})
    _, (decision,) = step(
        CoreState(), decode_fleet().observe(NOW), NOW, config, predictors={Role.DECODE: AnalyticPerf()}
    )
    assert decision.recommended_replicas == recommended
    assert decision.reasons[0] == Reason.SLA_NEEDS_MORE


def test_the_summary_says_what_happened_and_why() -> None:
    config = CoreConfig(roles={Role.DECODE: RoleConfig(mode=Mode.THRESHOLD, max_replicas=5)})
    fleet = decode_fleet()
    _, (decision,) = step(CoreState(), fleet.observe(NOW), NOW, config)
    assert decision.summary.startswith("decode 'decode': scale up 4 -> 5 (")
    assert decision.summary.endswith(")")
    assert "bounds: " in decision.summary

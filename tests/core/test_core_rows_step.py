"""Decision-pipeline rows the mutation run showed missing: which mode a role decides in (auto with and without a
ready perf model), the SLA settings reaching the recommendation, and the one-line summary."""

from __future__ import annotations

import pytest

from planner.core import CoreConfig, CoreState, Mode, Reason, RoleConfig, SlaTargets, Traffic
from planner.core.step import group_services, step
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


def test_a_service_whose_workers_disagree_on_the_role_takes_the_lowest_worker_ids_role() -> None:
    fleet = Fleet()
    fleet.add("b-worker", Role.DECODE, "shared")
    fleet.add("a-worker", Role.PREFILL, "shared")
    fleet.add("c-worker", Role.DECODE, "decode-only")
    groups = group_services(fleet.workers, CoreConfig(roles={Role.AGG: RoleConfig(service="agg-svc")}))
    assert {s: (role, [w.worker_id for w in ws]) for s, (role, ws) in groups.items()} == {
        "shared": (Role.PREFILL, ["b-worker", "a-worker"]),
        "decode-only": (Role.DECODE, ["c-worker"]),
        "agg-svc": (Role.AGG, []),
    }


def test_the_inputs_carry_the_load_and_the_traffic_the_decision_saw() -> None:
    fleet = decode_fleet()
    traffic = Traffic(request_rate_per_s=12.5, isl_tokens=900.0, osl_tokens=150.0)
    _, decisions = fleet.tick(CoreState(), NOW, CoreConfig(), {Role.DECODE: traffic})
    inputs = decisions["decode"].inputs
    assert (inputs.request_rate_per_s, inputs.isl_tokens, inputs.osl_tokens) == (12.5, 900.0, 150.0)
    assert (inputs.current_replicas, inputs.engines_expected, inputs.engines_reporting) == (4, 4, 4)
    assert (inputs.decode_requests, inputs.decode_kv_tokens, inputs.kv_capacity_tokens) == (400, 400_000, 400_000)
    assert inputs.kv_usage_frac == 1.0
    assert (inputs.prefill_token_budget, inputs.decode_seq_budget) == (4 * 8192, 4 * 256)

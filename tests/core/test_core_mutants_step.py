"""The fleet-wide step (planner.core.step) remembers when a decision ended below what its load asked (the bounds,
the GPU budget or the rate limit capped it): the closed loop does not tighten on misses that more capacity, which
cannot come, would fix. Written for the mutants of step.py that survived the suite (docs/mutation-results.md)."""

from __future__ import annotations

from planner.core import CoreConfig, CoreState, Mode, Reason, SlaTargets, Stage, Traffic
from planner.discovery import Role
from tests.core.analytic_perf import AnalyticPerf
from tests.core.fleetkit import Fleet, Load, hpa_role


def test_the_loop_does_not_tighten_while_the_count_is_capped_below_the_load() -> None:
    # 400 decoding requests holding 1000 KV tokens each: 1.1 x (8 + 80/N) ms is within 20 ms first at N = 8, and
    # max_replicas is 4. Half the requests missing their ITL would tighten the headroom; capped, the loop holds.
    fleet = Fleet()
    fleet.add_many(4, Role.DECODE)
    fleet.deploy("decode", 4)
    config = CoreConfig(
        roles={Role.DECODE: hpa_role(mode=Mode.SLA, sla=SlaTargets(ttft_ms=500.0, itl_ms=20.0), max_replicas=4)}
    )
    missing = {Role.DECODE: Traffic(itl_attainment_frac=0.5, itl_samples_in_window=500)}
    predictors = {Role.DECODE: AnalyticPerf()}
    state = CoreState()
    for now in (0.0, 5.0):
        fleet.publish_all(now, Load(decode=400, kv=400_000))
        state, decisions = fleet.tick(state, now, config, missing, predictors=predictors)
        decision = decisions["decode"]
        recommend = decision.stage(Stage.RECOMMEND)
        assert recommend is not None and recommend.replicas == 8
        assert decision.final_replicas == 4
        assert state.services["decode"].feedback.capped is True
    stage = decision.stage(Stage.SLA_FEEDBACK)
    assert stage is not None and stage.detail is not None
    assert stage.reason == Reason.SLA_FEEDBACK_FROZEN
    assert stage.detail.endswith("; not tightening while capacity cannot come (in flight or capped) -> 8 replicas")
    assert state.services["decode"].feedback.itl_frac == 0.0

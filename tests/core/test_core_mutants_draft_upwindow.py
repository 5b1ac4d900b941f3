"""Row for the recommendations' memory in one service's pipeline (planner.core.draft): the recommendations are
kept as long as the longest window that reads them, the scale-up stabilization window included (HPA's
``scaleUp.stabilizationWindowSeconds``: a scale-up goes no higher than the lowest recommendation of that window).
Written for ``draft_service`` mutant 320 of the 9ffb7b0 sample (the scale-up window left out of what is kept:
with a scale-up window longer than the scale-down window and no hold across gaps, the low recommendation was
pruned before the window read it); fails there."""

from __future__ import annotations

from planner.core import (
    CoreConfig,
    CoreState,
    ForecastConfig,
    ForecastMethod,
    Mode,
    PolicyKind,
    RoleConfig,
    ScaleRules,
    ScalingPolicy,
    Stage,
)
from planner.discovery import Role
from tests.core.fleetkit import Fleet, Load

_FAST = (ScalingPolicy(kind=PolicyKind.PERCENT, value=900.0, period_s=15.0),)


def test_a_scale_up_is_stabilized_over_the_whole_scale_up_window() -> None:
    """A 900 s scale-up window, a 30 s scale-down window, no hold across gaps: 2 asked at 0 s, 8 at 100 s; the
    scale-up goes no higher than the lowest of the last 900 s (2), so the 4 replicas stay 4."""
    rc = RoleConfig(
        mode=Mode.THRESHOLD,
        max_replicas=64,
        scale_up=ScaleRules(stabilization_window_s=900.0, policies=_FAST),
        scale_down=ScaleRules(stabilization_window_s=30.0, policies=_FAST),
        scale_down_window_startups=None,
        hold_across_gaps_max_s=None,
        forecast=ForecastConfig(method=ForecastMethod.NONE),
    )
    config = CoreConfig(roles={Role.DECODE: rc})
    fleet = Fleet()
    fleet.add_many(4, Role.DECODE)
    fleet.deploy(Role.DECODE.value, 4)
    state = CoreState()
    for now, asks in ((0.0, 2), (100.0, 8)):
        fleet.publish_all(now, Load(decode=asks * 204))
        state, decisions = fleet.tick(state, now, config, None)
    d = decisions["decode"]
    assert d.recommended_replicas == 8
    stabilize = d.stage(Stage.STABILIZE)
    assert stabilize is not None and stabilize.replicas == 4
    assert d.final_replicas == 4

"""A service whose scaling is disabled both ways (``select: disabled`` up and down, no policies: the config
docs/decision_core.md allows to freeze a role) still gets a decision each tick: the count held, the rate limit
saying why. Written for ``draft_service`` mutant 460 of docs/mutation-results.md (the scale events' memory
taken as the longest policy period with no default: no policy at all raised ValueError there)."""

from __future__ import annotations

from planner.core import CoreConfig, CoreState, Stage, Traffic, step
from planner.core.scale_rules import ScaleRules, SelectPolicy
from planner.discovery import Role
from tests.core.fleetkit import Fleet, Load, hpa_role

FROZEN = ScaleRules(stabilization_window_s=0.0, policies=(), select=SelectPolicy.DISABLED)


def test_a_role_with_scaling_disabled_both_ways_keeps_its_count() -> None:
    fleet = Fleet()
    fleet.add_many(4, Role.DECODE)
    fleet.deploy("decode", 4)
    config = CoreConfig(roles={Role.DECODE: hpa_role(scale_up=FROZEN, scale_down=FROZEN)})
    state = CoreState()
    for now, load in ((0.0, 3000), (30.0, 0)):  # a load that asks for more, then one that asks for less
        fleet.publish_all(now, Load(decode=load))
        state, (d,) = step(state, fleet.observe(now, {Role.DECODE: Traffic(request_rate_per_s=12.0)}), now, config)
        recommend, limited = d.stage(Stage.RECOMMEND), d.stage(Stage.RATE_LIMIT)
        assert recommend is not None and recommend.replicas != 4
        assert limited is not None and limited.replicas == 4
        assert (d.current_replicas, d.final_replicas) == (4, 4)

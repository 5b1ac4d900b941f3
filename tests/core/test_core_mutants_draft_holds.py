"""Rows for the long holds in one service's pipeline (planner.core.draft; docs/decision_core.md, "Beyond the base
window, only a level that came back is held"). Written for the ``draft_service`` mutants docs/mutation-results.md
listed as surviving; each fails on the mutant it names (``MUTANT_UNDER_TEST``)."""

from __future__ import annotations

from planner.core import CoreConfig, CoreState, Traffic, step
from planner.core.config import RoleBounds
from planner.discovery import Role
from tests.core.fleetkit import Fleet, Load, hpa_role
from tests.core.test_core_forecast_damping import CONFIG, bursts
from tests.core.test_core_returned import _drive

FOUR, IDLE = Load(decode=4 * 204), Load(decode=1)


def test_after_a_rebuy_that_did_not_grow_the_window_a_level_asked_once_is_held_for_the_base_window() -> None:
    """``draft_service`` 420 (the span the returns are looked for over taken as the hold's count, 4, not its 600 s):
    4 replicas idle from the start are released to 1 after the 30 s window and bought back 15 s later (a re-buy:
    the hold across gaps is in force; 1.5 x 15 s leaves the window at its base 30 s). The 4 were asked in that
    one episode only: held for the base window after it, then released, not held across the next 600 s."""
    state, ticks = _drive([(0.0, IDLE), (45.0, FOUR), (60.0, IDLE), (400.0, IDLE)])
    counts = {now: d.final_replicas for now, d in ticks.items()}
    memory = state.services["decode"]
    assert (memory.rebuy_counts, memory.rebuy_gaps) == (((45.0, 4, None),), ((45.0, 15.0),))
    assert [counts[t] for t in (30.0, 45.0, 80.0)] == [1, 4, 4]  # released, bought back, the base window holds
    assert [counts[t] for t in (85.0, 200.0, 395.0)] == [1, 1, 1]


def test_a_checked_floor_under_the_actuators_minimum_is_remembered_at_that_minimum() -> None:
    """``draft_service`` 360 (the checked recommendation bounded without the actuator's bounds): at a new high the
    floor asks 31 and its trend checked asks 14 (``test_core_forecast_damping``); with the actuator refusing fewer
    than 16 replicas, what the hold across gaps remembers is 16, a count the actuator accepts, as the
    recommendations as decided are."""
    fleet = Fleet()
    fleet.add_many(2, Role.DECODE)
    fleet.deploy("decode", 2)
    config = CoreConfig(roles={Role.DECODE: hpa_role(forecast=CONFIG)}).with_actuator_bounds(
        {Role.DECODE: RoleBounds(min_replicas=16, max_replicas=64)}
    )
    state = CoreState()
    for i, rate in enumerate(bursts([100.0] * 5 + [160.0])[:-2]):
        t = 5.0 * i
        fleet.publish_all(t, Load(decode=300))
        state, _ = step(state, fleet.observe(t, {Role.DECODE: Traffic(request_rate_per_s=rate)}), t, config)
    service = state.services["decode"]
    assert service.recommendations[-1][1] == 31
    assert service.checked_recommendations[-1][1] == 16
    assert service.checked_recommendations and min(count for _, count in service.checked_recommendations) == 16

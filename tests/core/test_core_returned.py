"""Beyond one scale-down window, the long holds keep only a level the recommendations came back to
(planner.core.returned): a burst's peak asked once is held for the base window, not for the grown window or the
hold across gaps; the level the traffic keeps coming back to is held as before."""

from __future__ import annotations

import itertools

from planner.core import (
    Action,
    CoreConfig,
    CoreState,
    Decision,
    ForecastConfig,
    ForecastMethod,
    Mode,
    PolicyKind,
    RoleConfig,
    ScaleRules,
    ScalingPolicy,
    Stage,
)
from planner.core.returned import capped_by_returns, remember_returns, returned_level
from planner.discovery import Role
from tests.core.fleetkit import Fleet, Load, drive_decode_rates

_UP = ScaleRules(
    stabilization_window_s=0.0, policies=(ScalingPolicy(kind=PolicyKind.PERCENT, value=900.0, period_s=15.0),)
)
_DOWN = ScaleRules(
    stabilization_window_s=30.0, policies=(ScalingPolicy(kind=PolicyKind.PERCENT, value=100.0, period_s=15.0),)
)

BASE_30 = [30.0] * 72  # six minutes at 30 req/s: the planner's first window passes, the history learns the level


def _config() -> CoreConfig:
    """Threshold decode, fast scale-ups, a 30 s scale-down window grown by re-buys, no forecast floor."""
    rc = RoleConfig(
        mode=Mode.THRESHOLD,
        max_replicas=64,
        scale_up=_UP,
        scale_down=_DOWN,
        scale_down_window_startups=None,
        forecast=ForecastConfig(method=ForecastMethod.NONE),
    )
    return CoreConfig(roles={Role.DECODE: rc})


def _drive(timeline: list[tuple[float, Load]]) -> tuple[CoreState, dict[float, Decision]]:
    fleet = Fleet()
    fleet.add_many(4, Role.DECODE)
    fleet.deploy(Role.DECODE.value, 4)
    state = CoreState()
    ticks: dict[float, Decision] = {}
    for (start, load), (end, _) in itertools.pairwise(timeline):
        now = start
        while now < end:
            fleet.publish_all(now, load)
            state, d = fleet.tick(state, now, _config(), None)
            if d["decode"].action != Action.HOLD:
                fleet.apply(d["decode"])
            ticks[now] = d["decode"]
            now += 5.0
    return state, ticks


def test_a_peak_asked_once_is_held_for_the_base_window_and_the_level_that_came_back_across_the_gaps() -> None:
    """4 replicas, released in an idle gap and bought back (the window grows to 1.5 x that gap, the hold across
    gaps keeps up to 4 for 600 s), then one burst of 8 for 30 s. The 8 has never come back: it is held for the
    base window (30 s) only, then the fleet holds the 4 the traffic came back to through the next gap (the old
    code held the 8 for the whole grown window, ~200 s)."""
    four, eight, idle = Load(decode=4 * 204), Load(decode=8 * 204), Load(decode=1)
    timeline = [(0.0, four), (60.0, idle), (200.0, four), (260.0, idle), (300.0, eight), (330.0, idle)]
    state, ticks = _drive([*timeline, (900.0, idle)])
    counts = {now: d.final_replicas for now, d in ticks.items()}
    assert max(counts[t] for t in counts if 300.0 <= t < 330.0) == 8
    assert counts[350.0] == 8  # the base window holds the peak
    assert [counts[t] for t in (400.0, 500.0, 600.0, 800.0)] == [4, 4, 4, 4]
    assert max(level for _, level in state.services["decode"].returns) == 4
    stabilize = next(s for s in ticks[355.0].stages if s.stage == Stage.STABILIZE)
    assert "only the highest count the recommendations came back to (4) is held: 4, not 8" in stabilize.detail


def test_returned_level_needs_a_gap_longer_than_the_base_window() -> None:
    entries = ((0.0, 5), (5.0, 2), (10.0, 5), (100.0, 3), (200.0, 3), (205.0, 1))
    # 5 came back after 5 s (inside a 30 s window: no return); 3 came back after 100 s
    assert returned_level(entries, -1.0, 30.0) == 3
    assert returned_level(entries, -1.0, 150.0) is None
    assert returned_level(entries, 50.0, 30.0) == 3  # the span starts after the first 5s
    assert returned_level(entries[:3], -1.0, 30.0) is None


def test_remembered_returns_are_superseded_by_a_higher_or_equal_one_and_forgotten_after_the_memory() -> None:
    entries = ((0.0, 6), (100.0, 6))
    returns = remember_returns(((10.0, 4), (20.0, 7)), entries, 100.0, 30.0, 600.0, 1800.0)
    assert returns == ((20.0, 7), (100.0, 6))
    assert remember_returns(returns, (), 1825.0, 30.0, 600.0, 1800.0) == ((100.0, 6),)
    # no growth beyond the base window: nothing new is looked for
    assert remember_returns((), entries, 100.0, 30.0, 30.0, 1800.0) == ()


def test_old_entries_are_capped_at_the_highest_return_and_recent_ones_are_not() -> None:
    entries = ((0.0, 9), (50.0, 3), (90.0, 9))
    assert capped_by_returns(entries, 100.0, 30.0, 600.0, ((40.0, 5),)) == ((0.0, 5), (50.0, 3), (90.0, 9))
    assert capped_by_returns(entries, 100.0, 30.0, 600.0, ()) == ((0.0, 0), (50.0, 0), (90.0, 9))
    assert capped_by_returns(entries, 100.0, 30.0, 30.0, ()) == entries


def test_a_return_is_looked_for_across_a_gap_as_asked_so_lowering_a_count_never_makes_one() -> None:
    """A decode service (threshold, Holt's floor; each action lands two ticks later), bursts of 120 req/s for
    120 s every 320 s (3 req/s between). The second onset's floor asks 26 (680-690 s), 24, 21, 18, 15 (720 s) while the
    load asks 12-13; the rate falls after the burst, so these refuted peaks count at the load's count + 1: 14 until
    690 s, 13 after. The third onset asks 24-25 from 1,000 s. As counted, 14 was left at 690 s and asked again at
    1,000 s (310 s, beyond the 300 s base window): the old code saw 14 "come back" and held it through the third
    burst's gap (14 from 1,060 s to 1,285 s). As asked, the burst asked 15 until 720 s, 280 s before: no return.
    The third onset's 24-25, asked of a settled fleet, stand until the minute they forecast came (planner.core.served,
    HOLD4), then the load's 12 + 1 they were asked with: 13 through the gap (before HOLD4: 12 from 1,060 s)."""
    counts, _, details = drive_decode_rates(BASE_30 + ([120.0] * 24 + [3.0] * 40) * 4, rollout_ticks=2)
    assert counts[203:211] == [24] * 8  # the third onset's floor (asked at 1,000 s), landed and held
    assert counts[211:266] == [13] * 55  # before: 14 from 1,060 s
    assert "came back to (0) is held: 13, not 14" in details[210]


def test_returned_level_looks_for_the_gap_as_asked_and_both_ends_as_counted() -> None:
    asked = ((0.0, 30), (5.0, 30), (50.0, 30), (100.0, 30), (200.0, 1), (260.0, 30))
    counted = ((0.0, 26), (5.0, 20), (50.0, 20), (100.0, 20), (200.0, 1), (260.0, 26))
    # as counted, 26 came back after 260 s; as asked 30 was asked until 100 s, 160 s before: no gap of 200 s
    assert returned_level(counted, -1.0, 200.0) == 26
    assert returned_level(counted, -1.0, 200.0, asked) is None
    assert returned_level(counted, -1.0, 150.0, asked) == 20  # 20 counted at 100 s, then 260 s: 160 s apart
    # the ask that left the level must count at or above it too: 26 was left counting 20 at 100 s
    assert returned_level(counted, -1.0, 100.0, asked) == 20
    assert returned_level(asked, -1.0, 150.0, asked) == returned_level(asked, -1.0, 150.0) == 30  # nothing capped
    assert remember_returns((), counted, 260.0, 200.0, 600.0, 1800.0, asked) == ()

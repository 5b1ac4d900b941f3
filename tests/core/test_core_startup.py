"""Surge- and start-up-aware scaling (issue 13 item 4): the start-up delay measured from desired -> ready, the
scale-down window in start-ups (a faster start-up makes the planner leaner by itself), an in-flight target raised
when the request rate grew since, and a scale-up sized for the backlog left after one start-up."""

from __future__ import annotations

import itertools

import pytest

from perf_model.model import PerfModel
from perf_model.step_timer import ProfileStepTimer
from planner.core import (
    Action,
    CoreConfig,
    CoreState,
    Decision,
    ForecastConfig,
    ForecastMethod,
    Mode,
    PolicyKind,
    Reason,
    RoleConfig,
    RoleLoad,
    ScaleRules,
    ScalingPolicy,
    SlaTargets,
    Traffic,
)
from planner.core.recommend import recommend_sla
from planner.discovery import Role
from tests.core.fleetkit import FAST_UP, H200_PROFILE, Fleet, Load, reconciled


def _fleet(n: int, role: Role = Role.DECODE) -> Fleet:
    fleet = Fleet()
    fleet.add_many(n, role)
    fleet.deploy(role.value, n)
    return fleet


def test_a_scale_up_raises_an_in_flight_target_when_the_rate_grew() -> None:
    fleet = _fleet(4)
    config = CoreConfig(roles={Role.DECODE: RoleConfig(mode=Mode.THRESHOLD, max_replicas=64, scale_up=FAST_UP)})
    state = CoreState()
    fleet.publish_all(0.0, Load(decode=8 * 204))
    state, d = fleet.tick(state, 0.0, config, {Role.DECODE: Traffic(request_rate_per_s=10.0)})
    assert d["decode"].action == Action.SCALE_UP and d["decode"].final_replicas == 8
    fleet.deploy("decode", 8, ready=4)  # in flight
    # The load doubles while the four new replicas start; the rate doubled too: the target is raised, in proportion.
    fleet.publish_all(5.0, Load(decode=20 * 204))
    state, d = fleet.tick(state, 5.0, config, {Role.DECODE: Traffic(request_rate_per_s=20.0)})
    assert d["decode"].final_replicas == 16 and Reason.IN_FLIGHT_TARGET_RAISED in d["decode"].reasons
    # Same load, no new growth of the rate since that raise: no stacking.
    fleet.deploy("decode", 16, ready=4)
    state, d = fleet.tick(state, 10.0, config, {Role.DECODE: Traffic(request_rate_per_s=21.0)})
    assert d["decode"].final_replicas == 16 and Reason.ACTION_IN_FLIGHT in d["decode"].reasons


def test_without_rate_growth_an_in_flight_scale_up_still_holds() -> None:
    fleet = _fleet(4)
    config = CoreConfig(roles={Role.DECODE: RoleConfig(mode=Mode.THRESHOLD, max_replicas=64, scale_up=FAST_UP)})
    state = CoreState()
    fleet.publish_all(0.0, Load(decode=8 * 204))
    state, _ = fleet.tick(state, 0.0, config, {Role.DECODE: Traffic(request_rate_per_s=10.0)})
    fleet.deploy("decode", 8, ready=4)
    fleet.publish_all(5.0, Load(decode=20 * 204))  # a backlog building, the same rate
    _, d = fleet.tick(state, 5.0, config, {Role.DECODE: Traffic(request_rate_per_s=10.5)})
    assert d["decode"].final_replicas == 8 and Reason.ACTION_IN_FLIGHT in d["decode"].reasons


@pytest.mark.parametrize(("startup_s", "held_s"), [(60.0, 120.0), (15.0, 30.0)])
def test_the_scale_down_window_follows_the_measured_start_up(startup_s: float, held_s: float) -> None:
    """A scale-up settles ``startup_s`` after it was decided; the window is then two measured start-ups: a snapshot
    restore (15 s) releases idle capacity four times sooner than a cold start (60 s), with no setting changed."""
    rc = RoleConfig(mode=Mode.THRESHOLD, max_replicas=64, scale_up=FAST_UP, scale_down_window_startups=2.0)
    config = CoreConfig(roles={Role.DECODE: rc})
    fleet = _fleet(2)
    state = CoreState()
    now = 0.0
    fleet.publish_all(now, Load(decode=8 * 204))
    state, d = fleet.tick(state, now, config)
    assert d["decode"].final_replicas == 8
    decision = d["decode"]
    fleet.deploy("decode", 8, ready=2)  # the new replicas start
    while now < startup_s:
        now += 5.0
        if now >= startup_s:
            fleet.apply(decision)  # ready
        fleet.publish_all(now, Load(decode=8 * 204))
        state, d = fleet.tick(state, now, config)
        assert d["decode"].final_replicas == 8
    assert state.services["decode"].startup_s_observed == pytest.approx(startup_s)
    # Idle from here: the scale-down waits two measured start-ups (and the planner's own first window).
    idle_from = now
    first_down = None
    while first_down is None and now < 2000.0:
        now += 5.0
        fleet.publish_all(now, Load(decode=1))
        state, d = fleet.tick(state, now, config)
        if d["decode"].action == Action.SCALE_DOWN:
            first_down = now
    assert first_down is not None
    assert first_down == pytest.approx(max(idle_from + held_s, 2 * startup_s), abs=5.0)


def test_a_surge_backlog_is_sized_for_what_remains_after_one_start_up() -> None:
    """A backlog of 3M prompt tokens on 4 engines that keep up with the arrivals (2 req/s of 2k tokens each, far
    below 4 engines' prefill rate): sized against today's queue the TTFT check asks for dozens of replicas that
    arrive when the current four have drained it; after one 60 s start-up the remaining backlog is what counts."""
    predictor = PerfModel(Role.AGG, bootstrap=ProfileStepTimer.from_dir(H200_PROFILE))
    load = RoleLoad(queued_prefill_tokens=3e6, decode_requests=40, decode_kv_tokens=40 * 2500)
    traffic = Traffic(request_rate_per_s=2.0, isl_tokens=2000.0, osl_tokens=200.0)
    sla = SlaTargets(ttft_ms=2000, itl_ms=50)

    four = reconciled(Role.AGG, 4, prefill_requests=16.0)

    def recommend(startup_s: float) -> int:
        return recommend_sla(Role.AGG, 4, four, load, traffic, predictor, sla, 0.0, 256, startup_s=startup_s).replicas

    naive, aware = recommend(0.0), recommend(60.0)
    assert naive > 20 and aware < naive / 4


def _gap_config() -> CoreConfig:
    """Threshold decode with fast scale-ups and a 30 s scale-down window (no start-up-grown window, no forecast
    floor: the request rate, when given, only says whether the traffic fell)."""
    down = ScaleRules(
        stabilization_window_s=30.0, policies=(ScalingPolicy(kind=PolicyKind.PERCENT, value=100.0, period_s=15.0),)
    )
    rc = RoleConfig(
        mode=Mode.THRESHOLD,
        max_replicas=64,
        scale_up=FAST_UP,
        scale_down=down,
        scale_down_window_startups=None,
        forecast=ForecastConfig(method=ForecastMethod.NONE),
    )
    return CoreConfig(roles={Role.DECODE: rc})


def _drive(
    fleet: Fleet, config: CoreConfig, timeline: list[tuple[float, Load]], rates: dict[float, float] | None = None
) -> tuple[CoreState, list[tuple[float, Decision]]]:
    """Tick every 5 s through ``timeline`` ((start, load) pairs; the last entry only ends the one before),
    applying every decision; returns the last state and each tick's decode decision. ``rates``: the request rate
    of the segment starting at each key (no traffic given without it)."""
    state = CoreState()
    ticks: list[tuple[float, Decision]] = []
    for (start, load), (end, _) in itertools.pairwise(timeline):
        now = start
        rate = (rates or {}).get(start)
        traffic = {Role.DECODE: Traffic(request_rate_per_s=rate)} if rate is not None else None
        while now < end:
            fleet.publish_all(now, load)
            state, d = fleet.tick(state, now, config, traffic)
            if d["decode"].action != Action.HOLD:
                fleet.apply(d["decode"])
            ticks.append((now, d["decode"]))
            now += 5.0
    return state, ticks


def test_capacity_bought_back_after_a_gap_is_held_across_the_next_gap() -> None:
    """Cost-aware scale-down: released at the first idle gap and bought back 100 s later, the capacity bought back
    is held across the next gap for ``hold_across_gaps_max_s`` (600 s, while such a re-buy is remembered: the
    next gap need not be the last one's length) instead of being released and bought back again."""
    busy, idle = Load(decode=4 * 204), Load(decode=1)
    timeline = [(0.0, busy), (60.0, idle), (200.0, busy), (260.0, idle), (1000.0, idle)]
    state, ticks = _drive(_fleet(4), _gap_config(), timeline)
    downs = [now for now, d in ticks if d.action == Action.SCALE_DOWN]
    first, second = downs[0], downs[1]
    assert 60.0 < first <= 100.0  # the first gap: released after the configured 30 s window
    gap = state.services["decode"].rebuy_gaps[0][1]
    assert 100.0 <= gap <= 140.0
    assert second >= 260.0 + 600.0 - 5.0  # the second gap: held for hold_across_gaps_max_s, not 1.5 x the gap


def test_capacity_held_across_gaps_is_at_most_what_the_traffic_bought_back() -> None:
    """Bought back at 2 replicas after an idle gap, the fleet then sees a burst of 8: once the scale-down window
    (1.5 x the gap) has passed it is held at 2 (the capacity the history says comes back) for the rest of the
    600 s hold, not at the burst's 8 and not released to 1."""
    two, eight, idle = Load(decode=2 * 204), Load(decode=8 * 204), Load(decode=1)
    timeline = [(0.0, two), (60.0, idle), (200.0, two), (260.0, idle), (300.0, eight), (360.0, idle), (600.0, idle)]
    state, ticks = _drive(_fleet(2), _gap_config(), timeline)
    counts = {now: d.final_replicas for now, d in ticks}
    reasons = {now: d.reasons for now, d in ticks}
    assert state.services["decode"].rebuy_counts[0][1] == 2
    assert max(counts[t] for t in counts if 300.0 <= t < 360.0) == 8
    assert counts[595.0] == 2 and Reason.SCALE_DOWN_HELD_ACROSS_GAPS in reasons[595.0]


def test_a_trim_bought_back_while_the_traffic_held_holds_nothing_across_gaps() -> None:
    """The recommendation trims 4 -> 3 and buys the replica back while the request rate holds (~60 req/s): that
    is the recommendation moving, not an idle gap (rebuy_min_fall_frac). When the traffic then ends, the fleet
    goes down within the scale-down window instead of holding the 4 for hold_across_gaps_max_s (600 s)."""
    four, three, idle = Load(decode=4 * 204), Load(decode=3 * 204), Load(decode=1)
    timeline = [(0.0, four), (60.0, three), (120.0, four), (300.0, idle), (900.0, idle)]
    rates = {0.0: 60.0, 60.0: 58.0, 120.0: 62.0, 300.0: 0.0}
    state, ticks = _drive(_fleet(4), _gap_config(), timeline, rates)
    actions = [(now, d.action) for now, d in ticks if d.action != Action.HOLD]
    assert [a for _, a in actions[:2]] == [Action.SCALE_DOWN, Action.SCALE_UP]  # the trim and its re-buy
    assert state.services["decode"].rebuy_counts == ()
    counts = {now: d.final_replicas for now, d in ticks}
    assert counts[400.0] == 1  # released within the 30 s window (and 1.5 x the re-buy's gap) of the traffic's end
    assert not any(Reason.SCALE_DOWN_HELD_ACROSS_GAPS in d.reasons for _, d in ticks)


def test_a_rebuy_after_the_traffic_fell_is_held_across_the_next_gap() -> None:
    """The same fleet moves, but the request rate fell from 60 to 10 req/s while the capacity was released and came
    back with it: an idle gap, and the 4 bought back are held after the traffic ends."""
    four, one, idle = Load(decode=4 * 204), Load(decode=1 * 204), Load(decode=1)
    timeline = [(0.0, four), (60.0, one), (200.0, four), (300.0, idle), (900.0, idle)]
    rates = {0.0: 60.0, 60.0: 10.0, 200.0: 60.0, 300.0: 0.0}
    state, ticks = _drive(_fleet(4), _gap_config(), timeline, rates)
    assert state.services["decode"].rebuy_counts[0][1] == 4
    counts = {now: d.final_replicas for now, d in ticks}
    reasons = {now: d.reasons for now, d in ticks}
    assert counts[595.0] == 4 and Reason.SCALE_DOWN_HELD_ACROSS_GAPS in reasons[595.0]  # past 1.5 x the gap


def test_a_hold_lasts_while_smaller_bursts_keep_coming_back() -> None:
    """Bought back at 4 after the traffic fell, the fleet then sees bursts that need 2, each after a lull (the
    request rate 60 -> 2 -> 30 req/s), for 40 minutes: every comeback renews the memory of the re-buy, so the 2
    the last 600 s needed are held through every lull, also past 30 minutes after the re-buy (before, the memory
    lapsed at 30 minutes because no burst needed the 4 again, and the next lull released the fleet to 1)."""
    four, two, idle = Load(decode=4 * 204), Load(decode=2 * 204), Load(decode=1)
    timeline: list[tuple[float, Load]] = [(0.0, four), (60.0, idle), (200.0, four)]
    rates = {0.0: 60.0, 60.0: 2.0, 200.0: 60.0}
    start = 260.0
    while start < 2700.0:
        timeline += [(start, idle), (start + 200.0, two)]
        rates |= {start: 2.0, start + 200.0: 30.0}
        start += 260.0
    timeline.append((start, idle))
    _, ticks = _drive(_fleet(4), _gap_config(), timeline, rates)
    counts = {now: d.final_replicas for now, d in ticks}
    assert counts[95.0] == 1 and counts[205.0] == 4  # released at the first lull and bought back
    assert min(counts[t] for t in counts if t >= 260.0) == 2  # held at the bursts' 2 through every later lull
    lulls = [t for t, load in timeline if t >= 2100.0 and load is idle]  # past 30 minutes after the re-buy
    late = [d for now, d in ticks if any(t + 60.0 <= now < t + 200.0 for t in lulls)]
    assert late and all(d.final_replicas == 2 and Reason.SCALE_DOWN_HELD_ACROSS_GAPS in d.reasons for d in late)

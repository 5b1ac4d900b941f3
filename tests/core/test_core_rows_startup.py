"""Rows for start-up awareness (planner.core.startup, issue 15): each pins documented behaviour of
docs/decision_core.md "Start-up awareness" — the measured start-up (an EWMA of decision -> every replica ready),
the in-flight raise on rate growth of at least ``in_flight_raise_rate_growth_frac``, and the memory of scale-downs
and of re-buy gaps (30 minutes; a re-buy within ``hold_across_gaps_max_s``)."""

from __future__ import annotations

import pytest

from planner.core import Mode, RoleConfig
from planner.core.startup import gap_hold, in_flight_raise_to, measured_startup_s, record_scale, scale_down_window_s
from planner.core.state import ServiceState

RC = RoleConfig(mode=Mode.THRESHOLD)  # hold_across_gaps_max_s 600 s, in_flight_raise_rate_growth_frac 0.2


def test_a_settled_scale_up_measures_the_time_from_its_decision() -> None:
    state = ServiceState(in_flight_since=1010.0, scale_up_at=1000.0)
    assert measured_startup_s(state, False, 1060.0) == pytest.approx(60.0)


def test_a_second_start_up_is_averaged_with_weight_one_half() -> None:
    state = ServiceState(in_flight_since=1010.0, scale_up_at=1000.0, startup_s_observed=100.0)
    assert measured_startup_s(state, False, 1060.0) == pytest.approx(80.0)


def test_a_scale_up_still_in_flight_measures_nothing_yet() -> None:
    state = ServiceState(in_flight_since=1010.0, scale_up_at=1000.0, startup_s_observed=100.0)
    assert measured_startup_s(state, True, 1060.0) == 100.0


def test_no_in_flight_raise_once_the_action_settled() -> None:
    state = ServiceState(scale_up_rate_per_s=10.0)
    assert in_flight_raise_to(RC, state, 100.0, False, 4) is None
    assert in_flight_raise_to(RC, state, 100.0, True, 4) == 40


def test_a_rate_grown_by_exactly_the_threshold_raises_the_target() -> None:
    rc = RoleConfig(mode=Mode.THRESHOLD, in_flight_raise_rate_growth_frac=0.5)
    state = ServiceState(scale_up_rate_per_s=10.0)
    assert in_flight_raise_to(rc, state, 15.0, True, 4) == 6
    assert in_flight_raise_to(rc, state, 14.0, True, 4) is None


def test_a_tick_without_a_change_forgets_scale_downs_older_than_30_minutes() -> None:
    state = ServiceState(scale_downs=((1000.0, 6), (9000.0, 4)))
    after = record_scale(state, RC, 3, 3, 10000.0)
    assert after.scale_downs == ((9000.0, 4),)
    assert after.rebuy_gaps == ()


def test_a_tick_without_a_change_keeps_a_recent_memory_as_it_is() -> None:
    state = ServiceState(scale_downs=((9000.0, 4),))
    assert record_scale(state, RC, 3, 3, 10000.0) == state


def test_a_scale_down_is_remembered_with_the_count_it_left() -> None:
    state = ServiceState(scale_downs=((1000.0, 6), (9000.0, 4)))
    after = record_scale(state, RC, 3, 2, 10000.0)
    assert after.scale_downs == ((9000.0, 4), (10000.0, 3))


@pytest.mark.parametrize("gap_s", [300.0, 600.0])
def test_buying_back_released_capacity_within_the_cap_remembers_the_gap(gap_s: float) -> None:
    now = 10000.0
    state = ServiceState(scale_downs=((1000.0, 6), (now - gap_s, 4)), rebuy_gaps=((5000.0, 50.0), (9500.0, 200.0)))
    after = record_scale(state, RC, 2, 4, now)
    assert after.rebuy_gaps == ((9500.0, 200.0), (now, gap_s))
    assert after.scale_downs == ((now - gap_s, 4),)


def test_buying_back_later_than_the_cap_remembers_no_gap() -> None:
    now = 10000.0
    state = ServiceState(scale_downs=((now - 601.0, 4),))
    after = record_scale(state, RC, 2, 4, now)
    assert after.rebuy_gaps == () and after.scale_downs == state.scale_downs


@pytest.mark.parametrize("gap_s", [10.0, 100.0, 500.0])
def test_a_remembered_rebuy_holds_its_count_for_the_cap_whatever_its_gap(gap_s: float) -> None:
    now = 10000.0
    rc = RoleConfig(mode=Mode.THRESHOLD, startup_s=60.0)  # 2 start-ups: 120 s; cap 600 s
    state = ServiceState(rebuy_gaps=((now - 100.0, gap_s),), rebuy_counts=((now - 300.0, 9), (now - 100.0, 4)))
    assert scale_down_window_s(rc, state, now) == max(120.0, min(1.5 * gap_s, 600.0))  # grown as before
    assert gap_hold(rc, state, now) == (600.0, 9)
    assert gap_hold(rc, state, now + 1701.0) is None  # both re-buys older than 30 minutes
    assert gap_hold(rc, ServiceState(), now) is None


def test_a_rebuy_remembers_the_count_bought_back() -> None:
    now = 10000.0
    state = ServiceState(scale_downs=((now - 200.0, 6),), rebuy_counts=((1000.0, 3), (9900.0, 2)))
    after = record_scale(state, RC, 2, 5, now)
    assert after.rebuy_counts == ((9900.0, 2), (now, 5))

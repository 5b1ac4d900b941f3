"""Rows for start-up awareness (planner.core.startup, issue 15): each pins documented behaviour of
docs/decision_core.md "Start-up awareness" — the measured start-up (an EWMA of decision -> every replica ready),
the in-flight raise on rate growth of at least ``in_flight_raise_rate_growth_frac``, and the memory of scale-downs
and of re-buy gaps (30 minutes; a re-buy within ``hold_across_gaps_max_s``)."""

from __future__ import annotations

import msgspec
import pytest

from planner.core import Mode, RoleConfig
from planner.core.startup import (
    gap_hold,
    in_flight_raise_to,
    measured_startup_s,
    record_scale,
    scale_down_window_s,
    traffic_fell,
)
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
    state = ServiceState(scale_downs=((1000.0, 6, None), (9000.0, 4, None)))
    after = record_scale(state, RC, 3, 3, 10000.0)
    assert after.scale_downs == ((9000.0, 4, None),)
    assert after.rebuy_gaps == ()


def test_a_tick_without_a_change_keeps_a_recent_memory_as_it_is() -> None:
    state = ServiceState(scale_downs=((9000.0, 4, 20.0),))
    assert record_scale(state, RC, 3, 3, 10000.0) == state
    assert record_scale(state, RC, 3, 3, 10000.0, 30.0) == state  # a higher rate leaves the lowest as it is


def test_a_scale_down_is_remembered_with_the_count_it_left() -> None:
    state = ServiceState(scale_downs=((1000.0, 6, None), (9000.0, 4, None)))
    after = record_scale(state, RC, 3, 2, 10000.0, 12.5)
    assert after.scale_downs == ((9000.0, 4, 12.5), (10000.0, 3, 12.5))


@pytest.mark.parametrize("gap_s", [300.0, 600.0])
def test_buying_back_released_capacity_within_the_cap_remembers_the_gap(gap_s: float) -> None:
    now = 10000.0
    state = ServiceState(
        scale_downs=((1000.0, 6, None), (now - gap_s, 4, None)), rebuy_gaps=((5000.0, 50.0), (9500.0, 200.0))
    )
    after = record_scale(state, RC, 2, 4, now)
    assert after.rebuy_gaps == ((9500.0, 200.0), (now, gap_s))
    assert after.scale_downs == ((now - gap_s, 4, None),)


def test_buying_back_later_than_the_cap_remembers_no_gap() -> None:
    now = 10000.0
    state = ServiceState(scale_downs=((now - 601.0, 4, None),))
    after = record_scale(state, RC, 2, 4, now)
    assert after.rebuy_gaps == () and after.scale_downs == state.scale_downs


@pytest.mark.parametrize("gap_s", [10.0, 100.0, 500.0])
def test_a_remembered_rebuy_holds_its_count_for_the_cap_whatever_its_gap(gap_s: float) -> None:
    now = 10000.0
    rc = RoleConfig(mode=Mode.THRESHOLD, startup_s=60.0)  # 2 start-ups: 120 s; cap 600 s
    state = ServiceState(
        rebuy_gaps=((now - 100.0, gap_s),), rebuy_counts=((now - 300.0, 9, None), (now - 100.0, 4, None))
    )
    assert scale_down_window_s(rc, state, now) == max(120.0, min(1.5 * gap_s, 600.0))  # grown as before
    assert gap_hold(rc, state, now) == (600.0, 9)
    assert gap_hold(rc, state, now + 1701.0) is None  # both re-buys older than 30 minutes
    assert gap_hold(rc, ServiceState(), now) is None


def test_a_rebuy_remembers_the_count_bought_back() -> None:
    now = 10000.0
    state = ServiceState(scale_downs=((now - 200.0, 6, None),), rebuy_counts=((1000.0, 3, None), (9900.0, 2, None)))
    after = record_scale(state, RC, 2, 5, now)
    assert after.rebuy_counts == ((9900.0, 2, None), (now, 5, None))


def test_a_scale_down_keeps_the_lowest_rate_seen_since() -> None:
    state = ServiceState(scale_downs=((9000.0, 6, 40.0), (9500.0, 4, None)))
    after = record_scale(state, RC, 4, 4, 10000.0, 30.0)
    assert after.scale_downs == ((9000.0, 6, 30.0), (9500.0, 4, 30.0))
    assert record_scale(after, RC, 4, 4, 10005.0, float("nan")).scale_downs == after.scale_downs  # not a rate


@pytest.mark.parametrize(
    ("lowest", "rate", "fell"),
    [
        (45.0, 60.0, True),  # fell by exactly a quarter (rebuy_min_fall_frac 0.25)
        (46.0, 60.0, False),  # a trim while the traffic held (~60 req/s): the recommendation moved
        (0.0, 0.1, False),  # a trickle's 0 -> 1 request in the 10 s window is counting noise, not a fall
        (0.0, 10.9, True),
        (None, 60.0, True),  # no rate since the release: as before, the re-buy counts
        (45.0, None, True),
        (0.0, 0.0, False),
    ],
)
def test_a_rebuy_counts_only_after_the_traffic_fell(lowest: float | None, rate: float | None, fell: bool) -> None:
    assert traffic_fell(RC, lowest, rate) is fell
    assert traffic_fell(RoleConfig(mode=Mode.THRESHOLD, rebuy_min_fall_frac=None), 46.0, 60.0) is True


def test_a_trim_bought_back_at_the_same_traffic_grows_the_window_but_holds_no_count() -> None:
    now = 10000.0
    state = ServiceState(scale_downs=((now - 50.0, 4, 58.0),), startup_s_observed=15.0)  # 50 s: past a start-up
    after = record_scale(state, RC, 3, 4, now, 62.0)
    assert after.rebuy_gaps == ((now, 50.0),)  # the window covers the recommendation's oscillation
    assert after.rebuy_counts == () and gap_hold(RC, after, now) is None
    fell = record_scale(ServiceState(scale_downs=((now - 50.0, 4, 20.0),)), RC, 3, 4, now, 62.0)
    assert fell.rebuy_counts == ((now, 4, 62.0),)


def test_a_remembered_rebuy_is_renewed_when_the_traffic_fell_and_came_back() -> None:
    """A hold that kept the capacity through a gap avoided the re-buy that would have renewed the memory: when the
    traffic fell since (the lowest rate since the re-buy) and came back, the re-buy is remembered from now, its
    count kept, whether or not the comeback needs that count (a smaller burst still says the traffic is bursty;
    the hold is the last 600 s's highest recommendation up to the count); without a fall it keeps its time and the
    lowest rate."""
    now = 10000.0
    state = ServiceState(rebuy_counts=((now - 1000.0, 8, 5.0),), recommendations=((now, 9),))
    assert record_scale(state, RC, 9, 9, now, 120.0).rebuy_counts == ((now, 8, 120.0),)
    assert record_scale(state, RC, 9, 9, now, 6.0).rebuy_counts == ((now - 1000.0, 8, 5.0),)  # no fall: kept
    below = ServiceState(rebuy_counts=((now - 1000.0, 8, 5.0),), recommendations=((now, 7),))
    assert record_scale(below, RC, 7, 7, now, 120.0).rebuy_counts == ((now, 8, 120.0),)  # a smaller comeback
    assert record_scale(below, RC, 7, 7, now, 6.0).rebuy_counts == ((now - 1000.0, 8, 5.0),)
    unknown = ServiceState(rebuy_counts=((now - 1000.0, 8, None),), recommendations=((now, 9),))
    assert record_scale(unknown, RC, 9, 9, now, None).rebuy_counts == unknown.rebuy_counts  # no rate: no renewal
    later = record_scale(state, RC, 9, 9, now + 801.0, 3.0)  # past 30 minutes: forgotten
    assert later.rebuy_counts == ()


def test_a_trim_bought_back_within_a_start_up_grows_the_window_past_its_run() -> None:
    """A replica trimmed and bought back at the same traffic within one start-up saved nothing and cost a
    start-up: the recommendation stayed below the count for the window before the trim (two 15 s start-ups) and
    the 5 s after it, so the window grows past that run (1.5 x 35 s); each such flap grows it further."""
    now = 10000.0
    rc = RoleConfig(mode=Mode.THRESHOLD)  # 2 start-ups
    state = ServiceState(scale_downs=((now - 5.0, 4, 60.0),), startup_s_observed=15.0)
    after = record_scale(state, rc, 3, 4, now, 60.0)
    assert after.rebuy_gaps == ((now, 35.0),) and after.rebuy_counts == ()
    assert scale_down_window_s(rc, after, now) == pytest.approx(52.5)
    again = msgspec.structs.replace(after, scale_downs=((now + 95.0, 4, 60.0),))
    assert scale_down_window_s(rc, record_scale(again, rc, 3, 4, now + 100.0, 60.0), now + 100.0) == pytest.approx(
        1.5 * (5.0 + 52.5)
    )
    slow = ServiceState(scale_downs=((now - 20.0, 4, 60.0),), startup_s_observed=15.0)  # came back after a start-up
    assert record_scale(slow, rc, 3, 4, now, 60.0).rebuy_gaps == ((now, 20.0),)

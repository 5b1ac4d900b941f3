"""Rows for planner/core/startup.py's memory of scale-downs and re-buys (docs/decision_core.md, "Holding across idle
gaps", "Only after the traffic fell", "Renewed while the traffic keeps coming back"; docs/testing.md, mutation
testing). Each row was run against the mutant it names (``MUTANT_UNDER_TEST``) and fails there:

- the memory is 30 minutes, the same for every reader of it: an entry exactly 1,800 s old is forgotten by the
  hold (``gap_hold`` 3), the grown window (``scale_down_window_s`` 8), the scale-down memory (``record_scale`` 16),
  the gap memory (``record_scale`` 51) and the re-buy memory (``_renewed`` 9);
- a re-buy is renewed only when the traffic is seen to fall since and come back: not with no rate seen since, nor
  with the fall check off (``_renewed`` 13);
- a request rate of 0 is a rate (the traffic stopped: the deepest fall there is), a rate that is not a number or
  below 0 is unknown (``record_scale`` 3, 8, 9);
- a scale-down tick keeps the re-buy memory's lowest rate (``record_scale`` 33);
- the memories are bounded: the last 32 scale-downs, 16 re-buy counts and 16 gaps (``record_scale`` 35, 69, 92);
- a trim bought back at the same traffic exactly one start-up later is no flap: its gap is recorded as it is
  (``record_scale`` 70, the start-up's ``<``);
- the in-flight raise needs the rate's growth of ``in_flight_raise_rate_growth_frac`` even where the counting noise
  is passed (``in_flight_raise_to`` 12), and its ratio is capped at a million, so a scale-up decided at a rate of
  almost nothing gives a finite count (``in_flight_raise_to`` 28); without a rate this tick it does not raise
  (``in_flight_raise_to`` 3).
"""

from __future__ import annotations

import math

import msgspec
import pytest

from planner.core import Mode, RoleConfig
from planner.core.startup import gap_hold, in_flight_raise_to, record_scale, scale_down_window_s
from planner.core.state import ServiceState

# start-up 60 s, two start-ups of base window (120 s), hold across gaps up to 600 s, a re-buy after a fall of 25 %,
# 10 s traffic windows, an in-flight raise on 20 % growth
RC = RoleConfig(mode=Mode.THRESHOLD)
NOW = 2000.0
EXACTLY_30_MIN_AGO = NOW - 1800.0  # 200.0, exactly


# --- the 30 minutes' end, the same for every reader of the memory ---


def test_a_rebuy_exactly_30_minutes_old_no_longer_holds() -> None:
    """gap_hold 3."""
    assert gap_hold(RC, ServiceState(rebuy_counts=((EXACTLY_30_MIN_AGO, 4, None),)), NOW) is None
    assert gap_hold(RC, ServiceState(rebuy_counts=((EXACTLY_30_MIN_AGO + 1.0, 4, None),)), NOW) == (600.0, 4)


def test_a_gap_exactly_30_minutes_old_no_longer_grows_the_window() -> None:
    """scale_down_window_s 8: the base 120 s, not 1.5 x the 300 s gap."""
    assert scale_down_window_s(RC, ServiceState(rebuy_gaps=((EXACTLY_30_MIN_AGO, 300.0),)), NOW) == 120.0
    assert scale_down_window_s(RC, ServiceState(rebuy_gaps=((EXACTLY_30_MIN_AGO + 1.0, 300.0),)), NOW) == 450.0


def test_a_tick_forgets_a_scale_down_and_a_rebuy_exactly_30_minutes_old() -> None:
    """record_scale 16 (the scale-down memory) and _renewed 9 (the re-buy memory)."""
    state = ServiceState(
        scale_downs=((EXACTLY_30_MIN_AGO, 4, None), (NOW - 100.0, 3, None)),
        rebuy_counts=((EXACTLY_30_MIN_AGO, 4, None), (NOW - 100.0, 3, None)),
    )
    after = record_scale(state, RC, 2, 2, NOW)
    assert after.scale_downs == ((NOW - 100.0, 3, None),)
    assert after.rebuy_counts == ((NOW - 100.0, 3, None),)


def test_a_rebuy_forgets_a_gap_exactly_30_minutes_old() -> None:
    """record_scale 51: released at 10 req/s, the traffic stopped, bought back 100 s later at 10 req/s."""
    state = ServiceState(
        scale_downs=((NOW - 100.0, 4, 0.0),),
        rebuy_gaps=((EXACTLY_30_MIN_AGO, 50.0), (NOW - 500.0, 80.0)),
    )
    after = record_scale(state, RC, 2, 4, NOW, 10.0)
    assert after.rebuy_gaps == ((NOW - 500.0, 80.0), (NOW, 100.0))
    assert after.rebuy_counts == ((NOW, 4, 10.0),)


# --- renewal needs a fall seen ---


def _ticked(state: ServiceState, now: float) -> ServiceState:
    """The state as step leaves it before record_scale: this tick's recommendation recorded."""
    return msgspec.structs.replace(state, recommendations=(*state.recommendations, (now, 2)))


def test_a_rebuy_with_no_rate_seen_since_is_not_renewed_by_a_rate_now() -> None:
    """_renewed 13: remembered without a rate (no traffic given), a rate now says nothing of a fall since; the
    re-buy keeps its time and now remembers the rate as the lowest seen."""
    state = _ticked(ServiceState(rebuy_counts=((1000.0, 4, None),)), 1500.0)
    after = record_scale(state, RC, 2, 2, 1500.0, 10.0)
    assert after.rebuy_counts == ((1000.0, 4, 10.0),)


def test_with_the_fall_check_off_a_rebuy_is_not_renewed() -> None:
    """_renewed 13: ``rebuy_min_fall_frac`` unset, every re-buy counts but none is renewed by the traffic."""
    rc = RoleConfig(mode=Mode.THRESHOLD, rebuy_min_fall_frac=None)
    state = _ticked(ServiceState(rebuy_counts=((1000.0, 4, 1.0),)), 1500.0)
    after = record_scale(state, rc, 2, 2, 1500.0, 10.0)
    assert after.rebuy_counts == ((1000.0, 4, 1.0),)
    assert gap_hold(rc, after, 1000.0 + 1800.0) is None  # lapsed 30 minutes after the re-buy


# --- which rates are known ---


@pytest.mark.parametrize("rate", [math.nan, math.inf, -1.0])
def test_a_rate_not_a_number_or_below_zero_is_remembered_as_unknown(rate: float) -> None:
    """record_scale 3."""
    after = record_scale(ServiceState(), RC, 4, 2, NOW, rate)
    assert after.scale_downs == ((NOW, 4, None),)


def test_a_rebuy_after_the_traffic_stopped_is_held() -> None:
    """record_scale 8, 9: released at 10 req/s, 0 req/s for a while (the traffic stopped: the lowest rate is 0),
    bought back at 10 req/s: a re-buy after a fall, its count held."""
    state = record_scale(ServiceState(), RC, 4, 2, 1000.0, 10.0)
    state = record_scale(state, RC, 2, 2, 1050.0, 0.0)
    assert state.scale_downs == ((1000.0, 4, 0.0),)
    state = record_scale(state, RC, 2, 4, 1100.0, 10.0)
    assert gap_hold(RC, state, 1100.0) == (600.0, 4)


def test_a_scale_down_tick_keeps_the_rebuys_lowest_rate() -> None:
    """record_scale 33: bought back at 10 req/s; the traffic falls to 1 req/s on the tick that scales down, and
    comes back: the re-buy is renewed then, and still held 30 minutes after it was first made."""
    state = ServiceState(rebuy_counts=((1000.0, 4, 10.0),))
    state = record_scale(state, RC, 4, 2, 1100.0, 1.0)
    assert state.rebuy_counts == ((1000.0, 4, 1.0),)
    state = record_scale(_ticked(state, 1200.0), RC, 2, 2, 1200.0, 10.0)
    assert state.rebuy_counts == ((1200.0, 4, 10.0),)
    assert gap_hold(RC, state, 1000.0 + 1800.0) == (600.0, 4)


# --- the memories' sizes ---


def test_the_last_32_scale_downs_are_remembered() -> None:
    """record_scale 35."""
    state = ServiceState(scale_downs=tuple((1000.0 + i, 40 - i, None) for i in range(32)))
    after = record_scale(state, RC, 8, 7, 1100.0)
    assert len(after.scale_downs) == 32
    assert after.scale_downs[0] == (1001.0, 39, None)
    assert after.scale_downs[-1] == (1100.0, 8, None)


def test_the_last_16_rebuy_counts_and_gaps_are_remembered() -> None:
    """record_scale 69 (counts), 92 (gaps): a 17th re-buy after a fall drops the oldest of each."""
    state = ServiceState(
        scale_downs=((9000.0, 4, 0.0),),
        rebuy_counts=tuple((8000.0 + i, 3, 0.0) for i in range(16)),
        rebuy_gaps=tuple((8000.0 + i, 60.0) for i in range(16)),
    )
    after = record_scale(state, RC, 2, 4, 9100.0, 10.0)
    assert len(after.rebuy_counts) == 16
    assert after.rebuy_counts[0] == (8001.0, 3, 0.0)
    assert after.rebuy_counts[-1] == (9100.0, 4, 10.0)
    assert len(after.rebuy_gaps) == 16
    assert after.rebuy_gaps[0] == (8001.0, 60.0)
    assert after.rebuy_gaps[-1] == (9100.0, 100.0)


# --- a flap is bought back within a start-up ---


def test_a_trim_bought_back_exactly_one_start_up_later_is_recorded_as_its_gap() -> None:
    """record_scale 70: at the same 10 req/s (no fall), 60 s after the trim with a 60 s start-up: the gap is 60 s,
    not 60 s + the 120 s window; 59 s later is a flap (59 + 120)."""
    state = ServiceState(scale_downs=((1000.0, 4, 10.0),))
    assert record_scale(state, RC, 3, 4, 1060.0, 10.0).rebuy_gaps == ((1060.0, 60.0),)
    assert record_scale(state, RC, 3, 4, 1059.0, 10.0).rebuy_gaps == ((1059.0, 179.0),)


# --- the in-flight raise ---


def test_growth_beyond_the_noise_but_under_the_threshold_does_not_raise() -> None:
    """in_flight_raise_to 12: 100 -> 115 req/s is 1,000 -> 1,150 requests a window, beyond 3 sd of the counts
    (3 sqrt(2,150) = 139), but a growth of 15 % < 20 %: no raise; 100 -> 120 raises 4 to 5."""
    state = ServiceState(scale_up_rate_per_s=100.0)
    assert in_flight_raise_to(RC, state, 115.0, True, 4) is None
    assert in_flight_raise_to(RC, state, 120.0, True, 4) == 5


def test_the_raise_from_a_rate_of_almost_nothing_is_finite() -> None:
    """in_flight_raise_to 28: a scale-up decided at a rate that rounds to nothing (the ratio overflows to inf)
    raises no further than a million times the target, a count, not an overflow."""
    assert in_flight_raise_to(RC, ServiceState(scale_up_rate_per_s=5e-324), 1.0, True, 1) == 1_000_000
    assert in_flight_raise_to(RC, ServiceState(scale_up_rate_per_s=1e-3), 2000.0, True, 2) == 2_000_000


def test_no_in_flight_raise_without_a_rate_now() -> None:
    """in_flight_raise_to 3 (``growth is None and not rate_per_s``): with the growth rule on and no request rate
    this tick (no traffic given), nothing says the rate grew: no raise (the mutant divided None)."""
    state = ServiceState(scale_up_rate_per_s=10.0)
    assert in_flight_raise_to(RC, state, None, True, 4) is None
    assert in_flight_raise_to(RC, state, 0.0, True, 4) is None

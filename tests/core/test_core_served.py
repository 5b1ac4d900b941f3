"""A count asked while capacity was still coming (planner.core.served): once the fleet, settled, is asked again at a
request rate not below the one the count was asked at, the holds count that entry at most the highest such settled
ask; until then, as asked.

A decode service in threshold mode (one replica per ~10 req/s) with Holt's forecast floor one minute ahead; a scale
action takes three ticks to land (tests.core.fleetkit.Rollout)."""

from __future__ import annotations

from planner.core.served import remember_asked, served
from tests.core.fleetkit import drive_decode_rates

BASE = [30.0] * 72  # six minutes at 30 req/s: the planner's first window passes, the history learns the level


def _run(rates: list[float]) -> tuple[list[int], list[int], list[str]]:
    """Per tick: the deployment's count after the tick, the load's count and the stabilize stage's detail."""
    return drive_decode_rates(rates, rollout_ticks=3)


def test_a_step_that_stays_is_held_at_what_the_ready_fleet_was_asked_not_at_the_floors_peak() -> None:
    """30 -> 120 req/s in three ticks, and it stays: while the scale-ups are in flight the floor asks 9 and 21
    (Holt's trend of the step); the ready fleet is asked 12 at the same rate. The window held 21 for 300 s after
    the last such ask (before); now 12 once a settled tick has asked it at that rate."""
    counts, loads, details = _run(BASE + [60.0, 90.0, 120.0] + [120.0] * 40)
    assert loads[74:] == [12] * 41
    assert counts[79:88] == [21] * 9  # in flight, then the settled window still has only unsettled asks above 12
    assert counts[88:] == [12] * 27  # before: 21 to the end
    assert details[85] == (
        "counts asked while capacity was coming held at what the ready fleet was asked at that rate: 12, not 21"
    )


def test_an_unsettled_ask_counts_at_most_the_highest_settled_ask_after_it_at_a_rate_not_below_its_own() -> None:
    entries = ((0.0, 9), (5.0, 7), (10.0, 4), (15.0, 5), (20.0, 3))
    asked = ((0.0, 100.0, False), (5.0, 100.0, False), (10.0, 100.0, True), (15.0, 50.0, True), (20.0, 95.0, True))
    # 9 and 7 were asked unsettled at 100 req/s; after them the ready fleet was asked 4 at 100 and 3 at 95 (within
    # the noise of 100), 5 at 50 (a fall: no evidence of what 100 needs)
    assert served(entries, asked, 10.0) == ((0.0, 4), (5.0, 4), (10.0, 4), (15.0, 5), (20.0, 3))
    first = entries[:2]
    assert served(first, asked, 10.0) is first  # no settled ask after them yet: as asked
    fell = ((0.0, 100.0, False), (5.0, 100.0, False), (10.0, 50.0, True), (15.0, 50.0, True), (20.0, 50.0, True))
    assert served(entries, fell, 10.0) is entries  # the burst ended before the fleet settled: as asked
    unknown = ((0.0, None, False), (5.0, 100.0, False), (10.0, 100.0, True))
    assert served(entries[:3], unknown, 10.0) == ((0.0, 9), (5.0, 4), (10.0, 4))  # an unknown rate: as asked
    assert served(((0.0, 3), (5.0, 4)), asked, 10.0) == ((0.0, 3), (5.0, 4))  # never raised


def test_asks_are_remembered_with_their_recommendation_and_this_ticks_replaces_a_same_time_one() -> None:
    asked = remember_asked((), ((0.0, 3),), 0.0, 30.0, False)
    assert asked == ((0.0, 30.0, False),)
    asked = remember_asked(asked, ((0.0, 3), (5.0, 4)), 5.0, float("nan"), True)
    assert asked == ((0.0, 30.0, False), (5.0, None, True))
    assert remember_asked(asked, ((5.0, 4), (10.0, 2)), 10.0, -1.0, True) == ((5.0, None, True), (10.0, None, True))

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
        "counts asked while capacity was coming or forecast above the load held at what the settled fleet was"
        " asked after them (a forecast: once its horizon came) at that rate: 12, not 21"
    )


def test_a_floors_peak_above_the_load_is_held_at_what_the_settled_fleet_was_asked_once_its_horizon_came() -> None:
    """Each action landing at once: 30 -> 60 -> 50 -> 55 req/s; the floor asks 9, 11, then 12 at 55 req/s on a
    settled fleet where the load asks 6 (Holt's trend, a prediction of the rate one minute ahead), then 11, 10, ...
    at the same rate. The window held the floor's 12 for 300 s (before); now 12 until the minute it forecast has
    come, then at most what was asked from then on at that rate, each later floor the same way, down to 7."""
    counts, loads, details = drive_decode_rates(BASE + [60.0, 50.0] + [55.0] * 40)
    assert loads[74] == 6 and counts[72:75] == [9, 11, 12]
    assert counts[75:86] == [12] * 11  # the horizon (60 s) of the 12 asked at 370 s has not come
    assert counts[86:93] == [11, 10, 9, 8, 7, 7, 7]  # before: 12 to the end
    assert counts[93:] == [6, 6] + [7] * 19
    assert details[86] == (
        "highest recommendation in the last 300 s is 11; counts asked while capacity was coming or forecast above the"
        " load held at what the settled fleet was asked after them (a forecast: once its horizon came) at that rate:"
        " 11, not 12"
    )


def test_a_forecast_is_not_capped_by_a_later_forecast_made_before_its_horizon_came() -> None:
    """A rise with a dip, each action landing at once: 50, 70, 65, 75, 90, 120 req/s. The floor asks 16 at 65 req/s
    (a forecast of the rate one minute ahead) and 13 at 75 req/s, its trend damped by the dip: the 13 is itself a
    forecast, made before the minute the 16 forecast came, so nothing yet says what that rate needs and the count
    stays 16 (capping 16 at the later 13 released 3 replicas one tick before 90 and 120 req/s: Azure x40 agg cold,
    22 -> 12 instead of 13 at 190 s before a 350 req/s surge, 99.16 -> 96.37 %)."""
    counts, loads, _ = drive_decode_rates(BASE + [50.0, 70.0, 65.0, 75.0, 90.0, 120.0] + [120.0] * 30)
    assert loads[74:78] == [7, 8, 9, 12]
    assert counts[72:78] == [7, 11, 16, 16, 16, 21]  # capped at once: 16, 13, 15, 21


def test_a_floor_held_above_the_load_at_a_rate_that_stays_is_held_until_its_horizon_came() -> None:
    """The step 30 -> 120 req/s that stays, each action landing at once: the floor asks 21 at 120 req/s (Holt's
    trend of the step, each a forecast one minute ahead) while the load asks 12; once the minute the last 21
    forecast has come, the settled fleet asked 13 at that rate, and the window counts the 21s at that (before: 21
    for the whole 300 s window; capping a 21 at the next tick's 21 kept it too)."""
    counts, loads, _ = drive_decode_rates(BASE + [60.0, 90.0, 120.0] + [120.0] * 40)
    assert loads[74:90] == [12] * 16
    assert counts[74:90] == [21] * 16
    assert counts[90:] == [20, 17, 15] + [13] * 22


def test_a_floor_above_the_load_that_the_rate_never_reached_again_is_held_as_asked() -> None:
    """A floor above the load on a settled fleet, and the rate falls at once: no settled ask at its rate, so the
    holds count it as before (the refuted peaks' rule, planner.core.refuted, then counts it at the load's + 1)."""
    counts, _, details = drive_decode_rates(BASE + [60.0, 90.0, 120.0] + [30.0] * 40)
    assert counts[75] == 13
    assert not any("forecast above the load" in d for d in details)


def test_an_unsettled_ask_counts_at_most_the_highest_settled_ask_after_it_at_a_rate_not_below_its_own() -> None:
    entries = ((0.0, 9), (5.0, 7), (10.0, 4), (15.0, 5), (20.0, 3))
    asked = (
        (0.0, 100.0, False, False),
        (5.0, 100.0, False, False),
        (10.0, 100.0, True, False),
        (15.0, 50.0, True, False),
        (20.0, 95.0, True, False),
    )
    # 9 and 7 were asked unsettled at 100 req/s; after them the ready fleet was asked 4 at 100 and 3 at 95 (within
    # the noise of 100), 5 at 50 (a fall: no evidence of what 100 needs)
    assert served(entries, asked, 10.0) == ((0.0, 4), (5.0, 4), (10.0, 4), (15.0, 5), (20.0, 3))
    first = entries[:2]
    assert served(first, asked, 10.0) is first  # no settled ask after them yet: as asked
    fell = tuple(
        (at, rate, settled, False)
        for at, rate, settled in (
            (0.0, 100.0, False),
            (5.0, 100.0, False),
            (10.0, 50.0, True),
            (15.0, 50.0, True),
            (20.0, 50.0, True),
        )
    )
    assert served(entries, fell, 10.0) is entries  # the burst ended before the fleet settled: as asked
    unknown = ((0.0, None, False, False), (5.0, 100.0, False, False), (10.0, 100.0, True, False))
    assert served(entries[:3], unknown, 10.0) == ((0.0, 9), (5.0, 4), (10.0, 4))  # an unknown rate: as asked
    assert served(((0.0, 3), (5.0, 4)), asked, 10.0) == ((0.0, 3), (5.0, 4))  # never raised


def test_a_predicted_ask_is_capped_like_an_unsettled_one_and_is_evidence_as_asked_when_settled() -> None:
    entries = ((0.0, 5), (5.0, 4), (10.0, 3))
    asked = ((0.0, 45.0, True, True), (5.0, 45.0, True, True), (10.0, 45.0, True, False))
    # 5 predicted (a floor above the load) at 45 req/s: the settled fleet was asked 4 (itself predicted, evidence as
    # asked) and 3 after it at that rate; 4 is capped at the 3 after it
    assert served(entries, asked, 10.0) == ((0.0, 4), (5.0, 3), (10.0, 3))
    fell = ((0.0, 45.0, True, True), (5.0, 15.0, True, False), (10.0, 15.0, True, False))
    assert served(entries, fell, 10.0) is entries  # the rate fell: no evidence of what 45 req/s needs


def test_a_trickles_floor_is_not_judged_by_asks_at_a_rate_the_counts_cannot_tell_from_no_traffic() -> None:
    """An idle trickle (0-3 requests per 10 s window): the forecast floor asks 3 at 45 s at 0.2 req/s (Holt's trend
    of one request, on a replica whose derived capacity is the trickle itself), and after the minute it forecast the
    settled fleet is asked 2 and 1 at 0.1-0.2 req/s and at none. Those rates are within the window's counting noise
    of no traffic (2 sd: more than 4 requests), so they are no evidence of what 0.2 req/s needed: the 3 counts as
    asked, as before HOLD4 (which capped it at 2 at 125 s: surge_from_idle seed 9 agg cold, one replica fewer ready
    when 60 req/s came at 545 s, 100.00 -> 94.07 %). An ask at a rate the counts show still judges it."""
    entries = ((45.0, 3), (105.0, 2), (110.0, 2), (115.0, 1), (120.0, 1))
    trickle = (
        (45.0, 0.2, True, True),
        (105.0, 0.2, True, True),
        (110.0, 0.1, True, True),
        (115.0, 0.0, True, False),
        (120.0, 0.0, True, False),
    )
    assert served(entries, trickle, 10.0, 60.0) is entries  # HOLD4 alone: ((45.0, 2), ...)
    shown = ((45.0, 0.2, True, True), (105.0, 0.2, True, True), (110.0, 2.0, True, True), *trickle[3:])
    assert served(entries, shown, 10.0, 60.0) == ((45.0, 2), *entries[1:])  # 2 asked at 2 req/s (20 requests)


def test_asks_are_remembered_with_their_recommendation_and_this_ticks_replaces_a_same_time_one() -> None:
    asked = remember_asked((), ((0.0, 3),), 0.0, 30.0, False)
    assert asked == ((0.0, 30.0, False, False),)
    asked = remember_asked(asked, ((0.0, 3), (5.0, 4)), 5.0, float("nan"), True, True)
    assert asked == ((0.0, 30.0, False, False), (5.0, None, True, True))
    assert remember_asked(asked, ((5.0, 4), (10.0, 2)), 10.0, -1.0, True) == (
        (5.0, None, True, True),
        (10.0, None, True, False),
    )

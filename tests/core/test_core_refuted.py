"""A forecast floor's peak that the rates refuted (planner.core.refuted): once the request rate has fallen below the
rate a floor more than one replica above the load was asked at, by more than the counting noise of two traffic
windows, the holds (the scale-down window, the hold across gaps, the new replicas' hold) count that recommendation
at the load's count + 1 it was asked with. A rise that holds is not refuted: its peak stands until the minute it
forecast came (then what the settled fleet was asked at that rate counts, planner.core.served).

A decode service in threshold mode (one replica per ~10 req/s: 20 running requests per req/s, 204.8 per replica at
0.8 of 256 seats) with Holt's forecast floor one minute ahead; each tick settles at once (tests.core.fleetkit)."""

from __future__ import annotations

import math

from planner.core.forecast import beyond_counting_noise
from planner.core.refuted import counted, track_peaks
from tests.core.fleetkit import drive_decode_rates

BASE = [30.0] * 72  # six minutes at 30 req/s: the planner's first window passes, the history learns the level
BURST = [60.0, 90.0, 120.0]  # a burst to new highs: Holt's whole trend, a floor far above the load


def _run(rates: list[float]) -> tuple[list[int], list[int], list[str]]:
    """Per tick: the deployment's count after the tick, the load's count and the stabilize stage's detail."""
    return drive_decode_rates(rates)


def test_a_burst_that_falls_is_held_at_the_loads_count_plus_one_not_at_its_floors_peak() -> None:
    """30 -> 120 req/s in three ticks: the floor asks 9, 15, 21 where the load asks 6, 9, 12. The burst falls back
    to 30 req/s: the peaks' rise did not come, and the 300 s window holds the load's 12 + 1, not 21 (before: 21
    for the whole window)."""
    counts, loads, details = _run(BASE + BURST + [30.0] * 40)
    assert loads[72:75] == [6, 9, 12] and counts[72:75] == [9, 15, 21]
    assert counts[75] == 13  # before: 21
    assert details[75] == (
        "highest recommendation in the last 300 s is 13; forecast peaks the rates refuted (the rate fell below the"
        " rate they were asked at) counted at the load's count + 1: 13, not the 21 the recommendations as decided"
        " hold"
    )
    assert set(counts[75:]) == {13}  # the load's own peak is still held by the window


def test_a_rise_that_holds_keeps_its_floors_peak_until_its_horizon_came() -> None:
    """No fall, so no peak is refuted: the floor's 21s, asked at 370-390 s (120 req/s, the load asking 12), stand
    until the minute the last one forecast came (450 s); from then the settled fleet's asks at that rate count
    (planner.core.served, whose test pins the fall to 13; before session 28's HOLD4: 21 for the whole window)."""
    counts, _, details = _run(BASE + BURST + [120.0] * 40)
    assert counts[74:90] == [21] * 16
    assert not any("refuted" in d for d in details)


def test_a_fall_counts_beyond_three_standard_deviations_of_two_windows_poisson_counts() -> None:
    # 100 req/s over 10 s windows: 3 sd of the two counts is 3 sqrt(1,870) = 129.7 requests at 87 req/s
    assert beyond_counting_noise(100.0, 87.0, 10.0)
    assert not beyond_counting_noise(100.0, 88.0, 10.0)
    assert not beyond_counting_noise(100.0, 120.0, 10.0)  # a rise is no fall
    assert not beyond_counting_noise(0.1, 0.0, 10.0)  # a trickle's 1 -> 0 requests is noise (at least one request's sd)
    assert math.isclose(3 * math.sqrt(1870.0), 129.73, abs_tol=0.01)


def test_peaks_are_kept_while_remembered_marked_once_refuted_and_counted_at_the_loads_count_plus_one() -> None:
    recs = ((0.0, 9), (5.0, 4), (10.0, 3))
    peaks = track_peaks((), recs[:1], 0.0, 9, 4, 100.0, 10.0)
    assert peaks == ((0.0, 100.0, 4, False),)
    assert track_peaks((), recs[:1], 0.0, 4, 4, 100.0, 10.0) == ()  # the load's count + 1 is not a peak
    assert track_peaks((), recs[:1], 0.0, 9, 4, None, 10.0) == ()  # nor one whose rate is unknown
    assert track_peaks(peaks, recs, 5.0, 4, 4, 95.0, 10.0) == peaks  # within the noise: standing
    assert track_peaks(peaks, recs, 5.0, 4, 4, None, 10.0) == peaks  # an unknown rate refutes nothing
    refuted = track_peaks(peaks, recs, 10.0, 3, 4, 50.0, 10.0)
    assert refuted == ((0.0, 100.0, 4, True),)
    assert track_peaks(refuted, recs, 15.0, 3, 4, 150.0, 10.0) == refuted  # refuted for good
    assert track_peaks(refuted, recs[1:], 15.0, 3, 4, 50.0, 10.0) == ()  # its recommendation left the memory
    assert counted(recs, peaks) is recs
    assert counted(recs, refuted) == ((0.0, 4), (5.0, 4), (10.0, 3))
    assert counted(((0.0, 3),), refuted) == ((0.0, 3),)  # never raised

"""Rows for planner/core/refuted.py's survivors (docs/testing.md, mutation testing): a fall exactly at the counting
noise is not beyond it, a rate that is not finite is unknown (no peak is tracked on it), and a stabilize stage with
no detail of its own gets the note alone. Each fails on the mutant it was written for."""

from __future__ import annotations

import math

from planner.core import Reason
from planner.core.clamp import Clamped
from planner.core.forecast import beyond_counting_noise
from planner.core.refuted import refuted_note, track_peaks


def test_a_fall_exactly_at_the_counting_noise_is_not_beyond_it() -> None:
    """6.5 -> 3.5 req/s over 10 s windows: a fall of 30 requests against 3 sd of 100 counted (3 x 10 = 30)."""
    assert not beyond_counting_noise(6.5, 3.5, 10.0)
    assert beyond_counting_noise(6.5, 3.4, 10.0)


def test_a_rate_that_is_not_finite_tracks_no_peak_and_refutes_none() -> None:
    recommendations = ((0.0, 6), (5.0, 6))
    peaks = ((0.0, 60.0, 4, False),)
    for unknown in (math.inf, math.nan, None):
        assert track_peaks(peaks, recommendations, 5.0, 6, 4, unknown, 10.0) == peaks
    # a known rate far below the peak's refutes it and tracks this tick's floor above the load's count + 1
    assert track_peaks(peaks, recommendations, 5.0, 6, 4, 20.0, 10.0) == ((0.0, 60.0, 4, True), (5.0, 20.0, 4, False))


def test_a_stabilize_stage_with_no_detail_gets_the_note_alone() -> None:
    noted = refuted_note(Clamped(replicas=3, reason=Reason.SCALE_DOWN_STABILIZED), 5)
    assert noted.detail == (
        "forecast peaks the rates refuted (the rate fell below the rate they were asked at) counted at the load's"
        " count + 1: 3, not the 5 the recommendations as decided hold"
    )
    assert (noted.replicas, noted.reason) == (3, Reason.SCALE_DOWN_STABILIZED)

"""Rows for planner/core/windup.py's survivors (docs/testing.md, mutation testing): the attainment's noise (two
binomial standard errors) of a window of one request, or of none (counted as one), and of an attainment past 1
(clamped: no noise, never a math domain error); and when a window's attainment is usable and has risen past the
noise. Each fails on the mutant it was written for."""

from __future__ import annotations

import pytest

from planner.core.windup import WindupTrack, attainment_noise, update_windup


def test_the_noise_of_one_request_and_of_none_is_two_standard_errors_of_one() -> None:
    assert attainment_noise(0.5, 1) == pytest.approx(1.0)  # 2 sqrt(0.25 / 1)
    assert attainment_noise(0.5, 0) == pytest.approx(1.0)
    assert attainment_noise(0.5, 100) == pytest.approx(0.1)


def test_an_attainment_outside_zero_to_one_is_clamped_into_it() -> None:
    assert attainment_noise(1.2, 100) == 0.0
    assert attainment_noise(-0.2, 100) == 0.0


AT_BOUND = dict(at_bound=True, min_samples=20, settled_now=True, quiet=True, after_settled=3)
TRACKED = WindupTrack(reference=0.9, settled=1)


def test_a_window_without_a_usable_attainment_only_counts_the_settled_action() -> None:
    """No attainment, no sample count, or fewer requests than min_samples: the reference stands, the action that
    settled counts."""
    for attainment, samples in ((None, 100), (0.95, None), (0.95, 5)):
        track = update_windup(TRACKED, attainment=attainment, samples=samples, **AT_BOUND)  # type: ignore[arg-type]
        assert track == WindupTrack(reference=0.9, settled=2)


def test_exactly_min_samples_requests_are_a_usable_attainment() -> None:
    track = update_windup(TRACKED, attainment=0.9, samples=20, **AT_BOUND)  # type: ignore[arg-type]
    assert track == WindupTrack(reference=0.9, settled=2)
    first = update_windup(WindupTrack(), attainment=0.9, samples=20, **AT_BOUND)  # type: ignore[arg-type]
    assert first == WindupTrack(reference=0.9)


def test_an_attainment_exactly_at_the_noise_above_the_reference_did_not_rise() -> None:
    """The capacity bought attainment only past the reference's noise: at exactly its edge the reference stands."""
    edge = 0.9 + attainment_noise(0.9, 100)
    track = update_windup(TRACKED, attainment=edge, samples=100, **AT_BOUND)  # type: ignore[arg-type]
    assert track.reference == 0.9
    past = update_windup(TRACKED, attainment=edge + 0.01, samples=100, **AT_BOUND)  # type: ignore[arg-type]
    assert past == WindupTrack(reference=edge + 0.01)

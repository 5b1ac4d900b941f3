"""Rows for planner/core/windup.py's survivors (docs/testing.md, mutation testing): the attainment's noise (two
binomial standard errors) of a window of one request, or of none (counted as one), and of an attainment past 1
(clamped: no noise, never a math domain error). Each fails on the mutant it was written for."""

from __future__ import annotations

import pytest

from planner.core.windup import attainment_noise


def test_the_noise_of_one_request_and_of_none_is_two_standard_errors_of_one() -> None:
    assert attainment_noise(0.5, 1) == pytest.approx(1.0)  # 2 sqrt(0.25 / 1)
    assert attainment_noise(0.5, 0) == pytest.approx(1.0)
    assert attainment_noise(0.5, 100) == pytest.approx(0.1)


def test_an_attainment_outside_zero_to_one_is_clamped_into_it() -> None:
    assert attainment_noise(1.2, 100) == 0.0
    assert attainment_noise(-0.2, 100) == 0.0

"""Rows for planner/core/feedback.py's ``request_work_tokens`` (docs/testing.md, mutation testing): the mean work per
request is the mean prompt plus the mean output, whatever the prompt's length once it is known; an output not
known, or of none, adds nothing. Each fails on the mutant it was written for."""

from __future__ import annotations

from planner.core import Traffic
from planner.core.feedback import request_work_tokens


def test_a_short_mean_prompt_is_still_a_known_work() -> None:
    assert request_work_tokens(Traffic(isl_tokens=0.5, osl_tokens=10.0)) == 10.5


def test_an_output_not_known_or_of_none_adds_nothing() -> None:
    assert request_work_tokens(Traffic(isl_tokens=100.0)) == 100.0
    assert request_work_tokens(Traffic(isl_tokens=100.0, osl_tokens=0.0)) == 100.0
    assert request_work_tokens(Traffic(isl_tokens=100.0, osl_tokens=0.5)) == 100.5


def test_no_prompt_length_no_work() -> None:
    assert request_work_tokens(None) is None
    assert request_work_tokens(Traffic(osl_tokens=10.0)) is None
    assert request_work_tokens(Traffic(isl_tokens=0.0, osl_tokens=10.0)) is None

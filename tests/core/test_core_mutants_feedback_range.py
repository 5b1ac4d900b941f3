"""Rows for planner/core/feedback.py's relaxation (docs/testing.md, mutation testing), against its module docstring
and its helpers' docstrings: the evidence an observation gives (a usable window above the goal only), how fast one
tick relaxes (a tenth of the gain) and where a decay stops, the range of request sizes a relaxed correction rests
on (earned on traffic of unknown size: none, applied whole; a correction shrinking keeps its range; re-earned whole
beyond it, the range grows, its spread the windows' weighted by the relaxation each added), and what the detail and
the applied correction say inside and beyond the range (only aggregated engines apply part of it). Each fails on
the mutant it was written for."""

from __future__ import annotations

import msgspec
import pytest

from planner.core import Traffic
from planner.core.config import SlaFeedbackConfig
from planner.core.feedback import FeedbackState, RelaxRange, _one, _relax_evidence, _relaxed_range, update_feedback

CFG = SlaFeedbackConfig()  # goal 99 %, gain 0.3/s, relaxing at 0.1 of it, min_samples 20


def test_only_a_usable_window_above_the_goal_is_evidence_for_a_relaxation() -> None:
    assert _relax_evidence(None, None, 5.0, CFG) == 0.0
    assert _relax_evidence(1.0, None, 5.0, CFG) == 0.0  # no count
    assert _relax_evidence(1.0, 19, 5.0, CFG) == 0.0  # under min_samples
    assert _relax_evidence(1.0, 20, 5.0, CFG) == pytest.approx(0.3 * 0.1 * 0.01 * 5.0)  # exactly min_samples
    assert _relax_evidence(0.99, 500, 5.0, CFG) == 0.0  # at the goal


def test_one_tick_relaxes_at_a_tenth_of_the_gain() -> None:
    """100 % observed against 99 % for 5 s: 0.3 x 0.1 x 0.01 x 5 = 0.0015 of the target."""
    window = Traffic(itl_attainment_frac=1.0, itl_samples_in_window=500)
    update = update_feedback(FeedbackState(last_at=0.0), window, 5.0, CFG, in_flight=False)
    assert update.state.itl_frac == pytest.approx(-0.0015)


def test_a_decay_stops_below_a_ten_thousandth_not_at_it() -> None:
    assert _one(1e-4, None, None, 0.0, CFG, False) == (1e-4, "decay")
    assert _one(0.9e-4, None, None, 0.0, CFG, False) == (0.0, "decay")


def test_a_relaxation_earned_on_traffic_of_unknown_size_has_no_range_and_applies_whole() -> None:
    """Relaxed to -0.1 while the prompt lengths were not known; now 5000-token prompts relax it further: the range
    cannot be told, so none is kept and recommend applies the correction whole."""
    state = FeedbackState(itl_frac=-0.1, last_at=0.0)
    window = Traffic(itl_attainment_frac=1.0, itl_samples_in_window=500, isl_tokens=5000.0, osl_tokens=100.0)
    update = update_feedback(state, window, 5.0, CFG, in_flight=False, aggregated=True)
    assert update.state.itl_relaxed_range is None and update.itl_frac == update.state.itl_frac < -0.1


def test_a_first_relaxation_is_its_windows_range() -> None:
    assert _relaxed_range(0.0, -0.1, None, 1000.0, 50.0, 0.0) == RelaxRange(
        lo_tokens=1000.0, hi_tokens=1000.0, spread_tokens=50.0
    )


EARNED = RelaxRange(lo_tokens=1000.0, hi_tokens=2000.0, spread_tokens=100.0)


def test_a_shrinking_correction_keeps_its_range_and_forgets_what_was_re_earned_beyond_it() -> None:
    """Decaying from -0.2 to -0.1 on 500-token requests (inside: below the range) widens nothing."""
    assert _relaxed_range(-0.2, -0.1, EARNED, 500.0, 0.0, 0.0) == EARNED
    beyond = msgspec.structs.replace(EARNED, beyond_frac=0.05)
    assert _relaxed_range(-0.2, -0.1, beyond, 1500.0, 0.0, 0.0) == EARNED


def test_inside_the_range_the_spread_moves_by_the_relaxations_weight_at_most_all_the_way() -> None:
    """Evidence 0.5 against a correction of 0.1 weighs 1 (not more): the spread becomes the window's."""
    assert _relaxed_range(-0.1, -0.1, EARNED, 1500.0, 300.0, 0.5).spread_tokens == 300.0  # type: ignore[union-attr]


def test_re_earned_whole_beyond_the_range_it_grows_to_the_requests_and_weighs_their_spread() -> None:
    """0.05 re-earned beyond before, 0.05 now: the whole 0.1. The range grows to the 5000-token requests; the
    spread moves half-way (0.05 of 0.1) from 100 to the window's 300."""
    beyond = msgspec.structs.replace(EARNED, beyond_frac=0.05)
    assert _relaxed_range(-0.1, -0.1, beyond, 5000.0, 300.0, 0.05) == RelaxRange(
        lo_tokens=1000.0, hi_tokens=5000.0, spread_tokens=200.0
    )


def ranged(isl_tokens: float) -> tuple[FeedbackState, Traffic]:
    state = FeedbackState(itl_frac=-0.1, last_at=0.0, itl_relaxed_range=EARNED)
    window = Traffic(itl_attainment_frac=1.0, itl_samples_in_window=500, isl_tokens=isl_tokens, osl_tokens=0.0)
    return state, window


def test_inside_its_range_the_relaxation_applies_whole_and_the_detail_says_nothing_of_a_range() -> None:
    state, window = ranged(1500.0)
    update = update_feedback(state, window, 5.0, CFG, in_flight=False, aggregated=True)
    assert update.itl_frac == update.state.itl_frac
    assert update.detail == (
        "goal 99%: TTFT headroom +0.000 (held; observed no observation), ITL headroom -0.102 (relax; observed"
        " 100.00% of 500)"
    )


def test_beyond_its_range_only_the_part_re_earned_applies_on_aggregated_engines_and_the_detail_says_so() -> None:
    state, window = ranged(5000.0)
    update = update_feedback(state, window, 5.0, CFG, in_flight=False, aggregated=True)
    assert update.itl_frac == pytest.approx(-0.0015)
    assert update.detail.endswith(
        "ITL headroom -0.102 (relax; observed 100.00% of 500), applied -0.002 (relaxed on 1000..2000-token requests"
        " +100 spread, 5000 now)"
    )
    whole = update_feedback(state, window, 5.0, CFG, in_flight=False)  # disaggregated: the default
    assert whole.itl_frac == whole.state.itl_frac == pytest.approx(-0.1015)

"""Rows for planner/core/feedback.py's wound-up detail (docs/testing.md, mutation testing): a correction wound up
at its bound holds the count only while no target tightens; the detail names each wound-up target, and only those,
joined by commas; with none wound up it is empty. Each fails on the mutant it was written for."""

from __future__ import annotations

from planner.core import Traffic
from planner.core.config import SlaFeedbackConfig
from planner.core.feedback import FeedbackState, update_feedback
from planner.core.windup import WindupTrack

CFG = SlaFeedbackConfig()  # bound 0.6, wound up after 3 settled actions

TTFT_WOUND = "TTFT at its bound, observed 88.00% after 3 settled action(s), not above 88.00% at the bound"


def tick(itl_frac: float, itl_windup: WindupTrack, itl_attained: float) -> tuple[bool, str]:
    """TTFT at its bound, 3 actions settled there at 88 %, 88 % again now (500 requests): wound up."""
    state = FeedbackState(
        ttft_frac=0.6,
        itl_frac=itl_frac,
        last_at=0.0,
        ttft_windup=WindupTrack(reference=0.88, settled=3),
        itl_windup=itl_windup,
    )
    window = Traffic(
        ttft_attainment_frac=0.88,
        ttft_samples_in_window=500,
        itl_attainment_frac=itl_attained,
        itl_samples_in_window=500,
    )
    update = update_feedback(state, window, 5.0, CFG, in_flight=False)
    return update.wound, update.wound_detail


def test_a_wound_up_correction_does_not_hold_the_count_while_the_other_tightens() -> None:
    assert tick(0.1, WindupTrack(), 0.95) == (False, "")


def test_only_the_wound_up_target_is_named() -> None:
    """The ITL at its bound too, at its reference, but no action settled there yet: not wound up, not named."""
    assert tick(0.6, WindupTrack(reference=0.9), 0.9) == (True, "; wound up: " + TTFT_WOUND)
    assert tick(0.0, WindupTrack(), 1.0) == (True, "; wound up: " + TTFT_WOUND)  # the ITL relaxing


def test_both_wound_up_targets_are_named_joined_by_a_comma() -> None:
    itl = "ITL at its bound, observed 90.00% after 3 settled action(s), not above 90.00% at the bound"
    assert tick(0.6, WindupTrack(reference=0.9, settled=3), 0.9) == (True, f"; wound up: {TTFT_WOUND}, {itl}")

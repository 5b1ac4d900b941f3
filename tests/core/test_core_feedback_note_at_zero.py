"""The loop's notes count the time since the capacity came from the action's own time, also when that time is 0 s
(the replay's clock starts at 0): an action in flight on the first tick is "10 s ago" ten seconds later, not 0 s."""

from __future__ import annotations

import msgspec

from planner.core import Reason, Traffic
from planner.core.config import SlaFeedbackConfig
from planner.core.feedback import FeedbackState, update_feedback

CFG = SlaFeedbackConfig()


def _after_action_at_zero(window_s: float) -> FeedbackState:
    return update_feedback(FeedbackState(), Traffic(window_s=window_s), 0.0, CFG, in_flight=True).state


def test_requests_that_arrived_before_an_action_at_zero_are_dated_from_it() -> None:
    flying = _after_action_at_zero(10.0)
    window = Traffic(itl_attainment_frac=0.98, itl_samples_in_window=500, window_s=10.0, ttft_ms_p50=12_000.0)
    update = update_feedback(flying, window, 10.0, CFG, in_flight=False)
    assert update.reason == Reason.SLA_FEEDBACK_FROZEN
    assert update.detail.endswith("arrived before the capacity came 10 s ago")


def test_itl_misses_that_may_predate_an_action_at_zero_are_dated_from_it() -> None:
    relaxed = msgspec.structs.replace(_after_action_at_zero(5.0), itl_frac=-0.1)
    window = Traffic(
        itl_attainment_frac=0.9, itl_samples_in_window=500, window_s=5.0, osl_tokens_p99=101.0, itl_ms_p99=200.0
    )
    update = update_feedback(relaxed, window, 10.0, CFG, in_flight=False)
    assert update.detail.endswith("longer than the 10 s since the capacity came")

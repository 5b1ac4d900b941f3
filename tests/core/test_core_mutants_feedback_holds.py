"""Rows for planner/core/feedback.py's holds (docs/testing.md, mutation testing), against its module docstring: the
loop does not tighten for one attainment window after an action in flight (and tightens again exactly at its end),
nor while the requests reported arrived before the capacity came (most of the window, or enough to be all of its
misses), nor within one start-up of the action while the backlog left from before it drains within a start-up (both
ends included), nor past 0 on ITL misses of requests that may have decoded before the capacity came; and each hold's
note follows the correction's own detail. Each fails on the mutant it was written for."""

from __future__ import annotations

import msgspec

from planner.core import Reason, Traffic
from planner.core.config import SlaFeedbackConfig
from planner.core.feedback import FeedbackState, update_feedback

CFG = SlaFeedbackConfig()  # goal 99 %, gain 0.3/s
T0 = 100.0  # the action in flight
HEAD = "goal 99%: TTFT headroom +0.000 (held; observed no observation), ITL headroom +0.000 ("  # the loop's detail


def itl_short(attained: float = 0.98, **kw: float) -> Traffic:
    """A window of 500 requests, ``attained`` of them within the ITL target."""
    return Traffic(itl_attainment_frac=attained, itl_samples_in_window=500, **kw)  # type: ignore[arg-type]


def after_action(window_s: float, queued_tokens: float | None = None) -> FeedbackState:
    """The state after a tick at 100 s with an action in flight (no observation yet)."""
    update = update_feedback(
        FeedbackState(), Traffic(window_s=window_s), T0, CFG, in_flight=True, queued_prefill_tokens=queued_tokens
    )
    return update.state


def test_the_hold_after_an_action_lasts_one_window_and_ends_exactly_there() -> None:
    flying = after_action(window_s=10.0)
    assert flying.hold_until == T0 + 10.0
    inside = update_feedback(flying, itl_short(window_s=10.0), T0 + 9.0, CFG, in_flight=False)
    assert inside.state.itl_frac == 0.0 and inside.reason == Reason.SLA_FEEDBACK_FROZEN
    assert inside.detail.startswith(HEAD + "frozen")
    assert inside.detail.endswith("; not tightening while capacity cannot come (in flight or capped)")
    at_end = update_feedback(flying, itl_short(window_s=10.0), T0 + 10.0, CFG, in_flight=False)
    assert at_end.reason == Reason.SLA_FEEDBACK_TIGHTENED and at_end.state.itl_frac > 0.0


def test_at_the_holds_end_requests_that_arrived_before_the_capacity_still_hold_it_and_the_note_says_so() -> None:
    """10 s after the action the window's TTFT p50 is 12 s: at least half of its requests arrived before the
    capacity came."""
    flying = after_action(window_s=10.0)
    update = update_feedback(flying, itl_short(window_s=10.0, ttft_ms_p50=12_000.0), T0 + 10.0, CFG, in_flight=False)
    assert update.state.itl_frac == 0.0 and update.reason == Reason.SLA_FEEDBACK_FROZEN
    assert update.detail.startswith(HEAD + "frozen")
    assert update.detail.endswith(
        "; not tightening: at least 50% of the requests reported arrived before the capacity came 10 s ago"
    )


def test_a_stale_share_that_may_be_all_of_the_misses_holds_but_not_more_misses() -> None:
    """20 s after the action, past the hold: the TTFT p90 (25 s) says at least 10 % of the requests arrived before
    the capacity came. 5 % of misses may all be theirs: held; 15 % cannot be: tightened."""
    flying = after_action(window_s=10.0)
    stale = {"ttft_ms_p50": 5_000.0, "ttft_ms_p90": 25_000.0, "window_s": 10.0}
    few = Traffic(ttft_attainment_frac=0.95, ttft_samples_in_window=500, **stale)  # type: ignore[arg-type]
    held = update_feedback(flying, few, T0 + 20.0, CFG, in_flight=False)
    assert held.state.ttft_frac == 0.0 and held.reason == Reason.SLA_FEEDBACK_FROZEN
    many = Traffic(ttft_attainment_frac=0.85, ttft_samples_in_window=500, **stale)  # type: ignore[arg-type]
    assert update_feedback(flying, many, T0 + 20.0, CFG, in_flight=False).state.ttft_frac > 0.0


def test_a_perfect_window_of_one_target_does_not_hold_the_other() -> None:
    """No action ever in flight: every TTFT within its target, 2 % of ITL misses: the ITL tightens."""
    traffic = Traffic(
        ttft_attainment_frac=1.0, ttft_samples_in_window=500, itl_attainment_frac=0.98, itl_samples_in_window=500
    )
    update = update_feedback(FeedbackState(last_at=0.0), traffic, 5.0, CFG, in_flight=False)
    assert update.state.itl_frac > 0.0 and update.state.ttft_frac < 0.0


def test_a_backlog_draining_exactly_one_start_up_after_the_action_still_holds() -> None:
    """Action in flight with 3000 prompt tokens queued; 20 s later, one start-up, 1000 are left, falling
    100 tokens/s: gone in 10 s. The ITL misses are the backlog's: held, and the detail says why after the loop's."""
    flying = after_action(window_s=5.0, queued_tokens=3000.0)
    update = update_feedback(
        flying, itl_short(window_s=5.0), T0 + 20.0, CFG, in_flight=False, queued_prefill_tokens=1000.0, startup_s=20.0
    )
    assert update.state.itl_frac == 0.0 and update.reason == Reason.SLA_FEEDBACK_FROZEN
    assert update.detail.startswith(HEAD + "frozen")
    assert update.detail.endswith(
        "; not tightening: the backlog left from before the capacity came drains in 10 s, within a start-up (20 s)"
    )


def test_a_backlog_gone_in_exactly_one_start_up_still_holds() -> None:
    """1500 -> 1000 queued tokens in 20 s: 25 tokens/s, gone in 40 s, the start-up."""
    flying = after_action(window_s=5.0, queued_tokens=1500.0)
    update = update_feedback(
        flying, itl_short(window_s=5.0), T0 + 20.0, CFG, in_flight=False, queued_prefill_tokens=1000.0, startup_s=40.0
    )
    assert update.state.itl_frac == 0.0 and "drains in 40 s, within a start-up (40 s)" in update.detail


def test_a_start_up_of_one_second_is_a_start_up_and_none_is_the_default() -> None:
    """1 s after the action the queue fell from 1000 to 10 tokens (gone in 0.01 s)."""
    flying = after_action(window_s=0.5, queued_tokens=1000.0)
    kw = {"in_flight": False, "queued_prefill_tokens": 10.0}
    one = update_feedback(flying, itl_short(window_s=0.5), T0 + 1.0, CFG, startup_s=1.0, **kw)  # type: ignore[arg-type]
    assert one.state.itl_frac == 0.0 and one.reason == Reason.SLA_FEEDBACK_FROZEN
    default = update_feedback(flying, itl_short(window_s=0.5), T0 + 1.0, CFG, **kw)  # type: ignore[arg-type]
    assert default.state.itl_frac > 0.0 and default.reason == Reason.SLA_FEEDBACK_TIGHTENED


def test_itl_misses_that_may_predate_the_capacity_take_back_a_relaxation_up_to_zero_and_say_so() -> None:
    """10 s after the action, the window's requests decoded up to (101 - 1) x 200 ms = 20 s: longer than the time
    since. 10 % of misses take the relaxation of -0.1 back to 0 (the model's own), not past it."""
    flying = after_action(window_s=5.0)
    relaxed = msgspec.structs.replace(flying, itl_frac=-0.1)
    stale = itl_short(0.9, window_s=5.0, osl_tokens_p99=101.0, itl_ms_p99=200.0)
    update = update_feedback(relaxed, stale, T0 + 10.0, CFG, in_flight=False)
    assert update.state.itl_frac == 0.0 and update.reason == Reason.SLA_FEEDBACK_TIGHTENED
    assert update.detail.startswith(HEAD + "tighten")
    assert update.detail.endswith(
        "; not tightening the ITL past the model's own: the requests reported decoded up to 20 s"
        " ((OSL p99 - 1) x ITL p99), longer than the 10 s since the capacity came"
    )


def test_a_window_at_the_goal_is_no_stale_miss_to_cap() -> None:
    """The same stale window, exactly at the goal: nothing moves, no stage, no note."""
    flying = after_action(window_s=5.0)
    at_goal = itl_short(0.99, window_s=5.0, osl_tokens_p99=101.0, itl_ms_p99=200.0)
    update = update_feedback(flying, at_goal, T0 + 10.0, CFG, in_flight=False)
    assert update.state.itl_frac == 0.0 and update.reason is None and update.detail == ""

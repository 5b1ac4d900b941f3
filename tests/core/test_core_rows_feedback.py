"""Rows for SLA mode's closed loop (planner.core.feedback, issue 15): each pins documented behaviour of
docs/decision_core.md "SLA feedback" — the integral, its thresholds, which reason each move reports, what the
stage detail names, and what the update keeps in the state."""

from __future__ import annotations

import pytest

from planner.core import Reason, Traffic
from planner.core.config import SlaFeedbackConfig
from planner.core.feedback import FeedbackState, update_feedback

CFG = SlaFeedbackConfig()


def itl_seen(frac: float | None, samples: int | None = 500) -> Traffic:
    return Traffic(itl_attainment_frac=frac, itl_samples_in_window=samples)


def ttft_seen(frac: float | None, samples: int | None = 500) -> Traffic:
    return Traffic(ttft_attainment_frac=frac, ttft_samples_in_window=samples)


def test_one_tick_integrates_gain_times_shortfall_times_the_time_since_the_last_tick() -> None:
    # The config's own example: 95 % observed against a 99 % goal tightens by 0.06 of the target per 5 s tick,
    # whatever the absolute clock reads.
    state = FeedbackState(last_at=1000.0)
    update = update_feedback(state, itl_seen(0.95), 1005.0, CFG, in_flight=False)
    assert update.state.itl_frac == pytest.approx(CFG.gain_per_s * 0.04 * 5.0)
    assert update.reason == Reason.SLA_FEEDBACK_TIGHTENED


@pytest.mark.parametrize("now", [1000.0, 990.0])
def test_a_tick_at_or_before_the_last_one_integrates_nothing(now: float) -> None:
    state = FeedbackState(itl_frac=0.1, last_at=1000.0)
    update = update_feedback(state, itl_seen(0.5), now, CFG, in_flight=False)
    assert update.state.itl_frac == 0.1


def test_exactly_min_samples_requests_is_a_usable_observation() -> None:
    state = FeedbackState(last_at=0.0)
    at_min = update_feedback(state, itl_seen(0.95, samples=CFG.min_samples), 5.0, CFG, in_flight=False)
    assert at_min.state.itl_frac > 0.0 and at_min.reason == Reason.SLA_FEEDBACK_TIGHTENED
    below = update_feedback(state, itl_seen(0.95, samples=CFG.min_samples - 1), 5.0, CFG, in_flight=False)
    assert below.state.itl_frac == 0.0 and below.reason is None


def test_a_decaying_correction_reaches_zero_and_then_reports_no_reason() -> None:
    state = FeedbackState(itl_frac=0.3, ttft_frac=-0.2, last_at=0.0)
    now = 0.0
    while now < 20 * CFG.decay_s:
        now += CFG.max_step_s
        state = update_feedback(state, None, now, CFG, in_flight=False).state
    assert state.itl_frac == 0.0 and state.ttft_frac == 0.0
    update = update_feedback(state, None, now + 5.0, CFG, in_flight=False)
    assert update.reason is None and update.detail == ""


def test_an_excess_relaxes_with_its_own_reason() -> None:
    update = update_feedback(FeedbackState(itl_frac=0.2, last_at=0.0), itl_seen(1.0), 5.0, CFG, in_flight=False)
    assert update.state.itl_frac < 0.2 and update.reason == Reason.SLA_FEEDBACK_RELAXED


@pytest.mark.parametrize("in_flight", [False, True])
def test_at_the_goal_the_correction_holds_and_says_so(in_flight: bool) -> None:
    # Attainment exactly at the goal: nothing to tighten (so nothing is frozen) and nothing to relax.
    state = FeedbackState(itl_frac=0.2, last_at=0.0)
    update = update_feedback(state, itl_seen(CFG.attainment_goal), 5.0, CFG, in_flight=in_flight)
    assert update.state.itl_frac == 0.2
    assert update.reason == Reason.SLA_FEEDBACK_HELD
    assert "ITL headroom +0.200 (held;" in update.detail
    assert "not tightening" not in update.detail


def test_at_the_goal_with_no_correction_in_force_there_is_no_reason() -> None:
    update = update_feedback(FeedbackState(last_at=0.0), itl_seen(CFG.attainment_goal), 5.0, CFG, in_flight=False)
    assert update.state.itl_frac == 0.0 and update.reason is None and update.detail == ""


def test_the_ttft_target_has_its_own_correction_and_is_frozen_alike() -> None:
    state = FeedbackState(last_at=0.0)
    update = update_feedback(state, ttft_seen(0.9), 5.0, CFG, in_flight=False)
    assert update.state.ttft_frac > 0.0 and update.state.itl_frac == 0.0
    assert update.reason == Reason.SLA_FEEDBACK_TIGHTENED
    assert "TTFT headroom +" in update.detail and "(tighten; observed 90.00% of 500)" in update.detail
    assert "ITL headroom +0.000 (held; observed no observation)" in update.detail
    frozen = update_feedback(FeedbackState(ttft_frac=0.1, last_at=0.0), ttft_seen(0.9), 5.0, CFG, in_flight=True)
    assert frozen.state.ttft_frac == 0.1 and frozen.reason == Reason.SLA_FEEDBACK_FROZEN


def test_the_detail_names_both_targets_and_what_each_rests_on() -> None:
    # A sample count without an attainment is no observation (and must not break the detail).
    traffic = Traffic(ttft_samples_in_window=500, itl_attainment_frac=0.5, itl_samples_in_window=400)
    update = update_feedback(FeedbackState(last_at=0.0), traffic, 5.0, CFG, in_flight=False)
    assert update.detail.startswith("goal 99%: TTFT headroom +0.000 (held; observed no observation), ITL headroom +")
    assert "observed 50.00% of 400)" in update.detail


def test_a_frozen_correction_explains_why_in_the_detail() -> None:
    update = update_feedback(FeedbackState(itl_frac=0.2, last_at=0.0), itl_seen(0.5), 5.0, CFG, in_flight=True)
    assert update.reason == Reason.SLA_FEEDBACK_FROZEN
    assert update.detail.startswith("goal 99%: TTFT headroom")
    assert "ITL headroom +0.200 (frozen;" in update.detail
    assert update.detail.endswith("; not tightening while capacity cannot come (in flight or capped)")


def test_relaxing_while_in_flight_is_not_reported_as_frozen() -> None:
    update = update_feedback(FeedbackState(itl_frac=0.2, last_at=0.0), itl_seen(1.0), 5.0, CFG, in_flight=True)
    assert update.reason == Reason.SLA_FEEDBACK_RELAXED
    assert "not tightening" not in update.detail


def test_the_update_keeps_the_capped_flag_the_step_set() -> None:
    state = FeedbackState(itl_frac=0.2, last_at=0.0, capped=True)
    update = update_feedback(state, itl_seen(0.5), 5.0, CFG, in_flight=False)
    assert update.state.capped is True and update.state.itl_frac == 0.2
    assert update.reason == Reason.SLA_FEEDBACK_FROZEN


def test_disabled_feedback_clears_the_corrections_and_reports_nothing() -> None:
    off = SlaFeedbackConfig(enabled=False)
    state = FeedbackState(itl_frac=0.3, ttft_frac=0.1, last_at=0.0, capped=True)
    update = update_feedback(state, itl_seen(0.5), 5.0, off, in_flight=False)
    assert update.state == FeedbackState(last_at=5.0)
    assert update.reason is None and update.detail == ""


@pytest.mark.parametrize("window_s", [10.0, 120.0])
def test_tightening_stays_frozen_for_one_attainment_window_of_the_traffic_after_an_action_settled(
    window_s: float,
) -> None:
    # The window the traffic reports still holds the misses of requests that arrived before the capacity served.
    def seen(frac: float) -> Traffic:
        return Traffic(itl_attainment_frac=frac, itl_samples_in_window=500, window_s=window_s)

    state = update_feedback(FeedbackState(itl_frac=0.1, last_at=0.0), seen(0.9), 5.0, CFG, in_flight=True).state
    inside = update_feedback(state, seen(0.9), 5.0 + 0.9 * window_s, CFG, in_flight=False)
    assert inside.state.itl_frac == 0.1 and inside.reason == Reason.SLA_FEEDBACK_FROZEN
    after = update_feedback(inside.state, seen(0.9), 5.0 + 1.1 * window_s, CFG, in_flight=False)
    assert after.state.itl_frac > 0.1 and after.reason in (Reason.SLA_FEEDBACK_TIGHTENED, Reason.SLA_FEEDBACK_CLAMPED)

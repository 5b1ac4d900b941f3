"""SLA mode's closed loop (issue 13 items 3b and 4): a relaxed correction is a calibration measured on the requests
it was earned on, and is not extrapolated beyond them. It remembers the range of work per request (prompt plus
output tokens) of the windows that earned it, widened by those windows' own spread; on aggregated engines, requests
larger than that range get only the relaxation re-earned on them (also while the correction is held at its bound),
so a relaxation earned on short prompts does not shrink the scale-up a prompt-length jump asks for."""

from __future__ import annotations

import pytest

from perf_model.model import PerfModel
from perf_model.step_timer import ProfileStepTimer
from planner.core import CoreConfig, CoreState, Mode, Reason, RoleConfig, SlaTargets, Stage, Traffic
from planner.core.config import SlaFeedbackConfig
from planner.core.feedback import FeedbackState, RelaxRange, request_work_tokens, update_feedback
from planner.discovery import Role
from tests.core.fleetkit import Fleet, Load
from tests.core.test_core_tail import H200_ENGINE, H200_PROFILE

CFG = SlaFeedbackConfig()
SLA = SlaTargets(ttft_ms=2000, itl_ms=50)


def _met(
    isl: float, osl: float, rate: float = 20.0, isl_p90: float | None = None, osl_p90: float | None = None
) -> Traffic:
    """A window in which every request met both targets."""
    return Traffic(
        request_rate_per_s=rate,
        isl_tokens=isl,
        osl_tokens=osl,
        isl_tokens_p90=isl_p90,
        osl_tokens_p90=osl_p90,
        ttft_attainment_frac=1.0,
        ttft_samples_in_window=200,
        itl_attainment_frac=1.0,
        itl_samples_in_window=200,
        window_s=10.0,
    )


def _relaxed_on_short_prompts(ticks: int = 240) -> FeedbackState:
    state = FeedbackState()
    for i in range(ticks):
        state = update_feedback(state, _met(350.0, 175.0), i * 5.0, CFG, in_flight=False, aggregated=True).state
    return state


def test_a_relaxation_remembers_the_range_of_requests_it_was_earned_on() -> None:
    state = _relaxed_on_short_prompts()
    assert state.ttft_frac == -CFG.max_relax_frac and state.itl_frac == -CFG.max_relax_frac
    assert state.ttft_relaxed_range == RelaxRange(lo_tokens=525.0, hi_tokens=525.0)
    # the same requests: applied whole, the reason is the loop's own
    same = update_feedback(state, _met(350.0, 175.0), 1200.0, CFG, in_flight=False, aggregated=True)
    assert (same.ttft_frac, same.itl_frac) == (same.state.ttft_frac, same.state.itl_frac)
    assert same.reason == Reason.SLA_FEEDBACK_CLAMPED
    # a larger window beyond the range (its spread unknown: 0) does not widen it: its evidence is counted apart
    larger = update_feedback(state, _met(500.0, 200.0), 1200.0, CFG, in_flight=False, aggregated=True).state
    on = larger.ttft_relaxed_range
    assert on is not None and (on.lo_tokens, on.hi_tokens) == (525.0, 525.0) and on.beyond_frac > 0.0
    # a smaller window that earns it widens the range down, and the evidence beyond it is dropped
    smaller = update_feedback(larger, _met(250.0, 150.0), 1205.0, CFG, in_flight=False, aggregated=True).state
    assert smaller.ttft_relaxed_range == RelaxRange(lo_tokens=400.0, hi_tokens=525.0)


def test_on_aggregated_engines_requests_beyond_the_range_get_only_the_relaxation_re_earned_on_them() -> None:
    state = _relaxed_on_short_prompts()
    long = _met(4400.0, 145.0, rate=19.0)
    update = update_feedback(state, long, 1200.0, CFG, in_flight=False, aggregated=True)
    assert request_work_tokens(long) == 4545.0
    evidence = CFG.gain_per_s * CFG.relax_gain_ratio * (1.0 - CFG.attainment_goal) * 5.0
    assert update.ttft_frac == pytest.approx(-evidence) and update.itl_frac == pytest.approx(-evidence)
    assert update.state.ttft_frac == -CFG.max_relax_frac  # the correction itself is unchanged
    assert update.reason == Reason.SLA_FEEDBACK_RELAX_BEYOND_RANGE
    assert "applied -0.00" in update.detail and "525..525-token requests" in update.detail
    assert "4545 now" in update.detail
    # a disaggregated (prefill-only / decode-only) engine: applied whole
    plain = update_feedback(state, long, 1200.0, CFG, in_flight=False, aggregated=False)
    assert (plain.ttft_frac, plain.itl_frac) == (-CFG.max_relax_frac, -CFG.max_relax_frac)
    # smaller requests: applied whole
    small = update_feedback(state, _met(200.0, 100.0), 1200.0, CFG, in_flight=False, aggregated=True)
    assert small.ttft_frac == -CFG.max_relax_frac
    # a window larger on average but within the spread the earning windows showed (long-tailed traffic): whole
    tailed = FeedbackState(ttft_frac=-0.3, itl_frac=-0.3, last_at=1195.0)
    for i in range(240):
        window = _met(350.0 + (i % 3) * 40.0, 175.0, isl_p90=900.0, osl_p90=400.0)
        tailed = update_feedback(tailed, window, 1200.0 + 5 * i, CFG, in_flight=False, aggregated=True).state
    noisy = update_feedback(tailed, _met(700.0, 200.0), 2400.0, CFG, in_flight=False, aggregated=True)
    assert noisy.ttft_frac == -CFG.max_relax_frac


def test_a_relaxation_at_its_bound_re_earns_itself_on_the_new_requests() -> None:
    """Held at -max_relax_frac, the loop still sees every request met: that evidence counts at the new size, so
    after the shift the relaxation comes back as it was earned the first time (not never), and the range grows."""
    state = _relaxed_on_short_prompts()
    long = _met(4400.0, 145.0, rate=19.0)
    applied = []
    for i in range(240, 240 + 720):  # one hour of long prompts, every request met
        update = update_feedback(state, long, i * 5.0, CFG, in_flight=False, aggregated=True)
        state = update.state
        applied.append(update.ttft_frac)
    assert applied == sorted(applied, reverse=True)  # more relaxed as evidence at the new size accumulates
    assert applied[0] > -0.01 and applied[-1] == -CFG.max_relax_frac
    assert applied.index(-CFG.max_relax_frac) == pytest.approx(
        CFG.max_relax_frac / (CFG.gain_per_s * CFG.relax_gain_ratio * (1.0 - CFG.attainment_goal) * 5.0), abs=2
    )
    on = state.ttft_relaxed_range
    assert on is not None and (on.lo_tokens, on.hi_tokens, on.beyond_frac) == (525.0, 4545.0, 0.0)
    # a tightening keeps its range; a relaxation gone forgets it
    missed = Traffic(isl_tokens=4400.0, osl_tokens=145.0, ttft_attainment_frac=0.9, ttft_samples_in_window=200)
    tightened = update_feedback(state, missed, 4800.0, CFG, in_flight=False, aggregated=True).state
    assert tightened.ttft_frac > state.ttft_frac and tightened.ttft_relaxed_range == on
    for i in range(20):
        tightened = update_feedback(tightened, missed, 4805.0 + 5 * i, CFG, in_flight=False, aggregated=True).state
    assert tightened.ttft_frac > 0 and tightened.ttft_relaxed_range is None


def _restored_agg_fleet() -> tuple[Fleet, CoreConfig, dict[Role, PerfModel]]:
    model = PerfModel(Role.AGG, bootstrap=ProfileStepTimer.from_dir(H200_PROFILE))
    rc = RoleConfig(mode=Mode.SLA, sla=SLA, max_replicas=64, startup_s=15.0)
    fleet = Fleet()
    for i in range(2):
        fleet.add(f"agg-{i}", Role.AGG, capacity=H200_ENGINE)
    fleet.deploy("agg", 2)
    return fleet, CoreConfig(roles={Role.AGG: rc}), {Role.AGG: model}


def test_a_relaxation_earned_on_short_prompts_does_not_shrink_the_scale_up_a_prompt_jump_asks_for() -> None:
    """prompt_shift, restored (15 s start-ups): 20 min of 350-token prompts at 20 req/s, every request met on 2
    replicas, relaxed both corrections to their bound. Then the prompts are 4,400 tokens at 19 req/s and a 63k-token
    queue is building. The model alone asks for 5 replicas; before, the relaxation earned on the short prompts cut
    that to 4 (the replay: 3 where 4 were asked, 98.59 %)."""
    fleet, config, predictors = _restored_agg_fleet()
    state = CoreState()
    now = 0.0
    while now < 1200.0:
        fleet.publish_all(now, Load(prefill=600, decode=16, kv=16 * 450))
        state, _ = fleet.tick(state, now, config, {Role.AGG: _met(350.0, 175.0)}, predictors=predictors)
        now += 5.0
    assert state.services["agg"].feedback.ttft_frac == -CFG.max_relax_frac
    fleet.publish_all(now, Load(queued_prefill=62_866, prefill=4000, decode=96, kv=96 * 4500))
    shifted = _met(4400.0, 145.0, rate=19.0)
    _, decisions = fleet.tick(state, now, config, {Role.AGG: shifted}, predictors=predictors)
    decision = decisions["agg"]
    # the model's own answer, with no correction at all
    off = CoreConfig(
        roles={
            Role.AGG: RoleConfig(
                mode=Mode.SLA, sla=SLA, max_replicas=64, startup_s=15.0, sla_feedback=SlaFeedbackConfig(enabled=False)
            )
        }
    )
    _, plain = fleet.tick(CoreState(), now, off, {Role.AGG: shifted}, predictors=predictors)
    assert decision.final_replicas == plain["agg"].final_replicas == 5
    stage = decision.stage(Stage.SLA_FEEDBACK)
    assert stage is not None and stage.reason == Reason.SLA_FEEDBACK_RELAX_BEYOND_RANGE
    assert "applied -0.00" in stage.detail and "4545 now" in stage.detail


def test_the_wide_windows_of_a_jump_do_not_stretch_the_range_to_the_new_size() -> None:
    """A window that straddles a prompt-length jump (short and long prompts mixed: its p90 is a long prompt) is
    within the range and still earned relaxation; its spread is weighed in only at the share of the relaxation it
    added, so the next window, mostly long prompts, is beyond the range and gets only what it re-earned."""
    state = FeedbackState()
    short = _met(350.0, 175.0, isl_p90=600.0, osl_p90=250.0)  # work 525, spread 850 - 525 = 325
    for i in range(240):
        state = update_feedback(state, short, i * 5.0, CFG, in_flight=False, aggregated=True).state
    on = state.ttft_relaxed_range
    assert on is not None and (on.hi_tokens, on.spread_tokens) == (525.0, pytest.approx(325.0))
    straddling = _met(600.0, 175.0, isl_p90=4400.0, osl_p90=250.0)  # work 775: within 525 + 325
    update = update_feedback(state, straddling, 1200.0, CFG, in_flight=False, aggregated=True)
    assert update.ttft_frac == -CFG.max_relax_frac
    on = update.state.ttft_relaxed_range
    assert on is not None and on.hi_tokens == 775.0 and 325.0 < on.spread_tokens < 350.0  # not 3,875
    mostly_long = update_feedback(update.state, _met(3000.0, 160.0), 1205.0, CFG, in_flight=False, aggregated=True)
    assert -0.01 < mostly_long.ttft_frac < 0.0 and mostly_long.state.ttft_frac == -CFG.max_relax_frac

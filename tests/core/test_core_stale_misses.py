"""The closed loop's stale ITL misses (planner.core.stale_misses): requests that decoded while the fleet was smaller
finish after the new capacity is ready; their misses do not tighten the correction for the new count."""

from __future__ import annotations

import msgspec

from planner.core import CoreConfig, CoreState, Decision, Mode, Reason, RoleConfig, SlaTargets, Stage, Traffic
from planner.core.config import SlaFeedbackConfig
from planner.core.feedback import FeedbackState, update_feedback
from planner.core.stale_misses import decode_lifetime_s, itl_misses_may_predate
from planner.discovery import Role
from tests.core.analytic_perf import AnalyticPerf
from tests.core.fleetkit import Fleet, Load, Rollout

CFG = SlaFeedbackConfig()


def _window(attained: float, itl_p99_ms: float, osl_p99: float = 590.0) -> Traffic:
    """A 10 s window of 1,000 finished requests: their ITL attainment, the slowest per-request ITL, the longest
    output (p90 a little below each)."""
    return Traffic(
        itl_attainment_frac=attained,
        itl_samples_in_window=1000,
        itl_ms_p50=19.7,
        itl_ms_p90=itl_p99_ms * 0.95,
        itl_ms_p99=itl_p99_ms,
        osl_tokens=180.0,
        osl_tokens_p50=155.0,
        osl_tokens_p90=osl_p99 * 0.56,
        osl_tokens_p99=osl_p99,
        window_s=10.0,
    )


def test_the_lifetime_is_the_longest_output_at_the_slowest_itl() -> None:
    assert decode_lifetime_s(_window(0.65, 98.0)) == 589.0 * 98.0 / 1000.0
    p90_only = Traffic(itl_ms_p90=90.0, itl_ms_p50=20.0, osl_tokens_p90=300.0, osl_tokens=180.0)
    assert decode_lifetime_s(p90_only) == 299.0 * 90.0 / 1000.0
    means = Traffic(itl_ms_p50=20.0, osl_tokens=181.0)
    assert decode_lifetime_s(means) == 180.0 * 20.0 / 1000.0
    assert decode_lifetime_s(Traffic(itl_ms_p99=20.0)) is None
    assert decode_lifetime_s(Traffic(osl_tokens_p99=200.0)) is None
    assert decode_lifetime_s(Traffic(itl_ms_p99=20.0, osl_tokens_p99=0.5)) == 0.0
    assert itl_misses_may_predate(_window(0.65, 98.0), None) is None  # no action seen
    assert itl_misses_may_predate(_window(0.65, 98.0), 57.0) == 589.0 * 98.0 / 1000.0
    assert itl_misses_may_predate(_window(0.65, 98.0), 589.0 * 98.0 / 1000.0) is None


def test_misses_of_requests_that_decoded_before_the_capacity_came_do_not_tighten() -> None:
    """Held-out flash_crowd on the launch-bound profile, aggregated: the scale-up was in flight until 755 s; at
    775 s (past the one-window hold and the backlog's drain) 64.8 % of the window's requests met their ITL, the
    slowest at 98 ms a token with outputs up to 590 tokens (58 s of decode, against 20 s since the capacity came).
    Before, that tightened the ITL correction -0.14 -> +0.37, then to its bound. Now they only take back the
    relaxation (they judge the count they ran at: the model relaxed was optimistic there), never past the model's
    own (0), and say why; at 0 they hold; a relaxation still relaxes, and the TTFT is not held by it."""
    state = FeedbackState(itl_frac=-0.143, ttft_frac=0.01, last_at=750.0)
    state = update_feedback(state, _window(0.0, 102.0), 755.0, CFG, in_flight=True).state
    state = update_feedback(state, _window(0.73, 102.0), 760.0, CFG, in_flight=False).state
    assert state.itl_frac == -0.143  # the one-window hold
    stale = update_feedback(state, _window(0.648, 98.0), 775.0, CFG, in_flight=False)
    assert stale.state.itl_frac == 0.0
    assert stale.reason == Reason.SLA_FEEDBACK_TIGHTENED
    assert (
        "not tightening the ITL past the model's own: the requests reported decoded up to 58 s ((OSL p99 - 1) x ITL"
        " p99), longer than the 20 s since the capacity came" in stale.detail
    )
    held = update_feedback(stale.state, _window(0.737, 94.0), 780.0, CFG, in_flight=False)
    assert held.state.itl_frac == 0.0 and held.reason == Reason.SLA_FEEDBACK_FROZEN
    small = update_feedback(state, _window(0.98, 98.0), 775.0, CFG, in_flight=False)  # within the relaxation
    assert -0.143 < small.state.itl_frac < 0.0 and "past the model's own" not in small.detail
    relaxed = update_feedback(state, _window(1.0, 98.0), 775.0, CFG, in_flight=False)
    assert relaxed.state.itl_frac < -0.143
    ttft = msgspec.structs.replace(_window(0.648, 98.0), ttft_attainment_frac=0.8, ttft_samples_in_window=500)
    assert update_feedback(state, ttft, 775.0, CFG, in_flight=False).state.ttft_frac > 0.01


def test_a_shortfall_of_requests_that_ran_at_the_new_count_still_tightens() -> None:
    """Once the window's slowest requests are quick enough to have decoded entirely since the capacity came (the
    lifetime shorter than the time since), its misses are the new count's, and the loop tightens."""
    state = FeedbackState(itl_frac=-0.143, last_at=750.0)
    state = update_feedback(state, _window(0.0, 102.0), 755.0, CFG, in_flight=True).state
    state = update_feedback(state, _window(0.9, 60.0), 765.0, CFG, in_flight=False).state
    quick = update_feedback(state, _window(0.9, 60.0, osl_p99=300.0), 775.0, CFG, in_flight=False)  # 18 s < 20 s
    assert quick.state.itl_frac > -0.143 and quick.reason == Reason.SLA_FEEDBACK_TIGHTENED
    later = update_feedback(state, _window(0.9, 98.0), 815.0, CFG, in_flight=False)  # 58 s < 60 s
    assert later.state.itl_frac > -0.143
    never = update_feedback(
        FeedbackState(itl_frac=-0.143, last_at=770.0), _window(0.9, 98.0), 775.0, CFG, in_flight=False
    )
    assert never.state.itl_frac > -0.143  # no action in flight seen: nothing predates anything


def _scaled_up_then_stale_windows() -> tuple[list[int], list[Decision]]:
    """A decode service at 2 replicas under a load the model sizes at 4 (1,200 decodes: 1.1 x (8 + 0.1 x 1,200 / N)
    ms within 50 ms first at N = 4); the scale-up is in flight for three ticks (15 s), then ready. The windows
    after it report the misses of requests that decoded at the old count (64.8 % met, the slowest at 98 ms a token,
    outputs up to 590 tokens: 58 s of decode) for 30 s, then 100 % met."""
    perf = AnalyticPerf(decode_ms_per_kv_token=0.0)
    fleet = Fleet()
    fleet.add_many(2, Role.DECODE)
    fleet.deploy("decode", 2)
    config = CoreConfig(
        roles={
            Role.DECODE: RoleConfig(
                mode=Mode.SLA, sla=SlaTargets(ttft_ms=500, itl_ms=50), max_replicas=16, itl_headroom_frac=None
            )
        }
    )
    state = CoreState()
    counts: list[int] = []
    decisions: list[Decision] = []
    rollout = Rollout(fleet, "decode")
    ready_at: float | None = None
    for tick in range(40):
        now = tick * 5.0
        fleet.publish_all(now, Load(decode=1200))
        if ready_at is None:
            traffic = _window(0.0 if tick else 1.0, 102.0)
        elif now - ready_at <= 30.0:
            traffic = _window(0.648, 98.0)
        else:
            traffic = _window(1.0, 21.0)
        state, out = fleet.tick(state, now, config, {Role.DECODE: traffic}, predictors={Role.DECODE: perf})
        if rollout.settle(out["decode"]):
            ready_at = now
        counts.append(out["decode"].final_replicas)
        decisions.append(out["decode"])
    return counts, decisions


def test_a_scale_up_is_judged_on_requests_that_ran_at_it() -> None:
    """Before, the stale windows tightened the ITL correction to its bound (+0.6 over the span above the model's
    8.9 ms floor: a 25.3 ms limit, 8 replicas); now the count bought (4, the model's own: no relaxation to take
    back) stays, the stage says why."""
    counts, decisions = _scaled_up_then_stale_windows()
    assert counts[0] == 4 and max(counts) == 4
    frozen = [d.stage(Stage.SLA_FEEDBACK) for d in decisions]
    assert any(s is not None and "not tightening the ITL past the model's own" in s.detail for s in frozen)

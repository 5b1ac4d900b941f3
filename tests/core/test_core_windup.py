"""The closed loop's wound-up correction (planner.core.windup): at its bound, capacity that settled without raising
the observed attainment is not stacked on."""

from __future__ import annotations

import pytest

from planner.core import CoreConfig, CoreState, Decision, Mode, Reason, RoleConfig, SlaTargets, Stage, Traffic
from planner.core.config import SlaFeedbackConfig
from planner.core.config_errors import CoreConfigError
from planner.core.feedback import FeedbackState, FeedbackUpdate, update_feedback
from planner.core.windup import WindupTrack, attainment_noise, update_windup
from planner.discovery import Role
from tests.core.analytic_perf import AnalyticPerf
from tests.core.fleetkit import Fleet, Load, Rollout

CFG = SlaFeedbackConfig(windup_settled_actions=1)


def _seen(ttft: float, samples: int = 500) -> Traffic:
    return Traffic(ttft_attainment_frac=ttft, ttft_samples_in_window=samples, window_s=30.0)


def _run(attainments: list[tuple[float, bool]]) -> list[FeedbackUpdate]:
    """Ticks 5 s apart from a TTFT correction at its bound: (observed attainment, an action in flight)."""
    state = FeedbackState(ttft_frac=CFG.max_tighten_frac, last_at=0.0)
    out = []
    for i, (attained, in_flight) in enumerate(attainments, start=1):
        update = update_feedback(state, _seen(attained), i * 5.0, CFG, in_flight=in_flight)
        state = update.state
        out.append(update)
    return out


def test_a_scale_up_that_did_not_raise_the_attainment_at_the_bound_winds_the_correction_up() -> None:
    """Mooncake disagg restore: the TTFT correction at +0.6, 87-90 % observed whatever the count; each settled
    scale-up stacked another (21 -> 24 -> 28 -> 33). After one settled and its window passed with the attainment
    within its noise of where it was, the correction is wound up and says why."""
    ticks = [(0.88, False)] * 2 + [(0.88, True)] * 3 + [(0.885, False)] * 8
    updates = _run(ticks)
    assert not any(u.wound for u in updates[:10])  # the reference, the action in flight, its window (30 s)
    assert updates[-1].wound and updates[-1].state.ttft_windup.settled == 1
    assert "wound up: TTFT at its bound, observed 88.50% after 1 settled action(s), not above 88.00%" in (
        updates[-1].wound_detail
    )
    assert updates[-1].state.ttft_frac == CFG.max_tighten_frac  # the correction itself is unchanged


def test_a_scale_up_that_raised_the_attainment_is_not_windup() -> None:
    ticks = [(0.88, False)] * 2 + [(0.88, True)] * 3 + [(0.95, False)] * 8
    updates = _run(ticks)
    assert not any(u.wound for u in updates)
    assert updates[-1].state.ttft_windup == WindupTrack(reference=0.95)  # re-based: judged from here on


def test_without_a_settled_action_at_the_bound_nothing_is_wound_up() -> None:
    updates = _run([(0.88, False)] * 20)
    assert not any(u.wound for u in updates) and updates[-1].state.ttft_windup.reference == 0.88


def test_a_correction_off_its_bound_forgets_the_windup() -> None:
    wound = WindupTrack(reference=0.88, settled=1, wound=True)
    track = update_windup(
        wound,
        at_bound=False,
        attainment=0.88,
        samples=500,
        min_samples=20,
        settled_now=False,
        quiet=True,
        after_settled=3,
    )
    assert track == WindupTrack()


def test_the_noise_is_two_standard_errors_of_the_window_count() -> None:
    assert abs(attainment_noise(0.88, 500) - 2 * (0.88 * 0.12 / 500) ** 0.5) < 1e-12
    track = WindupTrack(reference=0.88)
    within = update_windup(
        track,
        at_bound=True,
        attainment=0.88 + 0.02,
        samples=500,
        min_samples=20,
        settled_now=True,
        quiet=True,
        after_settled=1,
    )
    assert within.wound  # 2 points on 500 requests is within 2.9 points of noise
    beyond = update_windup(
        track,
        at_bound=True,
        attainment=0.88 + 0.04,
        samples=500,
        min_samples=20,
        settled_now=True,
        quiet=True,
        after_settled=1,
    )
    assert not beyond.wound and beyond.reference == 0.92


def test_by_default_it_takes_three_settled_actions() -> None:
    """One settled action is weak evidence (the load moved meanwhile, the window is noisy): the default waits for
    three that each left the attainment where it was."""
    cfg = SlaFeedbackConfig()
    assert cfg.windup_settled_actions == 3
    state = FeedbackState(ttft_frac=cfg.max_tighten_frac, last_at=0.0)
    wound = []
    t = 0.0
    for in_flight, ticks in [(False, 2)] + [(True, 3), (False, 8)] * 3:
        for _ in range(ticks):
            t += 5.0
            update = update_feedback(state, _seen(0.88), t, cfg, in_flight=in_flight)
            state = update.state
            wound.append(update.wound)
    assert len(wound) == 2 + 3 * (3 + 8)  # every tick recorded; wound only in the last three (quiet after the third)
    assert state.ttft_windup.settled == 3 and wound[-3:] == [True, True, True] and not any(wound[:-3])


def _rising_load_at_stuck_attainment(config: CoreConfig) -> tuple[list[int], list[Decision]]:
    """A decode load rising 600 -> 1,500 over an hour while the observed ITL attainment stays at 90 % whatever the
    count (misses no capacity relieves); each action is in flight for three ticks (15 s) before it settles."""
    perf = AnalyticPerf(decode_ms_per_kv_token=0.0)
    fleet = Fleet()
    fleet.add_many(2, Role.DECODE)
    fleet.deploy("decode", 2)
    state = CoreState()
    counts: list[int] = []
    decisions: list[Decision] = []
    rollout = Rollout(fleet, "decode")
    for tick in range(720):
        now = tick * 5.0
        fleet.publish_all(now, Load(decode=600 + int(now / 4.0)))
        traffic = {Role.DECODE: Traffic(itl_attainment_frac=0.9, itl_samples_in_window=500)}
        state, out = fleet.tick(state, now, config, traffic, predictors={Role.DECODE: perf})
        rollout.settle(out["decode"])
        counts.append(out["decode"].final_replicas)
        decisions.append(out["decode"])
    return counts, decisions


def _decode_config(feedback: SlaFeedbackConfig) -> CoreConfig:
    return CoreConfig(
        roles={
            Role.DECODE: RoleConfig(
                mode=Mode.SLA,
                sla=SlaTargets(ttft_ms=500, itl_ms=50),
                max_replicas=16,
                itl_headroom_frac=None,
                sla_feedback=feedback,
            )
        }
    )


def test_the_count_is_held_once_the_correction_wound_up_on_a_rising_load() -> None:
    """Without the windup rule the bound's headroom follows the load up to 10 replicas though 90 % is observed at
    every count (the bound's +0.6 taken over the span above the model's 8.9 ms floor, planner.core.latency_floor:
    a 25.4 ms limit, 1.1 x (8 + 0.1 x 1,500 / N) first within it at N = 10); with it, three settled scale-ups that
    bought nothing hold the count at 7 (the model's own, uncorrected count, 2 -> 4 here, could still raise it)."""
    unheld, _ = _rising_load_at_stuck_attainment(_decode_config(SlaFeedbackConfig(windup_settled_actions=0)))
    held, decisions = _rising_load_at_stuck_attainment(_decode_config(SlaFeedbackConfig()))
    assert max(unheld) == 10 and max(held) <= 7
    stage = decisions[-1].stage(Stage.SLA_FEEDBACK)
    assert stage is not None and stage.reason == Reason.SLA_FEEDBACK_WINDUP
    assert Reason.SLA_FEEDBACK_WINDUP in decisions[-1].reasons
    assert "wound up: ITL at its bound, observed 90.00% after 3 settled action(s), not above 90.00%" in stage.detail
    assert stage.detail.endswith(f"at the bound -> {held[-1]} replicas")


def test_a_negative_count_of_settled_actions_is_refused() -> None:
    with pytest.raises(CoreConfigError, match=r"sla_feedback\.windup_settled_actions must be >= 0"):
        SlaFeedbackConfig(windup_settled_actions=-1)
    off = update_windup(
        WindupTrack(reference=0.88, settled=5, wound=True),
        at_bound=True,
        attainment=0.88,
        samples=500,
        min_samples=20,
        settled_now=True,
        quiet=True,
        after_settled=0,
    )
    assert off == WindupTrack()  # 0: never wound up

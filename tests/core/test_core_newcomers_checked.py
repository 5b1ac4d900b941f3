"""The new replicas' hold keeps the checked count, not the whole count (planner.core.newcomers.newcomer_count).

The core's memory is its input (``CoreState``): each test starts from a state that remembers a recommendation of 8
whose forecast trend, checked against what came, was worth 5 (the checked history the hold across gaps reads),
on 8 reporting decode replicas whose load now needs 1. HPA's clamps (300 s scale-down window), a 60 s start-up.
"""

from __future__ import annotations

from planner.core import Action, CoreConfig, CoreState, Decision, Reason, Stage
from planner.core.newcomers import newcomer_count
from planner.core.state import ServiceState
from planner.discovery import Role
from tests.core.fleetkit import Fleet, Load, hpa_role

LOW = Load(decode=160, kv=16_000)  # one replica's worth


def decide(now: float, peak_at: float, first_report_at: float | None) -> Decision:
    fleet = Fleet()
    ids = [r.worker_id for r in fleet.add_many(8, Role.DECODE)]
    fleet.deploy("decode", 8)
    fleet.publish_all(now, LOW)
    state = CoreState(
        tick=10,
        started_at=0.0,
        last_now=now - 5.0,
        services={
            "decode": ServiceState(
                recommendations=((peak_at, 8), (now - 5.0, 1)),
                checked_recommendations=((peak_at, 5), (now - 5.0, 1)),
                coverage_complete_since=0.0,
                reported_workers=frozenset(ids),
                first_report_at=first_report_at,
            )
        },
    )
    config = CoreConfig(roles={Role.DECODE: hpa_role(startup_s=60.0)})
    return fleet.tick(state, now, config)[1]["decode"]


def test_the_new_replicas_hold_keeps_the_checked_count_not_the_whole_count() -> None:
    # the peak left the 300 s window (at 100, now 420) but the newest replica first reported at 200: held until 500,
    # at the highest checked recommendation since one window before that report (5), not at the 8 it completes
    d = decide(now=420.0, peak_at=100.0, first_report_at=200.0)
    assert d.action == Action.SCALE_DOWN and d.final_replicas == 5
    safety = d.stage(Stage.SAFETY)
    assert safety.replicas == 5 and safety.reason == Reason.NEW_REPLICAS_HELD
    assert safety.detail.endswith(": held at 5, the highest recommendation with its trend checked")
    assert Reason.NEW_REPLICAS_HELD in d.reasons and Reason.SCALE_DOWN_BLOCKED not in d.reasons


def test_the_new_replicas_hold_ends_a_window_after_their_first_report() -> None:
    d = decide(now=500.0, peak_at=100.0, first_report_at=200.0)
    assert d.action == Action.SCALE_DOWN and d.final_replicas == 1
    assert Reason.NEW_REPLICAS_HELD not in d.reasons


def test_newcomer_count_is_the_checked_high_since_a_window_before_the_first_report_within_value_and_current() -> None:
    checked = ((100.0, 5), (150.0, 3))
    assert newcomer_count(checked, 400.0, 300.0, 1, 8) == 3  # the entry at exactly 400 - 300 is outside
    assert newcomer_count(checked, 390.0, 300.0, 1, 8) == 5
    assert newcomer_count(checked, 390.0, 300.0, 6, 8) == 6  # never below the stabilized value
    assert newcomer_count(checked, 390.0, 300.0, 1, 4) == 4  # never above the current count
    assert newcomer_count((), 390.0, 300.0, 2, 8) == 2

"""Row for the new replicas' hold in one service's pipeline (planner.core.draft; docs/decision_core.md, the new
replicas' hold): a hold whose count is the scale-down's own value holds nothing and says nothing. Written for
``draft_service`` mutant 640 of the 9ffb7b0 sample (``count >= value``: the safety stage named
``new_replicas_held`` at the very count the scale-down went to); fails there."""

from __future__ import annotations

from planner.core import Action, Reason, Stage
from tests.core.test_core_newcomers_checked import decide


def test_a_new_replicas_hold_at_the_scale_downs_own_count_is_no_hold() -> None:
    # the newest replica first reported at 450 (held to 750), but the peak of 8 (checked 5) was at 100, before
    # one window (300 s) ahead of that report: the highest checked recommendation since is the load's 1
    d = decide(now=460.0, peak_at=100.0, first_report_at=450.0)
    assert d.action == Action.SCALE_DOWN and d.final_replicas == 1
    safety = d.stage(Stage.SAFETY)
    assert safety is not None and safety.replicas == 1 and safety.reason is None
    assert Reason.NEW_REPLICAS_HELD not in d.reasons

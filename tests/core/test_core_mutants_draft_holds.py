"""Rows for the long holds in one service's pipeline (planner.core.draft; docs/decision_core.md, "Beyond the base
window, only a level that came back is held"). Written for the ``draft_service`` mutants docs/mutation-results.md
listed as surviving; each fails on the mutant it names (``MUTANT_UNDER_TEST``)."""

from __future__ import annotations

from tests.core.fleetkit import Load
from tests.core.test_core_returned import _drive

FOUR, IDLE = Load(decode=4 * 204), Load(decode=1)


def test_after_a_rebuy_that_did_not_grow_the_window_a_level_asked_once_is_held_for_the_base_window() -> None:
    """``draft_service`` 420 (the span the returns are looked for over taken as the hold's count, 4, not its 600 s):
    4 replicas idle from the start are released to 1 after the 30 s window and bought back 15 s later (a re-buy:
    the hold across gaps is in force; 1.5 x 15 s leaves the window at its base 30 s). The 4 were asked in that
    one episode only: held for the base window after it, then released, not held across the next 600 s."""
    state, ticks = _drive([(0.0, IDLE), (45.0, FOUR), (60.0, IDLE), (400.0, IDLE)])
    counts = {now: d.final_replicas for now, d in ticks.items()}
    memory = state.services["decode"]
    assert (memory.rebuy_counts, memory.rebuy_gaps) == (((45.0, 4, None),), ((45.0, 15.0),))
    assert [counts[t] for t in (30.0, 45.0, 80.0)] == [1, 4, 4]  # released, bought back, the base window holds
    assert [counts[t] for t in (85.0, 200.0, 395.0)] == [1, 1, 1]

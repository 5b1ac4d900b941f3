"""Rows for planner/core/returned.py's survivors (docs/testing.md, mutation testing): which entries the cap at the
level that came back reaches (none without entries; those at or before the base window's start, once the oldest is
there), how long a return is remembered and which newer return supersedes it, the exact ends of the span and of
the gap that makes a return, and the stabilize detail's note. Each fails on the mutant it was written for."""

from __future__ import annotations

from planner.core import Reason
from planner.core.clamp import Clamped
from planner.core.returned import capped_by_returns, remember_returns, returned_level, returned_note

BASE_S = 30.0
SPAN_S = 600.0
RETURNS = ((50.0, 16),)  # 16 replicas came back


def test_no_entries_nothing_to_cap() -> None:
    assert capped_by_returns((), 100.0, BASE_S, SPAN_S, RETURNS) == ()


def test_entries_at_or_before_the_base_windows_start_are_capped_at_the_level_that_came_back() -> None:
    """At 100 s the base window starts at 70 s: the burst's 28 asked then (or earlier) counts as 16."""
    assert capped_by_returns(((0.0, 28), (100.0, 10)), 100.0, BASE_S, SPAN_S, RETURNS) == ((0.0, 16), (100.0, 10))
    assert capped_by_returns(((70.0, 28), (100.0, 10)), 100.0, BASE_S, SPAN_S, RETURNS) == ((70.0, 16), (100.0, 10))
    # at 40 s the window starts at 10 s: the 28 asked at 0 s is capped (a count, not a time, is no bound)
    assert capped_by_returns(((0.0, 28), (40.0, 10)), 40.0, BASE_S, SPAN_S, RETURNS) == ((0.0, 16), (40.0, 10))
    # all within the base window: unchanged
    assert capped_by_returns(((80.0, 28), (100.0, 10)), 100.0, BASE_S, SPAN_S, RETURNS) == ((80.0, 28), (100.0, 10))


def test_a_return_is_forgotten_exactly_its_memory_later() -> None:
    assert remember_returns(((0.0, 16),), (), 1800.0, BASE_S, BASE_S, memory_s=1800.0) == ()
    assert remember_returns(((0.5, 16),), (), 1800.0, BASE_S, BASE_S, memory_s=1800.0) == ((0.5, 16),)


def test_no_new_return_is_looked_for_within_the_base_window() -> None:
    """A span no longer than the base window: the remembered returns only (16 came back at 10 s and 60 s)."""
    entries = ((10.0, 16), (20.0, 4), (60.0, 16))
    assert remember_returns((), entries, 60.0, BASE_S, BASE_S) == ()
    assert remember_returns((), entries, 60.0, BASE_S, SPAN_S) == ((60.0, 16),)


def test_a_newer_return_at_the_same_level_supersedes_the_older() -> None:
    entries = ((10.0, 16), (20.0, 4), (60.0, 16))
    assert remember_returns(((5.0, 16), (6.0, 20)), entries, 60.0, BASE_S, SPAN_S) == ((6.0, 20), (60.0, 16))


def test_the_span_starts_after_since_and_a_return_needs_a_gap_longer_than_the_base_window() -> None:
    assert returned_level(((0.0, 16), (50.0, 16)), 0.0, BASE_S) is None  # the entry at `since` is outside
    assert returned_level(((0.0, 16), (50.0, 16)), -1.0, BASE_S) == 16
    assert returned_level(((10.0, 16), (40.0, 16)), 0.0, BASE_S) is None  # a gap of exactly the base window
    assert returned_level(((10.0, 16), (40.5, 16)), 0.0, BASE_S) == 16


def test_the_note_names_the_level_that_came_back_and_follows_the_stages_detail() -> None:
    held = Clamped(replicas=10, reason=Reason.SCALE_DOWN_STABILIZED, detail="window 600 s")
    noted = returned_note(held, 28, BASE_S, ((50.0, 16), (60.0, 10)))
    assert noted.detail == (
        "window 600 s; beyond the 30 s base window only the highest count the recommendations came back to (16) is"
        " held: 10, not 28"
    )
    alone = returned_note(Clamped(replicas=4, reason=Reason.SCALE_DOWN_STABILIZED), 28, BASE_S, ())
    assert alone.detail == (
        "beyond the 30 s base window only the highest count the recommendations came back to (0) is held: 4, not 28"
    )

"""Rows for planner/core/served.py's survivors (docs/testing.md, mutation testing): which request rates an ask
remembers (0 and a fraction of a request a second are rates; only a rate not known, not finite or negative is
None), that this tick's ask replaces one remembered at the same instant, that ``served`` hands back ``entries``
itself when no entry is lowered (draft.py skips the as-asked re-stabilize by identity), and that the stabilize
note follows the stage's own detail. Each fails on the mutant it was written for."""

from __future__ import annotations

import math

from planner.core import Reason
from planner.core.clamp import Clamped
from planner.core.served import remember_asked, served, served_note

WINDOW_S = 30.0


def test_a_rate_of_zero_or_under_one_request_a_second_is_remembered_as_a_rate() -> None:
    recs = ((0.0, 3),)
    assert remember_asked((), recs, 0.0, 0.0, True) == ((0.0, 0.0, True, False),)  # the traffic stopped: a rate
    assert remember_asked((), recs, 0.0, 0.5, False) == ((0.0, 0.5, False, False),)
    assert remember_asked((), recs, 0.0, -1.0, True) == ((0.0, None, True, False),)
    assert remember_asked((), recs, 0.0, math.nan, True) == ((0.0, None, True, False),)


def test_this_ticks_ask_replaces_one_remembered_at_the_same_instant() -> None:
    """A tick decided again at 100 s (rate 5 req/s, unsettled, before): only this tick's ask is remembered."""
    asked = ((50.0, 4.0, True, False), (100.0, 5.0, False, False))
    recs = ((50.0, 4), (100.0, 6))
    assert remember_asked(asked, recs, 100.0, 6.0, True) == ((50.0, 4.0, True, False), (100.0, 6.0, True, False))


def test_entries_come_back_themselves_when_the_settled_ask_is_the_same_count() -> None:
    """6 asked unsettled at 10 req/s, and 6 again once settled at that rate: nothing lowered, ``entries`` itself
    (draft.py re-stabilizes the recommendations as asked only when ``served`` handed back another tuple)."""
    entries = ((0.0, 6), (60.0, 6))
    asked = ((0.0, 10.0, False, False), (60.0, 10.0, True, False))
    assert served(entries, asked, WINDOW_S) is entries
    lowered = served(((0.0, 7), (60.0, 6)), asked, WINDOW_S)
    assert lowered == ((0.0, 6), (60.0, 6))


def test_the_note_follows_the_stages_own_detail() -> None:
    held = Clamped(replicas=12, reason=Reason.SCALE_DOWN_STABILIZED, detail="window 300 s")
    assert served_note(held, 21).detail == (
        "window 300 s; counts asked while capacity was coming or forecast above the load held at what the settled"
        " fleet was asked after them (a forecast: once its horizon came) at that rate: 12, not 21"
    )
    alone = Clamped(replicas=12, reason=Reason.SCALE_DOWN_STABILIZED)
    assert served_note(alone, 21).detail == (
        "counts asked while capacity was coming or forecast above the load held at what the settled fleet was asked"
        " after them (a forecast: once its horizon came) at that rate: 12, not 21"
    )

"""A count asked while capacity was still coming, in the holds, at most what the ready fleet was asked. Pure.

While a scale-up is in flight (and the feedback's window after it), the recommendation is asked of a fleet that is
not the one it asks for: the requests that queued during the start-up are in its load, a forecast floor may
extrapolate the step the burst made as a trend, and the in-flight target is raised with the rate. Those are the
highest recommendations of a burst (on ``burst_train``: 6-8 at its onset where the ready fleet, a minute later, is
asked 3-4 at the same rate), and the scale-down window (two start-ups, grown across gaps), the hold across gaps and
the returns a long hold keeps (:mod:`planner.core.returned`) held them for minutes after the fleet was ready.

So once the fleet has been asked again, settled, at a request rate not below the one an unsettled entry was asked
at (beyond the counting noise of two traffic windows, :func:`planner.core.forecast.beyond_counting_noise`), that
entry counts at most the highest such settled entry: the level the traffic needed once the capacity had come and
the backlog drained. Until then (the burst ended before the fleet settled, or no rate is known) it counts as
asked: nothing says the count was a transient, and the holds keep betting on its return as before. No knob.
"""

from __future__ import annotations

import math

import msgspec

from planner.core.clamp import Clamped
from planner.core.forecast import beyond_counting_noise

__all__ = ["Asked", "remember_asked", "served", "served_note"]

Entries = tuple[tuple[float, int], ...]
Asked = tuple[tuple[float, float | None, bool], ...]  # (at, request rate, settled) of each recommendation


def remember_asked(
    asked: Asked, recommendations: Entries, now: float, rate_per_s: float | None, settled: bool
) -> Asked:
    """The asks remembered after this tick: those whose recommendation is still remembered, plus this tick's."""
    kept_at = {at for at, _ in recommendations}
    rate = rate_per_s if rate_per_s is not None and math.isfinite(rate_per_s) and rate_per_s >= 0 else None
    return (*(item for item in asked if item[0] in kept_at and item[0] != now), (now, rate, settled))


def served(entries: Entries, asked: Asked, window_s: float) -> Entries:
    """``entries`` as the holds count them: one asked unsettled, at most the highest entry asked settled after it at
    a rate not below its own beyond the noise (``window_s``: the traffic window). ``entries`` itself when none
    changes."""
    info = {at: (rate, settled) for at, rate, settled in asked}
    later: list[tuple[float, int]] = []  # (rate, value) of the settled entries after the one looked at
    out: list[tuple[float, int]] = []
    changed = False
    for at, value in reversed(entries):
        rate, settled = info.get(at, (None, True))
        if settled:
            if rate is not None:
                later.append((rate, value))
        elif rate is not None:
            served_at = [v for r, v in later if not beyond_counting_noise(rate, r, window_s)]
            if served_at and max(served_at) < value:
                value = max(served_at)
                changed = True
        out.append((at, value))
    if not changed:
        return entries
    return tuple(reversed(out))


def served_note(stabilized: Clamped, as_asked: int) -> Clamped:
    """The stabilize stage's result with a note that counts asked while capacity was coming lowered it."""
    note = (
        f"counts asked while capacity was coming held at what the ready fleet was asked at that rate:"
        f" {stabilized.replicas}, not {as_asked}"
    )
    detail = f"{stabilized.detail}; {note}" if stabilized.detail else note
    return msgspec.structs.replace(stabilized, detail=detail)

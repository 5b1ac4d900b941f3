"""A count asked while capacity was still coming, in the holds, at most what the ready fleet was asked. Pure.

While a scale-up is in flight (and the feedback's window after it), the recommendation is asked of a fleet that is
not the one it asks for: the requests that queued during the start-up are in its load, a forecast floor may
extrapolate the step the burst made as a trend, and the in-flight target is raised with the rate. Those are the
highest recommendations of a burst (on ``burst_train``: 6-8 at its onset where the ready fleet, a minute later, is
asked 3-4 at the same rate), and the scale-down window (two start-ups, grown across gaps), the hold across gaps and
the returns a long hold keeps (:mod:`planner.core.returned`) held them for minutes after the fleet was ready.

A forecast floor above the load's own count is the same kind of count: a prediction that the rate will rise one
horizon ahead, not what the fleet was asked at the rate that came. On bursty traffic each onset's floor asks the
load's count + 1 or more (``burst_train`` disaggregated prefill: 4 at every onset where the settled fleet was asked
2-3 through the burst), and the scale-down window grown across gaps then held that onset's ask between the bursts.
So such an entry is remembered as predicted and counts the same way; asked of a settled fleet it is still evidence
for the entries before it, as asked (on a disaggregated decode service the floor's count above the load's is what
served the burst: ``burst_train`` seed 1, the load asked 1 decode replica at 45 req/s where 1 missed its ITL).

So once the fleet has been asked again, settled, at a request rate not below the one an unsettled entry
was asked at (beyond the counting noise of two traffic windows, :func:`planner.core.forecast.beyond_counting_noise`),
that entry counts at most the highest such settled entry: the level the traffic needed once the capacity had come and
the backlog drained. Until then (the burst ended before the fleet settled, or no rate is known) it counts as asked:
nothing says the count was a transient, and the holds keep betting on its return as before. An ask at a rate within
the counting noise of no traffic is no such evidence: on an idle trickle (0-3 requests per 10 s window) "not below"
holds for ticks that saw no request, and the floor's spare was released on them (``surge_from_idle`` seed 9: one
replica fewer ready when the surge came, 100.00 -> 94.07 %). No knob.
"""

from __future__ import annotations

import math

import msgspec

from planner.core.clamp import Clamped
from planner.core.forecast import beyond_counting_noise

__all__ = ["Asked", "remember_asked", "served", "served_note"]

Entries = tuple[tuple[float, int], ...]
# (at, request rate, settled, predicted) of each recommendation: settled, no action in flight and the feedback's hold
# after one passed; predicted, a forecast floor above the load's own count
Asked = tuple[tuple[float, float | None, bool, bool], ...]


def remember_asked(
    asked: Asked,
    recommendations: Entries,
    now: float,
    rate_per_s: float | None,
    settled: bool,
    predicted: bool = False,
) -> Asked:
    """The asks remembered after this tick: those whose recommendation is still remembered, plus this tick's."""
    kept_at = {at for at, _ in recommendations}
    rate = rate_per_s if rate_per_s is not None and math.isfinite(rate_per_s) and rate_per_s >= 0 else None
    return (*(item for item in asked if item[0] in kept_at and item[0] != now), (now, rate, settled, predicted))


def served(entries: Entries, asked: Asked, window_s: float, horizon_s: float = 0.0) -> Entries:
    """``entries`` as the holds count them: one asked unsettled, at most the highest entry asked settled after it at a
    rate not below its own beyond the noise (``window_s``: the traffic window); one predicted (a forecast floor above
    the load) on a settled fleet, the same, but only by the entries asked once the time it forecast came
    (``horizon_s``, the forecast's horizon, after it). A settled entry is evidence as asked, a predicted one too,
    when its rate is beyond the counting noise of no traffic. ``entries`` itself when none changes."""
    info = {at: (rate, settled, predicted) for at, rate, settled, predicted in asked}
    later: list[tuple[float, float, int]] = []  # (at, rate, value) of the settled entries after the one looked at
    out: list[tuple[float, int]] = []
    changed = False
    for at, asked_value in reversed(entries):
        rate, settled, predicted = info.get(at, (None, True, False))
        value = asked_value
        if rate is not None and (predicted or not settled):
            # a forecast asked of a settled fleet is judged by what was asked when its time came, not by a later
            # forecast of a rate still rising (Azure x40 agg cold: 13 asked at 180 s capped at 190 s by the floor's
            # 12, itself a forecast, 60 s before the 600 req/s it forecast)
            due = at + horizon_s if settled else at
            served_at = [v for a, r, v in later if a >= due and not beyond_counting_noise(rate, r, window_s)]
            if served_at and max(served_at) < value:
                value = max(served_at)
                changed = True
        if settled and rate is not None and beyond_counting_noise(rate, 0.0, window_s):
            # an ask at a rate the window's counts cannot tell from no traffic says nothing of what a rate needed:
            # with it, a trickle's forecast floor was judged by ticks that may have seen no request at all
            later.append((at, rate, asked_value))
        out.append((at, value))
    if not changed:
        return entries
    return tuple(reversed(out))


def served_note(stabilized: Clamped, as_asked: int) -> Clamped:
    """The stabilize stage's result with a note that counts asked while capacity was coming lowered it."""
    note = (
        f"counts asked while capacity was coming or forecast above the load held at what the settled fleet was"
        f" asked after them (a forecast: once its horizon came) at that rate:"
        f" {stabilized.replicas}, not {as_asked}"
    )
    detail = f"{stabilized.detail}; {note}" if stabilized.detail else note
    return msgspec.structs.replace(stabilized, detail=detail)

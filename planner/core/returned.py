"""Beyond one scale-down window, a hold keeps only a level the recommendations came back to. Pure.

The scale-down window (two start-ups) holds the highest recommendation it saw: a count asked now may be asked again
within a start-up, and releasing it would cost one. When the traffic shows idle gaps (capacity released and bought
back), the window grows past that (:func:`planner.core.startup.scale_down_window_s`, up to
``hold_across_gaps_max_s``) and the hold across gaps keeps the last ``hold_across_gaps_max_s``'s highest
recommendation (:func:`planner.core.startup.gap_hold`). Both were read as evidence for the highest count of that
long span; but a re-buy is evidence that *a* level came back, and on bursty traffic the highest count is usually
one burst's peak, asked once for a few ticks: a 25 s burst asking 28 replicas held 28 for ten minutes where the
bursts before and after asked at most 16-20.

So, beyond the base window, an entry counts only up to the highest level the recommendations came back to within
the span looked at: a level asked, then not asked for longer than the base window (the window alone would have
released it), then asked again. That is the return the long holds bet on, observed at that level. The cap applies
while a re-buy after the traffic fell is remembered (the hold across gaps is in force, the caller's choice): a
window grown only by the recommendation's own flaps at a steady traffic keeps its highest count (those flaps are
the evidence that its peaks recur). A level asked in
one episode only (however high) has shown no return and is held for the base window, as HPA's window holds any
peak; the levels the traffic keeps coming back to are held across the gaps as before. No knob: the gap that makes
a return is the base window itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from planner.core.clamp import Clamped

__all__ = ["MEMORY_S", "capped_by_returns", "remember_returns", "returned_level", "returned_note"]

Entries = tuple[tuple[float, int], ...]


def returned_level(
    entries: Sequence[tuple[float, int]],
    since: float,
    base_window_s: float,
    asked: Sequence[tuple[float, int]] | None = None,
) -> int | None:
    """The highest level ``v`` such that two entries at or above ``v`` after ``since`` are separated by entries
    all below ``v`` spanning more than ``base_window_s`` (from the last entry at or above ``v`` to the next one).
    None when no level came back.

    ``asked``: the same recommendations as asked, when ``entries`` are them as the holds count them (lowered by the
    served and refuted caps, never raised); the gap must then be one as asked too: an entry asked at or above ``v``
    ends it even where it counts lower, and both ends must count at or above ``v``: so lowering a count never makes
    a return (an episode asked at or above ``v`` throughout, its ticks capped below ``v`` in between, comes back as
    counted but was never left as asked), nor raises the level found."""
    as_asked = dict(asked) if asked is not None else {}
    span = [(at, value, max(value, as_asked.get(at, value))) for at, value in entries if at > since]
    for level in sorted({value for _, value, _ in span}, reverse=True):
        last: tuple[float, bool] | None = None  # (at, counted at or above the level) of the last ask at or above it
        for at, value, asked_value in span:
            if asked_value < level:
                continue
            if value >= level and last is not None and last[1] and at - last[0] > base_window_s:
                return level
            last = (at, value >= level)
    return None


Returns = tuple[tuple[float, int], ...]

MEMORY_S = 1800.0  # as long as a re-buy is remembered (planner.core.startup)


def remember_returns(
    returns: Returns,
    entries: Entries,
    now: float,
    base_window_s: float,
    span_s: float,
    memory_s: float = MEMORY_S,
    asked: Entries | None = None,
) -> Returns:
    """The returns remembered after this tick: those of the last ``memory_s`` not superseded, plus this tick's
    (:func:`returned_level` over the last ``span_s``, its gaps judged as ``asked`` when given) when a level came
    back; a newer return at the same level or higher supersedes an older one."""
    kept = tuple((at, level) for at, level in returns if at > now - memory_s)
    if span_s <= base_window_s:
        return kept
    level = returned_level(entries, now - span_s, base_window_s, asked)
    if level is None:
        return kept
    return (*((at, old) for at, old in kept if old > level), (now, level))


def capped_by_returns(entries: Entries, now: float, base_window_s: float, span_s: float, returns: Returns) -> Entries:
    """``entries`` as the long holds count them: those older than ``base_window_s`` capped at the highest level
    remembered to have come back (0 when none). Unchanged when ``span_s`` is not longer than the base window."""
    if span_s <= base_window_s or not entries or entries[0][0] > now - base_window_s:
        return entries
    cap = max((level for _, level in returns), default=0)
    cutoff = now - base_window_s
    return tuple((at, min(value, cap)) if at <= cutoff else (at, value) for at, value in entries)


def returned_note(capped: Clamped, before: int, base_window_s: float, returns: Returns) -> Clamped:
    """The stabilize stage's result with a note that the cap at the highest level that came back lowered it from
    ``before``."""
    level = max((level for _, level in returns), default=0)
    note = (
        f"beyond the {base_window_s:g} s base window only the highest count the recommendations came back to"
        f" ({level}) is held: {capped.replicas}, not {before}"
    )
    detail = f"{capped.detail}; {note}" if capped.detail else note
    return msgspec.structs.replace(capped, detail=detail)

"""A forecast floor's peak that the rates refuted, in the holds that look back over recommendations. Pure.

A forecast floor more than one replica above the load's own count is a prediction: the rate will rise, one
horizon ahead, to what the floor sizes for. The scale-down window (and the hold across gaps, and the new
replicas' hold) then keeps the highest recommendation it saw, that peak included, for the whole window — on the
grounds that what was asked may be asked again. Once the request rate has FALLEN below the rate the peak was asked
at, by more than the counting noise of two traffic windows (:data:`planner.core.forecast.RISE_SIGMAS` standard
deviations of their Poisson counts: :func:`planner.core.forecast.beyond_counting_noise`, the test a rise passes),
the rise the peak extrapolated is over: what it predicted did not come, and the peak is no evidence of what the
load needs back. From then on the holds count that recommendation at the load's count it was asked with plus one
replica (the floor's granularity, as the checked and damped floors keep it; within the bounds): what the rate
that did come asked. A rise that holds (a ramp, a plateau, a crowd that stays) does not fall and keeps its peak
for the whole window; a floor at the load's count + 1 is not a peak. The recommendations themselves are
remembered as decided; the holds read them through :func:`counted`.
"""

from __future__ import annotations

import math

import msgspec

from planner.core.clamp import Clamped
from planner.core.forecast import beyond_counting_noise

__all__ = ["Peaks", "counted", "refuted_note", "track_peaks"]

Entries = tuple[tuple[float, int], ...]
# (at, request rate it was asked at, the load's count + 1 then, refuted yet)
Peaks = tuple[tuple[float, float, int, bool], ...]


def track_peaks(
    peaks: Peaks,
    recommendations: Entries,
    now: float,
    recommended: int,
    came: int,
    rate_now_per_s: float | None,
    window_s: float,
) -> Peaks:
    """The peaks after this tick: those whose recommendation is still remembered (``recommendations``, pruned),
    each marked refuted once the rate has fallen beyond the noise below the rate it was asked at; plus this
    tick's, when its recommendation ``recommended`` is above ``came`` (the load's count + 1, bounded) and the rate
    is known. An unknown rate refutes nothing."""
    kept_at = {at for at, _ in recommendations}
    rate = rate_now_per_s if rate_now_per_s is not None and math.isfinite(rate_now_per_s) else None
    out = tuple(
        (at, asked_at, load_then, refuted or (rate is not None and beyond_counting_noise(asked_at, rate, window_s)))
        for at, asked_at, load_then, refuted in peaks
        if at in kept_at
    )
    if recommended > came and rate is not None:
        out = (*out, (now, rate, came, False))
    return out


def counted(entries: Entries, peaks: Peaks) -> Entries:
    """``entries`` as the holds count them: a refuted peak's at the load's count + 1 it was asked with."""
    refuted = {at: came for at, _, came, is_refuted in peaks if is_refuted}
    if not refuted:
        return entries
    return tuple((at, min(value, refuted[at])) if at in refuted else (at, value) for at, value in entries)


def refuted_note(stabilized: Clamped, as_decided: int) -> Clamped:
    """The stabilize stage's result with a note that refuted peaks lowered it from ``as_decided``."""
    note = (
        f"forecast peaks the rates refuted (the rate fell below the rate they were asked at) counted at the load's"
        f" count + 1: {stabilized.replicas}, not the {as_decided} the recommendations as decided hold"
    )
    detail = f"{stabilized.detail}; {note}" if stabilized.detail else note
    return msgspec.structs.replace(stabilized, detail=detail)

"""The closed loop's tightening of a latency target, taken over the span the replica count can move (pure).

The count moves a latency only down to the model's floor: the step of one engine with a single request (for ITL,
one sequence decoding, nothing else in the step), which no number of replicas goes below. A correction
(planner.core.feedback) says the model is optimistic: the limit recommend checks must be lower than the target
for the users to get it. Expressed as a share of the target, the same correction lands close to the floor on an
engine whose floor is a large share of the target (a launch-bound decode at 16 ms against 50 ms: +0.6 asked
for 20 ms, where more replicas barely lower the ITL, and the count ran to its bound), and past it on one whose
floor is above the limit; on an engine whose floor is small against the target it is the same either way.

So a tightening (a positive correction) is scaled by the share of the configured limit that lies above the
floor (the part the count moves)::

    base  = target x (1 - headroom)
    limit = base - correction x target x (base - floor) / base

which is ``target x (1 - headroom - correction)`` when the floor is 0, reaches the floor only at a correction of
``1 - headroom`` (recommend caps headroom plus correction at 0.95), and asks, for a given shortfall, a limit the
count can serve. A relaxation
(a negative correction) is unchanged: it loosens the limit, away from the floor. A floor that is unknown, not
finite or at/above the configured limit leaves the limit as before.
"""

from __future__ import annotations

import math

__all__ = ["corrected_limit_ms"]


def corrected_limit_ms(target_ms: float, headroom_frac: float, correction_frac: float, floor_ms: float | None) -> float:
    """The latency limit recommend checks: ``target_ms`` with the configured ``headroom_frac`` and the closed loop's
    ``correction_frac`` (their sum already capped by the caller), a tightening taken over the span above
    ``floor_ms`` (see the module docstring)."""
    base_ms = target_ms * (1.0 - headroom_frac)
    if correction_frac <= 0.0 or floor_ms is None or not math.isfinite(floor_ms) or not 0.0 < floor_ms < base_ms:
        return base_ms - correction_frac * target_ms
    return base_ms - correction_frac * target_ms * (base_ms - floor_ms) / base_ms

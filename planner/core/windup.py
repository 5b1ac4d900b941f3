"""The closed loop's wound-up correction: a correction at its tighten bound whose capacity did not buy attainment.

:mod:`planner.core.feedback` tightens the headroom while the observed attainment is below the goal, up to
``max_tighten_frac``. At the bound it keeps asking for the count the bound's headroom needs, and every tick the
load rises a little that count rises with it: scale-ups stack on a correction that has stopped integrating. When
the capacity those scale-ups added did not move the observed attainment (its window settled after each: the
misses are not of requests that queued before), the misses are not ones capacity relieves (requests no engine
serves within the target, whatever the count), and more replicas on the bound's headroom buy nothing users feel.

Per target: when the correction is at its bound and no action is in flight nor its window held, the attainment
is the reference; each action that settles after it counts. Once they have settled and the attainment, in a quiet
window, is not above the reference by more than two standard errors of its own binomial count
(``2 sqrt(p (1 - p) / n)``, the noise of a window of ``n`` requests), after ``windup_settled_actions`` (3) such
actions, the correction has wound up: the count is
held where it is (recommend's own, uncorrected count may still raise it: the load itself asking for more). An
attainment that rises past the noise re-bases the reference (the capacity bought something); a correction off its
bound forgets it all.

Pure: the state is :class:`WindupTrack` per target, kept in :class:`planner.core.feedback.FeedbackState`.
"""

from __future__ import annotations

import math

import msgspec

__all__ = ["WindupTrack", "attainment_noise", "update_windup"]


class WindupTrack(msgspec.Struct, frozen=True, kw_only=True):
    """One target's reference attainment at its bound (None: not at its bound, or not yet seen quiet there) and
    how many actions settled since."""

    reference: float | None = None
    settled: int = 0
    wound: bool = False


def attainment_noise(attainment: float, samples: int) -> float:
    """Two standard errors of an attainment measured on ``samples`` requests (binomial)."""
    p = min(max(attainment, 0.0), 1.0)
    return 2.0 * math.sqrt(p * (1.0 - p) / max(samples, 1))


def update_windup(
    track: WindupTrack,
    *,
    at_bound: bool,
    attainment: float | None,
    samples: int | None,
    min_samples: int,
    settled_now: bool,
    quiet: bool,
    after_settled: int,
) -> WindupTrack:
    """This tick's track: ``at_bound`` the correction sits at its tighten bound; ``settled_now`` an action in flight
    at the last tick is not any more; ``quiet`` no action in flight and the window after the last one passed;
    ``after_settled``: how many settled actions it takes (0: never wound up)."""
    if not at_bound or after_settled <= 0:
        return WindupTrack()
    settled = track.settled + (1 if settled_now and track.reference is not None else 0)
    usable = attainment is not None and samples is not None and samples >= min_samples
    if not usable or not quiet:
        return msgspec.structs.replace(track, settled=settled)
    assert attainment is not None and samples is not None
    if track.reference is None:
        return WindupTrack(reference=attainment)
    if attainment > track.reference + attainment_noise(track.reference, samples):
        return WindupTrack(reference=attainment)  # the capacity bought attainment: judge the next from here
    return WindupTrack(reference=track.reference, settled=settled, wound=settled >= after_settled)

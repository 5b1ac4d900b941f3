"""Start-up awareness (issue 13, item 4), pure: the start-up delay the core measures from the deployment's
desired -> ready transitions, the scale-down window in start-ups, and how far a scale-up may raise a target
still in flight. Used by :func:`planner.core.step`; the backlog a scale-up is sized for after one start-up is
in :func:`planner.core.recommend.recommend_sla` (``startup_s``)."""

from __future__ import annotations

import math

import msgspec

from planner.core.config import RoleConfig
from planner.core.forecast import RISE_SIGMAS, beyond_counting_noise
from planner.core.state import ServiceState

__all__ = [
    "base_window_s",
    "effective_startup_s",
    "gap_hold",
    "in_flight_raise_to",
    "measured_startup_s",
    "record_scale",
    "scale_down_window_s",
    "traffic_fell",
]


def effective_startup_s(rc: RoleConfig, state: ServiceState) -> float:
    """The start-up delay the core plans with: measured once seen, else ``rc.startup_s``."""
    return state.startup_s_observed if state.startup_s_observed is not None else rc.startup_s


def measured_startup_s(state: ServiceState, in_flight: bool, now: float) -> float | None:
    """The measured start-up (EWMA, weight 0.5) after this tick: a scale-up in flight at the last tick that has
    settled now took ``now - scale_up_at`` from its decision to every replica ready."""
    observed = state.startup_s_observed
    if not in_flight and state.in_flight_since is not None and state.scale_up_at is not None:
        took = now - state.scale_up_at
        observed = took if observed is None else 0.5 * observed + 0.5 * took
    return observed


_GAP_MEMORY_S = 1800.0  # re-buys older than this no longer hold capacity


_GAP_HOLD_FACTOR = 1.5


def base_window_s(rc: RoleConfig, state: ServiceState) -> float:
    """The scale-down window before any growth: ``scale_down_window_startups`` (measured) start-ups when set, else
    ``scale_down.stabilization_window_s``."""
    if rc.scale_down_window_startups is None:
        return rc.scale_down.stabilization_window_s
    return rc.scale_down_window_startups * effective_startup_s(rc, state)


def scale_down_window_s(rc: RoleConfig, state: ServiceState, now: float) -> float:
    """``scale_down_window_startups`` start-ups when set (capacity released on a dip costs a start-up to buy back,
    so a faster start-up makes the planner leaner by itself), else ``scale_down.stabilization_window_s``; grown
    to 1.5 x the longest idle gap after which released capacity was bought back in the last 30 minutes (at
    most ``hold_across_gaps_max_s``). What is held across idle gaps beyond it is :func:`gap_hold`'s."""
    window = base_window_s(rc, state)
    cap = rc.hold_across_gaps_max_s
    gaps = [gap for at, gap in state.rebuy_gaps if at > now - _GAP_MEMORY_S]
    if cap is not None and gaps:
        window = max(window, min(_GAP_HOLD_FACTOR * max(gaps), cap))
    return window


def gap_hold(rc: RoleConfig, state: ServiceState, now: float) -> tuple[float, int] | None:
    """``(hold_across_gaps_max_s, count)`` while a re-buy is remembered (the last 30 minutes): a scale-down goes no
    lower than the highest recommendation of that window, up to the highest count the traffic bought back (the
    capacity its history says comes back; a replica bought back on a trickle's noise does not hold a crowd's
    peak). The whole window, not a multiple of the gap seen: on bursty traffic the next gap is not the last
    one's length (Azure code x40: bought back after ~3 minutes, the next surge came ~5 minutes later, on the 4
    replicas left of 36). None: no re-buy remembered, or ``hold_across_gaps_max_s`` unset."""
    cap = rc.hold_across_gaps_max_s
    counts = [count for at, count, _ in state.rebuy_counts if at > now - _GAP_MEMORY_S]
    if cap is None or not counts:
        return None
    return cap, max(counts)


def _lowest(low: float | None, rate: float | None) -> float | None:
    if rate is None:
        return low
    return rate if low is None else min(low, rate)


_FALL_SIGMAS = RISE_SIGMAS  # a fall must exceed as many standard deviations of a window's Poisson count as a rise


def traffic_fell(rc: RoleConfig, lowest_rate_per_s: float | None, rate_per_s: float | None) -> bool:
    """Whether a re-buy at ``rate_per_s`` follows a fall of the traffic: the lowest request rate seen from the
    release to the re-buy is at most ``1 - rebuy_min_fall_frac`` of it, and the difference is more than the
    counting noise of one traffic window (3 standard deviations of a Poisson count over ``traffic_window_s``: a
    trickle's 0 -> 1 request is not a fall). Capacity trimmed while the traffic held and bought back at the same
    traffic is the recommendation moving (a floor's rounding, the loop probing), not an idle gap. Without a rate
    on either side (no traffic given) or with the check off: True, as before."""
    frac = rc.rebuy_min_fall_frac
    if frac is None or lowest_rate_per_s is None or rate_per_s is None:
        return True
    window_s = rc.traffic_window_s
    rise = (rate_per_s - lowest_rate_per_s) * window_s
    return lowest_rate_per_s <= (1.0 - frac) * rate_per_s and rise > _FALL_SIGMAS * math.sqrt(rate_per_s * window_s)


def _renewed(
    state: ServiceState, rc: RoleConfig, now: float, rate: float | None
) -> tuple[tuple[float, int, float | None], ...]:
    """The re-buys still remembered, each renewed (remembered from now, its count kept) when the traffic fell since
    and came back, whatever count the comeback needs: a hold that kept the capacity through the gap avoided the
    re-buy that would have renewed it, and a smaller comeback still says the traffic is bursty (what is held is
    the last ``hold_across_gaps_max_s``'s highest load count, up to the count). Else each keeps the lowest rate
    seen since."""
    ticked = bool(state.recommendations) and state.recommendations[-1][0] == now
    counts: list[tuple[float, int, float | None]] = []
    for at, count, low in state.rebuy_counts:
        if at <= now - _GAP_MEMORY_S:
            continue
        fell = rc.rebuy_min_fall_frac is not None and low is not None and rate is not None
        if fell and ticked and traffic_fell(rc, low, rate):
            counts.append((now, count, rate))
        else:
            counts.append((at, count, _lowest(low, rate)))
    return tuple(counts)


def record_scale(
    state: ServiceState, rc: RoleConfig, current: int, final: int, now: float, rate_per_s: float | None = None
) -> ServiceState:
    """Remember each scale-down (its time, the count it left, and the lowest request rate since), and a scale-up
    that buys capacity back after the traffic fell (:func:`traffic_fell`): the gap is the time since the fleet
    last left a count at or above the new target (within ``hold_across_gaps_max_s``), the count is the new target
    (what :func:`gap_hold` holds), renewed while the traffic falls and comes back to need it (:func:`_renewed`).
    ``rate_per_s``: the request rate this tick (None: unknown)."""
    rate = rate_per_s if rate_per_s is not None and math.isfinite(rate_per_s) and rate_per_s >= 0 else None
    downs = tuple((at, before, _lowest(low, rate)) for at, before, low in state.scale_downs if at > now - _GAP_MEMORY_S)
    counts = _renewed(state, rc, now, rate)
    if final < current:
        return msgspec.structs.replace(state, scale_downs=(*downs, (now, current, rate))[-32:], rebuy_counts=counts)
    cap = rc.hold_across_gaps_max_s
    if final > current and cap is not None:
        left = [(at, low) for at, before, low in downs if before >= final]
        if left and now - left[-1][0] <= cap:
            kept = tuple(item for item in state.rebuy_gaps if item[0] > now - _GAP_MEMORY_S)
            gap = now - left[-1][0]
            if traffic_fell(rc, left[-1][1], rate):
                counts = (*counts, (now, final, rate))[-16:]
            elif gap < effective_startup_s(rc, state):
                # a trim bought back at the same traffic within a start-up saved nothing and cost one: the
                # recommendation stayed below the count for the whole window before the trim and the gap after it;
                # the window grows past that run (each such flap grows it further, up to hold_across_gaps_max_s)
                gap += scale_down_window_s(rc, state, now)
            return msgspec.structs.replace(
                state, rebuy_gaps=(*kept, (now, gap))[-16:], rebuy_counts=counts, scale_downs=downs
            )
    if downs == state.scale_downs and counts == state.rebuy_counts:
        return state
    return msgspec.structs.replace(state, scale_downs=downs, rebuy_counts=counts)


def in_flight_raise_to(
    rc: RoleConfig, state: ServiceState, rate_per_s: float | None, in_flight: bool, current: int
) -> int | None:
    """How far a scale-up may raise an in-flight target: ``current`` times the growth of the request rate since
    the scale-up was decided, when it grew by at least ``in_flight_raise_rate_growth_frac`` and by more than the
    counting noise of the two traffic windows (:data:`RISE_SIGMAS` standard deviations of their Poisson request
    counts over ``traffic_window_s``: at a trickle, 1 -> 2 requests is no growth); else None (no stacking: a
    backlog building while replicas start is what they will absorb)."""
    growth = rc.in_flight_raise_rate_growth_frac
    if not in_flight or growth is None or not rate_per_s or not state.scale_up_rate_per_s:
        return None
    ratio = rate_per_s / state.scale_up_rate_per_s
    if ratio < 1.0 + growth:
        return None
    if not beyond_counting_noise(rate_per_s, state.scale_up_rate_per_s, rc.traffic_window_s):
        return None
    return math.ceil(current * min(ratio, 1e6) - 1e-9)

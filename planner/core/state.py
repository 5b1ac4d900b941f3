"""The decision core's memory between ticks: a frozen :class:`CoreState` returned by every
:func:`planner.core.step` and passed back into the next one. Nothing else is kept between ticks.

Time-based, not tick-based: every entry carries the ``now`` it was recorded at, and windows are in seconds.
"""

from __future__ import annotations

import msgspec

from planner.core.feedback import FeedbackState
from planner.core.forecast import ForecastState
from planner.core.observed_batch import OutputDemand

__all__ = ["CoreState", "ServiceState"]


class ServiceState(msgspec.Struct, frozen=True, kw_only=True):
    """One service's memory."""

    # (at, recommendation after bounds): what the stabilization windows look back over.
    recommendations: tuple[tuple[float, int], ...] = ()
    # (at, the same recommendation with a forecast floor's trend scaled by its checked gain even at a new high):
    # what the hold across idle gaps looks back over.
    checked_recommendations: tuple[tuple[float, int], ...] = ()
    # (at, request rate, the load's count + 1, refuted) of the recommendations a forecast floor raised above the load's
    # count + 1: once the rate fell beyond the noise below the rate asked at, the holds count them at the load's count
    # + 1 (planner.core.refuted).
    floor_peaks: tuple[tuple[float, float, int, bool], ...] = ()
    # (at, request rate, settled, predicted) of each recommendation: one asked while capacity was still coming, or a
    # forecast floor above the load's count, counts in the holds at most what the fleet, settled, was asked at that
    # rate (planner.core.served).
    asked: tuple[tuple[float, float | None, bool, bool], ...] = ()
    # (at, level) of the levels the recommendations came back to after more than a base scale-down window below them
    # (planner.core.returned): beyond the base window, the long holds keep no higher than the highest of them.
    returns: tuple[tuple[float, int], ...] = ()
    # (at, replica change): scale actions the deployment took, what the rate-limit periods count.
    scale_events: tuple[tuple[float, int], ...] = ()
    # (at, from, to) of the last decision that asked for a change; it becomes a scale event once the deployment
    # reports ``to`` as its desired count (an advisory or failed action never counts against the rate limits).
    pending_scale: tuple[float, int, int] | None = None
    # Since when every ready replica and rank has been covered without a break (None: not covered now).
    coverage_complete_since: float | None = None
    # Worker ids that have reported (fully fresh) at least once while discovered, and when the newest of them first
    # reported: a count is held on data from the count itself (planner.core.newcomers).
    reported_workers: frozenset[str] = frozenset()
    first_report_at: float | None = None
    # Since when the deployment has had an action in flight (None: settled).
    in_flight_since: float | None = None
    forecast: ForecastState = msgspec.field(default_factory=ForecastState)
    # Start-up delay measured from the deployment's desired -> ready transitions (EWMA; None: not seen yet).
    startup_s_observed: float | None = None
    # (at, count before, lowest request rate since or None) of recent scale-downs, and (at, gap_s) of recent
    # scale-ups that bought back capacity released gap_s earlier after the traffic fell: the idle gaps the traffic
    # shows, which the scale-down window learns to hold across.
    scale_downs: tuple[tuple[float, int, float | None], ...] = ()
    rebuy_gaps: tuple[tuple[float, float], ...] = ()
    # (at, count, lowest request rate since or None) of those re-buys after the traffic fell: the count the traffic
    # brought back, what is held across the next gaps; renewed while the traffic falls and comes back to need it.
    rebuy_counts: tuple[tuple[float, int, float | None], ...] = ()
    # When the last scale-up was decided (a desired -> ready transition is measured from it).
    scale_up_at: float | None = None
    # The request rate when the last scale-up was decided (what an in-flight target may be raised against).
    scale_up_rate_per_s: float | None = None
    # SLA mode's closed loop: the headroom corrections from the observed attainment.
    feedback: FeedbackState = msgspec.field(default_factory=FeedbackState)
    # The prompt lengths' log-normal sigma^2, an EWMA over windows (planner.core.prompt_spread), and when it was fed.
    prompt_log_var: float | None = None
    prompt_log_var_at: float | None = None
    # The output-token demand smoothed over a minute (planner.core.observed_batch): the demonstrated batch's margin.
    output_demand: OutputDemand | None = None


class CoreState(msgspec.Struct, frozen=True, kw_only=True):
    """The whole core's memory. Start with ``CoreState()``; the first step records ``started_at``."""

    tick: int = 0
    started_at: float | None = None
    last_now: float | None = None
    services: dict[str, ServiceState] = msgspec.field(default_factory=dict)
    # Fleet-wide unknown_worker drop counter at the last tick (a rise: reason unknown_worker_samples).
    unknown_worker_drops_seen: int = 0

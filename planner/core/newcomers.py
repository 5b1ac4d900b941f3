"""New replicas: the count just bought is judged on data from the count itself.

A replica that turns ready has not reported yet: its first FPM comes a tick or so later. Until every ready
replica has reported, the safety gate already holds any scale-down (coverage is not complete now). Once the last
new replica has reported, the count it completes is held for ``hold_s`` (the scale-down window) from that first
report (``new_replicas_held``): the load it sees was measured on a fleet that did not have those replicas, and a
count is only released on a window of data from the count itself. What is held is the count the recommendations
asked for with their forecast trends checked against what came (:func:`newcomer_count`: the highest checked
recommendation from one window before that first report until now, the one that bought the replicas included),
not the whole count: a forecast floor's peak at a new high that the rates did not confirm had its own window
(the scale-down window held it) and is not held a second time here. Whether the first report lands on the tick the
replica turns ready or one tick later (a timing accident of the publisher) no longer changes the decision.

The sustained-coverage clock (:mod:`planner.core.safety`) is therefore not restarted by a replica that has never
reported (a newcomer): that silence is the new count's start-up, held here, not a break in coverage. A replica
that has reported before and falls silent still breaks coverage and restarts the clock.

Which replicas have reported is remembered by worker id (``ServiceState.reported_workers``), pruned to the
workers discovered now; a fresh planner has seen none, so every worker's first report falls in its first tick
(inside the start-up window anyway). Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter

from planner.core.decision import Coverage, Reason, WorkerStatus
from planner.discovery import WorkerRecord

__all__ = ["newcomer_count", "newcomer_hold", "only_newcomers_silent", "update_reported"]

_WORKER_ID = attrgetter("worker_id")


def update_reported(
    coverage: Coverage, workers: Sequence[WorkerRecord], previous: frozenset[str]
) -> tuple[frozenset[str], bool]:
    """The worker ids that have reported (fully fresh on every rank) at least once while discovered, and whether
    one of them reported for the first time this tick."""
    ids = frozenset(map(_WORKER_ID, workers))  # C-level passes: the core's tick cost at thousands of workers
    healthy = ids.difference([p.worker_id for p in coverage.problems])
    first = not healthy <= previous
    if not first and ids >= previous:
        return previous, False
    return (previous & ids) | healthy, first


def only_newcomers_silent(coverage: Coverage, reported: frozenset[str]) -> bool:
    """Coverage is incomplete only because ready replicas that have never reported are silent (still starting)."""
    if coverage.complete or coverage.gaps != (Reason.WORKERS_SILENT,):
        return False
    return not any(p.worker_id in reported for p in coverage.problems if p.status == WorkerStatus.SILENT)


def newcomer_hold(first_report_at: float | None, now: float, hold_s: float) -> tuple[bool, str]:
    """Does the last new replica's first report hold a scale-down now? Returns (held, detail)."""
    if first_report_at is None:
        return False, ""
    since_s = now - first_report_at
    if since_s >= hold_s:
        return False, ""
    return True, (
        f"the newest replica first reported {since_s:g} s ago; the count is held for {hold_s:g} s of data"
        " from the count itself"
    )


def newcomer_count(
    checked: Sequence[tuple[float, int]], first_report_at: float, window_s: float, value: int, current: int
) -> int:
    """The count the hold keeps: the highest checked recommendation (a forecast floor's trend scaled by its checked
    gain) from one window before the newest replica's first report until now, at least ``value``, at most
    ``current``."""
    top = max((count for at, count in checked if at > first_report_at - window_s), default=value)
    return min(max(value, top), current)

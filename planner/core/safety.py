"""Safety rules (ARCHITECTURE.md, "Decisions"), pure:

- missing, stale or unattributable data never causes a scale-down: a scale-down needs complete coverage
  (see :mod:`planner.core.reconcile`) held without a break for one full scale-down window — which also means
  no scale-down in the planner's first window;
- engines without data count as idle for scale-up (done by reconcile/recommend: silent ranks add no load);
- no stacking while an action is in flight (in-flight replicas already count: ``current`` is the desired
  count); a target the pods have not reached may still be lowered, down to the replicas that are ready.
"""

from __future__ import annotations

from planner.core.clamp import Clamped
from planner.core.decision import Coverage, Reason, WorkerStatus
from planner.core.observation import DeploymentStatus

__all__ = ["coverage_gate", "describe_gaps", "hold_in_flight", "next_coverage_since"]


def next_coverage_since(
    coverage: Coverage, previous: float | None, now: float, newcomers_only: bool = False
) -> float | None:
    """Since when coverage has been complete without a break (None when it is not complete now).
    ``newcomers_only``: the only gap is ready replicas that have never reported (a new count starting,
    :mod:`planner.core.newcomers` holds it): not a break."""
    if not coverage.complete and not newcomers_only:
        return None
    return now if previous is None else previous


def describe_gaps(coverage: Coverage) -> str:
    """A sentence naming the workers behind each coverage gap."""
    parts: list[str] = []
    by_status: dict[WorkerStatus, list[str]] = {}
    for problem in coverage.problems:
        by_status.setdefault(problem.status, []).append(problem.worker_id)

    def names(ids: list[str]) -> str:
        shown = ", ".join(ids[:8])
        return shown + (f" and {len(ids) - 8} more" if len(ids) > 8 else "")

    for gap in coverage.gaps:
        if gap == Reason.IDENTITY_NOT_SYNCED:
            ids = by_status.get(WorkerStatus.IDENTITY_NOT_SYNCED, [])
            published = sorted(
                {p for w in coverage.problems if w.status == WorkerStatus.IDENTITY_NOT_SYNCED for p in w.published_as}
            )
            parts.append(
                f"identity_not_synced: {names(ids)} publish under "
                f"{', '.join(repr(p) for p in published)} instead of their registered ids"
            )
        elif gap == Reason.RANKS_MISSING:
            ids = [
                f"{w.worker_id} (ranks {', '.join(map(str, w.missing_ranks))})"
                for w in coverage.problems
                if w.status == WorkerStatus.PARTIAL
            ]
            parts.append(f"ranks_missing: {names(ids)}")
        elif gap == Reason.WORKERS_SILENT:
            parts.append(f"workers_silent: {names(by_status.get(WorkerStatus.SILENT, []))}")
        elif gap == Reason.READY_REPLICAS_UNDISCOVERED:
            usable = coverage.discovered - coverage.not_ready
            parts.append(
                f"ready_replicas_undiscovered: the deployment reports {coverage.deployment_ready} ready,"
                f" discovery knows {usable}"
            )
        else:
            parts.append(gap.value)
    return "; ".join(parts)


def coverage_gate(
    coverage: Coverage,
    since: float | None,
    started_at: float,
    now: float,
    window_s: float,
) -> tuple[bool, tuple[Reason, ...], str]:
    """May a scale-down happen now? Returns (allowed, reasons when not, detail)."""
    if not coverage.complete:
        return False, (*coverage.gaps, Reason.SCALE_DOWN_BLOCKED), describe_gaps(coverage)
    held_s = now - (since if since is not None else now)
    if held_s >= window_s:
        return True, (), ""
    if now - started_at < window_s:
        return (
            False,
            (Reason.STARTUP_WINDOW, Reason.SCALE_DOWN_BLOCKED),
            (f"planner started {now - started_at:g} s ago; no scale-down in the first {window_s:g} s window"),
        )
    return (
        False,
        (Reason.COVERAGE_NOT_SUSTAINED, Reason.SCALE_DOWN_BLOCKED),
        (f"coverage complete for {held_s:g} s of the {window_s:g} s a scale-down needs"),
    )


def hold_in_flight(
    value: int,
    current: int,
    deployment: DeploymentStatus | None,
    in_flight_since: float | None,
    now: float,
    pending_timeout_s: float,
    raise_to: int | None = None,
    arrivals_raise_to: int | None = None,
) -> tuple[Clamped, tuple[Reason, ...]]:
    """No stacking while an action is in flight. Returns the clamped value and extra (informational)
    reasons, e.g. ``target_not_reached`` when the target has been pending longer than
    ``pending_timeout_s``. ``raise_to``: the most a scale-up may raise the in-flight target to (the caller sizes
    it from the request rate's growth since the action was decided), ``in_flight_target_raised``.
    ``arrivals_raise_to``: the count the arrivals alone need (no backlog), when above the in-flight target: the
    target is raised to it (``in_flight_raised_for_arrivals``): a target that cannot serve the arrivals when it
    is reached is not worth waiting for (a prompt-length shift at the same request rate)."""
    if deployment is None or not deployment.in_flight:
        return Clamped(replicas=value), ()
    waited_s = now - (in_flight_since if in_flight_since is not None else now)
    extra: tuple[Reason, ...] = ()
    if waited_s >= pending_timeout_s and deployment.ready < deployment.desired:
        extra = (Reason.TARGET_NOT_REACHED,)
    ready = deployment.ready
    if value > current and arrivals_raise_to is not None and arrivals_raise_to > max(current, raise_to or 0):
        raised = min(value, arrivals_raise_to)
        return Clamped(
            replicas=raised,
            reason=Reason.IN_FLIGHT_RAISED_FOR_ARRIVALS,
            detail=f"{ready} of {deployment.desired} ready, but the arrivals alone need {arrivals_raise_to}:"
            f" target raised to {raised}",
        ), extra
    if value > current and raise_to is not None and raise_to > current:
        raised = min(value, raise_to)
        return Clamped(
            replicas=raised,
            reason=Reason.IN_FLIGHT_TARGET_RAISED,
            detail=f"{ready} of {deployment.desired} ready, but the request rate grew since the scale-up:"
            f" target raised to {raised}",
        ), extra
    if value > current:
        return Clamped(
            replicas=current,
            reason=Reason.ACTION_IN_FLIGHT,
            detail=f"{ready} of {deployment.desired} ready; no new scale-up until it settles",
        ), extra
    if value < current:
        lowest = max(value, min(ready, current))
        if lowest < current:
            return Clamped(
                replicas=lowest,
                reason=Reason.PENDING_TARGET_LOWERED,
                detail=f"target {current} not reached ({ready} ready): lowered to {lowest}",
            ), extra
        return Clamped(
            replicas=current,
            reason=Reason.ACTION_IN_FLIGHT,
            detail=f"scale-down waits until the action in flight settles ({ready} ready)",
        ), extra
    return Clamped(replicas=value), extra

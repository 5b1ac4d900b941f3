"""Actuation bookkeeping: whether a scale request may be sent, and what became of it and of status reads.

:class:`Actuation` decides, before the runner calls the actuator, whether a request is sent at all (deferred
by a Retry-After, recorded only on a follower or without an actuator), records every outcome in the history
and the metrics, and keeps the last status read, its error and the recent actuator errors for diagnostics.
The runner does the I/O (``await asyncio.to_thread(actuator.scale, ...)``) and hands it the monotonic
``clock`` and the ``wall_clock``; this module never imports the runner.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from planner.actuators.base import OutcomeKind, ScaleOutcome, ScaleRequest, ServiceStatus
from planner.errors import ActuatorError
from planner.service.history import History, OutcomeEntry
from planner.service.metrics import PlannerMetrics

__all__ = ["DEFERRED", "Actuation", "ActuatorErrorEntry", "Gate"]

log = logging.getLogger(__name__)

DEFERRED = "deferred"  # outcome kind: not sent because the API server's Retry-After has not passed


class ActuatorErrorEntry(msgspec.Struct, frozen=True, kw_only=True):
    at_s: float
    operation: str  # "status" | "scale"
    service: str
    kind: str
    message: str


class Gate(msgspec.Struct, frozen=True, kw_only=True):
    """Why a request is not sent: the outcome recorded instead."""

    kind: str
    message: str


class Actuation:
    """Retry-After deferrals, outcome records, the last status read and the recent actuator errors."""

    def __init__(
        self,
        *,
        history: History,
        metrics: PlannerMetrics,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
        max_errors: int,
    ) -> None:
        self.history = history
        self.metrics = metrics
        self._clock = clock
        self._wall_clock = wall_clock
        self.errors: deque[ActuatorErrorEntry] = deque(maxlen=max_errors)
        self.status: Mapping[str, ServiceStatus] | None = None
        self.status_error: str | None = None
        self._retry_not_before: dict[str, float] = {}  # service -> monotonic time a Retry-After allows again
        self.last_known: dict[str, int] = {}  # service -> desired count at the last successful status read

    # -- status --------------------------------------------------------------------------------------------

    def status_read(self, status: Mapping[str, ServiceStatus]) -> Mapping[str, ServiceStatus]:
        self.status_error = None
        self.status = dict(status)
        self.last_known.update({service: st.desired for service, st in self.status.items()})
        return self.status

    def status_failed(self, exc: ActuatorError) -> None:
        self.status_error = f"{type(exc).__name__}: {exc}"
        self.status = None
        self.error("status", "", type(exc).__name__, str(exc))

    # -- scale ---------------------------------------------------------------------------------------------

    def gate(self, request: ScaleRequest, *, leader: bool, configured: bool) -> Gate | None:
        """The outcome to record instead of sending ``request``; None: send it."""
        not_before = self._retry_not_before.get(request.service)
        wait_s = None if not_before is None else not_before - self._clock()
        if wait_s is not None and wait_s > 0:
            return Gate(
                kind=DEFERRED,
                message=f"not sent: the API server asked to retry after {wait_s:.1f} more s (Retry-After)",
            )
        if not leader:
            return Gate(kind=OutcomeKind.NOT_LEADER.value, message="not the leader: recorded, not applied")
        if not configured:
            return Gate(kind=OutcomeKind.ADVISORY.value, message="no actuator configured: recorded only")
        return None

    def expect(self, request: ScaleRequest) -> tuple[ScaleRequest, Gate | None]:
        """``request`` carrying the count it expects to replace, or the outcome to record instead of sending it.

        With this tick's status: the deployment's desired count. Without (the read failed): the count of the
        last successful read, and a request below it is not sent — a fleet the planner cannot see is never
        lowered; with no count ever read nothing is sent."""
        service = request.service
        if self.status is not None:
            current = self.status.get(service)
            expected = None if current is None else current.desired
            return msgspec.structs.replace(request, expected_replicas=expected), None
        known = self.last_known.get(service)
        if known is None:
            message = f"not sent: the status of {service!r} cannot be read and was never read; nothing written"
            return request, Gate(kind=OutcomeKind.STATUS_UNKNOWN.value, message=message)
        if request.replicas < known:
            message = (
                f"not sent: the status of {service!r} cannot be read; {request.replicas} is below its last known "
                f"count {known} and a fleet the planner cannot see is never lowered"
            )
            return request, Gate(kind=OutcomeKind.STATUS_UNKNOWN.value, message=message)
        return msgspec.structs.replace(request, expected_replicas=known), None

    def record(
        self,
        request: ScaleRequest,
        *,
        role: str,
        decision_id: int | None,
        at_s: float,
        gate: Gate | None = None,
        outcome: ScaleOutcome | None = None,
        failure: ActuatorError | None = None,
    ) -> OutcomeEntry:
        """Record what became of ``request``: held back by ``gate``, answered with ``outcome``, or raised
        ``failure``."""
        if gate is not None:
            kind, applied, message = gate.kind, False, gate.message
        elif failure is not None:
            kind, applied, message = "error", False, f"{type(failure).__name__}: {failure}"
        elif outcome is not None:
            kind, applied, message = outcome.kind.value, outcome.applied, outcome.message
            if outcome.retry_after_s is not None and outcome.retry_after_s > 0:
                self._retry_not_before[request.service] = self._clock() + outcome.retry_after_s
            else:
                self._retry_not_before.pop(request.service, None)
        else:
            raise ValueError("record needs a gate, an outcome or a failure")
        entry = OutcomeEntry(
            id=self.history.next_outcome_id(),
            decision_id=decision_id,
            role=role,
            service=request.service,
            at_s=at_s,
            requested=request.replicas,
            kind=kind,
            applied=applied,
            message=message,
            outcome={} if outcome is None else msgspec.to_builtins(outcome),
        )
        self.history.add_outcome(entry)
        self.metrics.observe_outcome(kind, service=request.service)
        log.info("scale %s to %d (decision %s): %s %s", request.service, request.replicas, decision_id, kind, message)
        if kind in ("error", DEFERRED) or (
            outcome is not None
            and not outcome.applied
            and outcome.kind not in (OutcomeKind.UNCHANGED, OutcomeKind.ADVISORY)
        ):
            self.error("scale", request.service, kind, message)
        return entry

    def error(self, operation: str, service: str, kind: str, message: str) -> None:
        self.errors.append(
            ActuatorErrorEntry(
                at_s=self._wall_clock(), operation=operation, service=service, kind=kind, message=message
            )
        )

    def brief(self, configured: bool) -> dict[str, Any]:
        return {
            "configured": configured,
            "status_error": self.status_error,
            "status": None if self.status is None else {k: msgspec.to_builtins(v) for k, v in self.status.items()},
            "recent_errors": [msgspec.to_builtins(e) for e in reversed(self.errors)],
        }

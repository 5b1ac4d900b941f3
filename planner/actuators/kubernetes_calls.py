"""One attempt's plumbing, shared by the DGD and apps/v1 scalers of the Kubernetes actuator: a client call whose
failure comes out mapped into the planner's error tree (:class:`CallFailed`), and the signal that ends a request
without a write (:class:`StopRequest`), e.g. after an ``expected_replicas`` mismatch (:func:`compare`).

Both exceptions stay inside the actuator: :class:`~planner.actuators.kubernetes.KubernetesActuator` turns them
into a :class:`~planner.actuators.base.ScaleOutcome`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from planner.actuators.base import ActuatorError, OutcomeKind, ScaleRequest, check_expected
from planner.k8s.errors import CLIENT_ERRORS, http_status, map_api_error

__all__ = ["CallFailed", "StopRequest", "call", "compare"]


class CallFailed(Exception):
    """One client call failed; ``error`` is the mapped planner error."""

    def __init__(self, error: ActuatorError, method: str, http_status: int | None) -> None:
        super().__init__(str(error))
        self.error = error
        self.method = method
        self.http_status = http_status


class StopRequest(Exception):
    """End the request with this outcome."""

    def __init__(self, kind: OutcomeKind, message: str, *, applied: bool = False, previous: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.applied = applied
        self.previous = previous


def call(method: str, verb: str, resource: str, name: str, fn: Callable[[], Any]) -> Any:
    """Run one client call; a failure comes out as :class:`CallFailed` carrying the mapped error."""
    try:
        return fn()
    except CLIENT_ERRORS as exc:
        err = map_api_error(exc, verb=verb, resource=resource, name=name)
        raise CallFailed(err, method, http_status(exc)) from exc


def compare(request: ScaleRequest, current: int, where: str) -> None:
    """Raise :class:`StopRequest` when ``request.expected_replicas`` disagrees with the count just read."""
    mismatch = check_expected(request, current, where)
    if mismatch is not None:
        raise StopRequest(mismatch.kind, mismatch.message, previous=current)

"""Advisory mode: decide and record, never write.

:class:`AdvisoryActuator` answers every scale request with ``OutcomeKind.ADVISORY`` (``applied=False``) and
keeps it in :attr:`AdvisoryActuator.history`. Status comes from an optional read-only ``reader`` (e.g. a
:class:`planner.actuators.kubernetes.KubernetesActuator`, of which only ``status()`` is ever called); without
one, every service reports the fixed count it was given, because nothing here changes the world.
The hard bound still applies: an out-of-bound request is recorded as ``OUT_OF_BOUNDS``, like any actuator, and
so does the expectation: a request whose ``expected_replicas`` is not the current count (or cannot be compared
with it) is recorded as ``CURRENT_MISMATCH``.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping

from planner.actuators.base import (
    Actuator,
    ActuatorError,
    OutcomeKind,
    ReplicaBounds,
    ScaleOutcome,
    ScaleRequest,
    ServiceStatus,
    UnknownServiceError,
    check_bounds,
    check_expected,
)

__all__ = ["AdvisoryActuator"]


class AdvisoryActuator:
    """Records scale requests; never writes. ``services`` maps each service to its hard bound;
    ``replicas`` gives the fixed count reported when there is no ``reader`` (default: the bound's minimum)."""

    def __init__(
        self,
        services: Mapping[str, ReplicaBounds],
        *,
        reader: Actuator | None = None,
        replicas: Mapping[str, int] | None = None,
        history_size: int = 1000,
    ) -> None:
        self._bounds = dict(services)
        self._reader = reader
        self._replicas = {s: (replicas or {}).get(s, b.min_replicas) for s, b in self._bounds.items()}
        self._lock = threading.Lock()
        self.history: deque[ScaleOutcome] = deque(maxlen=history_size)

    def replica_bounds(self) -> Mapping[str, ReplicaBounds]:
        return dict(self._bounds)

    def status(self) -> Mapping[str, ServiceStatus]:
        if self._reader is not None:
            return self._reader.status()
        return {
            s: ServiceStatus(service=s, desired=n, ready=n, available=n, updated=n, message="advisory: fixed count")
            for s, n in self._replicas.items()
        }

    def scale(self, request: ScaleRequest) -> ScaleOutcome:
        bounds = self._bounds.get(request.service)
        if bounds is None:
            raise UnknownServiceError(
                f"advisory actuator: unknown service {request.service!r} (configured: {sorted(self._bounds)})"
            )
        where = f"advisory/{request.service}"
        outcome = check_bounds(request, bounds, where)
        if outcome is None:
            previous: int | None
            note = ""
            try:
                previous = self.status()[request.service].desired
            except (ActuatorError, KeyError) as exc:
                previous, note = None, f" (current count unreadable: {exc})"
            mismatch = None if previous is None else check_expected(request, previous, where)
            if previous is None and request.expected_replicas is not None:
                mismatch = ScaleOutcome(
                    service=request.service,
                    requested=request.replicas,
                    applied=False,
                    kind=OutcomeKind.CURRENT_MISMATCH,
                    message=f"refused: the current count of {request.service!r} cannot be compared with the "
                    f"expected {request.expected_replicas}{note}; nothing written",
                    target=where,
                )
            outcome = mismatch or ScaleOutcome(
                service=request.service,
                requested=request.replicas,
                applied=False,
                kind=OutcomeKind.ADVISORY,
                message=f"advisory mode: would set {request.service} {previous} -> {request.replicas}{note}",
                previous=previous,
                target=where,
            )
        with self._lock:
            self.history.append(outcome)
        return outcome

"""The Actuator seam: what the service runner calls to read replica status and to apply a scale decision.

An actuator is an I/O shell. Its two methods are **blocking** (the Kubernetes actuator uses the official
client); the runner calls them through ``asyncio.to_thread`` so they stay off the event loop::

    status  = await asyncio.to_thread(actuator.status)            # Mapping[service, ServiceStatus]
    outcome = await asyncio.to_thread(actuator.scale, request)    # ScaleOutcome, never raises for API errors

Contract
--------
* ``status()`` returns one :class:`ServiceStatus` per service the actuator manages. It raises an
  :class:`ActuatorError` subclass when the status cannot be read (the runner treats that as "no data": it must
  not scale down on it).
* ``scale(request)`` always returns a :class:`ScaleOutcome`: every scale request ends recorded, with the
  attempts it took (``attempt_log``) and a :class:`OutcomeKind`. It does not raise for API failures; it raises
  only for programming errors (a service it does not manage: :class:`UnknownServiceError`).
* ``request.expected_replicas``, when set, is the count the request expects to replace (what the planner last
  read). Every actuator reads the target's current count before writing and refuses a mismatch
  (``OutcomeKind.CURRENT_MISMATCH``, ``applied=False``, nothing written): the planner never overwrites a count
  it has not seen. The Kubernetes actuator also writes with the read ``resourceVersion`` as a precondition, so a
  change between its read and its write is a 409, re-read and compared again.
* Every actuator holds a hard sanity bound per service (:class:`ReplicaBounds`), offered by its optional
  ``replica_bounds()`` (see :func:`replica_bounds`), and never writes a count outside it: such a request comes
  back ``OutcomeKind.OUT_OF_BOUNDS`` with ``applied=False``, nothing written. The decision core decides within
  it (the service hands it over at start); this bound is the last line of defence, not a clamp.
* ``outcome.transient`` says whether trying again later may succeed (conflict, throttling, server error,
  timeout, deployment not ready); ``outcome.retry_after_s`` is the server's Retry-After when it sent one.

Errors (all under :class:`planner.errors.ActuatorError`)::

    ActuatorError
    ├── UnknownServiceError      a service the actuator was not configured for (programming error)
    ├── NotFoundError            the target object (or its API) does not exist          permanent
    ├── ForbiddenError           RBAC refused; names the verb and the resource          permanent
    ├── InvalidError             the API server rejected the object (422 / 400)         permanent
    └── TransientActuatorError   trying again may succeed
        ├── ConflictError        409: the object changed under us (re-read and retry)
        ├── ThrottledError       429: carries retry_after_s
        ├── ServerError          5xx
        └── ApiTimeoutError      no answer within the request timeout, or connection failure
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Protocol, runtime_checkable

import msgspec

from planner.errors import ActuatorError

__all__ = [
    "TRANSIENT_OUTCOMES",
    "Actuator",
    "ActuatorError",
    "ApiTimeoutError",
    "AttemptRecord",
    "ConflictError",
    "ForbiddenError",
    "InvalidError",
    "NotFoundError",
    "OutcomeKind",
    "ReplicaBounds",
    "ScaleOutcome",
    "ScaleRequest",
    "ServerError",
    "ServiceStatus",
    "ThrottledError",
    "TransientActuatorError",
    "UnknownServiceError",
    "check_bounds",
    "check_expected",
    "replica_bounds",
]


# ---------------------------------------------------------------------------------------------------- errors
class UnknownServiceError(ActuatorError):
    """A service the actuator was not configured to manage."""


class NotFoundError(ActuatorError):
    """The target object, or the API serving it, does not exist (404)."""


class ForbiddenError(ActuatorError):
    """RBAC refused the request (403). ``verb`` and ``resource`` name what the service account is missing."""

    def __init__(self, message: str, *, verb: str = "", resource: str = "") -> None:
        super().__init__(message)
        self.verb = verb
        self.resource = resource


class InvalidError(ActuatorError):
    """The API server rejected the object we sent (422 Unprocessable / 400 Bad Request)."""


class TransientActuatorError(ActuatorError):
    """Trying again later may succeed."""


class ConflictError(TransientActuatorError):
    """409: the object's resourceVersion moved on (someone else wrote it). Re-read and retry."""


class ThrottledError(TransientActuatorError):
    """429 Too Many Requests; ``retry_after_s`` is the server's Retry-After (None when it sent none)."""

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ServerError(TransientActuatorError):
    """5xx from the API server."""


class ApiTimeoutError(TransientActuatorError):
    """No answer within the request timeout, or the connection failed."""


# ---------------------------------------------------------------------------------------------------- records
class ReplicaBounds(msgspec.Struct, frozen=True, kw_only=True):
    """The hard sanity bound an actuator enforces for one service: it never writes outside
    ``[min_replicas, max_replicas]``."""

    min_replicas: int = 0
    max_replicas: int = 64

    def __post_init__(self) -> None:
        if self.min_replicas < 0 or self.max_replicas < self.min_replicas:
            raise ValueError(
                f"replica bounds need 0 <= min_replicas <= max_replicas, got [{self.min_replicas}, {self.max_replicas}]"
            )

    def contains(self, replicas: int) -> bool:
        return self.min_replicas <= replicas <= self.max_replicas


class ServiceStatus(msgspec.Struct, frozen=True, kw_only=True):
    """Replica counts of one service as the deployment reports them.

    ``desired``: the count last written (spec); ``ready``: pods passing readiness; ``available``: ready for
    at least minReadySeconds (equals ``ready`` where the workload does not report it); ``updated``: at the
    current revision. ``observed_at`` is the wall time the status was read (None when not stamped).
    ``state`` is the workload's own summary ("successful", "pending", ...; "" when it has none) and
    ``ready_state`` whether it reports itself Ready (None when it does not say).
    """

    service: str
    desired: int
    ready: int
    available: int
    updated: int
    observed_at: float | None = None
    state: str = ""
    ready_state: bool | None = None
    message: str = ""


class ScaleRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Set ``service`` to ``replicas``. ``reason`` is free text for the record (the decision's top reason).
    ``expected_replicas``: the count this request expects to replace; the actuator refuses to write when the
    target holds another (None: no expectation, e.g. a manual request)."""

    service: str
    replicas: int
    reason: str = ""
    expected_replicas: int | None = None


class OutcomeKind(enum.StrEnum):
    APPLIED = "applied"  # the API server accepted the new count
    UNCHANGED = "unchanged"  # already at the requested count; nothing written
    ADVISORY = "advisory"  # advisory mode: recorded, never written
    OUT_OF_BOUNDS = "out_of_bounds"  # outside the actuator's hard bound; nothing written
    NOT_READY = "not_ready"  # deployment not Ready: scale-up deferred (scale-down still applies)
    NOT_FOUND = "not_found"
    FORBIDDEN = "forbidden"
    INVALID = "invalid"
    CONFLICT = "conflict"  # still conflicting after every retry
    THROTTLED = "throttled"
    SERVER_ERROR = "server_error"
    TIMEOUT = "timeout"
    NOT_LEADER = "not_leader"  # reserved for the runner: a follower records what it would have done
    CURRENT_MISMATCH = "current_mismatch"  # the target does not hold expected_replicas; nothing written
    STATUS_UNKNOWN = "status_unknown"  # reserved for the runner: not sent, the deployment's count is unknown


TRANSIENT_OUTCOMES: frozenset[OutcomeKind] = frozenset(
    {
        OutcomeKind.NOT_READY,
        OutcomeKind.CONFLICT,
        OutcomeKind.THROTTLED,
        OutcomeKind.SERVER_ERROR,
        OutcomeKind.TIMEOUT,
    }
)


class AttemptRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One API call made while serving a scale request."""

    method: str  # e.g. "dgdsa.scale", "dgd.patch", "deployment.scale", "statefulset.scale", "dgdsa.read"
    outcome: OutcomeKind
    http_status: int | None = None
    message: str = ""
    backoff_s: float = 0.0  # how long the actuator waited after this attempt before the next one


class ScaleOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """What became of one :class:`ScaleRequest`. ``previous`` is the count read before writing (None when it
    could not be read); ``attempts`` is ``len(attempt_log)``."""

    service: str
    requested: int
    applied: bool
    kind: OutcomeKind
    message: str = ""
    attempts: int = 0
    attempt_log: tuple[AttemptRecord, ...] = ()
    previous: int | None = None
    target: str = ""  # what was (or would have been) written, e.g. "dgdsa/ns/vllm-disagg-decode"
    retry_after_s: float | None = None

    @property
    def transient(self) -> bool:
        return self.kind in TRANSIENT_OUTCOMES


def check_bounds(request: ScaleRequest, bounds: ReplicaBounds, target: str = "") -> ScaleOutcome | None:
    """The OUT_OF_BOUNDS outcome for a request outside ``bounds``; None when the request is inside."""
    if bounds.contains(request.replicas):
        return None
    return ScaleOutcome(
        service=request.service,
        requested=request.replicas,
        applied=False,
        kind=OutcomeKind.OUT_OF_BOUNDS,
        message=(
            f"refused: {request.replicas} replicas is outside the hard bound "
            f"[{bounds.min_replicas}, {bounds.max_replicas}] for {request.service!r}; nothing written"
        ),
        target=target,
    )


def check_expected(request: ScaleRequest, current: int, target: str = "") -> ScaleOutcome | None:
    """The CURRENT_MISMATCH outcome when ``current`` is not the count ``request`` expects to replace; None when
    it is (or the request states no expectation)."""
    if request.expected_replicas is None or request.expected_replicas == current:
        return None
    return ScaleOutcome(
        service=request.service,
        requested=request.replicas,
        applied=False,
        kind=OutcomeKind.CURRENT_MISMATCH,
        message=(
            f"refused: {request.service!r} holds {current} replicas, not the {request.expected_replicas} this "
            f"request expected to replace; nothing written (re-read and decide again)"
        ),
        previous=current,
        target=target,
    )


def replica_bounds(actuator: object) -> Mapping[str, ReplicaBounds]:
    """The hard bound of every service ``actuator`` manages, from its optional ``replica_bounds()`` method
    (empty when it has none). The service hands them to the core so the two never disagree."""
    method = getattr(actuator, "replica_bounds", None)
    return {} if method is None else dict(method())


# ------------------------------------------------------------------------------------------------ protocol
@runtime_checkable
class Actuator(Protocol):
    """Reads replica status and applies scale requests. Both methods block: call them via to_thread."""

    def status(self) -> Mapping[str, ServiceStatus]:
        """Current status of every managed service, by service name. Raises ActuatorError when unreadable."""
        ...

    def scale(self, request: ScaleRequest) -> ScaleOutcome:
        """Apply ``request`` (or refuse it) and return its recorded outcome."""
        ...

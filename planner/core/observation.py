"""What one tick observes: discovered workers, a FleetStore snapshot, each deployment's status and,
optionally, traffic. :class:`Observation` is a thin frozen wrapper: building one costs nothing beyond the
snapshot itself, so a simulator can build one every tick::

    obs = Observation(
        workers=discovery.workers(now),                 # Mapping[worker_id, WorkerRecord]
        fleet=store.snapshot(now),                      # FleetSnapshot
        deployments={"decode": DeploymentStatus(service="decode", desired=4, ready=4)},
        traffic={Role.DECODE: Traffic(request_rate_per_s=12.0, isl_tokens=1000, osl_tokens=200)},
    )

Deployments are keyed by service name (the ``service`` of the workers of that role, see
:class:`planner.discovery.WorkerRecord`); :meth:`DeploymentStatus.from_service_status` converts the
actuator's :class:`planner.actuators.base.ServiceStatus`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import msgspec

from planner.actuators.base import ServiceStatus
from planner.discovery import Role, WorkerRecord
from planner.errors import PlannerError
from planner.ingest.store import FleetSnapshot

__all__ = [
    "MAX_PLAUSIBLE_COUNT",
    "MAX_PLAUSIBLE_RATE_PER_S",
    "MAX_PLAUSIBLE_TOKENS",
    "DeploymentStatus",
    "Observation",
    "ObservationError",
    "RoleLoad",
    "Traffic",
]

# Plausibility limits of the core's own inputs (whatever ingest lets through). A load count past 2^53 is no
# longer an exact float and no fleet has it (an FPM field at 2^64 - 1 is a broken counter, not load); a request
# of more than 2^31 tokens exceeds every model's context; a billion requests per second no router sees.
MAX_PLAUSIBLE_COUNT = 2.0**53
MAX_PLAUSIBLE_TOKENS = 2.0**31
MAX_PLAUSIBLE_RATE_PER_S = 1e9


class ObservationError(PlannerError, ValueError):
    """An observation (or ``now``) the core cannot decide on; the message says what is wrong."""


class DeploymentStatus(msgspec.Struct, frozen=True, kw_only=True):
    """A deployment's replica counts as its actuator reports them.

    ``desired``: the count last written (spec). ``ready``: pods passing readiness. ``available``: ready long
    enough to serve (None = same as ready). ``updated``: at the current revision (None = not reported).
    ``action_in_flight``: the actuator knows a scale it issued has not settled (the core also treats
    ``ready < desired`` as in flight). ``not_ready_workers``: worker ids the deployment reports not ready
    (e.g. from a pod watch), classified ``not_ready`` rather than silent.
    """

    service: str
    desired: int
    ready: int
    available: int | None = None
    updated: int | None = None
    action_in_flight: bool = False
    not_ready_workers: tuple[str, ...] = ()

    @classmethod
    def from_service_status(
        cls, status: ServiceStatus, *, action_in_flight: bool = False, not_ready_workers: tuple[str, ...] = ()
    ) -> DeploymentStatus:
        return cls(
            service=status.service,
            desired=status.desired,
            ready=status.ready,
            available=status.available,
            updated=status.updated,
            action_in_flight=action_in_flight,
            not_ready_workers=not_ready_workers,
        )

    @property
    def in_flight(self) -> bool:
        """An earlier action has not settled: flagged by the actuator, or fewer ready than desired."""
        return self.action_in_flight or self.ready < self.desired


def _finite_or_none(value: float | None, limit: float = math.inf) -> float | None:
    """The value when it is a number in ``[0, limit]`` (finite), else None (unknown)."""
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value if math.isfinite(value) and 0 <= value <= limit else None


def _fraction_or_none(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) and 0 <= value <= 1 else None


def _count_or_none(value: int | None) -> int | None:
    return value if value is not None and not isinstance(value, bool) and value >= 0 else None


class Traffic(msgspec.Struct, frozen=True, kw_only=True):
    """Request traffic into a role, when the caller knows it (a replayed trace, a router, or the FPM traffic
    extension through :mod:`planner.ingest.traffic`). Every field is optional; non-finite or negative values
    (and attainment fractions outside [0, 1], a rate past :data:`MAX_PLAUSIBLE_RATE_PER_S`, a length past
    :data:`MAX_PLAUSIBLE_TOKENS`) are treated as unknown by :meth:`clean`.

    Rates and means: ``request_rate_per_s`` (arrivals per second), ``isl_tokens``/``osl_tokens`` (mean input /
    output sequence length). Distributions over the same window: ``isl_tokens_p50/p90/p99`` (prompt tokens of
    the requests that arrived), ``osl_tokens_p50/p90/p99`` (output tokens of the requests that finished).

    Observed latency (what users felt), over the window: ``ttft_ms_p50/p90/p99`` over the requests whose first
    token was produced in the window, ``itl_ms_p50/p90/p99`` over the per-request mean ITL of the requests that
    finished in it. ``ttft_attainment_frac``/``itl_attainment_frac``: the fraction of those requests at or
    under the SLA target (``CoreConfig.sla.ttft_ms`` / ``itl_ms``); the producer computes it against the
    targets it is given (the service and the replay pass the core's), from the extension's fixed log-bucket
    histogram, interpolated inside the bucket that holds the target. ``ttft_samples_in_window`` /
    ``itl_samples_in_window``: how many requests those figures rest on (a fraction over 3 requests is not one
    over 3000). ``requests_in_window``: arrivals counted; ``window_s``: the span the figures cover (shorter
    than the configured window while it fills).
    """

    request_rate_per_s: float | None = None
    isl_tokens: float | None = None  # mean input sequence length
    osl_tokens: float | None = None  # mean output sequence length
    isl_tokens_p50: float | None = None
    isl_tokens_p90: float | None = None
    isl_tokens_p99: float | None = None
    osl_tokens_p50: float | None = None
    osl_tokens_p90: float | None = None
    osl_tokens_p99: float | None = None
    ttft_ms_p50: float | None = None
    ttft_ms_p90: float | None = None
    ttft_ms_p99: float | None = None
    itl_ms_p50: float | None = None
    itl_ms_p90: float | None = None
    itl_ms_p99: float | None = None
    ttft_attainment_frac: float | None = None
    itl_attainment_frac: float | None = None
    ttft_samples_in_window: int | None = None
    itl_samples_in_window: int | None = None
    requests_in_window: int | None = None
    window_s: float | None = None

    def clean(self) -> Traffic:
        return Traffic(
            request_rate_per_s=_finite_or_none(self.request_rate_per_s, MAX_PLAUSIBLE_RATE_PER_S),
            isl_tokens=_finite_or_none(self.isl_tokens, MAX_PLAUSIBLE_TOKENS),
            osl_tokens=_finite_or_none(self.osl_tokens, MAX_PLAUSIBLE_TOKENS),
            isl_tokens_p50=_finite_or_none(self.isl_tokens_p50, MAX_PLAUSIBLE_TOKENS),
            isl_tokens_p90=_finite_or_none(self.isl_tokens_p90, MAX_PLAUSIBLE_TOKENS),
            isl_tokens_p99=_finite_or_none(self.isl_tokens_p99, MAX_PLAUSIBLE_TOKENS),
            osl_tokens_p50=_finite_or_none(self.osl_tokens_p50, MAX_PLAUSIBLE_TOKENS),
            osl_tokens_p90=_finite_or_none(self.osl_tokens_p90, MAX_PLAUSIBLE_TOKENS),
            osl_tokens_p99=_finite_or_none(self.osl_tokens_p99, MAX_PLAUSIBLE_TOKENS),
            ttft_ms_p50=_finite_or_none(self.ttft_ms_p50),
            ttft_ms_p90=_finite_or_none(self.ttft_ms_p90),
            ttft_ms_p99=_finite_or_none(self.ttft_ms_p99),
            itl_ms_p50=_finite_or_none(self.itl_ms_p50),
            itl_ms_p90=_finite_or_none(self.itl_ms_p90),
            itl_ms_p99=_finite_or_none(self.itl_ms_p99),
            ttft_attainment_frac=_fraction_or_none(self.ttft_attainment_frac),
            itl_attainment_frac=_fraction_or_none(self.itl_attainment_frac),
            ttft_samples_in_window=_count_or_none(self.ttft_samples_in_window),
            itl_samples_in_window=_count_or_none(self.itl_samples_in_window),
            requests_in_window=_count_or_none(self.requests_in_window),
            window_s=_finite_or_none(self.window_s),
        )


class RoleLoad(msgspec.Struct, frozen=True, kw_only=True):
    """A role's load summed over its engines. Reconcile measures it from FPM; ``/v1/what-if`` may give it
    instead (``Observation.load_override``)."""

    queued_prefill_tokens: float = 0.0
    scheduled_prefill_tokens: float = 0.0
    decode_requests: float = 0.0
    queued_decode_requests: float = 0.0
    decode_kv_tokens: float = 0.0

    def finite(self) -> RoleLoad:
        """This load with NaN / infinite / negative fields read as 0 (for records: a decision's JSON never carries
        NaN; the ``load_invalid`` detail names the values as given)."""
        if not any(_finite_or_none(getattr(self, name)) is None for name in self.__struct_fields__):
            return self
        return RoleLoad(**{name: _finite_or_none(getattr(self, name)) or 0.0 for name in self.__struct_fields__})

    def invalid_fields(self) -> tuple[str, ...]:
        """Fields that are not a number in ``[0, MAX_PLAUSIBLE_COUNT]`` (NaN, infinite, negative, or a broken
        counter's 2^64 - 1): the core holds rather than decide on them (reason ``load_invalid``)."""
        return tuple(
            f"{name}={getattr(self, name)!r}"
            for name in self.__struct_fields__
            if _finite_or_none(getattr(self, name), MAX_PLAUSIBLE_COUNT) is None
        )


class Observation(msgspec.Struct, frozen=True, kw_only=True):
    """Everything :func:`planner.core.step` reads at one tick.

    ``workers``: discovered workers by id (the set the FleetStore was given). ``fleet``: the store's snapshot.
    ``deployments``: status by service name (a service missing here: ``deployment_status_missing``, no
    scale-down). ``traffic``: optional, per role. ``load_override``: what-if only, replaces the measured load
    of a role.
    """

    workers: Mapping[str, WorkerRecord]
    fleet: FleetSnapshot
    deployments: Mapping[str, DeploymentStatus] = msgspec.field(default_factory=dict)
    traffic: Mapping[Role, Traffic] = msgspec.field(default_factory=dict)
    load_override: Mapping[Role, RoleLoad] = msgspec.field(default_factory=dict)

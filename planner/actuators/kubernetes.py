"""The Kubernetes actuator: scales a DynamoGraphDeployment service or an apps/v1 Deployment / StatefulSet
through the official client, and reads their replica status.

Targets (one per planner service, :class:`ScaleTarget`):

* ``dgd``: the scale subresource of the service's ``DynamoGraphDeploymentScalingAdapter``
  (``nvidia.com/v1alpha1``, named ``{dgd}-{service}`` in lower case unless ``adapter`` names it); when the
  adapter does not exist (404), a JSON merge patch of ``spec.services.<service>.replicas`` on the
  ``DynamoGraphDeployment`` itself, with ``metadata.resourceVersion`` as a precondition. A scale-up of a DGD
  that reports itself not Ready is deferred (``OutcomeKind.NOT_READY``, transient: the runner retries it);
  a scale-down is always applied, so a target pods never reach (Pending) can still be lowered.
* ``deployment`` / ``statefulset``: the apps/v1 scale subresource.

Each write is read-modify-write: read the current count and resourceVersion, write with that
resourceVersion, and on a 409 read again and retry at once. A 429 waits for Retry-After (up to
``max_retry_after_s``; beyond that the request ends ``THROTTLED`` with ``retry_after_s`` for the runner);
5xx and timeouts back off exponentially (``backoff_initial_s`` doubling up to ``backoff_max_s``); 403, 404
and 422 end the request at once. A request makes at most ``max_attempts`` failed calls. Every attempt is in
``ScaleOutcome.attempt_log``.

Requests outside a target's hard :class:`ReplicaBounds` are refused before any API call. A request with
``expected_replicas`` is compared with the count read in each attempt: a mismatch ends it
``CURRENT_MISMATCH`` with nothing written (the write carries that read's resourceVersion, so a change after the
read is a 409: read again, compare again).

The client's own urllib3 retries must be off (see :func:`planner.k8s.client.make_api_client`).

Layout: the targets, configuration and DGD status parsing are in :mod:`planner.actuators.kubernetes_targets`,
one DGD attempt in :mod:`planner.actuators.kubernetes_dgd`, one apps/v1 attempt in
:mod:`planner.actuators.kubernetes_apps`, the shared call plumbing in :mod:`planner.actuators.kubernetes_calls`;
this module holds the actuator (serialising, bounds, the retry loop, outcomes) and re-exports the public names.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client as k8s

from planner.actuators.base import (
    Actuator,
    AttemptRecord,
    ConflictError,
    OutcomeKind,
    ReplicaBounds,
    ScaleOutcome,
    ScaleRequest,
    ServiceStatus,
    ThrottledError,
    TransientActuatorError,
    UnknownServiceError,
    check_bounds,
)
from planner.actuators.kubernetes_apps import AppsScaler
from planner.actuators.kubernetes_calls import CallFailed, StopRequest
from planner.actuators.kubernetes_dgd import DgdScaler
from planner.actuators.kubernetes_targets import (
    ADAPTER_PLURAL,
    DGD_GROUP,
    DGD_PLURAL,
    DGD_VERSION,
    KubernetesActuatorConfig,
    ScaleTarget,
    TargetKind,
    dgd_readiness,
)
from planner.errors import ConfigError
from planner.k8s.errors import outcome_kind

__all__ = [
    "ADAPTER_PLURAL",
    "DGD_GROUP",
    "DGD_PLURAL",
    "DGD_VERSION",
    "KubernetesActuator",
    "KubernetesActuatorConfig",
    "ScaleTarget",
    "TargetKind",
    "dgd_readiness",
    "from_options",
]


class KubernetesActuator:
    """See the module docstring. Thread-safe: scale requests are serialised."""

    def __init__(
        self,
        api_client: k8s.ApiClient,
        config: KubernetesActuatorConfig,
        *,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not config.targets:
            raise ConfigError("kubernetes actuator: no scale targets configured")
        self.config = config
        self._targets = {t.service: t for t in config.targets}
        self._dgd = DgdScaler(api_client, config)
        self._apps = AppsScaler(api_client, config)
        self._sleep = sleep
        self._lock = threading.Lock()
        self.history: deque[ScaleOutcome] = deque(maxlen=config.history_size)

    @property
    def targets(self) -> Mapping[str, ScaleTarget]:
        return self._targets

    def replica_bounds(self) -> Mapping[str, ReplicaBounds]:
        """Each target's hard bound, by service."""
        return {service: t.bounds for service, t in self._targets.items()}

    # ------------------------------------------------------------------------------------------------ status
    def status(self) -> Mapping[str, ServiceStatus]:
        return {service: self._status_of(target) for service, target in self._targets.items()}

    def _status_of(self, t: ScaleTarget) -> ServiceStatus:
        return self._dgd.status(t) if t.kind is TargetKind.DGD else self._apps.status(t)

    # ------------------------------------------------------------------------------------------------ scale
    def scale(self, request: ScaleRequest) -> ScaleOutcome:
        target = self._targets.get(request.service)
        if target is None:
            raise UnknownServiceError(
                f"kubernetes actuator: no scale target for service {request.service!r} "
                f"(configured: {sorted(self._targets)})"
            )
        where = target.describe(self.config.namespace)
        if not isinstance(request.replicas, int) or isinstance(request.replicas, bool):
            outcome = ScaleOutcome(
                service=request.service,
                requested=-1,
                applied=False,
                kind=OutcomeKind.OUT_OF_BOUNDS,
                message=f"refused: replicas {request.replicas!r} is not an integer; nothing written",
                target=where,
            )
        else:
            refused = check_bounds(request, target.bounds, where)
            with self._lock:
                outcome = refused if refused is not None else self._scale_with_retries(target, request, where)
        self.history.append(outcome)
        return outcome

    def _scale_with_retries(self, t: ScaleTarget, request: ScaleRequest, where: str) -> ScaleOutcome:
        log: list[AttemptRecord] = []
        previous: int | None = None
        retry_after: float | None = None
        last_kind, last_message = OutcomeKind.SERVER_ERROR, "no attempt made"
        failures = 0
        while failures < self.config.max_attempts:
            try:
                previous, method = self._attempt(t, request)
            except StopRequest as stop:
                if stop.previous is not None:
                    previous = stop.previous
                return self._outcome(request, stop.kind, stop.message, log, previous, where, applied=stop.applied)
            except CallFailed as failed:
                err, method, status = failed.error, failed.method, failed.http_status
                failures += 1
                last_kind, last_message = outcome_kind(err), str(err)
                if not isinstance(err, TransientActuatorError):
                    log.append(AttemptRecord(method=method, outcome=last_kind, http_status=status, message=str(err)))
                    return self._outcome(request, last_kind, last_message, log, previous, where)
                wait = 0.0
                if isinstance(err, ThrottledError):
                    retry_after = err.retry_after_s
                    if retry_after is not None and retry_after > self.config.max_retry_after_s:
                        log.append(
                            AttemptRecord(method=method, outcome=last_kind, http_status=status, message=str(err))
                        )
                        return self._outcome(
                            request,
                            last_kind,
                            f"{err}; retry in {retry_after:g}s",
                            log,
                            previous,
                            where,
                            retry_after_s=retry_after,
                        )
                    wait = retry_after if retry_after is not None else self._backoff(failures)
                elif not isinstance(err, ConflictError):
                    wait = self._backoff(failures)
                if failures >= self.config.max_attempts:
                    wait = 0.0
                log.append(
                    AttemptRecord(
                        method=method, outcome=last_kind, http_status=status, message=str(err), backoff_s=wait
                    )
                )
                if wait > 0:
                    self._sleep(wait)
                continue
            log.append(AttemptRecord(method=method, outcome=OutcomeKind.APPLIED, http_status=200))
            return self._outcome(
                request,
                OutcomeKind.APPLIED,
                f"{where}: {previous} -> {request.replicas} replicas",
                log,
                previous,
                where,
                applied=True,
            )
        return self._outcome(
            request,
            last_kind,
            f"gave up after {failures} failed attempts: {last_message}",
            log,
            previous,
            where,
            retry_after_s=retry_after,
        )

    def _backoff(self, failures: int) -> float:
        return float(min(self.config.backoff_max_s, self.config.backoff_initial_s * 2 ** (failures - 1)))

    def _outcome(
        self,
        request: ScaleRequest,
        kind: OutcomeKind,
        message: str,
        log: list[AttemptRecord],
        previous: int | None,
        where: str,
        *,
        applied: bool = False,
        retry_after_s: float | None = None,
    ) -> ScaleOutcome:
        return ScaleOutcome(
            service=request.service,
            requested=request.replicas,
            applied=applied,
            kind=kind,
            message=message,
            attempts=len(log),
            attempt_log=tuple(log),
            previous=previous,
            target=where,
            retry_after_s=retry_after_s,
        )

    def _attempt(self, t: ScaleTarget, request: ScaleRequest) -> tuple[int, str]:
        """One read-modify-write by the target's scaler. Returns (previous count, method) after a successful
        write; raises StopRequest for an outcome without a write, or CallFailed."""
        return self._dgd.attempt(t, request) if t.kind is TargetKind.DGD else self._apps.attempt(t, request)


def from_options(options: Mapping[str, Any]) -> Actuator:
    """Build the actuator from the service configuration's ``actuator.options`` (see
    :class:`planner.actuators.kubernetes_options.KubernetesOptions` and docs/kubernetes.md). With
    ``advisory: true`` it is an AdvisoryActuator reading this cluster's status. Raises :class:`ConfigError` naming
    the offending field."""
    from planner.actuators.advisory import AdvisoryActuator
    from planner.actuators.kubernetes_options import parse_options
    from planner.k8s.client import make_api_client

    parsed = parse_options(options)
    opts = parsed.options
    config = KubernetesActuatorConfig(
        namespace=opts.namespace,
        targets=parsed.targets,
        use_adapter=opts.use_adapter,
        defer_scale_up_when_not_ready=opts.defer_scale_up_when_not_ready,
        max_attempts=opts.max_attempts,
        backoff_initial_s=opts.backoff_initial_s,
        backoff_max_s=opts.backoff_max_s,
        max_retry_after_s=opts.max_retry_after_s,
        request_timeout_s=opts.request_timeout_s,
    )
    actuator = KubernetesActuator(make_api_client(parsed.client), config)
    if opts.advisory:
        return AdvisoryActuator({t.service: t.bounds for t in parsed.targets}, reader=actuator)
    return actuator

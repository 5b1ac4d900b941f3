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
"""

from __future__ import annotations

import enum
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
from kubernetes import client as k8s

from planner.actuators.base import (
    Actuator,
    ActuatorError,
    AttemptRecord,
    ConflictError,
    NotFoundError,
    OutcomeKind,
    ReplicaBounds,
    ScaleOutcome,
    ScaleRequest,
    ServiceStatus,
    ThrottledError,
    TransientActuatorError,
    UnknownServiceError,
    check_bounds,
    check_expected,
)
from planner.errors import ConfigError
from planner.k8s.errors import CLIENT_ERRORS, http_status, map_api_error, outcome_kind

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

DGD_GROUP = "nvidia.com"
DGD_VERSION = "v1alpha1"
DGD_PLURAL = "dynamographdeployments"
ADAPTER_PLURAL = "dynamographdeploymentscalingadapters"
MERGE_PATCH = "application/merge-patch+json"


class TargetKind(enum.StrEnum):
    DGD = "dgd"
    DEPLOYMENT = "deployment"
    STATEFULSET = "statefulset"


class ScaleTarget(msgspec.Struct, frozen=True, kw_only=True):
    """What to scale for one planner service. ``name`` is the DGD (kind ``dgd``) or the Deployment /
    StatefulSet. ``dgd_service`` is the key in the DGD's ``spec.services`` (default: ``service``);
    ``adapter`` the scaling adapter's name (default ``{name}-{dgd_service}`` in lower case)."""

    service: str
    kind: TargetKind
    name: str
    dgd_service: str = ""
    adapter: str = ""
    bounds: ReplicaBounds = ReplicaBounds()

    def __post_init__(self) -> None:
        if not self.service or not self.name:
            raise ValueError("scale target needs a service and a name")

    @property
    def service_key(self) -> str:
        return self.dgd_service or self.service

    @property
    def adapter_name(self) -> str:
        return self.adapter or f"{self.name}-{self.service_key}".lower()

    def describe(self, namespace: str) -> str:
        if self.kind is TargetKind.DGD:
            return f"dgd/{namespace}/{self.name}/{self.service_key}"
        return f"{self.kind.value}/{namespace}/{self.name}"


class KubernetesActuatorConfig(msgspec.Struct, frozen=True, kw_only=True):
    namespace: str
    targets: tuple[ScaleTarget, ...]
    use_adapter: bool = True
    defer_scale_up_when_not_ready: bool = True
    max_attempts: int = 4
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 8.0
    max_retry_after_s: float = 30.0
    request_timeout_s: float = 10.0
    history_size: int = 1000

    def __post_init__(self) -> None:
        if not self.namespace:
            raise ValueError("namespace must not be empty")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if min(self.backoff_initial_s, self.backoff_max_s, self.max_retry_after_s) < 0:
            raise ValueError("backoff and Retry-After limits must be >= 0")
        if self.request_timeout_s <= 0:
            raise ValueError(f"request_timeout_s must be > 0, got {self.request_timeout_s}")
        services = [t.service for t in self.targets]
        if len(set(services)) != len(services):
            raise ValueError(f"a service is listed twice in targets: {services}")


def dgd_readiness(dgd: Mapping[str, Any]) -> tuple[bool | None, str]:
    """Whether a DGD reports itself Ready (its ``Ready`` condition, else ``status.state == "successful"``),
    None when its status says neither; and its state for messages."""
    status = dgd.get("status") or {}
    state = str(status.get("state") or "")
    for cond in status.get("conditions") or []:
        if isinstance(cond, Mapping) and cond.get("type") == "Ready":
            ok = cond.get("status") == "True"
            why = cond.get("reason") or cond.get("message") or ""
            return ok, state or ("Ready" if ok else f"not Ready{': ' + str(why) if why else ''}")
    if state:
        return state == "successful", state
    return None, ""


def _int(value: Any) -> int:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else 0


class _CallFailed(Exception):
    """Internal: one client call failed; ``error`` is the mapped planner error."""

    def __init__(self, error: ActuatorError, method: str, http_status: int | None) -> None:
        super().__init__(str(error))
        self.error = error
        self.method = method
        self.http_status = http_status


class _Stop(Exception):
    """Internal: end the request with this outcome."""

    def __init__(self, kind: OutcomeKind, message: str, *, applied: bool = False, previous: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.applied = applied
        self.previous = previous


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
        self._custom = k8s.CustomObjectsApi(api_client)
        self._apps = k8s.AppsV1Api(api_client)
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
        ns, timeout = self.config.namespace, self.config.request_timeout_s
        if t.kind is TargetKind.DGD:
            dgd = self._get_dgd(t)
            spec_services = (dgd.get("spec") or {}).get("services") or {}
            if t.service_key not in spec_services:
                raise NotFoundError(f"DynamoGraphDeployment {ns}/{t.name} has no service {t.service_key!r}")
            desired = _int(spec_services[t.service_key].get("replicas"))
            if self.config.use_adapter:
                scale = self._get_adapter_scale(t)
                if scale is not None:
                    desired = _int((scale.get("spec") or {}).get("replicas"))
            ready_state, state = dgd_readiness(dgd)
            svc = ((dgd.get("status") or {}).get("services") or {}).get(t.service_key)
            if not isinstance(svc, Mapping):
                return ServiceStatus(
                    service=t.service,
                    desired=desired,
                    ready=0,
                    available=0,
                    updated=0,
                    state=state,
                    ready_state=ready_state,
                    message=f"DGD reports no status for service {t.service_key!r} yet",
                )
            ready = _int(svc.get("readyReplicas"))
            available = _int(svc.get("availableReplicas")) if "availableReplicas" in svc else ready
            return ServiceStatus(
                service=t.service,
                desired=desired,
                ready=ready,
                available=available,
                updated=_int(svc.get("updatedReplicas")),
                state=state,
                ready_state=ready_state,
            )
        resource = "deployments" if t.kind is TargetKind.DEPLOYMENT else "statefulsets"
        try:
            if t.kind is TargetKind.DEPLOYMENT:
                obj: k8s.V1Deployment | k8s.V1StatefulSet = self._apps.read_namespaced_deployment(
                    t.name, ns, _request_timeout=timeout
                )
            else:
                obj = self._apps.read_namespaced_stateful_set(t.name, ns, _request_timeout=timeout)
        except CLIENT_ERRORS as exc:
            raise map_api_error(exc, verb="get", resource=resource, name=t.name) from exc
        spec_replicas = obj.spec.replicas if obj.spec is not None and obj.spec.replicas is not None else 1
        st = obj.status
        ready = (st.ready_replicas or 0) if st is not None else 0
        available = st.available_replicas if st is not None and st.available_replicas is not None else ready
        updated = (st.updated_replicas or 0) if st is not None else 0
        return ServiceStatus(
            service=t.service, desired=spec_replicas, ready=ready, available=available, updated=updated
        )

    def _get_dgd(self, t: ScaleTarget) -> dict[str, Any]:
        try:
            obj = self._custom.get_namespaced_custom_object(
                DGD_GROUP,
                DGD_VERSION,
                self.config.namespace,
                DGD_PLURAL,
                t.name,
                _request_timeout=self.config.request_timeout_s,
            )
        except CLIENT_ERRORS as exc:
            raise map_api_error(exc, verb="get", resource=DGD_PLURAL, name=t.name) from exc
        return dict(obj) if isinstance(obj, Mapping) else {}

    def _get_adapter_scale(self, t: ScaleTarget) -> dict[str, Any] | None:
        """The adapter's Scale, or None when it does not exist."""
        try:
            obj = self._custom.get_namespaced_custom_object_scale(
                DGD_GROUP,
                DGD_VERSION,
                self.config.namespace,
                ADAPTER_PLURAL,
                t.adapter_name,
                _request_timeout=self.config.request_timeout_s,
            )
        except CLIENT_ERRORS as exc:
            if http_status(exc) == 404:
                return None
            raise map_api_error(exc, verb="get", resource=f"{ADAPTER_PLURAL}/scale", name=t.adapter_name) from exc
        return dict(obj) if isinstance(obj, Mapping) else {}

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
            except _Stop as stop:
                if stop.previous is not None:
                    previous = stop.previous
                return self._outcome(request, stop.kind, stop.message, log, previous, where, applied=stop.applied)
            except _CallFailed as failed:
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

    def _call(self, method: str, verb: str, resource: str, name: str, fn: Callable[[], Any]) -> Any:
        """Run one client call; a failure comes out as :class:`_CallFailed` carrying the mapped error."""
        try:
            return fn()
        except CLIENT_ERRORS as exc:
            err = map_api_error(exc, verb=verb, resource=resource, name=name)
            raise _CallFailed(err, method, http_status(exc)) from exc

    def _attempt(self, t: ScaleTarget, request: ScaleRequest) -> tuple[int, str]:
        """One read-modify-write. Returns (previous count, method) after a successful write; raises _Stop for
        an outcome without a write, or a mapped ActuatorError."""
        ns, timeout = self.config.namespace, self.config.request_timeout_s
        if t.kind is TargetKind.DGD:
            return self._attempt_dgd(t, request)
        if t.kind is TargetKind.DEPLOYMENT:
            read, replace, resource = (
                self._apps.read_namespaced_deployment_scale,
                self._apps.replace_namespaced_deployment_scale,
                "deployments/scale",
            )
        else:
            read, replace, resource = (
                self._apps.read_namespaced_stateful_set_scale,
                self._apps.replace_namespaced_stateful_set_scale,
                "statefulsets/scale",
            )
        method = f"{t.kind.value}.scale"
        scale: k8s.V1Scale = self._call(
            method, "get", resource, t.name, lambda: read(t.name, ns, _request_timeout=timeout)
        )
        current = scale.spec.replicas if scale.spec is not None and scale.spec.replicas is not None else 0
        _compare(request, current, t.describe(ns))
        if current == request.replicas:
            raise _Stop(OutcomeKind.UNCHANGED, f"{t.describe(ns)} already at {current} replicas")
        rv = scale.metadata.resource_version if scale.metadata is not None else None
        body = k8s.V1Scale(
            api_version="autoscaling/v1",
            kind="Scale",
            metadata=k8s.V1ObjectMeta(name=t.name, namespace=ns, resource_version=rv),
            spec=k8s.V1ScaleSpec(replicas=request.replicas),
        )
        self._call(method, "update", resource, t.name, lambda: replace(t.name, ns, body, _request_timeout=timeout))
        return current, method

    def _attempt_dgd(self, t: ScaleTarget, request: ScaleRequest) -> tuple[int, str]:
        ns, timeout = self.config.namespace, self.config.request_timeout_s
        dgd: Any = self._call(
            "dgd.read",
            "get",
            DGD_PLURAL,
            t.name,
            lambda: self._custom.get_namespaced_custom_object(
                DGD_GROUP, DGD_VERSION, ns, DGD_PLURAL, t.name, _request_timeout=timeout
            ),
        )
        services = ((dgd.get("spec") or {}).get("services") or {}) if isinstance(dgd, Mapping) else {}
        if t.service_key not in services:
            raise _Stop(
                OutcomeKind.NOT_FOUND,
                f"DynamoGraphDeployment {ns}/{t.name} has no service {t.service_key!r} (services: {sorted(services)})",
            )
        scale: Any = None
        if self.config.use_adapter:
            try:
                scale = self._call(
                    "dgdsa.read",
                    "get",
                    f"{ADAPTER_PLURAL}/scale",
                    t.adapter_name,
                    lambda: self._custom.get_namespaced_custom_object_scale(
                        DGD_GROUP, DGD_VERSION, ns, ADAPTER_PLURAL, t.adapter_name, _request_timeout=timeout
                    ),
                )
            except _CallFailed as failed:
                if not isinstance(failed.error, NotFoundError):
                    raise
                scale = None  # no adapter: patch the DGD
        if scale is not None:
            current = _int((scale.get("spec") or {}).get("replicas"))
        else:
            current = _int(services[t.service_key].get("replicas"))
        _compare(request, current, t.describe(ns))
        if current == request.replicas:
            raise _Stop(OutcomeKind.UNCHANGED, f"{t.describe(ns)} already at {current} replicas")
        ready, state = dgd_readiness(dgd)
        if request.replicas > current and ready is False and self.config.defer_scale_up_when_not_ready:
            raise _Stop(
                OutcomeKind.NOT_READY,
                f"scale-up {current} -> {request.replicas} deferred: DynamoGraphDeployment {ns}/{t.name} "
                f"is not Ready (state {state or 'unknown'}); retried on a later tick",
            )
        if scale is not None:
            body = {
                "apiVersion": "autoscaling/v1",
                "kind": "Scale",
                "metadata": {
                    "name": t.adapter_name,
                    "namespace": ns,
                    "resourceVersion": (scale.get("metadata") or {}).get("resourceVersion"),
                },
                "spec": {"replicas": request.replicas},
            }
            self._call(
                "dgdsa.scale",
                "update",
                f"{ADAPTER_PLURAL}/scale",
                t.adapter_name,
                lambda: self._custom.replace_namespaced_custom_object_scale(
                    DGD_GROUP, DGD_VERSION, ns, ADAPTER_PLURAL, t.adapter_name, body, _request_timeout=timeout
                ),
            )
            return current, "dgdsa.scale"
        patch = {
            "metadata": {"resourceVersion": (dgd.get("metadata") or {}).get("resourceVersion")},
            "spec": {"services": {t.service_key: {"replicas": request.replicas}}},
        }
        self._call(
            "dgd.patch",
            "patch",
            DGD_PLURAL,
            t.name,
            lambda: self._custom.patch_namespaced_custom_object(
                DGD_GROUP,
                DGD_VERSION,
                ns,
                DGD_PLURAL,
                t.name,
                patch,
                _content_type=MERGE_PATCH,
                _request_timeout=timeout,
            ),
        )
        return current, "dgd.patch"


def _compare(request: ScaleRequest, current: int, where: str) -> None:
    mismatch = check_expected(request, current, where)
    if mismatch is not None:
        raise _Stop(mismatch.kind, mismatch.message, previous=current)


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

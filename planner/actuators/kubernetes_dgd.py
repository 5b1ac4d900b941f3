"""The DynamoGraphDeployment side of the Kubernetes actuator: read a DGD service's status, and make one
read-modify-write attempt at its replica count, through the ``DynamoGraphDeploymentScalingAdapter``'s scale
subresource or, when that adapter does not exist (404), a JSON merge patch of ``spec.services.<service>.replicas``
on the DGD with ``metadata.resourceVersion`` as the precondition. A scale-up of a DGD that reports itself not
Ready is deferred (``OutcomeKind.NOT_READY``). Retries are the caller's
(:class:`~planner.actuators.kubernetes.KubernetesActuator`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes import client as k8s

from planner.actuators.base import NotFoundError, OutcomeKind, ScaleRequest, ServiceStatus
from planner.actuators.kubernetes_calls import CallFailed, StopRequest, call, compare
from planner.actuators.kubernetes_targets import (
    ADAPTER_PLURAL,
    DGD_GROUP,
    DGD_PLURAL,
    DGD_VERSION,
    MERGE_PATCH,
    KubernetesActuatorConfig,
    ScaleTarget,
    dgd_readiness,
    replica_count,
)
from planner.k8s.errors import CLIENT_ERRORS, http_status, map_api_error

__all__ = ["DgdScaler"]


class DgdScaler:
    """Status and one scale attempt for ``dgd`` targets, through the custom-objects API."""

    def __init__(self, api_client: k8s.ApiClient, config: KubernetesActuatorConfig) -> None:
        self.config = config
        self._custom = k8s.CustomObjectsApi(api_client)

    # ------------------------------------------------------------------------------------------------ status
    def status(self, t: ScaleTarget) -> ServiceStatus:
        ns = self.config.namespace
        dgd = self._get_dgd(t)
        spec_services = (dgd.get("spec") or {}).get("services") or {}
        if t.service_key not in spec_services:
            raise NotFoundError(f"DynamoGraphDeployment {ns}/{t.name} has no service {t.service_key!r}")
        desired = replica_count(spec_services[t.service_key].get("replicas"))
        if self.config.use_adapter:
            scale = self._get_adapter_scale(t)
            if scale is not None:
                desired = replica_count((scale.get("spec") or {}).get("replicas"))
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
        ready = replica_count(svc.get("readyReplicas"))
        available = replica_count(svc.get("availableReplicas")) if "availableReplicas" in svc else ready
        return ServiceStatus(
            service=t.service,
            desired=desired,
            ready=ready,
            available=available,
            updated=replica_count(svc.get("updatedReplicas")),
            state=state,
            ready_state=ready_state,
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
    def attempt(self, t: ScaleTarget, request: ScaleRequest) -> tuple[int, str]:
        """One read-modify-write. Returns (previous count, method) after a successful write; raises
        :class:`StopRequest` for an outcome without a write, or :class:`CallFailed`."""
        ns, timeout = self.config.namespace, self.config.request_timeout_s
        dgd: Any = call(
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
            raise StopRequest(
                OutcomeKind.NOT_FOUND,
                f"DynamoGraphDeployment {ns}/{t.name} has no service {t.service_key!r} (services: {sorted(services)})",
            )
        scale: Any = None
        if self.config.use_adapter:
            try:
                scale = call(
                    "dgdsa.read",
                    "get",
                    f"{ADAPTER_PLURAL}/scale",
                    t.adapter_name,
                    lambda: self._custom.get_namespaced_custom_object_scale(
                        DGD_GROUP, DGD_VERSION, ns, ADAPTER_PLURAL, t.adapter_name, _request_timeout=timeout
                    ),
                )
            except CallFailed as failed:
                if not isinstance(failed.error, NotFoundError):
                    raise
                scale = None  # no adapter: patch the DGD
        if scale is not None:
            current = replica_count((scale.get("spec") or {}).get("replicas"))
        else:
            current = replica_count(services[t.service_key].get("replicas"))
        compare(request, current, t.describe(ns))
        if current == request.replicas:
            raise StopRequest(OutcomeKind.UNCHANGED, f"{t.describe(ns)} already at {current} replicas")
        ready, state = dgd_readiness(dgd)
        if request.replicas > current and ready is False and self.config.defer_scale_up_when_not_ready:
            raise StopRequest(
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
            call(
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
        call(
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

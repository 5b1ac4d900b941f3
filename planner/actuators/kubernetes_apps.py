"""The apps/v1 side of the Kubernetes actuator: read a Deployment's or StatefulSet's replica status, and make
one read-modify-write attempt at its count through the scale subresource (the write carries the read's
resourceVersion, so a change in between is a 409). Retries are the caller's
(:class:`~planner.actuators.kubernetes.KubernetesActuator`)."""

from __future__ import annotations

from kubernetes import client as k8s

from planner.actuators.base import OutcomeKind, ScaleRequest, ServiceStatus
from planner.actuators.kubernetes_calls import StopRequest, call, compare
from planner.actuators.kubernetes_targets import KubernetesActuatorConfig, ScaleTarget, TargetKind
from planner.k8s.errors import CLIENT_ERRORS, map_api_error

__all__ = ["AppsScaler"]


class AppsScaler:
    """Status and one scale attempt for ``deployment`` / ``statefulset`` targets, through the apps/v1 API."""

    def __init__(self, api_client: k8s.ApiClient, config: KubernetesActuatorConfig) -> None:
        self.config = config
        self._apps = k8s.AppsV1Api(api_client)

    def status(self, t: ScaleTarget) -> ServiceStatus:
        ns, timeout = self.config.namespace, self.config.request_timeout_s
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

    def attempt(self, t: ScaleTarget, request: ScaleRequest) -> tuple[int, str]:
        """One read-modify-write. Returns (previous count, method) after a successful write; raises
        :class:`StopRequest` for an outcome without a write, or
        :class:`~planner.actuators.kubernetes_calls.CallFailed`."""
        ns, timeout = self.config.namespace, self.config.request_timeout_s
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
        scale: k8s.V1Scale = call(method, "get", resource, t.name, lambda: read(t.name, ns, _request_timeout=timeout))
        current = scale.spec.replicas if scale.spec is not None and scale.spec.replicas is not None else 0
        compare(request, current, t.describe(ns))
        if current == request.replicas:
            raise StopRequest(OutcomeKind.UNCHANGED, f"{t.describe(ns)} already at {current} replicas")
        rv = scale.metadata.resource_version if scale.metadata is not None else None
        body = k8s.V1Scale(
            api_version="autoscaling/v1",
            kind="Scale",
            metadata=k8s.V1ObjectMeta(name=t.name, namespace=ns, resource_version=rv),
            spec=k8s.V1ScaleSpec(replicas=request.replicas),
        )
        call(method, "update", resource, t.name, lambda: replace(t.name, ns, body, _request_timeout=timeout))
        return current, method

"""Where a planner service's Events and conditions go in Kubernetes: the object it scales.

:class:`KubeStatusSink` maps a planner service to its scale target (the DynamoGraphDeployment for ``dgd``
targets — what ``kubectl describe dgd`` shows —, else the Deployment / StatefulSet), resolves the object's uid
once (``kubectl describe`` selects Events by uid), and hands Events to an :class:`EventRecorder` and conditions
to a :class:`ConditionWriter`. It never raises: a failure is counted and logged by those two.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from kubernetes import client as k8s

from planner.actuators.kubernetes import DGD_GROUP, DGD_PLURAL, DGD_VERSION, ScaleTarget, TargetKind
from planner.actuators.kubernetes_options import parse_options
from planner.k8s.errors import CLIENT_ERRORS
from planner.k8s.events import (
    ConditionWriter,
    EventCorrelator,
    EventCorrelatorConfig,
    EventReason,
    EventRecorder,
    EventType,
    ObjectRef,
    PlannedEvent,
    ScaleStatus,
)

__all__ = ["KubeStatusSink", "from_options"]

log = logging.getLogger(__name__)

_KINDS = {
    TargetKind.DGD: ("nvidia.com/v1alpha1", "DynamoGraphDeployment"),
    TargetKind.DEPLOYMENT: ("apps/v1", "Deployment"),
    TargetKind.STATEFULSET: ("apps/v1", "StatefulSet"),
}


class KubeStatusSink:
    """Events and conditions of each planner service on its scaled object."""

    def __init__(
        self,
        api: k8s.ApiClient,
        namespace: str,
        targets: Mapping[str, ScaleTarget],
        *,
        reporting_instance: str = "fpm-planner",
    ) -> None:
        self.namespace = namespace
        self.targets = dict(targets)
        self._custom = k8s.CustomObjectsApi(api)
        self._apps = k8s.AppsV1Api(api)
        self.recorder = EventRecorder(
            api, EventCorrelator(EventCorrelatorConfig(reporting_instance=reporting_instance))
        )
        self._writers = {
            kind: ConditionWriter.for_object(api, namespace, _KINDS[kind][1])
            for kind in {t.kind for t in targets.values()}
        }
        self._uids: dict[str, str] = {}

    def _uid(self, t: ScaleTarget) -> str:
        if t.name in self._uids:
            return self._uids[t.name]
        try:
            obj: Any
            if t.kind is TargetKind.DGD:
                obj = self._custom.get_namespaced_custom_object(
                    DGD_GROUP, DGD_VERSION, self.namespace, DGD_PLURAL, t.name
                )
                uid = str(obj["metadata"]["uid"])
            elif t.kind is TargetKind.DEPLOYMENT:
                obj = self._apps.read_namespaced_deployment(t.name, self.namespace)
                uid = str(obj.metadata.uid)
            else:
                obj = self._apps.read_namespaced_stateful_set(t.name, self.namespace)
                uid = str(obj.metadata.uid)
        except CLIENT_ERRORS as exc:
            log.warning("cannot read %s %s/%s for its uid: %s", t.kind.value, self.namespace, t.name, exc)
            return ""
        self._uids[t.name] = uid
        return uid

    def ref(self, service: str) -> ObjectRef | None:
        t = self.targets.get(service)
        if t is None:
            return None
        api_version, kind = _KINDS[t.kind]
        return ObjectRef(api_version=api_version, kind=kind, name=t.name, namespace=self.namespace, uid=self._uid(t))

    def event(self, service: str, type_: EventType, reason: EventReason, note: str, now_s: float) -> bool:
        """Record an Event about ``service`` on its object (False: no such service here)."""
        ref = self.ref(service)
        if ref is None:
            return False
        t = self.targets[service]
        prefix = f"{t.service_key}: " if t.kind is TargetKind.DGD else ""
        self.recorder.record(PlannedEvent(regarding=ref, type=type_, reason=reason, note=prefix + note), now_s)
        return True

    def conditions(self, service: str, status: ScaleStatus, now_s: float) -> None:
        t = self.targets.get(service)
        if t is None:
            return
        self._writers[t.kind].update(t.name, t.service_key, status, now_s)


def from_options(options: Mapping[str, Any], *, reporting_instance: str = "fpm-planner") -> KubeStatusSink:
    """A sink for the targets of the Kubernetes actuator's ``actuator.options`` (same client settings)."""
    from planner.k8s.client import make_api_client

    parsed = parse_options(options)
    targets = {t.service: t for t in parsed.targets}
    return KubeStatusSink(
        make_api_client(parsed.client), parsed.options.namespace, targets, reporting_instance=reporting_instance
    )

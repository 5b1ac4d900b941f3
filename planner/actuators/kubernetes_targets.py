"""What the Kubernetes actuator scales: the DynamoGraphDeployment API coordinates, the per-service
:class:`ScaleTarget`, the actuator's :class:`KubernetesActuatorConfig` (validated when built), and the parsing of a
DGD's readiness and replica counts out of the objects the API returns. No I/O here."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

import msgspec

from planner.actuators.base import ReplicaBounds

__all__ = [
    "ADAPTER_PLURAL",
    "DGD_GROUP",
    "DGD_PLURAL",
    "DGD_VERSION",
    "MERGE_PATCH",
    "KubernetesActuatorConfig",
    "ScaleTarget",
    "TargetKind",
    "dgd_readiness",
    "replica_count",
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


def replica_count(value: Any) -> int:
    """A replica count read from an API object; anything but an int (bools included) reads as 0."""
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else 0

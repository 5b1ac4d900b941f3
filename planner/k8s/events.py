"""Kubernetes Events (``events.k8s.io/v1``) and HPA-like status conditions on the object the planner scales.

Events
    :class:`EventCorrelator` is pure (``now`` is an argument, no I/O) and decides, for each event the planner
    wants to emit, what to send, the way client-go's ``EventCorrelator`` does for the kubelet and the HPA:

    * an event identical to one sent less than ``series_window_s`` ago (same object, type, reason, action and
      note) is not a new object: its ``series.count`` grows and the existing Event is patched;
    * every write (create or patch) for one object takes a token from that object's bucket (``burst`` tokens,
      one back every ``refill_interval_s``; client-go: 25 and 300 s). Without a token the write is dropped,
      and a series keeps counting so that its next write carries the full count.

    :class:`EventRecorder` performs the correlator's writes through the official client and never raises:
    a failed write is counted in :attr:`EventRecorder.failures` and logged (an Event must never stop a tick).

Conditions
    :func:`compute_conditions` turns a :class:`ScaleStatus` into conditions named like the HPA's
    (``AbleToScale``, ``ScalingActive``, ``ScalingLimited``) and KEDA's (``Paused``, ``Fallback``), keeping
    ``lastTransitionTime`` while a condition's status does not change. :class:`ConditionWriter` writes them as
    ``conditions.fpm-planner.io/<service>`` (JSON) and a one-line summary ``status.fpm-planner.io/<service>``
    (``kubectl describe`` cuts annotations past 140 characters; the summary fits) on the scaled object with a
    JSON merge patch, only when they change. Why annotations and not ``status.conditions``: the scaling
    adapter's CRD declares a closed ``status`` schema (``replicas``, ``selector``, ``lastScaleTime``: a real
    API server prunes anything else) that Dynamo's controller owns, and a Deployment's status belongs to its
    controller. See docs/kubernetes.md.
"""

from __future__ import annotations

import enum
import json
import logging
import re
import threading
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import msgspec
from kubernetes import client as k8s

from planner.k8s.errors import CLIENT_ERRORS, map_api_error

__all__ = [
    "CONDITIONS_ANNOTATION_PREFIX",
    "SUMMARY_ANNOTATION_PREFIX",
    "Condition",
    "ConditionType",
    "ConditionWriter",
    "CreateEvent",
    "DropEvent",
    "EventCorrelator",
    "EventCorrelatorConfig",
    "EventReason",
    "EventRecorder",
    "EventType",
    "ObjectRef",
    "PatchEvent",
    "PlannedEvent",
    "ScaleStatus",
    "compute_conditions",
    "conditions_annotation",
    "parse_conditions",
    "summarize",
]

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
CONDITIONS_ANNOTATION_PREFIX = "conditions.fpm-planner.io/"  # the conditions, JSON
SUMMARY_ANNOTATION_PREFIX = "status.fpm-planner.io/"  # one short line, readable in `kubectl describe`
_HEALTHY = {
    "AbleToScale": "True",
    "ScalingActive": "True",
    "ScalingLimited": "False",
    "Paused": "False",
    "Fallback": "False",
}
_SERVICE_KEY = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


class EventType(enum.StrEnum):
    NORMAL = "Normal"
    WARNING = "Warning"


class EventReason(enum.StrEnum):
    """The ``reason`` of the planner's Events (documented in docs/kubernetes.md)."""

    SUCCESSFUL_RESCALE = "SuccessfulRescale"  # a scale was applied
    FAILED_RESCALE = "FailedRescale"  # the actuator could not apply a scale
    BLIND_HOLD = "BlindHold"  # held: no attributable FPM for the service
    IDENTITY_NOT_SYNCED = "IdentityNotSynced"  # held: a worker publishes under another identity
    CAPPED_AT_MAX = "CappedAtMaxWithPredictedMiss"  # at max_replicas while the SLA is predicted to be missed
    PAUSED = "Paused"
    RESUMED = "Resumed"
    FALLBACK = "FallbackApplied"  # blind too long: fallback_replicas applied


class ObjectRef(msgspec.Struct, frozen=True, kw_only=True):
    """The object an Event is about (``regarding``)."""

    api_version: str
    kind: str
    name: str
    namespace: str
    uid: str = ""

    def as_dict(self) -> dict[str, str]:
        out = {"apiVersion": self.api_version, "kind": self.kind, "name": self.name, "namespace": self.namespace}
        if self.uid:
            out["uid"] = self.uid
        return out


class PlannedEvent(msgspec.Struct, frozen=True, kw_only=True):
    """An event the planner wants to emit."""

    regarding: ObjectRef
    type: EventType
    reason: EventReason
    note: str
    action: str = "Scale"


class EventCorrelatorConfig(msgspec.Struct, frozen=True, kw_only=True):
    reporting_controller: str = "fpm-planner"
    reporting_instance: str = "fpm-planner"
    burst: int = 25
    refill_interval_s: float = 300.0
    series_window_s: float = 600.0
    max_tracked: int = 4096

    def __post_init__(self) -> None:
        if self.burst < 1:
            raise ValueError(f"burst must be >= 1, got {self.burst}")
        if self.refill_interval_s <= 0 or self.series_window_s <= 0:
            raise ValueError("refill_interval_s and series_window_s must be > 0")
        if self.max_tracked < 1:
            raise ValueError(f"max_tracked must be >= 1, got {self.max_tracked}")


class CreateEvent(msgspec.Struct, frozen=True):
    body: dict[str, Any]


class PatchEvent(msgspec.Struct, frozen=True):
    name: str
    patch: dict[str, Any]


class DropEvent(msgspec.Struct, frozen=True):
    reason: str  # "rate_limited"


def _micro(now: float) -> str:
    return datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _seconds(now: float) -> str:
    return datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class _Bucket:
    __slots__ = ("tokens", "updated")

    def __init__(self, tokens: float, updated: float) -> None:
        self.tokens = tokens
        self.updated = updated


class _Series:
    __slots__ = ("count", "first", "last", "name", "sent")

    def __init__(self, name: str, now: float) -> None:
        self.name = name
        self.count = 1
        self.first = now
        self.last = now
        self.sent = False  # whether the Event object exists on the server


_Key = tuple[str, str, str, str, str, str, str]


class EventCorrelator:
    """Decides what to write for each planned event; pure (see the module docstring)."""

    def __init__(self, config: EventCorrelatorConfig | None = None, *, name_suffix: Callable[[], str] | None = None):
        self.config = config or EventCorrelatorConfig()
        self._buckets: dict[tuple[str, str, str], _Bucket] = {}
        self._series: dict[_Key, _Series] = {}
        self._suffix = name_suffix or (lambda: uuid.uuid4().hex[:10])

    @staticmethod
    def _key(ev: PlannedEvent) -> _Key:
        r = ev.regarding
        return (r.namespace, r.kind, r.name, ev.type.value, ev.reason.value, ev.action, ev.note)

    def _take_token(self, ref: ObjectRef, now: float) -> bool:
        cfg = self.config
        key = (ref.namespace, ref.kind, ref.name)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(float(cfg.burst), now)
        elapsed = max(0.0, now - bucket.updated)
        bucket.tokens = min(float(cfg.burst), bucket.tokens + elapsed / cfg.refill_interval_s)
        bucket.updated = now
        if bucket.tokens < 1.0:
            return False
        bucket.tokens -= 1.0
        return True

    def _forget_old(self, now: float) -> None:
        window = self.config.series_window_s
        for key in [k for k, s in self._series.items() if now - s.last > window]:
            del self._series[key]
        while len(self._series) > self.config.max_tracked:
            oldest = min(self._series, key=lambda k: self._series[k].last)
            del self._series[oldest]

    def observe(self, ev: PlannedEvent, now: float) -> CreateEvent | PatchEvent | DropEvent:
        self._forget_old(now)
        key = self._key(ev)
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = _Series(f"{ev.regarding.name}.{self._suffix()}", now)
        else:
            series.count += 1
            series.last = now
        if not self._take_token(ev.regarding, now):
            return DropEvent("rate_limited")
        if series.sent:
            return PatchEvent(
                series.name,
                {
                    "series": {"count": series.count, "lastObservedTime": _micro(now)},
                    "deprecatedLastTimestamp": _seconds(now),
                    "deprecatedCount": series.count,
                },
            )
        series.sent = True
        body: dict[str, Any] = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": series.name, "namespace": ev.regarding.namespace},
            "eventTime": _micro(series.first),
            "reportingController": self.config.reporting_controller,
            "reportingInstance": self.config.reporting_instance,
            "action": ev.action,
            "reason": ev.reason.value,
            "note": ev.note[:1024],
            "type": ev.type.value,
            "regarding": ev.regarding.as_dict(),
            "deprecatedFirstTimestamp": _seconds(series.first),
            "deprecatedLastTimestamp": _seconds(now),
            "deprecatedCount": series.count,
        }
        if series.count > 1:  # it counted while throttled before its first write
            body["series"] = {"count": series.count, "lastObservedTime": _micro(now)}
        return CreateEvent(body)

    def written_failed(self, ev: PlannedEvent) -> None:
        """The create of ``ev``'s Event failed: the next occurrence creates it again."""
        series = self._series.get(self._key(ev))
        if series is not None:
            series.sent = False


class EventRecorder:
    """Sends the correlator's writes with the official client; never raises (see the module docstring).
    Thread-safe: the tick and the API (pause / resume) record from different threads."""

    def __init__(self, api: k8s.ApiClient, correlator: EventCorrelator | None = None) -> None:
        self._lock = threading.Lock()
        self._api = k8s.EventsV1Api(api)
        self.correlator = correlator or EventCorrelator()
        self.failures = 0
        self.dropped = 0
        self.written = 0

    def record(self, ev: PlannedEvent, now: float) -> CreateEvent | PatchEvent | DropEvent:
        with self._lock:
            return self._record(ev, now)

    def _record(self, ev: PlannedEvent, now: float) -> CreateEvent | PatchEvent | DropEvent:
        action = self.correlator.observe(ev, now)
        ns = ev.regarding.namespace
        try:
            if isinstance(action, CreateEvent):
                self._api.create_namespaced_event(ns, action.body)  # type: ignore[arg-type]  # a dict is accepted
            elif isinstance(action, PatchEvent):
                self._api.patch_namespaced_event(action.name, ns, action.patch, _content_type=MERGE_PATCH)
            else:
                self.dropped += 1
                return action
        except CLIENT_ERRORS as exc:
            self.failures += 1
            if isinstance(action, CreateEvent):
                self.correlator.written_failed(ev)
            log.warning(
                "event %s on %s/%s not written: %s",
                ev.reason,
                ev.regarding.kind,
                ev.regarding.name,
                map_api_error(exc, verb="create", resource="events"),
            )
            return action
        self.written += 1
        return action


# ---------------------------------------------------------------------------------------------- conditions
class ConditionType(enum.StrEnum):
    ABLE_TO_SCALE = "AbleToScale"
    SCALING_ACTIVE = "ScalingActive"
    SCALING_LIMITED = "ScalingLimited"
    PAUSED = "Paused"
    FALLBACK = "Fallback"


class Condition(msgspec.Struct, frozen=True, kw_only=True):
    type: ConditionType
    status: str  # "True" / "False" / "Unknown"
    reason: str
    message: str
    last_transition_time: str = msgspec.field(default="", name="lastTransitionTime")


class ScaleStatus(msgspec.Struct, frozen=True, kw_only=True):
    """What the conditions are computed from, for one planner service."""

    actuator_ok: bool = True
    actuator_message: str = ""
    blind: bool = False
    hold_reason: str = ""  # e.g. "identity_not_synced"; "" when the planner decided freely
    capped_at_max: bool = False
    capped_at_min: bool = False
    predicted_miss: bool = False
    paused: bool = False
    paused_by: str = ""
    fallback_active: bool = False
    fallback_replicas: int | None = None
    desired_replicas: int | None = None


def _cond(t: ConditionType, ok: bool, reason: str, message: str) -> Condition:
    return Condition(type=t, status="True" if ok else "False", reason=reason, message=message)


def compute_conditions(s: ScaleStatus, previous: tuple[Condition, ...], now: float) -> tuple[Condition, ...]:
    """HPA-like conditions for ``s``; a condition whose status is unchanged from ``previous`` keeps its
    ``lastTransitionTime``."""
    if s.paused:
        able = _cond(ConditionType.ABLE_TO_SCALE, False, "Paused", f"scaling paused by {s.paused_by or 'an operator'}")
    elif not s.actuator_ok:
        able = _cond(ConditionType.ABLE_TO_SCALE, False, "FailedRescale", s.actuator_message or "actuator failing")
    else:
        able = _cond(ConditionType.ABLE_TO_SCALE, True, "SucceededRescale", "the planner can scale this service")
    if s.blind:
        active = _cond(ConditionType.SCALING_ACTIVE, False, "Blind", "no attributable FPM: holding")
    elif s.hold_reason:
        active = _cond(ConditionType.SCALING_ACTIVE, False, s.hold_reason, f"holding: {s.hold_reason}")
    else:
        active = _cond(ConditionType.SCALING_ACTIVE, True, "ValidMetricFound", "deciding from forward-pass metrics")
    if s.capped_at_max:
        why = "; the SLA is predicted to be missed" if s.predicted_miss else ""
        limited = _cond(ConditionType.SCALING_LIMITED, True, "TooManyReplicas", f"capped at max_replicas{why}")
    elif s.capped_at_min:
        limited = _cond(ConditionType.SCALING_LIMITED, True, "TooFewReplicas", "held at min_replicas")
    else:
        limited = _cond(ConditionType.SCALING_LIMITED, False, "DesiredWithinRange", "within the bounds")
    paused = _cond(
        ConditionType.PAUSED,
        s.paused,
        "PausedByOperator" if s.paused else "NotPaused",
        f"paused by {s.paused_by}" if s.paused else "not paused",
    )
    fallback = _cond(
        ConditionType.FALLBACK,
        s.fallback_active,
        "BlindTooLong" if s.fallback_active else "NotActive",
        f"fallback_replicas={s.fallback_replicas} applied" if s.fallback_active else "fallback not active",
    )
    before = {c.type: c for c in previous}
    out = []
    for c in (able, active, limited, paused, fallback):
        old = before.get(c.type)
        stamp = old.last_transition_time if old is not None and old.status == c.status else _seconds(now)
        out.append(msgspec.structs.replace(c, last_transition_time=stamp))
    return tuple(out)


def conditions_annotation(service: str, prefix: str = CONDITIONS_ANNOTATION_PREFIX) -> str:
    if not _SERVICE_KEY.match(service):
        raise ValueError(f"service {service!r} cannot name an annotation (alphanumerics, '-', '_', '.'; <= 63)")
    return prefix + service


def summarize(conditions: tuple[Condition, ...]) -> str:
    """One line: ``Type=Status``, with ``(Reason)`` where the status is not the healthy one."""
    parts = []
    for c in conditions:
        healthy = _HEALTHY.get(c.type.value) == c.status
        parts.append(f"{c.type.value}={c.status}" + ("" if healthy else f"({c.reason})"))
    return " ".join(parts)


class ConditionWriter:
    """Writes a service's conditions as a JSON annotation on the scaled object, when they change.

    ``patch(name, body)`` is the merge patch of that object (the DGD or the Deployment / StatefulSet); build
    it with :meth:`for_object`. Failures are counted and logged, never raised."""

    def __init__(self, patch: Callable[[str, dict[str, Any]], Any]) -> None:
        self._patch = patch
        self._last: dict[tuple[str, str], tuple[Condition, ...]] = {}
        self.failures = 0
        self.writes = 0

    @classmethod
    def for_object(cls, api: k8s.ApiClient, namespace: str, kind: str) -> ConditionWriter:
        """A writer for ``kind`` (``DynamoGraphDeployment``, ``Deployment`` or ``StatefulSet``)."""
        if kind == "DynamoGraphDeployment":
            custom = k8s.CustomObjectsApi(api)

            def patch(name: str, body: dict[str, Any]) -> Any:
                return custom.patch_namespaced_custom_object(
                    "nvidia.com", "v1alpha1", namespace, "dynamographdeployments", name, body
                )

        elif kind in ("Deployment", "StatefulSet"):
            apps = k8s.AppsV1Api(api)
            fn = apps.patch_namespaced_deployment if kind == "Deployment" else apps.patch_namespaced_stateful_set

            def patch(name: str, body: dict[str, Any]) -> Any:
                return fn(name, namespace, body, _content_type=MERGE_PATCH)

        else:
            raise ValueError(f"no condition writer for kind {kind!r}")
        return cls(patch)

    def current(self, name: str, service: str) -> tuple[Condition, ...]:
        return self._last.get((name, service), ())

    def update(self, name: str, service: str, status: ScaleStatus, now: float) -> tuple[Condition, ...]:
        key = (name, service)
        previous = self._last.get(key, ())
        conditions = compute_conditions(status, previous, now)
        if conditions == previous:
            return conditions
        value = json.dumps({"conditions": [msgspec.to_builtins(c) for c in conditions]}, separators=(",", ":"))
        try:
            annotations = {
                conditions_annotation(service): value,
                conditions_annotation(service, SUMMARY_ANNOTATION_PREFIX): summarize(conditions),
            }
            self._patch(name, {"metadata": {"annotations": annotations}})
        except CLIENT_ERRORS as exc:
            self.failures += 1
            log.warning(
                "conditions of %s/%s not written: %s", name, service, map_api_error(exc, verb="patch", resource=name)
            )
            return previous
        self.writes += 1
        self._last[key] = conditions
        return conditions


def parse_conditions(annotations: Mapping[str, str] | None, service: str) -> tuple[Condition, ...]:
    """The conditions written for ``service`` in an object's annotations (empty when none)."""
    raw = (annotations or {}).get(conditions_annotation(service))
    if not raw:
        return ()
    doc = json.loads(raw)
    return tuple(msgspec.convert(c, Condition) for c in doc.get("conditions", []))

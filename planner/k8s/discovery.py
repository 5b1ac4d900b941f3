"""Worker discovery from Kubernetes pods: list, then watch, pods matching a label selector in one namespace.

Pod contract (see ``docs/kubernetes.md``)::

    labels:
      fpm-planner.io/role: prefill | decode | agg          required (the default selector: this key exists)
      fpm-planner.io/service: <deployment service name>    optional, default: the role
    annotations:
      fpm-planner.io/worker-id: <registered id>            optional, default: the pod name
      fpm-planner.io/fpm-port: "20380"                     optional, base port; rank r publishes on port + r
      fpm-planner.io/dp-size: "1"                          optional, data-parallel ranks
      fpm-planner.io/max-num-batched-tokens: "8192"        optional capacities (EngineCapacity fields)
      fpm-planner.io/max-num-seqs: "256"
      fpm-planner.io/max-model-len: "8192"
      fpm-planner.io/kv-capacity-tokens: "0"

A pod becomes a :class:`~planner.discovery.WorkerRecord` once it has an IP and is not finished (phase
Succeeded/Failed); its FPM endpoints are ``tcp://{podIP}:{fpm-port + rank}``. Readiness comes from the pod's
``Ready`` condition (and no deletion in progress) and is exposed by :meth:`PodDiscovery.readiness` for the
decision core. A pod that breaks the contract is left out and listed in :meth:`PodDiscovery.pods` with the
reason; it never takes the others down.

The I/O shell: :meth:`PodDiscovery.run` lists (remembering the list's resourceVersion), then watches from it;
when a watch ends it resumes from the last resourceVersion seen; on 410 Gone it lists again. It runs in a
thread (:meth:`start` / :meth:`stop`); :meth:`workers` only reads the cache, so it is safe on the event loop.
"""

from __future__ import annotations

import enum
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
from kubernetes import client as k8s
from kubernetes import watch as k8s_watch

from planner.discovery import DEFAULT_FPM_PORT_BASE, EngineCapacity, Role, WorkerRecord, default_endpoints
from planner.errors import DiscoveryError
from planner.k8s.errors import CLIENT_ERRORS, http_status, map_api_error

__all__ = [
    "ANNOTATION_PREFIX",
    "ROLE_LABEL",
    "SERVICE_LABEL",
    "PodDiscovery",
    "PodDiscoveryConfig",
    "PodIssue",
    "PodState",
    "pod_state",
]

log = logging.getLogger(__name__)

ANNOTATION_PREFIX = "fpm-planner.io/"
ROLE_LABEL = ANNOTATION_PREFIX + "role"
SERVICE_LABEL = ANNOTATION_PREFIX + "service"
_CAPACITY_ANNOTATIONS = {
    "max-num-batched-tokens": "max_num_batched_tokens",
    "max-num-seqs": "max_num_seqs",
    "max-model-len": "max_model_len",
    "kv-capacity-tokens": "kv_capacity_tokens",
}


class PodIssue(enum.StrEnum):
    """Why a matching pod is not (yet) a worker."""

    NONE = ""
    NO_IP = "no_ip"  # not scheduled / no pod IP yet
    FINISHED = "finished"  # phase Succeeded or Failed
    MISSING_ROLE = "missing_role"
    BAD_ROLE = "bad_role"
    BAD_ANNOTATION = "bad_annotation"
    DUPLICATE_WORKER_ID = "duplicate_worker_id"  # another pod claims the same worker id


class PodState(msgspec.Struct, frozen=True, kw_only=True):
    """One matching pod as discovery sees it."""

    pod: str
    phase: str
    ready: bool  # Ready condition True and not being deleted
    terminating: bool
    pod_ip: str = ""
    node: str = ""
    resource_version: str = ""
    issue: PodIssue = PodIssue.NONE
    detail: str = ""
    record: WorkerRecord | None = None


class PodDiscoveryConfig(msgspec.Struct, frozen=True, kw_only=True):
    namespace: str
    label_selector: str = ROLE_LABEL  # pods carrying the role label
    watch_timeout_s: int = 300  # server-side timeout of one watch request; it is then resumed
    retry_backoff_s: float = 1.0  # wait after a failed list or watch
    request_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if not self.namespace:
            raise ValueError("namespace must not be empty")
        if self.watch_timeout_s < 1 or self.retry_backoff_s < 0 or self.request_timeout_s <= 0:
            raise ValueError("watch_timeout_s >= 1, retry_backoff_s >= 0 and request_timeout_s > 0 required")


def _int_annotation(annotations: Mapping[str, str], key: str, default: int, minimum: int) -> int:
    raw = annotations.get(ANNOTATION_PREFIX + key)
    if raw is None:
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ValueError(f"annotation {ANNOTATION_PREFIX}{key}={raw!r} is not an integer") from None
    if value < minimum:
        raise ValueError(f"annotation {ANNOTATION_PREFIX}{key}={value} must be >= {minimum}")
    return value


def pod_state(pod: Mapping[str, Any]) -> PodState:
    """Pure: a pod (as the API returns it, a dict) -> its :class:`PodState`, with a WorkerRecord when the pod
    satisfies the contract and has an IP."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    name = str(meta.get("name") or "")
    labels: Mapping[str, str] = meta.get("labels") or {}
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    phase = str(status.get("phase") or "Pending")
    terminating = meta.get("deletionTimestamp") is not None
    ready_cond = any(
        isinstance(c, Mapping) and c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    pod_ip = str(status.get("podIP") or "")
    base = PodState(
        pod=name,
        phase=phase,
        ready=ready_cond and not terminating and phase == "Running",
        terminating=terminating,
        pod_ip=pod_ip,
        node=str(spec.get("nodeName") or ""),
        resource_version=str(meta.get("resourceVersion") or ""),
    )
    role_raw = labels.get(ROLE_LABEL)
    if not role_raw:
        return msgspec.structs.replace(base, issue=PodIssue.MISSING_ROLE, detail=f"label {ROLE_LABEL} missing")
    try:
        role = Role(role_raw)
    except ValueError:
        return msgspec.structs.replace(
            base,
            issue=PodIssue.BAD_ROLE,
            detail=f"label {ROLE_LABEL}={role_raw!r} is not one of {[r.value for r in Role]}",
        )
    if phase in ("Succeeded", "Failed"):
        return msgspec.structs.replace(base, issue=PodIssue.FINISHED, detail=f"phase {phase}")
    if not pod_ip:
        return msgspec.structs.replace(base, issue=PodIssue.NO_IP, detail="no pod IP yet")
    try:
        dp_size = _int_annotation(annotations, "dp-size", 1, 1)
        port = _int_annotation(annotations, "fpm-port", DEFAULT_FPM_PORT_BASE, 1)
        if port + dp_size - 1 > 65535:
            raise ValueError(f"fpm-port {port} + dp-size {dp_size} runs past port 65535")
        defaults = EngineCapacity()
        capacity = EngineCapacity(
            **{
                field: _int_annotation(annotations, key, getattr(defaults, field), 0)
                for key, field in _CAPACITY_ANNOTATIONS.items()
            }
        )
        record = WorkerRecord(
            worker_id=str(annotations.get(ANNOTATION_PREFIX + "worker-id") or name),
            role=role,
            service=str(labels.get(SERVICE_LABEL) or role.value),
            dp_size=dp_size,
            fpm_endpoints=default_endpoints(pod_ip, dp_size, port),
            capacity=capacity,
        )
    except ValueError as exc:
        return msgspec.structs.replace(base, issue=PodIssue.BAD_ANNOTATION, detail=str(exc))
    return msgspec.structs.replace(base, record=record)


class PodDiscovery:
    """Pods -> workers; see the module docstring. Implements :class:`planner.discovery.Discovery`."""

    def __init__(
        self,
        api_client: k8s.ApiClient,
        config: PodDiscoveryConfig,
        *,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.config = config
        self._core = k8s.CoreV1Api(api_client)
        self._on_change = on_change
        self._lock = threading.Lock()
        self._raw: dict[str, PodState] = {}  # pod name -> state (before duplicate resolution)
        self._pods: dict[str, PodState] = {}
        self._workers: dict[str, WorkerRecord] = {}
        self._ready: dict[str, bool] = {}
        self.resource_version: str | None = None
        self.lists = 0  # full lists done (the first one included)
        self.gone = 0  # 410 Gone answers that forced a relist
        self.watch_restarts = 0  # watches resumed from a resourceVersion
        self.events = 0
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch: k8s_watch.Watch | None = None

    # ------------------------------------------------------------------------------------------- reads
    def workers(self, now: float) -> Mapping[str, WorkerRecord]:
        with self._lock:
            return dict(self._workers)

    def readiness(self, now: float) -> Mapping[str, bool]:
        """Worker id -> whether its pod is Ready (Ready condition, Running, not being deleted)."""
        with self._lock:
            return dict(self._ready)

    def not_ready_workers(self, now: float, service: str | None = None) -> tuple[str, ...]:
        """Worker ids whose pod is not Ready (optionally of one service), sorted: what
        ``planner.core.observation.DeploymentStatus.not_ready_workers`` takes."""
        with self._lock:
            return tuple(
                sorted(
                    wid
                    for wid, ok in self._ready.items()
                    if not ok and (service is None or self._workers[wid].service == service)
                )
            )

    def pods(self) -> Mapping[str, PodState]:
        """Every matching pod by name, with why it is not a worker when it is not."""
        with self._lock:
            return dict(self._pods)

    # ------------------------------------------------------------------------------------------- I/O
    def sync(self) -> None:
        """List the pods (blocking) and replace the cache; remembers the list's resourceVersion.
        Raises :class:`DiscoveryError`."""
        try:
            resp = self._core.list_namespaced_pod(
                self.config.namespace,
                label_selector=self.config.label_selector,
                _preload_content=False,
                _request_timeout=self.config.request_timeout_s,
            )
            doc = json.loads(getattr(resp, "data", b"") or b"{}")
        except CLIENT_ERRORS as exc:
            err = map_api_error(exc, verb="list", resource="pods")
            raise DiscoveryError(f"pod discovery: {err}") from exc
        except (ValueError, TypeError) as exc:
            raise DiscoveryError(f"pod discovery: unreadable pod list: {exc}") from exc
        states = {}
        for item in doc.get("items") or []:
            st = pod_state(item)
            states[st.pod] = st
        with self._lock:
            self._raw = states
            self._rebuild()
        self.resource_version = str((doc.get("metadata") or {}).get("resourceVersion") or "") or None
        self.lists += 1
        self._changed()

    def watch_once(self) -> None:
        """One watch request from :attr:`resource_version` until the server ends it. A 410 Gone clears the
        resourceVersion (the next :meth:`run` round lists again). Raises :class:`DiscoveryError` on other
        failures."""
        w = k8s_watch.Watch()  # type: ignore[no-untyped-call]
        self._watch = w
        try:
            for event in w.stream(  # type: ignore[no-untyped-call]
                self._core.list_namespaced_pod,
                self.config.namespace,
                label_selector=self.config.label_selector,
                resource_version=self.resource_version,
                timeout_seconds=self.config.watch_timeout_s,
                _request_timeout=(self.config.request_timeout_s, self.config.watch_timeout_s + 30),
            ):
                self._apply(event)
                if self._stop.is_set():
                    w.stop()  # type: ignore[no-untyped-call]
        except CLIENT_ERRORS as exc:
            if http_status(exc) == 410:
                self.gone += 1
                self.resource_version = None
                return
            if self._stop.is_set():
                return
            err = map_api_error(exc, verb="watch", resource="pods")
            raise DiscoveryError(f"pod discovery: {err}") from exc
        finally:
            self._watch = None

    def _apply(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        raw = event.get("raw_object")
        if not isinstance(raw, Mapping):
            return
        rv = (raw.get("metadata") or {}).get("resourceVersion")
        st = pod_state(raw)
        with self._lock:
            if kind == "DELETED":
                self._raw.pop(st.pod, None)
            elif kind in ("ADDED", "MODIFIED"):
                self._raw[st.pod] = st
            else:
                return
            self._rebuild()
        if rv:
            self.resource_version = str(rv)
        self.events += 1
        self._changed()

    def _rebuild(self) -> None:
        """Resolve duplicate worker ids (the oldest pod name in sort order keeps it) and rebuild the views.
        Caller holds the lock."""
        pods: dict[str, PodState] = {}
        workers: dict[str, WorkerRecord] = {}
        ready: dict[str, bool] = {}
        owner: dict[str, str] = {}
        for name in sorted(self._raw):
            st = self._raw[name]
            rec = st.record
            if rec is not None:
                if rec.worker_id in owner:
                    st = msgspec.structs.replace(
                        st,
                        record=None,
                        issue=PodIssue.DUPLICATE_WORKER_ID,
                        detail=f"worker id {rec.worker_id!r} already claimed by pod {owner[rec.worker_id]}",
                    )
                else:
                    owner[rec.worker_id] = name
                    workers[rec.worker_id] = rec
                    ready[rec.worker_id] = st.ready
            pods[name] = st
        self._pods, self._workers, self._ready = pods, workers, ready

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()

    def run(self) -> None:
        """List then watch until :meth:`stop`; resume after a watch ends, relist after 410, back off after
        errors (recorded in :attr:`last_error`). Blocking: run it in a thread (see :meth:`start`)."""
        while not self._stop.is_set():
            try:
                if self.resource_version is None:
                    self.sync()
                else:
                    self.watch_restarts += 1
                self.watch_once()
                self.last_error = None
            except DiscoveryError as exc:
                self.last_error = str(exc)
                log.warning("%s", exc)
                self._stop.wait(self.config.retry_backoff_s)

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self.run, name="pod-discovery", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """End :meth:`run` and wait for its thread. An open watch is cut (its socket shut down); the cut is
        repeated until the thread exits, since a watch request may still be on its way when stop is called."""
        self._stop.set()
        thread = self._thread
        if thread is None:
            return
        deadline = time.monotonic() + timeout_s
        while thread.is_alive() and time.monotonic() < deadline:
            w = self._watch
            if w is not None:
                w.stop()  # type: ignore[no-untyped-call]
            thread.join(0.05)
        self._thread = None

"""A Kubernetes API emulator: a real HTTP server on a loopback port speaking the REST subset the official
``kubernetes`` Python client uses against it.

Supported (namespaced resources only):

* ``GET`` an object, ``GET`` a collection (``labelSelector``: ``k=v``, ``k!=v``, ``k``, ``!k``,
  ``k in (a,b)``, ``k notin (a,b)``), and ``GET ...?watch=true`` streaming chunked JSON lines
  (``ADDED``/``MODIFIED``/``DELETED``; resume from ``resourceVersion``; an ``ERROR`` event with code 410 when
  that version has been compacted away; the stream ends after ``timeoutSeconds``);
* ``POST`` (create; 409 AlreadyExists), ``PUT`` (replace; 409 Conflict on a stale
  ``metadata.resourceVersion``), ``PATCH`` with ``application/merge-patch+json`` or
  ``application/strategic-merge-patch+json`` (applied as a JSON merge patch; a ``metadata.resourceVersion`` in
  the patch is a precondition, 409 on mismatch), ``DELETE``;
* the ``scale`` subresource (``GET``/``PUT``/``PATCH``) of apps/v1 Deployment and StatefulSet and of the
  DynamoGraphDeploymentScalingAdapter (paths from its CRD), and the ``status`` subresource;
* objects validated on every write: the adapter against its CRD, the DynamoGraphDeployment against a schema
  derived from the example manifests (422 Invalid with the field path);
* optional RBAC: give :attr:`K8sApiEmulator.rbac_rules` a Role's ``rules`` and everything else gets a 403
  whose message names the verb and resource, like the real API server; :attr:`K8sApiEmulator.audit` records
  every request's ``(verb, group, resource)``;
* fault injection (:meth:`K8sApiEmulator.inject`): a status (409, 429 with Retry-After, 500, 403, ...) or a
  delay (so that the client times out) on requests matching a method and a path pattern, a given number of
  times;
* an optional adapter controller (``adapter_controller=True``): a write to an adapter's replicas is copied to
  its DynamoGraphDeployment's ``spec.services.<serviceName>.replicas``, as Dynamo's controller does.
"""

from __future__ import annotations

import copy
import http.server
import json
import re
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tests.fakes.k8s_api import events as _events
from tests.fakes.k8s_api.schema import DGD_SCHEMA, SHARED_K8S, crd_schema, load_crd, validate

__all__ = ["Fault", "K8sApiEmulator", "ResourceType"]

Obj = dict[str, Any]


@dataclass(frozen=True)
class ResourceType:
    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    schema: dict[str, Any] | None = None
    scale_spec_path: tuple[str, ...] | None = None  # e.g. ("spec", "replicas")
    scale_status_path: tuple[str, ...] | None = None
    scale_selector_path: tuple[str, ...] | None = None

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


@dataclass
class Fault:
    """Answer matching requests with ``status`` (and ``retry_after_s`` as Retry-After), or hold them for
    ``delay_s`` first (``status=None`` + ``delay_s``: a timeout as far as a client with a shorter timeout can
    tell; the request is not applied). ``times=None`` means until removed."""

    method: str  # "GET", "PUT", "PATCH", "POST", "DELETE" or "*"
    path_pattern: str  # a regex searched in the request path
    status: int | None = 500
    times: int | None = 1
    retry_after_s: float | None = None
    delay_s: float = 0.0
    message: str = "injected fault"
    user_agent: str | None = None  # only requests from this client (User-Agent), e.g. one planner replica
    hits: int = 0

    def matches(self, method: str, path: str, user_agent: str = "") -> bool:
        return (
            self.method in ("*", method)
            and re.search(self.path_pattern, path) is not None
            and (self.user_agent is None or self.user_agent == user_agent)
        )


@dataclass
class _Event:
    rv: int
    kind: str  # ADDED / MODIFIED / DELETED
    obj: Obj


@dataclass
class _Watcher:
    generation: int


@dataclass
class _State:
    rv: int = 100
    objects: dict[tuple[str, str, str], Obj] = field(default_factory=dict)  # (type key, ns, name)
    events: dict[str, list[_Event]] = field(default_factory=dict)  # type key -> log
    compacted_rv: dict[str, int] = field(default_factory=dict)  # type key -> oldest resumable rv


def _now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _get_path(obj: Obj, path: tuple[str, ...]) -> Any:
    cur: Any = obj
    for key in path:
        if not isinstance(cur, dict) or key not in cur:
            return None
        cur = cur[key]
    return cur


def _set_path(obj: Obj, path: tuple[str, ...], value: Any) -> None:
    cur = obj
    for key in path[:-1]:
        cur = cur.setdefault(key, {})
    cur[path[-1]] = value


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


_SEL_IN = re.compile(r"^\s*([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_selector(selector: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def label_match(selector: str | None, labels: dict[str, str]) -> bool:
    if not selector:
        return True
    for term in _split_selector(selector):
        m = _SEL_IN.match(term)
        if m:
            values = {v.strip() for v in m.group(3).split(",") if v.strip()}
            present = labels.get(m.group(1))
            if m.group(2) == "in" and present not in values:
                return False
            if m.group(2) == "notin" and present in values:
                return False
        elif "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k.strip()) == v.strip():
                return False
        elif "=" in term:
            k, v = term.split("==", 1) if "==" in term else term.split("=", 1)
            if labels.get(k.strip()) != v.strip():
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif term not in labels:
            return False
    return True


class _ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.headers = headers or {}


def _status_body(code: int, reason: str, message: str) -> Obj:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class K8sApiEmulator:
    """The emulator. Use as a context manager (or :meth:`start` / :meth:`stop`); :attr:`url` is its URL."""

    def __init__(self, *, adapter_controller: bool = False, watch_history: int = 10_000) -> None:
        crd = load_crd(SHARED_K8S / "crds" / "nvidia.com_dynamographdeploymentscalingadapters.yaml")
        scale = next(v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1")["subresources"]["scale"]

        def jp(expr: str) -> tuple[str, ...]:
            return tuple(expr.lstrip(".").split("."))

        types = [
            ResourceType("", "v1", "pods", "Pod"),
            ResourceType(
                "apps",
                "v1",
                "deployments",
                "Deployment",
                None,
                ("spec", "replicas"),
                ("status", "replicas"),
                ("status", "selector"),
            ),
            ResourceType(
                "apps",
                "v1",
                "statefulsets",
                "StatefulSet",
                None,
                ("spec", "replicas"),
                ("status", "replicas"),
                ("status", "selector"),
            ),
            ResourceType("coordination.k8s.io", "v1", "leases", "Lease"),
            ResourceType(
                "nvidia.com",
                "v1alpha1",
                crd["spec"]["names"]["plural"],
                crd["spec"]["names"]["kind"],
                crd_schema(crd, "v1alpha1"),
                jp(scale["specReplicasPath"]),
                jp(scale["statusReplicasPath"]),
                jp(scale["labelSelectorPath"]),
            ),
            ResourceType("nvidia.com", "v1alpha1", "dynamographdeployments", "DynamoGraphDeployment", DGD_SCHEMA),
            *_events.extra_types(),  # Events, ConfigMaps, ReplicaSets (tests/fakes/k8s_api/events.py)
        ]
        self.types: dict[str, ResourceType] = {self._key(t.group, t.version, t.plural): t for t in types}
        self.adapter_controller = adapter_controller
        self.watch_history = watch_history
        self.rbac_rules: list[dict[str, Any]] | None = None
        self.rbac_user = "system:serviceaccount:default:fpm-planner"
        self.audit: list[tuple[str, str, str]] = []  # (verb, group, resource[/sub])
        self.requests: list[tuple[str, str]] = []  # (method, path)
        self.request_log: list[tuple[str, str, str]] = []  # (method, path, user agent)
        self._faults: list[Fault] = []
        self._state = _State()
        self._cond = threading.Condition()
        self._watch_generation = 0
        self.open_watches = 0  # watch streams currently open
        self._stopping = False
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------------------------------ lifecycle
    @staticmethod
    def _key(group: str, version: str, plural: str) -> str:
        return f"{group}/{version}/{plural}"

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("emulator not started")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> K8sApiEmulator:
        emulator = self

        class Handler(_Handler):
            emu = emulator

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, args=(0.05,), name="k8s-api-emulator", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> K8sApiEmulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------------------------------ control plane
    def inject(self, fault: Fault) -> Fault:
        with self._cond:
            self._faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        with self._cond:
            self._faults.clear()

    def close_watches(self) -> None:
        """End every open watch stream (as an API server restart or a load balancer would)."""
        with self._cond:
            self._watch_generation += 1
            self._cond.notify_all()

    def wait_for_watchers(self, count: int = 1, timeout_s: float = 10.0) -> None:
        """Block until at least ``count`` watch streams are open (raises TimeoutError otherwise)."""
        with self._cond:
            if not self._cond.wait_for(lambda: self.open_watches >= count, timeout=timeout_s):
                raise TimeoutError(f"{self.open_watches} watch streams open, waited for {count}")

    def compact(self) -> int:
        """Forget the event history: a watch resuming from an older resourceVersion gets 410 Gone."""
        with self._cond:
            for key in self._state.events:
                self._state.events[key] = []
                self._state.compacted_rv[key] = self._state.rv + 1
            return self._state.rv

    def get(self, plural: str, namespace: str, name: str) -> Obj | None:
        t = self._type_by_plural(plural)
        with self._cond:
            obj = self._state.objects.get((self._key(t.group, t.version, t.plural), namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def put(self, obj: Obj, *, validate_schema: bool = True) -> Obj:
        """Create or replace ``obj`` directly (no RBAC, no faults): test setup and controller actions."""
        group, _, version = obj["apiVersion"].rpartition("/")
        t = next(
            (t for t in self.types.values() if t.group == group and t.version == version and t.kind == obj["kind"]),
            None,
        )
        if t is None:
            raise KeyError(f"unknown kind {obj['apiVersion']} {obj['kind']}")
        ns = obj["metadata"].get("namespace", "default")
        with self._cond:
            key = (self._key(t.group, t.version, t.plural), ns, obj["metadata"]["name"])
            old = self._state.objects.get(key)
            if validate_schema:
                self._validate(t, obj)
            return self._store(t, ns, obj, old)

    def patch_status(self, plural: str, namespace: str, name: str, status_patch: Obj) -> Obj:
        """Merge ``status_patch`` into an object's status (a controller reporting)."""
        t = self._type_by_plural(plural)
        with self._cond:
            key = (self._key(t.group, t.version, t.plural), namespace, name)
            old = self._state.objects[key]
            new = copy.deepcopy(old)
            new["status"] = merge_patch(old.get("status", {}), status_patch)
            return self._store(t, namespace, new, old)

    def delete(self, plural: str, namespace: str, name: str) -> None:
        t = self._type_by_plural(plural)
        with self._cond:
            self._delete(t, namespace, name)

    def _type_by_plural(self, plural: str) -> ResourceType:
        for t in self.types.values():
            if t.plural == plural:
                return t
        raise KeyError(plural)

    # ------------------------------------------------------------------------------------------ storage
    def _validate(self, t: ResourceType, obj: Obj) -> None:
        name = obj.get("metadata", {}).get("name")
        if not name:
            raise _ApiError(422, "Invalid", f"{t.kind} is invalid: metadata.name: Required value")
        if obj.get("kind") not in (None, t.kind):
            raise _ApiError(400, "BadRequest", f"kind {obj.get('kind')!r} does not match {t.kind}")
        if t.schema is not None:
            errors = validate(t.schema, obj)
            if errors:
                raise _ApiError(
                    422,
                    "Invalid",
                    f'{t.kind}.{t.group} "{name}" is invalid: ' + "; ".join(errors),
                )

    def _store(self, t: ResourceType, ns: str, obj: Obj, old: Obj | None) -> Obj:
        st = self._state
        st.rv += 1
        new = copy.deepcopy(obj)
        new["apiVersion"] = t.api_version
        new["kind"] = t.kind
        meta = new.setdefault("metadata", {})
        meta["namespace"] = ns
        meta["resourceVersion"] = str(st.rv)
        if old is None:
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = _now_iso()
            meta["generation"] = 1
        else:
            meta["uid"] = old["metadata"]["uid"]
            meta["creationTimestamp"] = old["metadata"]["creationTimestamp"]
            gen = old["metadata"].get("generation", 1)
            meta["generation"] = gen + 1 if old.get("spec") != new.get("spec") else gen
        tkey = self._key(t.group, t.version, t.plural)
        st.objects[(tkey, ns, meta["name"])] = new
        self._record(tkey, "ADDED" if old is None else "MODIFIED", new)
        if self.adapter_controller and t.plural == "dynamographdeploymentscalingadapters":
            self._sync_adapter(ns, new)
        return copy.deepcopy(new)

    def _record(self, tkey: str, kind: str, obj: Obj) -> None:
        log = self._state.events.setdefault(tkey, [])
        log.append(_Event(self._state.rv, kind, copy.deepcopy(obj)))
        if len(log) > self.watch_history:
            dropped = log.pop(0)
            self._state.compacted_rv[tkey] = dropped.rv + 1
        self._cond.notify_all()

    def _delete(self, t: ResourceType, ns: str, name: str) -> Obj:
        tkey = self._key(t.group, t.version, t.plural)
        old = self._state.objects.pop((tkey, ns, name), None)
        if old is None:
            raise _ApiError(404, "NotFound", f'{t.plural}.{t.group or "core"} "{name}" not found')
        self._state.rv += 1
        gone = copy.deepcopy(old)
        gone["metadata"]["resourceVersion"] = str(self._state.rv)
        self._record(tkey, "DELETED", gone)
        return gone

    def _sync_adapter(self, ns: str, adapter: Obj) -> None:
        ref = adapter.get("spec", {}).get("dgdRef", {})
        dgd_t = self._type_by_plural("dynamographdeployments")
        key = (self._key(dgd_t.group, dgd_t.version, dgd_t.plural), ns, ref.get("name", ""))
        dgd = self._state.objects.get(key)
        service = ref.get("serviceName", "")
        if dgd is None or service not in dgd.get("spec", {}).get("services", {}):
            return
        replicas = adapter["spec"]["replicas"]
        if dgd["spec"]["services"][service].get("replicas") != replicas:
            new = copy.deepcopy(dgd)
            new["spec"]["services"][service]["replicas"] = replicas
            self._store(dgd_t, ns, new, dgd)

    # ------------------------------------------------------------------------------------------ RBAC
    def _authorize(self, verb: str, t: ResourceType, sub: str | None, ns: str, name: str | None) -> None:
        resource = t.plural + (f"/{sub}" if sub else "")
        self.audit.append((verb, t.group, resource))
        if self.rbac_rules is None:
            return
        for rule in self.rbac_rules:
            groups = rule.get("apiGroups", [])
            if (
                ("*" in groups or t.group in groups)
                and ("*" in rule.get("resources", []) or resource in rule.get("resources", []))
                and ("*" in rule.get("verbs", []) or verb in rule.get("verbs", []))
            ):
                names = rule.get("resourceNames")
                if not names or (name is not None and name in names):
                    return
        group_txt = f'in API group "{t.group}"'
        target = f'{t.plural}.{t.group} "{name}"' if name else f"{t.plural}.{t.group or ''}".rstrip(".")
        raise _ApiError(
            403,
            "Forbidden",
            f'{target} is forbidden: User "{self.rbac_user}" cannot {verb} resource "{resource}" '
            f'{group_txt} in the namespace "{ns}"',
        )

    # ------------------------------------------------------------------------------------------ dispatch
    _PATH = re.compile(
        r"^/(?:api/(?P<core_version>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
        r"/namespaces/(?P<ns>[^/]+)/(?P<plural>[^/]+)(?:/(?P<name>[^/]+)(?:/(?P<sub>[^/]+))?)?$"
    )

    def _route(self, path: str) -> tuple[ResourceType, str, str | None, str | None]:
        m = self._PATH.match(path)
        if not m:
            raise _ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        group = "" if m.group("core_version") else m.group("group")
        version = m.group("core_version") or m.group("version")
        t = self.types.get(self._key(group, version, m.group("plural")))
        if t is None:
            raise _ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        sub = m.group("sub")
        if sub not in (None, "scale", "status") or (sub == "scale" and t.scale_spec_path is None):
            raise _ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        return t, m.group("ns"), m.group("name"), sub

    def take_fault(self, method: str, path: str, user_agent: str = "") -> Fault | None:
        with self._cond:
            for fault in self._faults:
                if fault.matches(method, path, user_agent):
                    fault.hits += 1
                    if fault.times is not None:
                        fault.times -= 1
                        if fault.times <= 0:
                            self._faults.remove(fault)
                    return fault
        return None

    def _scale_view(self, t: ResourceType, obj: Obj) -> Obj:
        assert t.scale_spec_path is not None and t.scale_status_path is not None
        status: Obj = {"replicas": _get_path(obj, t.scale_status_path) or 0}
        selector = _get_path(obj, t.scale_selector_path) if t.scale_selector_path else None
        if selector:
            status["selector"] = selector if isinstance(selector, str) else ""
        meta = obj["metadata"]
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")},
            "spec": {"replicas": _get_path(obj, t.scale_spec_path) or 0},
            "status": status,
        }

    def handle(self, method: str, path: str, query: dict[str, str], body: Any, content_type: str) -> Obj:
        t, ns, name, sub = self._route(path)
        if method == "GET":
            verb = "get" if name else ("watch" if query.get("watch") in ("true", "1") else "list")
        else:
            verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}[method]
        with self._cond:
            self._authorize(verb, t, sub, ns, name)
            tkey = self._key(t.group, t.version, t.plural)
            if name is None:
                if method == "GET":
                    return self._list(t, ns, query.get("labelSelector"))
                if method == "POST":
                    if not isinstance(body, dict):
                        raise _ApiError(400, "BadRequest", "body must be a JSON object")
                    body.setdefault("metadata", {})["namespace"] = ns
                    self._validate(t, body)
                    if (tkey, ns, body["metadata"]["name"]) in self._state.objects:
                        raise _ApiError(
                            409,
                            "AlreadyExists",
                            f'{t.plural}.{t.group} "{body["metadata"]["name"]}" already exists',
                        )
                    return self._store(t, ns, body, None)
                raise _ApiError(405, "MethodNotAllowed", f"{method} not allowed on a collection")
            old = self._state.objects.get((tkey, ns, name))
            if old is None:
                raise _ApiError(404, "NotFound", f'{t.plural}.{t.group} "{name}" not found')
            if method == "DELETE":
                return self._delete(t, ns, name)
            if method == "GET":
                return self._scale_view(t, old) if sub == "scale" else copy.deepcopy(old)
            if not isinstance(body, dict):
                raise _ApiError(400, "BadRequest", "body must be a JSON object")
            if method == "PATCH":
                if "json-patch" in content_type or "apply-patch" in content_type:
                    raise _ApiError(415, "UnsupportedMediaType", f"{content_type} is not supported here")
                if "strategic-merge-patch" in content_type and t.group not in ("", "apps", "coordination.k8s.io"):
                    raise _ApiError(
                        415,
                        "UnsupportedMediaType",
                        f"the body of the request was in an unknown format - accepted media types include: "
                        f"application/json-patch+json, application/merge-patch+json ({t.kind} is a custom resource)",
                    )
                current = self._scale_view(t, old) if sub == "scale" else old
                want_rv = body.get("metadata", {}).get("resourceVersion")
                body = merge_patch(current, body)
                if want_rv is None:
                    body["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
            rv = body.get("metadata", {}).get("resourceVersion")
            if rv is not None and rv != old["metadata"]["resourceVersion"]:
                raise _ApiError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {t.plural}.{t.group} "{name}": the object has been '
                    "modified; please apply your changes to the latest version and try again",
                )
            if sub == "scale":
                replicas = body.get("spec", {}).get("replicas")
                if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
                    raise _ApiError(
                        422, "Invalid", f'Scale.autoscaling "{name}" is invalid: spec.replicas: must be >= 0'
                    )
                new = copy.deepcopy(old)
                assert t.scale_spec_path is not None
                _set_path(new, t.scale_spec_path, replicas)
            elif sub == "status":
                new = copy.deepcopy(old)
                new["status"] = body.get("status", {})
            else:
                new = copy.deepcopy(body)
                new.setdefault("metadata", {})["name"] = name
                new["status"] = old.get("status", {})  # the main resource does not write status
            self._validate(t, new)
            stored = self._store(t, ns, new, old)
            return self._scale_view(t, stored) if sub == "scale" else stored

    def _list(self, t: ResourceType, ns: str, selector: str | None) -> Obj:
        tkey = self._key(t.group, t.version, t.plural)
        items = [
            copy.deepcopy(o)
            for (k, o_ns, _), o in sorted(self._state.objects.items(), key=lambda kv: kv[0])
            if k == tkey and o_ns == ns and label_match(selector, o["metadata"].get("labels", {}))
        ]
        return {
            "kind": f"{t.kind}List",
            "apiVersion": t.api_version,
            "metadata": {"resourceVersion": str(self._state.rv)},
            "items": items,
        }

    def open_watch(self, path: str, query: dict[str, str]) -> Iterator[Obj]:
        """Check a watch request (404, 403, 410 come out here) and return its events, as dicts, until the
        timeout, a :meth:`close_watches` or a :meth:`stop`."""
        t, ns, name, _ = self._route(path)
        if name is not None:
            raise _ApiError(405, "MethodNotAllowed", "watch a collection, not an object")
        tkey = self._key(t.group, t.version, t.plural)
        selector = query.get("labelSelector")
        deadline = time.monotonic() + float(query.get("timeoutSeconds", "1800"))
        rv_param = query.get("resourceVersion", "")
        with self._cond:
            self._authorize("watch", t, None, ns, None)
            generation = self._watch_generation
            if rv_param in ("", "0"):
                # Synthetic ADDED events for the current state, then changes.
                initial = [
                    {"type": "ADDED", "object": copy.deepcopy(o)}
                    for (k, o_ns, _), o in sorted(self._state.objects.items(), key=lambda kv: kv[0])
                    if k == tkey and o_ns == ns and label_match(selector, o["metadata"].get("labels", {}))
                ]
                since = self._state.rv
            else:
                initial = []
                since = int(rv_param)
                if since < self._state.compacted_rv.get(tkey, 0) - 1:
                    gone = _status_body(410, "Expired", f"too old resource version: {since}")
                    return iter([{"type": "ERROR", "object": gone}])
        return self._follow(tkey, ns, selector, since, deadline, generation, initial)

    def _follow(
        self,
        tkey: str,
        ns: str,
        selector: str | None,
        since: int,
        deadline: float,
        generation: int,
        initial: list[Obj],
    ) -> Iterator[Obj]:
        with self._cond:
            self.open_watches += 1
            self._cond.notify_all()
        try:
            yield from initial
            yield from self._changes(tkey, ns, selector, since, deadline, generation)
        finally:
            with self._cond:
                self.open_watches -= 1
                self._cond.notify_all()

    def _changes(
        self, tkey: str, ns: str, selector: str | None, since: int, deadline: float, generation: int
    ) -> Iterator[Obj]:
        while True:
            with self._cond:
                if self._stopping or generation != self._watch_generation:
                    return
                log = self._state.events.get(tkey, [])
                pending = [
                    e
                    for e in log
                    if e.rv > since
                    and e.obj["metadata"].get("namespace") == ns
                    and label_match(selector, e.obj["metadata"].get("labels", {}))
                ]
                if not pending:
                    if log:
                        since = max(since, log[-1].rv)
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return
                    self._cond.wait(timeout=min(remaining, 0.5))
                    continue
            for e in pending:
                since = e.rv
                yield {"type": e.kind, "object": e.obj}


class _Handler(http.server.BaseHTTPRequestHandler):
    emu: K8sApiEmulator
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:  # silence the default stderr log
        return

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def _send_json(self, code: int, payload: Obj, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _serve(self, method: str) -> None:
        parsed = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(parsed.query))
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        emu = self.emu
        user_agent = self.headers.get("User-Agent", "")
        with emu._cond:
            emu.requests.append((method, parsed.path))
            emu.request_log.append((method, parsed.path, user_agent))
        try:
            fault = emu.take_fault(method, parsed.path, user_agent)
            if fault is not None:
                if fault.delay_s:
                    time.sleep(fault.delay_s)
                if fault.status is None:
                    self.close_connection = True
                    return
                headers = {}
                if fault.retry_after_s is not None:
                    headers["Retry-After"] = str(int(fault.retry_after_s))
                reason = {
                    403: "Forbidden",
                    404: "NotFound",
                    409: "Conflict",
                    410: "Gone",
                    429: "TooManyRequests",
                    500: "InternalError",
                    503: "ServiceUnavailable",
                    504: "Timeout",
                }.get(fault.status, "InternalError")
                raise _ApiError(fault.status, reason, fault.message, headers)
            try:
                body = json.loads(raw) if raw else None
            except json.JSONDecodeError as exc:
                raise _ApiError(400, "BadRequest", f"invalid JSON body: {exc}") from exc
            if method == "GET" and query.get("watch") in ("true", "1"):
                self._stream(parsed.path, query)
                return
            result = _events.hook(emu, method, parsed.path, query)  # discovery, core Events, fieldSelector
            if result is None:
                result = emu.handle(method, parsed.path, query, body, self.headers.get("Content-Type", ""))
            self._send_json(201 if method == "POST" else 200, result)
        except _ApiError as err:
            try:
                self._send_json(err.code, _status_body(err.code, err.reason, err.message), err.headers)
            except (BrokenPipeError, ConnectionResetError):
                pass
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _stream(self, path: str, query: dict[str, str]) -> None:
        events = self.emu.open_watch(path, query)  # raises _ApiError (404, 403) before any header is sent
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for event in events:
                self._chunk(event)
            self.wfile.write(b"0\r\n\r\n")  # a clean end: the connection stays usable (keep-alive)
            self.wfile.flush()
        except (TimeoutError, BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True

    def _chunk(self, event: Obj) -> None:
        data = json.dumps(event).encode() + b"\n"
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

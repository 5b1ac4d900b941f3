"""What the emulator adds for Events, ConfigMaps and ``kubectl``:

* resource types: ``events.k8s.io/v1`` Events, core ``v1`` ConfigMaps, ``apps/v1`` ReplicaSets (``kubectl
  describe deployment`` lists them) and core ``v1`` Events;
* one storage for Events: core ``v1`` Events are a *view* of the ``events.k8s.io/v1`` ones, converted the way
  the API server converts them (``regarding`` -> ``involvedObject``, ``note`` -> ``message``, ``series.count``
  -> ``count``...), which is what ``kubectl describe`` reads;
* ``fieldSelector`` on Event lists (``regarding.*`` / ``involvedObject.*``, ``reason``, ``type``,
  ``metadata.name``; ``=``, ``==`` and ``!=``);
* discovery (``/api``, ``/api/v1``, ``/apis``, ``/apis/<group>/<version>``, ``/version``) built from the
  registered types, so that ``kubectl`` can map ``deployment`` or ``dgd`` to a resource.

:func:`hook` is the one entry point the server calls: it answers a request itself or returns None.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.fakes.k8s_api.server import K8sApiEmulator, ResourceType

__all__ = ["EVENTS_GROUP", "extra_types", "field_match", "hook", "to_core_event"]

Obj = dict[str, Any]

EVENTS_GROUP = "events.k8s.io"

_SHORT_NAMES = {
    "deployments": ["deploy"],
    "configmaps": ["cm"],
    "events": ["ev"],
    "dynamographdeployments": ["dgd"],
    "dynamographdeploymentscalingadapters": ["dgdsa"],
    "replicasets": ["rs"],
    "statefulsets": ["sts"],
    "pods": ["po"],
}


def extra_types() -> list[ResourceType]:
    from tests.fakes.k8s_api.server import ResourceType

    return [
        ResourceType(EVENTS_GROUP, "v1", "events", "Event"),
        ResourceType("", "v1", "events", "Event"),
        ResourceType("", "v1", "configmaps", "ConfigMap"),
        ResourceType("apps", "v1", "replicasets", "ReplicaSet"),
    ]


# ---------------------------------------------------------------------------------------------- conversion
def _micro(value: Any) -> str | None:
    """A timestamp in the API server's MicroTime form (``...T11:00:00.000000Z``), as it stores them."""
    if not value:
        return None
    parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    return parsed.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _seconds(value: Any) -> str | None:
    if not value:
        return None
    parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    return parsed.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def to_core_event(ev: Obj) -> Obj:
    """An ``events.k8s.io/v1`` Event as a core ``v1`` Event (the API server's conversion)."""
    series = ev.get("series")
    core: Obj = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": copy.deepcopy(ev.get("metadata", {})),
        "involvedObject": copy.deepcopy(ev.get("regarding", {})),
        "reason": ev.get("reason", ""),
        "message": ev.get("note", ""),
        "type": ev.get("type", ""),
        "action": ev.get("action", ""),
        "reportingComponent": ev.get("reportingController", ""),
        "reportingInstance": ev.get("reportingInstance", ""),
        "source": copy.deepcopy(ev.get("deprecatedSource", {})),
        "firstTimestamp": _seconds(ev.get("deprecatedFirstTimestamp")),
        "lastTimestamp": _seconds(ev.get("deprecatedLastTimestamp")),
        "count": ev.get("deprecatedCount", 0),
        "eventTime": _micro(ev.get("eventTime")),
    }
    if series:
        core["series"] = {"count": series.get("count", 0), "lastObservedTime": _micro(series.get("lastObservedTime"))}
        core["count"] = series.get("count", 0)
    if ev.get("related"):
        core["related"] = copy.deepcopy(ev["related"])
    return core


# ---------------------------------------------------------------------------------------------- field selectors
_CORE_TO_V1 = {"involvedObject": "regarding", "message": "note", "reportingComponent": "reportingController"}


def _field_value(ev: Obj, path: str) -> str:
    head, _, rest = path.partition(".")
    head = _CORE_TO_V1.get(head, head)
    if head == "source":
        head = "deprecatedSource"
    cur: Any = ev.get(head)
    for key in rest.split(".") if rest else []:
        cur = cur.get(key) if isinstance(cur, dict) else None
    return "" if cur is None else str(cur)


def field_match(selector: str | None, ev: Obj) -> bool:
    """Whether ``ev`` (an ``events.k8s.io/v1`` Event) matches a field selector written for either API."""
    if not selector:
        return True
    for term in (t.strip() for t in selector.split(",") if t.strip()):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if _field_value(ev, key.strip()) == value.strip():
                return False
        else:
            key, value = term.split("==", 1) if "==" in term else term.split("=", 1)
            if _field_value(ev, key.strip()) != value.strip():
                return False
    return True


# ---------------------------------------------------------------------------------------------- discovery
def _resources(emu: K8sApiEmulator, group: str, version: str) -> list[Obj]:
    out: list[Obj] = []
    for t in emu.types.values():
        if t.group != group or t.version != version:
            continue
        out.append(
            {
                "name": t.plural,
                "singularName": t.kind.lower(),
                "namespaced": True,
                "kind": t.kind,
                "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
                "shortNames": _SHORT_NAMES.get(t.plural, []),
            }
        )
        for sub in ("status",) + (("scale",) if t.scale_spec_path is not None else ()):
            out.append(
                {
                    "name": f"{t.plural}/{sub}",
                    "singularName": "",
                    "namespaced": True,
                    "kind": "Scale" if sub == "scale" else t.kind,
                    "verbs": ["get", "patch", "update"],
                }
            )
    return out


def _discovery(emu: K8sApiEmulator, path: str) -> Obj | None:
    path = path.rstrip("/")
    versions: dict[str, list[str]] = {}
    for t in emu.types.values():
        if t.group and t.version not in versions.setdefault(t.group, []):
            versions[t.group].append(t.version)
    if path == "/version":
        return {"major": "1", "minor": "32", "gitVersion": "v1.32.0-emulator", "platform": "linux/amd64"}
    if path == "/api":
        return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
    if path == "/api/v1":
        return {"kind": "APIResourceList", "groupVersion": "v1", "resources": _resources(emu, "", "v1")}
    if path == "/apis":
        groups = [
            {
                "name": g,
                "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
                "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]},
            }
            for g, vs in sorted(versions.items())
        ]
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
    parts = path.split("/")
    if len(parts) == 4 and parts[1] == "apis" and parts[3] in versions.get(parts[2], []):
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{parts[2]}/{parts[3]}",
            "resources": _resources(emu, parts[2], parts[3]),
        }
    return None


# ---------------------------------------------------------------------------------------------- the hook
def _is_core_events(path: str) -> bool:
    parts = path.split("/")  # "", "api", "v1", "namespaces", ns, "events"[, name]
    return len(parts) in (6, 7) and parts[1:3] == ["api", "v1"] and parts[3] == "namespaces" and parts[5] == "events"


def hook(emu: K8sApiEmulator, method: str, path: str, query: dict[str, str]) -> Obj | None:
    """Answer discovery and core-Event reads (a view of the ``events.k8s.io`` storage); None: not ours."""
    if method != "GET" or query.get("watch") in ("true", "1"):
        return None
    doc = _discovery(emu, path)
    if doc is not None:
        return doc
    if _is_core_events(path):
        parts = path.split("/")
        v1_path = f"/apis/{EVENTS_GROUP}/v1/namespaces/{parts[4]}/events" + (f"/{parts[6]}" if len(parts) == 7 else "")
        result = emu.handle("GET", v1_path, {k: v for k, v in query.items() if k != "fieldSelector"}, None, "")
        if len(parts) == 7:
            return to_core_event(result)
        items = [to_core_event(e) for e in result["items"] if field_match(query.get("fieldSelector"), e)]
        return {"kind": "EventList", "apiVersion": "v1", "metadata": result["metadata"], "items": items}
    if query.get("fieldSelector") and path.startswith(f"/apis/{EVENTS_GROUP}/v1/namespaces/"):
        result = emu.handle("GET", path, query, None, "")
        if result.get("kind") == "EventList":
            result["items"] = [e for e in result["items"] if field_match(query["fieldSelector"], e)]
        return result
    return None

"""A small OpenAPI v3 validator (the subset CRD structural schemas use) and the schemas the emulator enforces.

* DynamoGraphDeploymentScalingAdapter: the ``openAPIV3Schema`` of the CRD in ``../shared/k8s/crds/``, loaded
  as is.
* DynamoGraphDeployment: no CRD is shipped, so the schema below is derived from the example manifests in
  ``../shared/k8s/examples/`` (every field those manifests use at the levels the planner touches; deeper
  levels are kept as ``x-kubernetes-preserve-unknown-fields``). ``test_k8s_emulator.py`` checks that every
  example validates.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "DGD_SCHEMA",
    "SHARED_K8S",
    "crd_schema",
    "load_crd",
    "validate",
]

SHARED_K8S = Path(os.environ.get("FPM_SHARED_K8S", Path(__file__).resolve().parents[4] / "shared" / "k8s"))

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1

_PRESERVE = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}

_SERVICE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "x-kubernetes-preserve-unknown-fields": True,
    "properties": {
        "componentType": {"type": "string", "enum": ["main", "worker", "planner", "frontend", "epp"]},
        "subComponentType": {"type": "string", "enum": ["prefill", "decode"]},
        "replicas": {"type": "integer", "format": "int32", "minimum": 0},
        "envFromSecret": {"type": "string"},
        "envs": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name"],
                "properties": {"name": {"type": "string", "minLength": 1}, "value": {"type": "string"}},
            },
        },
        "livenessProbe": _PRESERVE,
        "readinessProbe": _PRESERVE,
        "resources": _PRESERVE,
        "extraPodSpec": _PRESERVE,
    },
}

DGD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
        "spec": {
            "type": "object",
            "required": ["services"],
            "properties": {
                "envs": _SERVICE_SCHEMA["properties"]["envs"],
                "backendFramework": {"type": "string"},
                "services": {"type": "object", "additionalProperties": _SERVICE_SCHEMA},
            },
            "x-kubernetes-preserve-unknown-fields": True,
        },
        "status": {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": True,
            "properties": {
                "state": {"type": "string"},
                "conditions": {"type": "array", "items": _PRESERVE},
                "services": {
                    "type": "object",
                    "additionalProperties": {
                        "type": "object",
                        "properties": {
                            "componentKind": {"type": "string"},
                            "componentName": {"type": "string"},
                            "replicas": {"type": "integer", "minimum": 0},
                            "updatedReplicas": {"type": "integer", "minimum": 0},
                            "readyReplicas": {"type": "integer", "minimum": 0},
                            "availableReplicas": {"type": "integer", "minimum": 0},
                        },
                    },
                },
            },
        },
    },
    "required": ["spec"],
}


def load_crd(path: Path) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    if len(docs) != 1 or docs[0].get("kind") != "CustomResourceDefinition":
        raise ValueError(f"{path}: expected one CustomResourceDefinition")
    crd: dict[str, Any] = docs[0]
    return crd


def crd_schema(crd: dict[str, Any], version: str) -> dict[str, Any]:
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            schema: dict[str, Any] = v["schema"]["openAPIV3Schema"]
            return schema
    raise KeyError(f"CRD {crd['metadata']['name']} has no version {version}")


_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "boolean": (bool,),
    "integer": (int,),
    "number": (int, float),
}


def validate(schema: dict[str, Any], value: Any, path: str = "") -> list[str]:
    """Errors (``"spec.replicas: must be >= 0"``) of ``value`` against ``schema``; empty when valid."""
    errors: list[str] = []
    where = path or "<root>"
    kind = schema.get("type")
    if kind is not None:
        ok = isinstance(value, _TYPES[kind]) and not (kind in ("integer", "number") and isinstance(value, bool))
        if not ok:
            return [f"{where}: expected {kind}, got {type(value).__name__} {value!r}"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{where}: {value!r} not one of {schema['enum']}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{where}: must be >= {schema['minimum']}, got {value}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{where}: must be <= {schema['maximum']}, got {value}")
        if schema.get("format") == "int32" and not _INT32_MIN <= value <= _INT32_MAX:
            errors.append(f"{where}: out of int32 range: {value}")
    if isinstance(value, str) and "minLength" in schema and len(value) < schema["minLength"]:
        errors.append(f"{where}: must have at least {schema['minLength']} characters")
    if isinstance(value, dict):
        for req in schema.get("required", []):
            if req not in value:
                errors.append(f"{path + '.' if path else ''}{req}: Required value")
        props: dict[str, Any] = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            sub = f"{path}.{key}" if path else key
            if key in props:
                errors.extend(validate(props[key], item, sub))
            elif isinstance(extra, dict):
                errors.extend(validate(extra, item, sub))
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            errors.extend(validate(schema["items"], item, f"{path}[{i}]"))
    return errors

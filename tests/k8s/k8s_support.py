"""Helpers for the Kubernetes tests: objects to load into the emulator, a sleep that only records."""

from __future__ import annotations

from typing import Any

import yaml

from tests.fakes.k8s_api.schema import SHARED_K8S

__all__ = ["NS", "FakeSleep", "adapter", "deployment", "example_dgd"]

NS = "llm"


class FakeSleep:
    """Records the waits asked for instead of sleeping."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


def example_dgd(name: str = "dgd_vllm_disagg.yaml") -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((SHARED_K8S / "examples" / name).read_text())
    doc["metadata"]["namespace"] = NS
    return doc


def adapter(dgd: str, service: str, replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "DynamoGraphDeploymentScalingAdapter",
        "metadata": {"name": f"{dgd}-{service}".lower(), "namespace": NS},
        "spec": {"dgdRef": {"name": dgd, "serviceName": service}, "replicas": replicas},
    }


def deployment(name: str, replicas: int, kind: str = "Deployment") -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {"name": name, "namespace": NS, "labels": {"app": name}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]},
            },
        },
        "status": {
            "replicas": replicas,
            "readyReplicas": replicas,
            "availableReplicas": replicas,
            "updatedReplicas": replicas,
        },
    }

"""The API emulator itself, driven through the official client: the shared manifests and CRD validate, the
REST semantics the planner relies on hold (resourceVersion preconditions, 409, 410 on compacted watches), and
bad objects are refused with the field named."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import watch as k8s_watch

from tests.fakes.k8s_api import Fault, K8sApiEmulator
from tests.fakes.k8s_api.schema import DGD_SCHEMA, SHARED_K8S, crd_schema, load_crd, validate
from tests.fakes.k8s_api.server import label_match, merge_patch
from tests.k8s.k8s_support import NS, adapter, example_dgd

pytestmark = pytest.mark.kubernetes

EXAMPLES = sorted(p.name for p in (SHARED_K8S / "examples").glob("*.yaml"))
G, V = "nvidia.com", "v1alpha1"


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_example_manifest_validates_and_loads(
    name: str, emulator: K8sApiEmulator, api_client: k8s.ApiClient
) -> None:
    doc = example_dgd(name)
    assert validate(DGD_SCHEMA, doc) == []
    created = k8s.CustomObjectsApi(api_client).create_namespaced_custom_object(G, V, NS, "dynamographdeployments", doc)
    assert created["spec"]["services"] == doc["spec"]["services"]
    assert created["metadata"]["resourceVersion"]


def test_examples_exist() -> None:
    assert len(EXAMPLES) >= 3  # the schema is derived from these; losing them would make validation vacuous


def test_adapter_crd_schema_is_enforced(emulator: K8sApiEmulator, api_client: k8s.ApiClient) -> None:
    api = k8s.CustomObjectsApi(api_client)
    api.create_namespaced_custom_object(
        G, V, NS, "dynamographdeploymentscalingadapters", adapter("vllm-disagg", "decode", 1)
    )
    bad = adapter("vllm-disagg", "prefill", -1)
    with pytest.raises(k8s.ApiException) as err:
        api.create_namespaced_custom_object(G, V, NS, "dynamographdeploymentscalingadapters", bad)
    assert err.value.status == 422 and "spec.replicas" in str(err.value.body)
    missing = adapter("vllm-disagg", "prefill", 1)
    del missing["spec"]["dgdRef"]["serviceName"]
    with pytest.raises(k8s.ApiException) as err:
        api.create_namespaced_custom_object(G, V, NS, "dynamographdeploymentscalingadapters", missing)
    assert err.value.status == 422 and "serviceName" in str(err.value.body)
    schema = crd_schema(load_crd(SHARED_K8S / "crds" / "nvidia.com_dynamographdeploymentscalingadapters.yaml"), V)
    assert validate(schema, adapter("x", "y", 2)) == []


@pytest.mark.parametrize(
    "patch,field",
    [
        ({"spec": {"services": {"decode": {"replicas": -1}}}}, "spec.services.decode.replicas"),
        ({"spec": {"services": {"decode": {"replicas": "two"}}}}, "spec.services.decode.replicas"),
        ({"spec": {"services": {"decode": {"componentType": "gpu"}}}}, "spec.services.decode.componentType"),
        ({"spec": {"services": None}}, "spec.services"),
    ],
)
def test_dgd_patches_that_break_the_schema_are_refused(
    patch: dict[str, Any], field: str, emulator: K8sApiEmulator, api_client: k8s.ApiClient
) -> None:
    api = k8s.CustomObjectsApi(api_client)
    api.create_namespaced_custom_object(G, V, NS, "dynamographdeployments", example_dgd())
    with pytest.raises(k8s.ApiException) as err:
        api.patch_namespaced_custom_object(
            G, V, NS, "dynamographdeployments", "vllm-disagg", patch, _content_type="application/merge-patch+json"
        )
    assert err.value.status == 422 and field in str(err.value.body)
    stored = emulator.get("dynamographdeployments", NS, "vllm-disagg")
    assert stored is not None and stored["spec"]["services"]["decode"]["replicas"] == 1  # nothing lost


def test_stale_resource_version_conflicts(emulator: K8sApiEmulator, api_client: k8s.ApiClient) -> None:
    api = k8s.CustomObjectsApi(api_client)
    api.create_namespaced_custom_object(G, V, NS, "dynamographdeployments", example_dgd())
    first = api.get_namespaced_custom_object(G, V, NS, "dynamographdeployments", "vllm-disagg")
    stale = first["metadata"]["resourceVersion"]
    api.patch_namespaced_custom_object(
        G,
        V,
        NS,
        "dynamographdeployments",
        "vllm-disagg",
        {"spec": {"services": {"decode": {"replicas": 2}}}},
        _content_type="application/merge-patch+json",
    )
    with pytest.raises(k8s.ApiException) as err:
        api.patch_namespaced_custom_object(
            G,
            V,
            NS,
            "dynamographdeployments",
            "vllm-disagg",
            {"metadata": {"resourceVersion": stale}, "spec": {"services": {"decode": {"replicas": 5}}}},
            _content_type="application/merge-patch+json",
        )
    assert err.value.status == 409
    with pytest.raises(k8s.ApiException) as err:
        api.create_namespaced_custom_object(G, V, NS, "dynamographdeployments", example_dgd())
    assert err.value.status == 409 and "already exists" in str(err.value.body)


def test_strategic_merge_patch_is_refused_on_custom_resources(
    emulator: K8sApiEmulator, api_client: k8s.ApiClient
) -> None:
    api = k8s.CustomObjectsApi(api_client)
    api.create_namespaced_custom_object(G, V, NS, "dynamographdeployments", example_dgd())
    with pytest.raises(k8s.ApiException) as err:  # as on a real cluster: CRs take no strategic merge patch
        api.patch_namespaced_custom_object(
            G,
            V,
            NS,
            "dynamographdeployments",
            "vllm-disagg",
            {"spec": {"services": {"decode": {"replicas": 2}}}},
            _content_type="application/strategic-merge-patch+json",
        )
    assert err.value.status == 415


def test_watch_resumes_and_answers_410_once_compacted(emulator: K8sApiEmulator, api_client: k8s.ApiClient) -> None:
    core = k8s.CoreV1Api(api_client)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p-0", "labels": {"a": "b"}},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
    }
    listed = core.list_namespaced_pod(NS)
    rv = listed.metadata.resource_version
    core.create_namespaced_pod(NS, pod)
    events = list(k8s_watch.Watch().stream(core.list_namespaced_pod, NS, resource_version=rv, timeout_seconds=1))
    assert [(e["type"], e["object"].metadata.name) for e in events] == [("ADDED", "p-0")]
    emulator.compact()
    with pytest.raises(k8s.ApiException) as err:
        list(k8s_watch.Watch().stream(core.list_namespaced_pod, NS, resource_version=rv, timeout_seconds=1))
    assert err.value.status == 410


def test_faults_are_injected_and_consumed(emulator: K8sApiEmulator, api_client: k8s.ApiClient) -> None:
    core = k8s.CoreV1Api(api_client)
    fault = emulator.inject(Fault("GET", r"/pods$", status=429, retry_after_s=7, times=1))
    with pytest.raises(k8s.ApiException) as err:
        core.list_namespaced_pod(NS)
    assert err.value.status == 429 and err.value.headers["Retry-After"] == "7"
    core.list_namespaced_pod(NS)  # consumed
    assert fault.hits == 1


def test_merge_patch_and_selectors() -> None:
    assert merge_patch({"a": {"b": 1, "c": 2}}, {"a": {"b": None, "d": 3}}) == {"a": {"c": 2, "d": 3}}
    labels = {"role": "decode", "tier": "gpu"}
    assert label_match("role=decode,tier", labels)
    assert label_match("role in (prefill, decode),!missing", labels)
    assert not label_match("role notin (decode)", labels)
    assert not label_match("tier!=gpu", labels)

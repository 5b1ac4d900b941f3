"""Every actuator refuses to overwrite a count it did not expect (issue 12 item 4): a ScaleRequest carries
``expected_replicas`` and the Kubernetes actuator (DGD scaling adapter, DGD patch, Deployment and StatefulSet
scale, against the API emulator with the official client), the local and the advisory actuator compare it
with the target's current count before writing."""

from __future__ import annotations

import pytest
from kubernetes import client as k8s

from planner.actuators.advisory import AdvisoryActuator
from planner.actuators.base import OutcomeKind, ReplicaBounds, ScaleRequest
from planner.actuators.kubernetes import KubernetesActuator, KubernetesActuatorConfig, ScaleTarget, TargetKind
from planner.actuators.local import LocalActuator
from planner.sim.engine import EngineConfig
from planner.sim.fleet import FleetConfig, SimFleet
from planner.sim.realtime import RealtimeReplay
from planner.sim.timing import ProfileFitTimer
from planner.sim.traces import synthetic_trace
from tests.fakes.k8s_api import K8sApiEmulator
from tests.k8s.k8s_support import NS, FakeSleep, adapter, deployment, example_dgd

pytestmark = pytest.mark.kubernetes

BOUNDS = ReplicaBounds(min_replicas=0, max_replicas=16)
TARGETS = (
    ScaleTarget(service="decode", kind=TargetKind.DGD, name="vllm-disagg", bounds=BOUNDS),  # via the adapter
    ScaleTarget(service="prefill", kind=TargetKind.DGD, name="vllm-disagg", bounds=BOUNDS),  # DGD patch
    ScaleTarget(service="agg", kind=TargetKind.DEPLOYMENT, name="vllm-agg", bounds=BOUNDS),
    ScaleTarget(service="sts", kind=TargetKind.STATEFULSET, name="vllm-sts", bounds=BOUNDS),
)


def current(emu: K8sApiEmulator, service: str) -> int:
    if service in ("decode", "prefill"):
        obj = emu.get("dynamographdeployments", NS, "vllm-disagg")
        assert obj is not None
        return int(obj["spec"]["services"][service]["replicas"])
    plural, name = ("deployments", "vllm-agg") if service == "agg" else ("statefulsets", "vllm-sts")
    obj = emu.get(plural, NS, name)
    assert obj is not None
    return int(obj["spec"]["replicas"])


@pytest.fixture
def cluster(emulator: K8sApiEmulator) -> K8sApiEmulator:
    dgd = example_dgd()
    for service in ("decode", "prefill"):
        dgd["spec"]["services"][service]["replicas"] = 8
    emulator.put(dgd)
    emulator.put(adapter("vllm-disagg", "decode", 8))
    emulator.put(deployment("vllm-agg", 8))
    emulator.put(deployment("vllm-sts", 8, kind="StatefulSet"))
    emulator.requests.clear()
    return emulator


@pytest.mark.parametrize("service", ["decode", "prefill", "agg", "sts"])
def test_a_request_expecting_another_count_writes_nothing(
    cluster: K8sApiEmulator, api_client: k8s.ApiClient, service: str
) -> None:
    act = KubernetesActuator(api_client, KubernetesActuatorConfig(namespace=NS, targets=TARGETS), sleep=FakeSleep())
    out = act.scale(ScaleRequest(service=service, replicas=6, expected_replicas=4))
    assert (out.kind, out.applied, out.previous) == (OutcomeKind.CURRENT_MISMATCH, False, 8)
    assert "holds 8 replicas, not the 4" in out.message
    assert [m for m, _ in cluster.requests if m in ("PUT", "PATCH", "POST")] == []
    assert current(cluster, service) == 8
    # the same request expecting what is there goes through
    ok = act.scale(ScaleRequest(service=service, replicas=6, expected_replicas=8))
    assert (ok.kind, ok.applied, ok.previous) == (OutcomeKind.APPLIED, True, 8)
    assert current(cluster, service) == 6


def test_the_advisory_actuator_reading_the_cluster_refuses_a_mismatch_too(
    cluster: K8sApiEmulator, api_client: k8s.ApiClient
) -> None:
    reader = KubernetesActuator(api_client, KubernetesActuatorConfig(namespace=NS, targets=TARGETS))
    act = AdvisoryActuator({"agg": BOUNDS}, reader=reader)
    assert act.scale(ScaleRequest(service="agg", replicas=6, expected_replicas=4)).kind is OutcomeKind.CURRENT_MISMATCH
    assert act.scale(ScaleRequest(service="agg", replicas=6, expected_replicas=8)).kind is OutcomeKind.ADVISORY


def test_the_advisory_actuator_refuses_an_expectation_it_cannot_compare(
    cluster: K8sApiEmulator, api_client: k8s.ApiClient
) -> None:
    cluster.delete("deployments", NS, "vllm-agg")  # the reader's status now fails (404)
    reader = KubernetesActuator(api_client, KubernetesActuatorConfig(namespace=NS, targets=TARGETS))
    act = AdvisoryActuator({"agg": BOUNDS}, reader=reader)
    out = act.scale(ScaleRequest(service="agg", replicas=6, expected_replicas=8))
    assert out.kind is OutcomeKind.CURRENT_MISMATCH and "cannot be compared" in out.message


def test_the_local_actuator_refuses_a_mismatch() -> None:
    timer = ProfileFitTimer(base_s=0.010, a_p=0.0001, a_attn=0.0, a_d=0.001, a_kv=0.0)
    fleet = SimFleet(FleetConfig(engine=EngineConfig(prefix_cache=False)), timer)
    trace = synthetic_trace(rate_per_s=[(10.0, 1.0)], isl=100, osl=5)
    act = LocalActuator(RealtimeReplay(fleet, trace, initial_replicas=3, clock=lambda: 100.0), max_replicas=16)
    service = "sim-agg"
    out = act.scale(ScaleRequest(service=service, replicas=1, expected_replicas=5))
    assert (out.kind, out.applied, out.previous) == (OutcomeKind.CURRENT_MISMATCH, False, 3)
    assert act.status()[service].desired == 3
    assert act.scale(ScaleRequest(service=service, replicas=5, expected_replicas=3)).applied
    assert act.status()[service].desired == 5

"""The Kubernetes actuator against the API emulator: DGD scaling adapter, DGD patch fallback, apps/v1 scale,
status, hard bounds, and every fault the API server can answer with."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client as k8s

from planner.actuators.advisory import AdvisoryActuator
from planner.actuators.base import (
    Actuator,
    ForbiddenError,
    NotFoundError,
    OutcomeKind,
    ReplicaBounds,
    ScaleRequest,
    UnknownServiceError,
)
from planner.actuators.kubernetes import (
    KubernetesActuator,
    KubernetesActuatorConfig,
    ScaleTarget,
    TargetKind,
    from_options,
)
from planner.errors import ConfigError
from tests.fakes.k8s_api import Fault, K8sApiEmulator
from tests.k8s.k8s_support import NS, FakeSleep, adapter, deployment, example_dgd

pytestmark = pytest.mark.kubernetes

BOUNDS = ReplicaBounds(min_replicas=1, max_replicas=8)
DECODE = ScaleTarget(service="decode", kind=TargetKind.DGD, name="vllm-disagg", bounds=BOUNDS)
PREFILL = ScaleTarget(service="prefill", kind=TargetKind.DGD, name="vllm-disagg", bounds=BOUNDS)
AGG_DEPLOY = ScaleTarget(service="agg", kind=TargetKind.DEPLOYMENT, name="vllm-agg", bounds=BOUNDS)
STS = ScaleTarget(service="sts", kind=TargetKind.STATEFULSET, name="vllm-sts", bounds=BOUNDS)


def make_actuator(api: k8s.ApiClient, sleep: FakeSleep, **overrides: Any) -> KubernetesActuator:
    cfg = KubernetesActuatorConfig(namespace=NS, targets=(DECODE, PREFILL, AGG_DEPLOY, STS), **overrides)
    return KubernetesActuator(api, cfg, sleep=sleep)


def dgd_replicas(emu: K8sApiEmulator, service: str) -> int:
    obj = emu.get("dynamographdeployments", NS, "vllm-disagg")
    assert obj is not None
    return int(obj["spec"]["services"][service]["replicas"])


def writes(emu: K8sApiEmulator) -> list[tuple[str, str]]:
    return [(m, p) for m, p in emu.requests if m in ("PUT", "PATCH", "POST")]


@pytest.fixture
def cluster(emulator: K8sApiEmulator) -> K8sApiEmulator:
    emulator.put(example_dgd())
    emulator.put(adapter("vllm-disagg", "decode", 1))
    emulator.put(deployment("vllm-agg", 2))
    emulator.put(deployment("vllm-sts", 1, kind="StatefulSet"))
    emulator.requests.clear()
    return emulator


def test_is_an_actuator(api_client: k8s.ApiClient, fake_sleep: FakeSleep) -> None:
    assert isinstance(make_actuator(api_client, fake_sleep), Actuator)
    assert isinstance(AdvisoryActuator({"decode": BOUNDS}), Actuator)


def test_scale_through_the_adapter_reaches_the_dgd(
    cluster: K8sApiEmulator, api_client: k8s.ApiClient, fake_sleep: FakeSleep
) -> None:
    out = make_actuator(api_client, fake_sleep).scale(ScaleRequest(service="decode", replicas=3, reason="load"))
    assert (out.kind, out.applied, out.previous, out.attempts) == (OutcomeKind.APPLIED, True, 1, 1)
    assert out.attempt_log[-1].method == "dgdsa.scale"
    ad = cluster.get("dynamographdeploymentscalingadapters", NS, "vllm-disagg-decode")
    assert ad is not None and ad["spec"]["replicas"] == 3
    assert dgd_replicas(cluster, "decode") == 3  # the emulated adapter controller propagated it
    # Only the adapter's scale subresource was written, never the DGD directly.
    assert writes(cluster) == [
        (
            "PUT",
            f"/apis/nvidia.com/v1alpha1/namespaces/{NS}/dynamographdeploymentscalingadapters/vllm-disagg-decode/scale",
        )
    ]


def test_without_an_adapter_the_dgd_is_merge_patched(
    cluster: K8sApiEmulator, api_client: k8s.ApiClient, fake_sleep: FakeSleep
) -> None:
    out = make_actuator(api_client, fake_sleep).scale(ScaleRequest(service="prefill", replicas=4))
    assert (out.kind, out.applied, out.previous) == (OutcomeKind.APPLIED, True, 1)
    assert out.attempt_log[-1].method == "dgd.patch"
    assert dgd_replicas(cluster, "prefill") == 4
    assert dgd_replicas(cluster, "decode") == 1  # the patch touched only its own service
    obj = cluster.get("dynamographdeployments", NS, "vllm-disagg")
    assert obj is not None and obj["spec"]["services"]["prefill"]["componentType"] == "worker"


def test_same_count_writes_nothing(cluster: K8sApiEmulator, api_client: k8s.ApiClient, fake_sleep: FakeSleep) -> None:
    out = make_actuator(api_client, fake_sleep).scale(ScaleRequest(service="decode", replicas=1))
    assert (out.kind, out.applied) == (OutcomeKind.UNCHANGED, False)
    assert writes(cluster) == []


@pytest.mark.parametrize(
    "target,kind,plural", [("agg", "Deployment", "deployments"), ("sts", "StatefulSet", "statefulsets")]
)
def test_apps_v1_scale_subresource(
    cluster: K8sApiEmulator,
    api_client: k8s.ApiClient,
    fake_sleep: FakeSleep,
    target: str,
    kind: str,
    plural: str,
) -> None:
    name = "vllm-agg" if target == "agg" else "vllm-sts"
    out = make_actuator(api_client, fake_sleep).scale(ScaleRequest(service=target, replicas=5))
    assert (out.kind, out.applied) == (OutcomeKind.APPLIED, True)
    obj = cluster.get(plural, NS, name)
    assert obj is not None and obj["spec"]["replicas"] == 5 and obj["kind"] == kind
    assert writes(cluster) == [("PUT", f"/apis/apps/v1/namespaces/{NS}/{plural}/{name}/scale")]


@pytest.mark.parametrize("replicas", [0, 9, -1, 1000])
def test_never_writes_outside_the_hard_bound(
    cluster: K8sApiEmulator, api_client: k8s.ApiClient, fake_sleep: FakeSleep, replicas: int
) -> None:
    act = make_actuator(api_client, fake_sleep)
    for service in ("decode", "prefill", "agg", "sts"):
        out = act.scale(ScaleRequest(service=service, replicas=replicas))
        assert (out.kind, out.applied, out.attempts) == (OutcomeKind.OUT_OF_BOUNDS, False, 0)
        assert "[1, 8]" in out.message
    assert cluster.requests == []  # not even a read
    assert len(act.history) == 4  # but every refusal is recorded


def test_unknown_service_is_a_programming_error(api_client: k8s.ApiClient, fake_sleep: FakeSleep) -> None:
    with pytest.raises(UnknownServiceError, match="nope"):
        make_actuator(api_client, fake_sleep).scale(ScaleRequest(service="nope", replicas=2))


def test_status_from_dgd_status_services_and_deployment_status(
    cluster: K8sApiEmulator, api_client: k8s.ApiClient, fake_sleep: FakeSleep
) -> None:
    cluster.patch_status(
        "dynamographdeployments",
        NS,
        "vllm-disagg",
        {
            "state": "successful",
            "conditions": [{"type": "Ready", "status": "True"}],
            "services": {
                "decode": {
                    "componentKind": "PodClique",
                    "componentName": "vllm-disagg-decode",
                    "replicas": 1,
                    "updatedReplicas": 1,
                    "readyReplicas": 1,
                },
                "prefill": {
                    "componentKind": "Deployment",
                    "componentName": "vllm-disagg-prefill",
                    "replicas": 1,
                    "updatedReplicas": 0,
                    "readyReplicas": 1,
                    "availableReplicas": 0,
                },
            },
        },
    )
    cluster.patch_status(
        "deployments", NS, "vllm-agg", {"readyReplicas": 1, "availableReplicas": 1, "updatedReplicas": 2}
    )
    act = make_actuator(api_client, fake_sleep)
    act.scale(ScaleRequest(service="decode", replicas=2))
    st = act.status()
    assert (st["decode"].desired, st["decode"].ready, st["decode"].available, st["decode"].updated) == (
        2,
        1,
        1,
        1,
    )
    assert st["decode"].ready_state is True and st["decode"].state == "successful"
    assert (st["prefill"].desired, st["prefill"].ready, st["prefill"].available, st["prefill"].updated) == (
        1,
        1,
        0,
        0,
    )
    assert (st["agg"].desired, st["agg"].ready, st["agg"].available, st["agg"].updated) == (2, 1, 1, 2)
    assert st["sts"].desired == 1


def test_status_of_a_missing_dgd_raises_not_found(
    emulator: K8sApiEmulator, api_client: k8s.ApiClient, fake_sleep: FakeSleep
) -> None:
    cfg = KubernetesActuatorConfig(namespace=NS, targets=(DECODE,))
    with pytest.raises(NotFoundError, match="vllm-disagg"):
        KubernetesActuator(api_client, cfg, sleep=fake_sleep).status()


def test_not_ready_dgd_defers_scale_up_but_lowers_a_target(
    cluster: K8sApiEmulator, api_client: k8s.ApiClient, fake_sleep: FakeSleep
) -> None:
    cluster.patch_status(
        "dynamographdeployments",
        NS,
        "vllm-disagg",
        {"state": "pending", "conditions": [{"type": "Ready", "status": "False", "reason": "PodsPending"}]},
    )
    act = make_actuator(api_client, fake_sleep)
    up = act.scale(ScaleRequest(service="prefill", replicas=6))
    assert (up.kind, up.applied, up.transient) == (OutcomeKind.NOT_READY, False, True)
    assert "not Ready" in up.message and "pending" in up.message
    assert dgd_replicas(cluster, "prefill") == 1
    assert writes(cluster) == []
    # An earlier scale-up to 6 whose pods stay Pending: the target can still be lowered.
    cluster.put(adapter("vllm-disagg", "decode", 6))
    down = act.scale(ScaleRequest(service="decode", replicas=2))
    assert (down.kind, down.applied, down.previous) == (OutcomeKind.APPLIED, True, 6)
    assert dgd_replicas(cluster, "decode") == 2


# ------------------------------------------------------------------------------------------------ faults
def test_conflict_is_retried_with_a_fresh_resource_version(
    cluster: K8sApiEmulator, api_client: k8s.ApiClient, fake_sleep: FakeSleep
) -> None:
    cluster.inject(Fault("PUT", r"/scale$", status=409, times=2))
    out = make_actuator(api_client, fake_sleep).scale(ScaleRequest(service="decode", replicas=3))
    assert (out.kind, out.applied, out.attempts) == (OutcomeKind.APPLIED, True, 3)
    assert [a.outcome for a in out.attempt_log] == [
        OutcomeKind.CONFLICT,
        OutcomeKind.CONFLICT,
        OutcomeKind.APPLIED,
    ]
    assert fake_sleep.waits == []  # conflicts are retried at once
    # Each retry read the object again before writing.
    scale_reads = [p for m, p in cluster.requests if m == "GET" and p.endswith("/scale")]
    assert len(scale_reads) == 3


def test_a_real_concurrent_write_causes_a_conflict_then_succeeds(
    cluster: K8sApiEmulator, api_client: k8s.ApiClient, fake_sleep: FakeSleep
) -> None:
    # Someone else bumps the DGD between our read and our patch: inject that as a delayed-free interleaving
    # by writing through the emulator after our GET (a fault that fires on the PATCH and mutates first).
    original = cluster.handle

    def racing(method: str, path: str, query: dict[str, str], body: Any, ctype: str) -> dict[str, Any]:
        if method == "PATCH" and not racing.done:  # type: ignore[attr-defined]
            racing.done = True  # type: ignore[attr-defined]
            cluster.patch_status("dynamographdeployments", NS, "vllm-disagg", {"state": "successful"})
        return original(method, path, query, body, ctype)

    racing.done = False  # type: ignore[attr-defined]
    cluster.handle = racing  # type: ignore[method-assign]
    out = make_actuator(api_client, fake_sleep).scale(ScaleRequest(service="prefill", replicas=2))
    assert (out.kind, out.attempts) == (OutcomeKind.APPLIED, 2)
    assert out.attempt_log[0].outcome is OutcomeKind.CONFLICT and out.attempt_log[0].http_status == 409
    assert dgd_replicas(cluster, "prefill") == 2


def test_throttled_waits_for_retry_after(
    cluster: K8sApiEmulator, api_client: k8s.ApiClient, fake_sleep: FakeSleep
) -> None:
    cluster.inject(Fault("PUT", r"/scale$", status=429, retry_after_s=3))
    out = make_actuator(api_client, fake_sleep).scale(ScaleRequest(service="agg", replicas=3))
    assert (out.kind, out.applied, out.attempts) == (OutcomeKind.APPLIED, True, 2)
    assert fake_sleep.waits == [3.0]
    assert out.attempt_log[0].outcome is OutcomeKind.THROTTLED and out.attempt_log[0].backoff_s == 3.0


def test_a_long_retry_after_is_handed_back_not_slept(
    cluster: K8sApiEmulator, api_client: k8s.ApiClient, fake_sleep: FakeSleep
) -> None:
    cluster.inject(Fault("PUT", r"/scale$", status=429, retry_after_s=120))
    out = make_actuator(api_client, fake_sleep).scale(ScaleRequest(service="agg", replicas=3))
    assert (out.kind, out.applied, out.retry_after_s, out.transient) == (
        OutcomeKind.THROTTLED,
        False,
        120,
        True,
    )
    assert fake_sleep.waits == []
    obj = cluster.get("deployments", NS, "vllm-agg")
    assert obj is not None and obj["spec"]["replicas"] == 2


def test_server_errors_back_off_exponentially_then_succeed(
    cluster: K8sApiEmulator, api_client: k8s.ApiClient, fake_sleep: FakeSleep
) -> None:
    cluster.inject(Fault("PUT", r"/scale$", status=500, times=2))
    out = make_actuator(api_client, fake_sleep, backoff_initial_s=0.5).scale(ScaleRequest(service="decode", replicas=2))
    assert (out.kind, out.applied, out.attempts) == (OutcomeKind.APPLIED, True, 3)
    assert fake_sleep.waits == [0.5, 1.0]


def test_persistent_server_errors_give_up_and_say_so(
    cluster: K8sApiEmulator, api_client: k8s.ApiClient, fake_sleep: FakeSleep
) -> None:
    cluster.inject(Fault("*", r"vllm-disagg", status=503, times=None))
    out = make_actuator(api_client, fake_sleep, max_attempts=3).scale(ScaleRequest(service="decode", replicas=2))
    assert (out.kind, out.applied, out.attempts, out.transient) == (OutcomeKind.SERVER_ERROR, False, 3, True)
    assert "gave up after 3" in out.message
    assert len(fake_sleep.waits) == 2
    assert dgd_replicas(cluster, "decode") == 1


def test_timeouts_are_transient_and_retried(
    cluster: K8sApiEmulator, api_client: k8s.ApiClient, fake_sleep: FakeSleep
) -> None:
    cluster.inject(Fault("PUT", r"/scale$", status=None, delay_s=1.5))
    act = make_actuator(api_client, fake_sleep, request_timeout_s=0.5)
    out = act.scale(ScaleRequest(service="agg", replicas=4))
    assert out.attempt_log[0].outcome is OutcomeKind.TIMEOUT
    assert (out.kind, out.applied) == (OutcomeKind.APPLIED, True)
    obj = cluster.get("deployments", NS, "vllm-agg")
    assert obj is not None and obj["spec"]["replicas"] == 4


def test_forbidden_names_the_verb_and_resource_and_is_not_retried(
    cluster: K8sApiEmulator, api_client: k8s.ApiClient, fake_sleep: FakeSleep
) -> None:
    cluster.rbac_rules = [
        {"apiGroups": ["nvidia.com"], "resources": ["dynamographdeployments"], "verbs": ["get"]},
        {
            "apiGroups": ["nvidia.com"],
            "resources": ["dynamographdeploymentscalingadapters/scale"],
            "verbs": ["get"],
        },
    ]
    out = make_actuator(api_client, fake_sleep).scale(ScaleRequest(service="decode", replicas=2))
    assert (out.kind, out.applied, out.attempts, out.transient) == (OutcomeKind.FORBIDDEN, False, 1, False)
    assert "'update'" in out.message and "dynamographdeploymentscalingadapters/scale" in out.message
    assert out.attempt_log[0].http_status == 403
    assert fake_sleep.waits == []


def test_forbidden_status_read_raises_forbidden_error(
    cluster: K8sApiEmulator, api_client: k8s.ApiClient, fake_sleep: FakeSleep
) -> None:
    cluster.rbac_rules = []
    with pytest.raises(ForbiddenError) as err:
        make_actuator(api_client, fake_sleep).status()
    assert err.value.verb == "get" and err.value.resource == "dynamographdeployments"


def test_invalid_is_permanent(cluster: K8sApiEmulator, api_client: k8s.ApiClient, fake_sleep: FakeSleep) -> None:
    cluster.inject(Fault("PATCH", r"dynamographdeployments/vllm-disagg$", status=422, message="bad"))
    out = make_actuator(api_client, fake_sleep).scale(ScaleRequest(service="prefill", replicas=2))
    assert (out.kind, out.applied, out.attempts) == (OutcomeKind.INVALID, False, 1)


def test_missing_dgd_is_not_found(emulator: K8sApiEmulator, api_client: k8s.ApiClient, fake_sleep: FakeSleep) -> None:
    out = make_actuator(api_client, fake_sleep).scale(ScaleRequest(service="decode", replicas=2))
    assert (out.kind, out.applied, out.transient) == (OutcomeKind.NOT_FOUND, False, False)
    assert "vllm-disagg" in out.message


def test_fault_storm_never_writes_outside_bounds(
    cluster: K8sApiEmulator, api_client: k8s.ApiClient, fake_sleep: FakeSleep
) -> None:
    """Faults of every kind interleaved with requests in and out of bounds: every write that landed is inside
    the bound and every request has an outcome."""
    faults = [Fault("PUT", r"/scale$", status=s, times=1, retry_after_s=1) for s in (409, 429, 500, 409, 503)]
    act = make_actuator(api_client, fake_sleep)
    seen: list[int] = []
    for i, replicas in enumerate([2, 0, 9, 5, 3, 12, 8, 1, -3, 4]):
        if i < len(faults):
            cluster.inject(faults[i])
        out = act.scale(ScaleRequest(service="decode", replicas=replicas))
        assert out.requested == replicas
        if 1 <= replicas <= 8:
            assert out.kind in (OutcomeKind.APPLIED, OutcomeKind.UNCHANGED), out
        else:
            assert out.kind is OutcomeKind.OUT_OF_BOUNDS
        ad = cluster.get("dynamographdeploymentscalingadapters", NS, "vllm-disagg-decode")
        assert ad is not None
        seen.append(ad["spec"]["replicas"])
    assert len(seen) == 10 and all(1 <= n <= 8 for n in seen)
    assert len(act.history) == 10


# ------------------------------------------------------------------------------------------------ advisory
def test_advisory_records_and_never_writes(
    cluster: K8sApiEmulator, api_client: k8s.ApiClient, fake_sleep: FakeSleep
) -> None:
    reader = make_actuator(api_client, fake_sleep)
    adv = AdvisoryActuator({"decode": BOUNDS, "agg": BOUNDS}, reader=reader)
    out = adv.scale(ScaleRequest(service="decode", replicas=6, reason="ttft"))
    assert (out.kind, out.applied, out.previous) == (OutcomeKind.ADVISORY, False, 1)
    assert adv.scale(ScaleRequest(service="agg", replicas=99)).kind is OutcomeKind.OUT_OF_BOUNDS
    assert writes(cluster) == []
    assert [o.requested for o in adv.history] == [6, 99]
    assert adv.status()["decode"].desired == 1


def test_advisory_without_a_reader_reports_its_fixed_counts() -> None:
    adv = AdvisoryActuator({"decode": BOUNDS}, replicas={"decode": 3})
    assert adv.status()["decode"].desired == 3
    assert adv.scale(ScaleRequest(service="decode", replicas=4)).previous == 3


# ------------------------------------------------------------------------------------------------ options
def test_from_options_builds_a_working_actuator(cluster: K8sApiEmulator) -> None:
    act = from_options(
        {
            "namespace": NS,
            "client": {"host": cluster.url},
            "targets": [
                {
                    "service": "decode",
                    "kind": "dgd",
                    "name": "vllm-disagg",
                    "min_replicas": 1,
                    "max_replicas": 4,
                }
            ],
        }
    )
    assert act.scale(ScaleRequest(service="decode", replicas=5)).kind is OutcomeKind.OUT_OF_BOUNDS
    assert act.scale(ScaleRequest(service="decode", replicas=4)).kind is OutcomeKind.APPLIED
    adv = from_options(
        {
            "namespace": NS,
            "advisory": True,
            "client": {"host": cluster.url},
            "targets": [{"service": "decode", "name": "vllm-disagg"}],
        }
    )
    assert adv.scale(ScaleRequest(service="decode", replicas=2)).kind is OutcomeKind.ADVISORY
    assert dgd_replicas(cluster, "decode") == 4


@pytest.mark.parametrize(
    "options,field",
    [
        ({"targets": []}, "namespace"),
        ({"namespace": NS, "targets": [{"service": "d", "name": "x", "kind": "daemonset"}]}, "kind"),
        (
            {
                "namespace": NS,
                "targets": [{"service": "d", "name": "x", "min_replicas": 5, "max_replicas": 2}],
            },
            "min_replicas",
        ),
        ({"namespace": NS, "targets": [], "bogus": 1}, "bogus"),
    ],
)
def test_from_options_rejects_bad_configuration(options: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        from_options(options)

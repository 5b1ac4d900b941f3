"""Pod discovery: the pod -> WorkerRecord contract (pure, table-driven), and list/watch/resume/relist against
the API emulator with the official client."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from planner.discovery import Discovery, EngineCapacity, Role, WorkerRecord
from planner.errors import DiscoveryError
from planner.k8s.discovery import PodDiscovery, PodDiscoveryConfig, PodIssue, pod_state
from tests.fakes.k8s_api import Fault, K8sApiEmulator
from tests.k8s.k8s_support import NS

pytestmark = pytest.mark.kubernetes


def pod(
    name: str,
    *,
    role: str | None = "decode",
    ip: str | None = "10.0.0.1",
    ready: bool = True,
    phase: str = "Running",
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    lab = dict(labels or {})
    if role is not None:
        lab["fpm-planner.io/role"] = role
    meta: dict[str, Any] = {"name": name, "namespace": NS, "labels": lab, "annotations": annotations or {}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status: dict[str, Any] = {
        "phase": phase,
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    if ip is not None:
        status["podIP"] = ip
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"nodeName": "node-1", "containers": [{"name": "vllm", "image": "vllm"}]},
        "status": status,
    }


# ---------------------------------------------------------------------------------------------- contract
CASES: list[tuple[str, dict[str, Any], PodIssue, bool]] = [
    ("ready decode pod with defaults", pod("d-0"), PodIssue.NONE, True),
    ("running but not Ready", pod("d-1", ready=False), PodIssue.NONE, False),
    ("being deleted is not ready", pod("d-2", deleting=True), PodIssue.NONE, False),
    ("pending without an IP", pod("d-3", ip=None, phase="Pending", ready=False), PodIssue.NO_IP, False),
    ("finished pod", pod("d-4", phase="Failed", ready=False), PodIssue.FINISHED, False),
    ("no role label", pod("d-5", role=None), PodIssue.MISSING_ROLE, True),
    ("unknown role", pod("d-6", role="router"), PodIssue.BAD_ROLE, True),
    (
        "non-integer port",
        pod("d-7", annotations={"fpm-planner.io/fpm-port": "abc"}),
        PodIssue.BAD_ANNOTATION,
        True,
    ),
    ("zero dp size", pod("d-8", annotations={"fpm-planner.io/dp-size": "0"}), PodIssue.BAD_ANNOTATION, True),
    (
        "ports past 65535",
        pod("d-9", annotations={"fpm-planner.io/fpm-port": "65535", "fpm-planner.io/dp-size": "2"}),
        PodIssue.BAD_ANNOTATION,
        True,
    ),
    (
        "negative capacity",
        pod("d-10", annotations={"fpm-planner.io/max-num-seqs": "-1"}),
        PodIssue.BAD_ANNOTATION,
        True,
    ),
]


@pytest.mark.parametrize("name,obj,issue,ready", CASES, ids=[c[0] for c in CASES])
def test_pod_contract(name: str, obj: dict[str, Any], issue: PodIssue, ready: bool) -> None:
    st = pod_state(obj)
    assert st.issue is issue, st.detail
    assert st.ready is ready
    assert (st.record is not None) is (issue is PodIssue.NONE)
    if issue is not PodIssue.NONE:
        assert st.detail


def test_pod_with_every_annotation() -> None:
    st = pod_state(
        pod(
            "p-0",
            role="prefill",
            ip="10.1.2.3",
            labels={"fpm-planner.io/service": "VllmPrefill"},
            annotations={
                "fpm-planner.io/worker-id": "ns/prefill/abc",
                "fpm-planner.io/fpm-port": "30000",
                "fpm-planner.io/dp-size": "2",
                "fpm-planner.io/max-num-batched-tokens": "4096",
                "fpm-planner.io/max-num-seqs": "64",
                "fpm-planner.io/max-model-len": "32768",
                "fpm-planner.io/kv-capacity-tokens": "500000",
            },
        )
    )
    assert st.record == WorkerRecord(
        worker_id="ns/prefill/abc",
        role=Role.PREFILL,
        service="VllmPrefill",
        dp_size=2,
        fpm_endpoints=("tcp://10.1.2.3:30000", "tcp://10.1.2.3:30001"),
        capacity=EngineCapacity(
            max_num_batched_tokens=4096, max_num_seqs=64, max_model_len=32768, kv_capacity_tokens=500000
        ),
    )


def test_defaults_pod_name_role_service_and_port() -> None:
    st = pod_state(pod("vllm-decode-7f9c", ip="10.0.0.9"))
    assert st.record is not None
    assert (st.record.worker_id, st.record.service, st.record.fpm_endpoints) == (
        "vllm-decode-7f9c",
        "decode",
        ("tcp://10.0.0.9:20380",),
    )


# ---------------------------------------------------------------------------------------------- live
class Waiter:
    """Wakes the test when discovery reports a change; waits are bounded by an event, not asserted on time."""

    def __init__(self) -> None:
        self.cond = threading.Condition()

    def notify(self) -> None:
        with self.cond:
            self.cond.notify_all()

    def until(self, predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
        with self.cond:
            if not self.cond.wait_for(predicate, timeout=timeout_s):
                raise AssertionError("condition not reached")


@pytest.fixture
def discovery(emulator: K8sApiEmulator, api_client: k8s.ApiClient) -> Iterator[tuple[PodDiscovery, Waiter]]:
    waiter = Waiter()
    disc = PodDiscovery(
        api_client,
        PodDiscoveryConfig(namespace=NS, watch_timeout_s=30, retry_backoff_s=0.05),
        on_change=waiter.notify,
    )
    yield disc, waiter
    disc.stop()


def test_list_then_watch_follows_pods(emulator: K8sApiEmulator, discovery: tuple[PodDiscovery, Waiter]) -> None:
    disc, waiter = discovery
    emulator.put(pod("d-0", ip="10.0.0.1"))
    emulator.put(pod("other", role=None, labels={"app": "frontend"}))  # not selected
    disc.start()
    waiter.until(lambda: "d-0" in disc.workers(0.0))
    source: Discovery = disc  # the runner sees it through the Discovery protocol
    assert set(source.workers(0.0)) == {"d-0"}
    assert "other" not in disc.pods()
    # A new pod, not ready yet, then ready; then deleted.
    emulator.put(pod("d-1", ip="10.0.0.2", ready=False))
    waiter.until(lambda: "d-1" in disc.workers(0.0))
    assert disc.readiness(0.0) == {"d-0": True, "d-1": False}
    assert disc.not_ready_workers(0.0) == ("d-1",)
    assert disc.not_ready_workers(0.0, service="prefill") == ()
    emulator.put(pod("d-1", ip="10.0.0.2", ready=True))
    waiter.until(lambda: disc.readiness(0.0).get("d-1") is True)
    emulator.delete("pods", NS, "d-0")
    waiter.until(lambda: "d-0" not in disc.workers(0.0))
    assert set(disc.workers(0.0)) == {"d-1"}
    assert disc.lists == 1  # one list; everything else came through the watch


def test_resumes_from_resource_version_when_a_watch_ends(
    emulator: K8sApiEmulator, discovery: tuple[PodDiscovery, Waiter]
) -> None:
    disc, waiter = discovery
    emulator.put(pod("d-0"))
    disc.start()
    waiter.until(lambda: "d-0" in disc.workers(0.0))
    emulator.wait_for_watchers(1)
    restarts = disc.watch_restarts
    emulator.close_watches()
    emulator.put(pod("d-1", ip="10.0.0.2"))
    waiter.until(lambda: "d-1" in disc.workers(0.0))
    assert disc.lists == 1 and disc.gone == 0
    watches = [p for m, p in emulator.requests if m == "GET" and p.endswith("/pods")]
    assert len(watches) >= 3  # list, first watch, resumed watch
    waiter.until(lambda: disc.watch_restarts > restarts)


def test_relists_after_410_gone(emulator: K8sApiEmulator, discovery: tuple[PodDiscovery, Waiter]) -> None:
    disc, waiter = discovery
    emulator.put(pod("d-0"))
    disc.start()
    waiter.until(lambda: "d-0" in disc.workers(0.0))
    disc.stop()
    # While discovery is away: d-0 goes, d-1 comes, and the history it would resume from is compacted.
    emulator.delete("pods", NS, "d-0")
    emulator.put(pod("d-1", ip="10.0.0.2"))
    emulator.compact()
    disc.start()
    waiter.until(lambda: disc.lists == 2)
    assert disc.gone == 1
    assert set(disc.workers(0.0)) == {"d-1"}


def test_duplicate_worker_id_keeps_one_and_says_why(
    emulator: K8sApiEmulator, discovery: tuple[PodDiscovery, Waiter]
) -> None:
    disc, _ = discovery
    same = {"fpm-planner.io/worker-id": "w-1"}
    emulator.put(pod("a", ip="10.0.0.1", annotations=same))
    emulator.put(pod("b", ip="10.0.0.2", annotations=same))
    emulator.put(pod("c", ip="10.0.0.3", annotations={"fpm-planner.io/dp-size": "x"}))
    disc.sync()
    assert set(disc.workers(0.0)) == {"w-1"}
    assert disc.workers(0.0)["w-1"].fpm_endpoints == ("tcp://10.0.0.1:20380",)
    pods = disc.pods()
    assert pods["b"].issue is PodIssue.DUPLICATE_WORKER_ID and "a" in pods["b"].detail
    assert pods["c"].issue is PodIssue.BAD_ANNOTATION


def test_list_errors_are_discovery_errors_and_keep_the_last_good_list(
    emulator: K8sApiEmulator, discovery: tuple[PodDiscovery, Waiter]
) -> None:
    disc, _ = discovery
    emulator.put(pod("d-0"))
    disc.sync()
    emulator.inject(Fault("GET", r"/pods$", status=403, message="pods is forbidden"))
    with pytest.raises(DiscoveryError, match="'list' on resource 'pods'"):
        disc.sync()
    assert set(disc.workers(0.0)) == {"d-0"}


def test_recovers_after_transient_list_failures(
    emulator: K8sApiEmulator, discovery: tuple[PodDiscovery, Waiter]
) -> None:
    disc, waiter = discovery
    emulator.put(pod("d-0"))
    emulator.inject(Fault("GET", r"/pods$", status=500, times=2))
    disc.start()
    waiter.until(lambda: "d-0" in disc.workers(0.0))
    assert disc.lists == 1

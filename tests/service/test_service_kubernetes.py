"""The service as ``fpm-planner serve`` builds it with a ``kubernetes`` section, against the Kubernetes API
emulator: workers come from pods (readiness included), the planner takes the Lease, and scales a Deployment
through the Kubernetes actuator — all over HTTP, with real FPM from a publisher for one pod."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from planner.service.config import ActuatorConfig, ActuatorKind, ServiceConfig
from planner.service.serve_cli import build_runner
from tests.fakes.k8s_api import Fault, K8sApiEmulator
from tests.k8s.k8s_support import NS, deployment
from tests.service.support import AUTH, free_port, make_config, serve_runner, wait_for
from worker_shim.fpm import QueuedRequests, ScheduledRequests
from worker_shim.publisher import FpmPublisher

pytestmark = pytest.mark.kubernetes


def pod(name: str, port: int, *, ready: bool) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {"fpm-planner.io/role": "decode", "fpm-planner.io/service": "decode"},
            "annotations": {"fpm-planner.io/fpm-port": str(port)},
        },
        "spec": {"containers": [{"name": "vllm", "image": "vllm"}]},
        "status": {
            "phase": "Running",
            "podIP": "127.0.0.1",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def k8s_config(emu: K8sApiEmulator) -> ServiceConfig:
    """Fast ticks, pod discovery, a short Lease, and the Kubernetes actuator on Deployment 'decode'."""
    client = {"host": emu.url}
    return msgspec.structs.replace(
        make_config(),
        tick_interval_s=0.2,
        actuator=ActuatorConfig(
            kind=ActuatorKind.KUBERNETES,
            options={
                "namespace": NS,
                "client": client,
                "targets": [{"service": "decode", "kind": "deployment", "name": "decode", "max_replicas": 8}],
            },
        ),
        core={"roles": {"decode": {"service": "decode"}}},
        kubernetes={
            "namespace": NS,
            "client": client,
            "pod_discovery": {"enabled": True},
            "leader_election": {
                "enabled": True,
                "lease_duration_s": 3.0,
                "renew_deadline_s": 2.0,
                "retry_period_s": 0.25,
            },
        },
    )


def test_pods_lease_and_deployment_scaling_through_the_service() -> None:
    with K8sApiEmulator() as emu:
        emu.put(deployment("decode", 1))
        live_port, other_port = free_port(), free_port()
        emu.put(pod("decode-0", live_port, ready=True))
        emu.put(pod("decode-1", other_port, ready=False))
        config = k8s_config(emu)
        runner, pieces = build_runner(config, {"POD_NAME": "planner-0"})
        pieces.start()
        try:
            with (
                serve_runner(runner) as served,
                FpmPublisher(
                    worker_id="decode-0", endpoint=f"tcp://127.0.0.1:{live_port}", heartbeat_interval_s=0.05
                ) as publisher,
            ):
                http = served.http
                listed = wait_for(
                    lambda: (
                        len(http.get("/v1/workers").json()["workers"]) == 2
                        and http.get("/v1/workers").json()["workers"]
                    )
                )
                assert {w["worker_id"]: w["source"] for w in listed} == {
                    "decode-0": "kubernetes",
                    "decode-1": "kubernetes",
                }

                def classified() -> dict[str, str] | None:
                    publisher.publish(0.01, ScheduledRequests(num_decode_requests=2), QueuedRequests())
                    workers = http.get("/v1/diagnostics").json()["workers"]
                    found = {w["worker_id"]: w["classification"] for w in workers}
                    return found if found.get("decode-0") == "healthy" else None

                assert wait_for(classified) == {"decode-0": "healthy", "decode-1": "not_ready"}
                wait_for(lambda: http.get("/v1/diagnostics").json()["leadership"] == "leader")
                status = wait_for(lambda: http.get("/v1/diagnostics").json()["actuator"]["status"])
                assert status["decode"]["desired"] == 1

                # min 3: the leader scales the Deployment's scale subresource
                http.patch("/v1/bounds", json={"roles": {"decode": {"min_replicas": 3}}}, headers=AUTH)
                wait_for(lambda: (emu.get("deployments", NS, "decode") or {})["spec"]["replicas"] == 3)
                applied = wait_for(
                    lambda: [o for o in http.get("/v1/outcomes").json()["outcomes"] if o["kind"] == "applied"]
                )
                assert applied[-1]["requested"] == 3 and applied[-1]["outcome"]["target"] == f"deployment/{NS}/decode"
        finally:
            pieces.stop()
        lease = emu.get("leases", NS, "fpm-planner-leader")
        assert lease is not None


def test_a_retry_after_beyond_the_actuators_patience_defers_the_next_requests() -> None:
    """429 with Retry-After 60 s: the actuator gives up at once (THROTTLED, retry_after_s 60); the runner then
    records the following moves as deferred without calling the API server until the time has passed."""
    with K8sApiEmulator() as emu:
        emu.put(deployment("decode", 1))
        fault = emu.inject(
            Fault(method="PUT", path_pattern="deployments/decode/scale", status=429, retry_after_s=60.0, times=None)
        )
        runner, pieces = build_runner(k8s_config(emu), {"POD_NAME": "planner-0"})
        pieces.start()
        try:
            with serve_runner(runner) as served:
                http = served.http
                wait_for(lambda: http.get("/v1/diagnostics").json()["leadership"] == "leader")
                http.patch("/v1/bounds", json={"roles": {"decode": {"min_replicas": 2}}}, headers=AUTH)
                outcomes = wait_for(lambda: (o := http.get("/v1/outcomes").json()["outcomes"]) and len(o) >= 4 and o)
                kinds = [o["kind"] for o in reversed(outcomes)]  # oldest first
                assert kinds[0] == "throttled"
                assert outcomes[-1]["outcome"]["retry_after_s"] == 60.0
                assert set(kinds[1:]) == {"deferred"}
                assert fault.hits == 1  # one write reached the server
                assert (emu.get("deployments", NS, "decode") or {})["spec"]["replicas"] == 1
                errors = http.get("/v1/diagnostics").json()["actuator"]["recent_errors"]
                assert {e["kind"] for e in errors} >= {"throttled", "deferred"}
        finally:
            pieces.stop()

"""A fleet the planner cannot see is never lowered (issue 12 item 4), end to end: the service as ``serve`` builds
it, pods from the Kubernetes API emulator, the Kubernetes actuator on a Deployment holding 8 replicas, and the
Deployment's status read failing (500) — the core, falling back to the 4 discovered pods, decides "scale up
4 -> 6", and nothing below 8 is ever written."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from planner.service.config import ActuatorConfig, ActuatorKind, ServiceConfig
from planner.service.serve_cli import build_runner
from tests.fakes.k8s_api import Fault, K8sApiEmulator
from tests.k8s.k8s_support import NS, deployment
from tests.service.support import AUTH, free_port, make_config, serve_runner, wait_for
from tests.service.test_service_kubernetes import pod

pytestmark = pytest.mark.kubernetes

STATUS_READ = r"/deployments/decode$"  # the status read; the scale subresource is .../decode/scale


def config(emu: K8sApiEmulator) -> ServiceConfig:
    client = {"host": emu.url}
    return msgspec.structs.replace(
        make_config(),
        tick_interval_s=0.2,
        actuator=ActuatorConfig(
            kind=ActuatorKind.KUBERNETES,
            options={
                "namespace": NS,
                "client": client,
                "max_attempts": 1,
                "targets": [{"service": "decode", "kind": "deployment", "name": "decode", "max_replicas": 16}],
            },
        ),
        core={"roles": {"decode": {"service": "decode", "max_replicas": 16}}},
        kubernetes={"namespace": NS, "client": client, "pod_discovery": {"enabled": True}},
    )


def replicas(emu: K8sApiEmulator) -> int:
    obj = emu.get("deployments", NS, "decode")
    assert obj is not None
    return int(obj["spec"]["replicas"])


def scale_writes(emu: K8sApiEmulator) -> list[tuple[str, str]]:
    """Writes of the replica count (the scale subresource); annotation patches (status summaries) are not."""
    return [(m, p) for m, p in emu.requests if m in ("PUT", "PATCH") and p.endswith("deployments/decode/scale")]


def outcomes_after(http: Any, count: int) -> list[dict[str, Any]]:
    return list(wait_for(lambda: (o := http.get("/v1/outcomes").json()["outcomes"]) and len(o) >= count and o))


def test_a_failed_status_read_never_lowers_the_deployment() -> None:
    with K8sApiEmulator() as emu:
        emu.put(deployment("decode", 8))
        for i in range(4):
            emu.put(pod(f"decode-{i}", free_port(), ready=True))
        emu.inject(Fault(method="GET", path_pattern=STATUS_READ, status=500, times=None))
        runner, pieces = build_runner(config(emu), {"POD_NAME": "planner-0"})
        pieces.start()
        try:
            with serve_runner(runner) as served:
                http = served.http
                wait_for(lambda: http.get("/v1/diagnostics").json()["roles"]["decode"]["discovered"] == 4)
                assert http.patch(
                    "/v1/bounds", json={"roles": {"decode": {"min_replicas": 6}}}, headers=AUTH
                ).is_success
                outcomes = outcomes_after(http, 5)
                decisions = http.get("/v1/decisions", params={"limit": 5}).json()["decisions"]
                assert {(d["current"], d["final"]) for d in decisions if d["action"] == "scale_up"} == {(4, 6)}
                assert {o["kind"] for o in outcomes} == {"status_unknown"}
                assert "never read" in outcomes[0]["message"]
                assert scale_writes(emu) == []
                assert replicas(emu) == 8
        finally:
            pieces.stop()


def test_after_a_good_read_a_blind_planner_never_writes_below_the_last_known_count() -> None:
    with K8sApiEmulator() as emu:
        emu.put(deployment("decode", 8))
        for i in range(4):
            emu.put(pod(f"decode-{i}", free_port(), ready=True))
        runner, pieces = build_runner(config(emu), {"POD_NAME": "planner-0"})
        pieces.start()
        try:
            with serve_runner(runner) as served:
                http = served.http
                # the first tick may not have listed the service yet
                wait_for(
                    lambda: [s for s in http.get("/v1/diagnostics").json()["services"] if s["deployment_desired"] == 8]
                )
                emu.inject(Fault(method="GET", path_pattern=STATUS_READ, status=500, times=None))
                wait_for(lambda: http.get("/v1/diagnostics").json()["actuator"]["status_error"])
                assert http.patch(
                    "/v1/bounds", json={"roles": {"decode": {"min_replicas": 6}}}, headers=AUTH
                ).is_success
                outcomes = outcomes_after(http, 3)
                assert {o["kind"] for o in outcomes} == {"status_unknown"}
                assert "below its last known count 8" in outcomes[0]["message"]
                assert scale_writes(emu) == [] and replicas(emu) == 8
                # a scale-up above the last known count is sent, expecting 8 — and refused, since the
                # Deployment moved to 3 meanwhile: the planner never overwrites a count it has not seen
                emu.put(deployment("decode", 3))
                assert http.patch(
                    "/v1/bounds", json={"roles": {"decode": {"min_replicas": 10}}}, headers=AUTH
                ).is_success
                mismatch = wait_for(
                    lambda: [o for o in http.get("/v1/outcomes").json()["outcomes"] if o["kind"] == "current_mismatch"]
                )
                assert mismatch[0]["outcome"]["previous"] == 3
                assert replicas(emu) == 3
        finally:
            pieces.stop()

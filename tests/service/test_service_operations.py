"""The operator controls through the real service (uvicorn over HTTP) against the Kubernetes API emulator:
Events and conditions on the scaled Deployment (read back with the official client and the real ``kubectl``),
durable bounds / pause / registrations across a restart and a failover (a ConfigMap), the audit log naming the
credential, and a read-only credential that cannot mutate."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest
from kubernetes import client as k8s

from planner.k8s.client import KubeClientConfig, make_api_client
from planner.k8s.events import ConditionType, parse_conditions
from planner.service.config import ActuatorConfig, ActuatorKind, ServiceConfig
from planner.service.serve_cli import build_runner
from tests.fakes.k8s_api import K8sApiEmulator
from tests.fakes.leader import SwitchableElector
from tests.k8s.k8s_support import NS, deployment
from tests.service.support import AUTH, TOKEN, free_port, make_config, registration, serve_runner, wait_for
from tests.service.test_service_kubernetes import pod
from worker_shim.fpm import QueuedRequests, ScheduledRequests
from worker_shim.publisher import FpmPublisher

pytestmark = pytest.mark.kubernetes

READ_TOKEN = "read-token-0123456789abcdef0123456789"
PROFILE = Path(__file__).resolve().parents[3] / "shared" / "data" / "profiles" / "h200_llama31_8b_fp8_tp1"


def config(emu: K8sApiEmulator, **operations: Any) -> ServiceConfig:
    client = {"host": emu.url}
    return msgspec.structs.replace(
        make_config(FPM_PLANNER_READ_TOKEN=READ_TOKEN),
        tick_interval_s=0.2,
        actuator=ActuatorConfig(
            kind=ActuatorKind.KUBERNETES,
            options={
                "namespace": NS,
                "client": client,
                "targets": [{"service": "decode", "kind": "deployment", "name": "decode", "max_replicas": 16}],
            },
        ),
        core={"roles": {"decode": {"service": "decode", "max_replicas": 16}}},
        kubernetes={"namespace": NS, "client": client, "pod_discovery": {"enabled": True}},
        operations={"state": {"configmap": "fpm-planner-state", "sync_interval_s": 0.2}, **operations},
    )


def events(emu: K8sApiEmulator) -> dict[str, Any]:
    api = make_api_client(KubeClientConfig(host=emu.url))
    try:
        items = k8s.EventsV1Api(api).list_namespaced_event(NS, field_selector="regarding.name=decode").items
    finally:
        api.close()
    return {e.reason: e for e in items}


def conditions(emu: K8sApiEmulator) -> dict[ConditionType, Any]:
    obj = emu.get("deployments", NS, "decode")
    assert obj is not None
    return {c.type: c for c in parse_conditions(obj["metadata"].get("annotations"), "decode")}


def test_a_scale_up_and_a_blind_hold_are_events_and_conditions_kubectl_shows(tmp_path: Path) -> None:
    with K8sApiEmulator() as emu:
        emu.put(deployment("decode", 2))
        for i in range(2):  # discovered and ready, but no FPM: the planner is blind
            emu.put(pod(f"decode-{i}", free_port(), ready=True))
        runner, pieces = build_runner(config(emu), {"POD_NAME": "planner-0"})
        pieces.start()
        try:
            with serve_runner(runner) as served:
                wait_for(lambda: "BlindHold" in events(emu))
                wait_for(lambda: getattr(conditions(emu).get(ConditionType.SCALING_ACTIVE), "reason", None) == "Blind")
                served.http.patch(
                    "/v1/bounds", json={"roles": {"decode": {"min_replicas": 3}}}, headers=AUTH
                ).raise_for_status()
                rescale = wait_for(lambda: events(emu).get("SuccessfulRescale"))
                assert rescale.note.startswith("New size: 3; reason:") and "clamped_to_min" in rescale.note
                assert rescale.reporting_instance == "planner-0"
                wait_for(
                    lambda: (
                        getattr(conditions(emu).get(ConditionType.SCALING_LIMITED), "reason", None) == "TooFewReplicas"
                    )
                )
        finally:
            pieces.stop()
        env = dict(os.environ, HOME=str(tmp_path), KUBECONFIG=str(tmp_path / "none"))
        out = subprocess.run(
            ["kubectl", "--server", emu.url, "-n", NS, "describe", "deployment/decode"],
            capture_output=True, text=True, env=env, timeout=120, check=True,
        ).stdout  # fmt: skip
        listed = out.split("Events:", 1)[1]
        assert "Warning  BlindHold" in listed and "Normal   SuccessfulRescale" in listed
        assert "New size: 3" in listed and "fpm-planner" in listed
        assert "ScalingActive=False(Blind)" in " ".join(out.split("Annotations:", 1)[1].split())


def test_bounds_pause_and_registrations_survive_a_restart_and_the_audit_names_the_credential() -> None:
    with K8sApiEmulator() as emu:
        emu.put(deployment("decode", 2))
        runner, pieces = build_runner(config(emu), {"POD_NAME": "planner-0"})
        pieces.start()
        try:
            with serve_runner(runner) as served:
                http = served.http
                pause = {"service": "decode", "reason": "incident"}
                http.post("/v1/pause", json=pause, headers=AUTH).raise_for_status()
                bounds = {"roles": {"decode": {"min_replicas": 3, "max_replicas": 4}}}
                http.patch("/v1/bounds", json=bounds, headers=AUTH).raise_for_status()
                endpoints = [f"tcp://127.0.0.1:{free_port()}"]
                http.put("/v1/workers/w-1", json=registration(endpoints), headers=AUTH).raise_for_status()
                outcomes = "/v1/outcomes"
                paused = wait_for(lambda: [o for o in http.get(outcomes).json()["outcomes"] if o["kind"] == "paused"])
                assert "paused by default" in paused[0]["message"] and paused[0]["requested"] == 3
                assert emu.get("deployments", NS, "decode")["spec"]["replicas"] == 2  # type: ignore[index]
                audit = http.get("/v1/audit").json()["records"]
                assert [(r["who"], r["action"]) for r in audit] == [
                    ("default", "register"),
                    ("default", "set bounds"),
                    ("default", "pause"),
                ]
                assert audit[1]["before"] is None and audit[1]["after"] == {"min_replicas": 3, "max_replicas": 4}
                assert TOKEN not in http.get("/v1/audit").text
        finally:
            pieces.stop()
        # the ConfigMap is all that remains of the first planner
        restarted, pieces = build_runner(config(emu), {"POD_NAME": "planner-1"})
        pieces.start()
        try:
            with serve_runner(restarted) as served:
                http = served.http
                wait_for(lambda: http.get("/readyz").status_code == 200)
                assert http.get("/v1/bounds").json()["roles"]["decode"]["max_replicas"] == 4
                assert http.get("/v1/bounds").json()["roles"]["decode"]["min_replicas"] == 3
                assert [p["by"] for p in http.get("/v1/pause").json()["paused"]] == ["default"]
                assert "w-1" in {w["worker_id"] for w in http.get("/v1/workers").json()["workers"]}
                assert len(http.get("/v1/audit").json()["records"]) == 3
        finally:
            pieces.stop()


def test_a_failover_keeps_the_pause_and_a_read_token_cannot_mutate() -> None:
    with K8sApiEmulator() as emu:
        emu.put(deployment("decode", 2))
        electors = [SwitchableElector(leader=True), SwitchableElector(leader=False)]
        runners = []
        for i, elector in enumerate(electors):
            runner, _ = build_runner(config(emu), {"POD_NAME": f"planner-{i}"})
            runner.elector = elector
            runners.append(runner)
        with serve_runner(runners[0]) as first, serve_runner(runners[1]) as second:
            read = {"Authorization": f"Bearer {READ_TOKEN}"}
            refused = first.http.post("/v1/pause", json={"service": "*"}, headers=read)
            assert refused.status_code == 403 and "read" in refused.json()["detail"]
            assert first.http.patch("/v1/bounds", json={"max_total_gpus": 4}, headers=read).status_code == 403
            assert first.http.get("/v1/audit").json()["records"] == []
            first.http.post("/v1/pause", json={"service": "*"}, headers=AUTH).raise_for_status()
            # the standby sees the pause without a restart, and keeps it once it leads
            wait_for(lambda: second.http.get("/v1/pause").json()["paused"])
            electors[0].is_leader, electors[1].is_leader = False, True
            second.http.patch(
                "/v1/bounds", json={"roles": {"decode": {"min_replicas": 3}}}, headers=AUTH
            ).raise_for_status()
            held = wait_for(
                lambda: [o for o in second.http.get("/v1/outcomes").json()["outcomes"] if o["kind"] == "paused"]
            )
            assert held[0]["requested"] == 3
            assert emu.get("deployments", NS, "decode")["spec"]["replicas"] == 2  # type: ignore[index]
            wait_for(lambda: first.http.get("/v1/bounds").json()["roles"]["decode"]["min_replicas"] == 3)


def test_a_blind_service_gets_its_fallback_once_with_an_event() -> None:
    with K8sApiEmulator() as emu:
        emu.put(deployment("decode", 2))
        for i in range(2):  # discovered and ready, but no FPM: blind
            emu.put(pod(f"decode-{i}", free_port(), ready=True))
        fallback = {"replicas": {"decode": 4}, "after_s": 0.5}
        runner, pieces = build_runner(config(emu, fallback=fallback), {"POD_NAME": "planner-0"})
        pieces.start()
        try:
            with serve_runner(runner) as served:
                event = wait_for(lambda: events(emu).get("FallbackApplied"))
                assert "fallback_replicas=4 -> 4" in event.note and event.type == "Warning"
                wait_for(lambda: emu.get("deployments", NS, "decode")["spec"]["replicas"] == 4)  # type: ignore[index]
                applied = [
                    o
                    for o in served.http.get("/v1/outcomes").json()["outcomes"]
                    if o["kind"] == "applied" and o["decision_id"] is None
                ]
                assert [o["requested"] for o in applied] == [4]  # once per blind spell
                wait_for(lambda: getattr(conditions(emu).get(ConditionType.FALLBACK), "status", None) == "True")
        finally:
            pieces.stop()


def test_capped_at_max_with_a_predicted_miss_is_an_event_a_condition_and_a_gauge() -> None:
    with K8sApiEmulator() as emu:
        emu.put(deployment("decode", 1))
        base = config(emu)
        sla_core = {"roles": {"decode": {"service": "decode", "mode": "sla", "sla": {"itl_ms": 15}, "max_replicas": 1}}}
        perf = msgspec.structs.replace(base.perf_model, profile_dir=str(PROFILE))  # the measured profile: ready
        runner, _ = build_runner(msgspec.structs.replace(base, core=sla_core, perf_model=perf), {})  # pods: none
        port = free_port()
        endpoint = f"tcp://127.0.0.1:{port}"
        with (
            serve_runner(runner) as served,
            FpmPublisher(worker_id="w-0", endpoint=endpoint, heartbeat_interval_s=0.05) as publisher,
        ):
            served.http.put("/v1/workers/w-0", json=registration([endpoint]), headers=AUTH).raise_for_status()
            stop = threading.Event()

            def feed() -> None:  # a decode engine far beyond what one replica serves within 15 ms ITL
                while not stop.wait(0.02):
                    publisher.publish(
                        0.03,
                        ScheduledRequests(num_decode_requests=200, sum_decode_kv_tokens=200_000),
                        QueuedRequests(num_decode_requests=50),
                    )

            feeder = threading.Thread(target=feed, daemon=True)
            feeder.start()
            try:
                event = wait_for(lambda: events(emu).get("CappedAtMaxWithPredictedMiss"))
                assert event.type == "Warning" and "capped at max_replicas=1 while the SLA needs" in event.note
                # the conditions are rewritten every tick: an early tick without load may have left TooFewReplicas
                limited = wait_for(
                    lambda: [
                        c
                        for c in [conditions(emu).get(ConditionType.SCALING_LIMITED)]
                        if c is not None and c.reason == "TooManyReplicas"
                    ]
                )[0]
                assert "predicted to be missed" in limited.message
                metrics = served.http.get("/metrics").text
                assert 'fpm_planner_capped_at_max_predicted_miss{role="decode",service="decode"} 1.0' in metrics
            finally:
                stop.set()
                feeder.join(5)

"""The decision core's effective bounds never exceed the actuator's (issue 12 item 5): with the Helm chart's
shape (the actuator's target allows 8, the core keeps its default max 64) and load needing far more, the
planner asks for 8 and the Deployment gets 8 — never an ``out_of_bounds`` refusal every tick; bounds that
cannot agree are refused at start."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from planner.actuators.advisory import AdvisoryActuator
from planner.actuators.base import ReplicaBounds
from planner.discovery import Role
from planner.errors import ConfigError
from planner.service.config import ActuatorConfig, ActuatorKind, ServiceConfig
from planner.service.runner import PlannerRunner
from planner.service.serve_cli import build_runner
from tests.fakes.k8s_api import K8sApiEmulator
from tests.k8s.k8s_support import NS, deployment
from tests.service.support import free_port, make_config, serve_runner, wait_for
from tests.service.test_service_kubernetes import pod
from worker_shim.fpm import QueuedRequests, ScheduledRequests
from worker_shim.publisher import FpmPublisher

pytestmark = pytest.mark.kubernetes

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "fpm-planner"


def chart_shaped(emu: K8sApiEmulator) -> ServiceConfig:
    """Target max 8 and the core's defaults (max 64), as the chart had them."""
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
        services={"decode": "decode"},
        kubernetes={"namespace": NS, "client": client, "pod_discovery": {"enabled": True}},
    )


def test_load_needing_more_than_the_actuator_allows_gets_the_actuators_max() -> None:
    with K8sApiEmulator() as emu:
        emu.put(deployment("decode", 6))
        ports = [free_port() for _ in range(6)]
        for i, port in enumerate(ports):
            emu.put(pod(f"decode-{i}", port, ready=True))
        runner, pieces = build_runner(chart_shaped(emu), {"POD_NAME": "planner-0"})
        pieces.start()
        try:
            with (
                serve_runner(runner) as served,
                FpmPublisher(worker_id="decode-0", endpoint=f"tcp://127.0.0.1:{ports[0]}") as publisher,
            ):
                http = served.http

                def scaled() -> bool:
                    # one engine with 40x its decode target running and queued: the load needs far more than 8
                    publisher.publish(
                        0.02,
                        ScheduledRequests(num_decode_requests=256, sum_decode_kv_tokens=200_000),
                        QueuedRequests(num_decode_requests=400),
                    )
                    obj = emu.get("deployments", NS, "decode") or {}
                    return bool(obj["spec"]["replicas"] == 8)

                wait_for(scaled)
                outcomes: list[dict[str, Any]] = http.get("/v1/outcomes").json()["outcomes"]
                assert outcomes and {o["kind"] for o in outcomes} <= {"applied", "unchanged", "not_ready"}
                assert all(o["requested"] <= 8 for o in outcomes)
                up = [d for d in http.get("/v1/decisions").json()["decisions"] if d["action"] == "scale_up"]
                assert up and all(d["final"] <= 8 for d in up)
                assert any("capped_by_actuator_bounds" in d["reasons"] for d in up)
        finally:
            pieces.stop()


def test_bounds_that_cannot_agree_are_refused_at_start() -> None:
    config = msgspec.structs.replace(
        make_config(), core={"roles": {"decode": {"service": "decode", "min_replicas": 10, "max_replicas": 20}}}
    )
    actuator = AdvisoryActuator({"decode": ReplicaBounds(min_replicas=0, max_replicas=8)})
    with pytest.raises(ConfigError, match=r"do not agree.*\[10, 20\] do not intersect the actuator's \[0, 8\]"):
        PlannerRunner(config, actuator=actuator)


def test_the_core_decides_within_the_intersection() -> None:
    config = msgspec.structs.replace(make_config(), services={"decode": "decode"})
    actuator = AdvisoryActuator({"decode": ReplicaBounds(min_replicas=2, max_replicas=8)})
    rc = PlannerRunner(config, actuator=actuator).core_config.role(Role.DECODE)
    assert rc.actuator_bounds is not None
    assert (rc.actuator_bounds.min_replicas, rc.actuator_bounds.max_replicas) == (2, 8)
    assert (rc.min_replicas, rc.max_replicas) == (1, 64)  # the core's own, shown by /v1/bounds


def test_the_charts_default_core_bounds_lie_within_its_targets() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())["planner"]
    roles = (values.get("core") or {}).get("roles") or {}
    for role, service in values["services"].items():
        (target,) = [t for t in values["targets"] if t["service"] == service]
        bounds = roles.get(role) or {}
        assert bounds.get("max_replicas", 64) <= target["maxReplicas"], role
        assert bounds.get("min_replicas", 1) >= target["minReplicas"], role

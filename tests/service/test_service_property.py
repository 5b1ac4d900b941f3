"""Property test of the whole path core -> runner -> actuator (issue 12): two real runners (each with its own
Kubernetes actuator and official client) take turns as leader over one Deployment in the API emulator, while
the status read fails on some ticks, the core's and the actuator's bounds are drawn independently, someone else
rescales the Deployment now and then, and the FPM and traffic fed to the runners carry non-finite and absurd
values. Whatever the draw:

* every tick answers (no exception, within a bounded wait);
* the Deployment is never written outside the effective bounds (core ∩ actuator);
* while the status cannot be read, the Deployment is never lowered;
* bounds that cannot agree are refused at start (ConfigError), never run.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.core import Traffic
from planner.discovery import EngineCapacity, Role
from planner.errors import ConfigError
from planner.service.config import ActuatorConfig, ActuatorKind
from planner.service.runner import PlannerRunner
from planner.service.serve_cli import build_actuator
from tests.fakes.k8s_api import Fault, K8sApiEmulator
from tests.fakes.leader import SwitchableElector
from tests.k8s.k8s_support import NS, deployment
from tests.service.support import free_port, make_config
from worker_shim.fpm import ForwardPassMetrics, QueuedRequests, ScheduledRequests

pytestmark = pytest.mark.kubernetes

STATUS_READ = r"/deployments/decode$"
WORKERS = 4
NASTY = [math.nan, math.inf, -math.inf, -1.0, 1e300]


@pytest.fixture(scope="module")
def emulator() -> Iterator[K8sApiEmulator]:
    with K8sApiEmulator() as emu:
        yield emu


step = st.fixed_dictionaries(
    {
        "leader": st.sampled_from([0, 1]),
        "status_fails": st.booleans(),
        "decode_requests": st.sampled_from([0, 1, 40, 300, 2**64 - 1]),
        "wall_time": st.sampled_from([0.02, math.nan, math.inf, -0.5]),
        "rate": st.sampled_from([None, 0.0, 50.0, *NASTY]),
        "external": st.one_of(st.none(), st.integers(min_value=0, max_value=20)),
    }
)


def load(worker_id: str, counter: int, decode_requests: int, wall_time: float) -> ForwardPassMetrics:
    return ForwardPassMetrics(
        worker_id=worker_id,
        dp_rank=0,
        counter_id=counter,
        wall_time=wall_time,
        scheduled_requests=ScheduledRequests(num_decode_requests=decode_requests, var_decode_kv_tokens=wall_time),
        queued_requests=QueuedRequests(num_decode_requests=decode_requests),
    )


def replicas(emu: K8sApiEmulator) -> int:
    obj = emu.get("deployments", NS, "decode")
    assert obj is not None
    return int(obj["spec"]["replicas"])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    core_bounds=st.tuples(st.integers(0, 6), st.integers(2, 16)).filter(lambda b: b[0] <= b[1]),
    target_bounds=st.tuples(st.integers(0, 6), st.integers(2, 16)).filter(lambda b: b[0] <= b[1]),
    start=st.integers(0, 16),
    steps=st.lists(step, min_size=4, max_size=10),
)
def test_never_outside_bounds_never_lower_while_blind_every_tick_answers(
    emulator: K8sApiEmulator,
    core_bounds: tuple[int, int],
    target_bounds: tuple[int, int],
    start: int,
    steps: list[dict[str, Any]],
) -> None:
    emu = emulator
    emu.clear_faults()
    lo, hi = max(core_bounds[0], target_bounds[0]), min(core_bounds[1], target_bounds[1])
    start = min(max(start, target_bounds[0]), target_bounds[1])
    emu.put(deployment("decode", start))
    config = msgspec.structs.replace(
        make_config(),
        core={
            "roles": {"decode": {"service": "decode", "min_replicas": core_bounds[0], "max_replicas": core_bounds[1]}}
        },
        actuator=ActuatorConfig(
            kind=ActuatorKind.KUBERNETES,
            options={
                "namespace": NS,
                "client": {"host": emu.url},
                "max_attempts": 1,
                "request_timeout_s": 5.0,
                "targets": [
                    {
                        "service": "decode",
                        "kind": "deployment",
                        "name": "decode",
                        "min_replicas": target_bounds[0],
                        "max_replicas": target_bounds[1],
                    }
                ],
            },
        ),
    )
    electors = [SwitchableElector(True), SwitchableElector(False)]
    try:
        runners = [PlannerRunner(config, actuator=build_actuator(config), elector=e) for e in electors]
    except ConfigError as exc:
        assert lo > hi, f"refused bounds that agree: {exc}"  # refused only when they cannot agree
        return
    assert lo <= hi, "bounds that cannot agree were not refused"
    endpoints = [f"tcp://127.0.0.1:{free_port()}" for _ in range(WORKERS)]
    for runner in runners:
        for i, endpoint in enumerate(endpoints):
            runner.register(
                f"decode-{i}",
                role=Role.DECODE,
                service="decode",
                dp_size=1,
                fpm_endpoints=(endpoint,),
                capacity=EngineCapacity(),
                ttl_s=600.0,
            )

    async def run() -> None:
        counter = 0
        for s in steps:
            for i, e in enumerate(electors):
                e.is_leader = i == s["leader"]
            if s["external"] is not None:  # someone else rescales between ticks
                emu.put(deployment("decode", min(max(s["external"], 0), 20)))
            emu.clear_faults()
            if s["status_fails"]:
                emu.inject(Fault(method="GET", path_pattern=STATUS_READ, status=500, times=None))
            counter += 1
            for runner in runners:
                now = runner.now()
                with runner.subscriber.lock:
                    for i, endpoint in enumerate(endpoints):
                        sample = load(f"decode-{i}", counter, s["decode_requests"], s["wall_time"])
                        runner.store.ingest(endpoint, sample, now, now)
                runner.traffic[Role.DECODE] = Traffic(request_rate_per_s=s["rate"])
            before = replicas(emu)
            for runner in runners:
                await asyncio.wait_for(runner.tick(), timeout=60.0)  # every tick answers
            after = replicas(emu)
            if after != before:
                assert lo <= after <= hi, f"wrote {after} outside the effective bounds [{lo}, {hi}]"
            if s["status_fails"]:
                assert after >= before, f"lowered {before} -> {after} while the status could not be read"
        for runner in runners:
            assert runner.last_tick_error is None

    try:
        asyncio.run(run())
    finally:
        emu.clear_faults()

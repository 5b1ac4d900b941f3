"""Operator controls around the tick, on real decisions of the core (tests/core/fleetkit: a real FleetStore fed
FPM samples): the decision log, fallback, pause with its durable state and audit, and the Events and conditions
they put on a Deployment in the Kubernetes API emulator through the official client."""

from __future__ import annotations

import io
import itertools
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from planner.actuators.kubernetes import ScaleTarget, TargetKind
from planner.core import CoreConfig, CoreState, Decision, Mode, RoleConfig, SlaTargets, step
from planner.discovery import Role
from planner.k8s.client import KubeClientConfig, make_api_client
from planner.k8s.events import ConditionType, parse_conditions
from planner.k8s.status_sink import KubeStatusSink
from planner.service.decision_log import DecisionLog
from planner.service.history import OutcomeEntry
from planner.service.metrics import PlannerMetrics
from planner.service.operations import FallbackConfig, Operations, OperationsConfig, is_blind
from planner.service.state_store import FileBackend, MemoryBackend, StateStore
from tests.core.analytic_perf import AnalyticPerf
from tests.core.fleetkit import Fleet, Load
from tests.fakes.k8s_api import K8sApiEmulator

NS = "llm"
T0 = 1_790_000_000.0


def counting_clock(start: float = 0.0) -> Callable[[], float]:
    ticks = itertools.count()
    return lambda: start + next(ticks)


def decide(fleet: Fleet, now: float, config: CoreConfig | None = None, **kw: Any) -> Decision:
    _, decisions = step(CoreState(), fleet.observe(now), now, config or CoreConfig(), **kw)
    return next(d for d in decisions if d.service == "decode")


def decode_fleet(n: int) -> Fleet:
    fleet = Fleet()
    fleet.add_many(n, Role.DECODE)
    fleet.deploy("decode", n)
    return fleet


def blind_decision(n: int = 2, now: float = 100.0) -> Decision:
    fleet = decode_fleet(n)  # discovered and ready, but no FPM at all
    return decide(fleet, now)


def capped_decision() -> Decision:
    fleet = decode_fleet(1)
    fleet.publish_all(0.0, Load(decode=600))
    config = CoreConfig(
        roles={
            Role.DECODE: RoleConfig(
                mode=Mode.SLA, sla=SlaTargets(ttft_ms=500, itl_ms=50), max_replicas=1, itl_headroom_frac=0.0
            )
        }
    )
    return decide(fleet, 0.0, config, predictors={Role.DECODE: AnalyticPerf(decode_ms_per_kv_token=0.0)})


def operations(store: StateStore | None = None, sink: Any = None, **fallback: Any) -> Operations:
    config = OperationsConfig(fallback=FallbackConfig(**fallback)) if fallback else OperationsConfig()
    return Operations(
        config,
        store=store or StateStore(MemoryBackend(), counting_clock(T0)),
        metrics=PlannerMetrics(),
        sink=sink,
        clock=counting_clock(),
        wall_clock=lambda: T0,
    )


# ------------------------------------------------------------------------------------------------ decision log
@pytest.fixture
def json_lines() -> Iterator[io.StringIO]:
    from pythonjsonlogger.json import JsonFormatter

    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter("%(levelname)s %(name)s %(message)s"))
    logger = logging.getLogger("planner.decisions")
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.INFO)
    yield out
    logger.removeHandler(handler)
    logger.setLevel(old)


def test_a_repeated_decision_is_logged_once_and_a_new_reason_again(json_lines: io.StringIO) -> None:
    log = DecisionLog()
    blind = blind_decision()
    assert log.observe([blind], leader=True, advisory=True) == [blind]
    assert log.observe([blind_decision(now=105.0)], leader=True, advisory=True) == []  # same hold, same why
    capped = capped_decision()
    assert log.observe([capped], leader=True, advisory=True) == [capped]  # a new reason chain
    lines = [json.loads(line) for line in json_lines.getvalue().splitlines()]
    assert len(lines) == 2
    first = lines[0]
    assert first["service"] == "decode" and first["action"] == "hold" and first["advisory"] is True
    assert first["reasons"] == [r.value for r in blind.reasons] and first["decision_id"] == blind.id
    assert "because" in first["message"] and " > ".join(first["reasons"]) in first["message"]
    assert lines[1]["reasons"][-1] == capped.reasons[-1].value and "clamped_to_max" in lines[1]["reasons"]


# ------------------------------------------------------------------------------------------------ fallback
def test_fallback_applies_once_per_blind_spell_never_below_running() -> None:
    ops = operations(replicas={"decode": 1}, after_s=60.0)
    d = blind_decision(n=3)
    assert is_blind(d)
    assert ops.fallback([d], 0.0) == []  # the spell starts
    assert ops.fallback([d], 59.0) == []
    assert ops.fallback([d], 61.0) == []  # fallback 1 < 3 running: kept at 3, nothing to send
    assert ops.status_of(d).fallback_active and ops.status_of(d).fallback_replicas == 3

    ops = operations(replicas={"decode": 5}, after_s=60.0)
    ops.fallback([d], 0.0)
    ((request, role),) = ops.fallback([d], 60.0)
    assert (request.service, request.replicas, request.reason, role) == ("decode", 5, "fallback", "decode")
    assert ops.fallback([d], 120.0) == []  # once per spell
    healthy = decode_fleet(3)
    healthy.publish_all(200.0, Load(decode=10))
    seen = decide(healthy, 200.0)
    assert not is_blind(seen)
    ops.fallback([seen], 200.0)  # the spell ends
    ops.fallback([d], 300.0)
    assert [r.replicas for r, _ in ops.fallback([d], 360.0)] == [5]  # a new spell, a new fallback


def test_fallback_below_running_only_when_allowed() -> None:
    ops = operations(replicas={"decode": 1}, after_s=10.0, allow_below_running=True)
    d = blind_decision(n=3)
    ops.fallback([d], 0.0)
    assert [r.replicas for r, _ in ops.fallback([d], 10.0)] == [1]


# ------------------------------------------------------------------------------------------------ pause, durable
def test_pause_is_durable_and_audited(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    ops = operations(StateStore(FileBackend(path), counting_clock(T0)))
    ops.sync(force=True)
    assert ops.gate("decode") is None
    ops.pause("*", who="alice", reason="incident 42")
    assert ops.gate("decode") == "paused by alice (every service): recorded, not applied"

    restarted = operations(StateStore(FileBackend(path), counting_clock(T0)))
    assert restarted.sync(force=True) is not None
    assert restarted.gate("prefill") is not None and restarted.pauses()[0].reason == "incident 42"
    assert b'fpm_planner_paused{service="*"} 1.0' in restarted.metrics.render()
    restarted.resume("*", who="bob")
    assert restarted.gate("decode") is None
    assert b'fpm_planner_paused{service="*"} 0.0' in restarted.metrics.render()
    audit = restarted.store.audit()
    assert [(r.who, r.action, r.before is None, r.after is None) for r in audit] == [
        ("alice", "pause", True, False),
        ("bob", "resume", False, True),
    ]


def test_registration_renewals_write_nothing() -> None:
    ops = operations()
    value = {"role": "decode", "service": "decode", "dp_size": 1, "fpm_endpoints": ["tcp://10.0.0.1:5557"]}
    ops.record_registration("w-1", value, who="worker")
    generation = ops.store.state.generation
    ops.record_registration("w-1", dict(value), who="worker")
    assert ops.store.state.generation == generation
    ops.record_registration("w-1", None, who="worker")
    assert ops.store.state.registrations == {} and [r.action for r in ops.store.audit()] == ["register", "deregister"]


def test_bounds_round_trip_as_a_patch() -> None:
    ops = operations()
    after = {"roles": {"decode": {"min_replicas": 2, "max_replicas": 4, "gpus_per_replica": 1}}, "max_total_gpus": 16}
    ops.record_bounds({"roles": {"decode": {"max_replicas": 4}}, "max_total_gpus": 16}, after, who="alice")
    assert Operations.bounds_patch(ops.store.state) == {
        "roles": {"decode": {"min_replicas": 2, "max_replicas": 4}},
        "max_total_gpus": 16,
    }


# ------------------------------------------------------------------------------------------------ Events, conditions
@pytest.fixture
def emulator() -> Iterator[K8sApiEmulator]:
    with K8sApiEmulator() as emu:
        yield emu


@pytest.fixture
def api(emulator: K8sApiEmulator) -> Iterator[k8s.ApiClient]:
    client = make_api_client(KubeClientConfig(host=emulator.url))
    yield client
    client.close()


def outcome(kind: str, requested: int, message: str = "") -> OutcomeEntry:
    return OutcomeEntry(
        id=1, decision_id=1, role="decode", service="decode", at_s=T0, requested=requested, kind=kind,
        applied=kind == "applied", message=message, outcome={},
    )  # fmt: skip


@pytest.mark.kubernetes
def test_events_and_conditions_land_on_the_deployment(emulator: K8sApiEmulator, api: k8s.ApiClient) -> None:
    from tests.k8s.k8s_support import deployment

    emulator.put(deployment("vllm-decode", 2))
    target = ScaleTarget(service="decode", kind=TargetKind.DEPLOYMENT, name="vllm-decode")
    sink = KubeStatusSink(api, NS, {"decode": target})
    ops = operations(sink=sink)

    ops.after_tick([blind_decision()], [], leader=True, advisory=False)
    ops.after_tick([capped_decision()], [outcome("applied", 3)], leader=True, advisory=False)
    ops.after_tick([capped_decision()], [outcome("forbidden", 3, "no verb")], leader=True, advisory=False)
    ops.after_tick([blind_decision()], [], leader=False, advisory=False)  # a follower writes nothing

    events = k8s.EventsV1Api(api).list_namespaced_event(NS, field_selector="regarding.name=vllm-decode").items
    by_reason = {e.reason: e for e in events}
    assert set(by_reason) == {"BlindHold", "SuccessfulRescale", "CappedAtMaxWithPredictedMiss", "FailedRescale"}
    assert by_reason["CappedAtMaxWithPredictedMiss"].series.count == 2  # two ticks, one Event
    assert by_reason["CappedAtMaxWithPredictedMiss"].type == "Warning"
    assert "while the SLA needs 2" in by_reason["CappedAtMaxWithPredictedMiss"].note
    assert "forbidden: no verb" in by_reason["FailedRescale"].note
    assert all(e.regarding.uid for e in events)
    stored = emulator.get("deployments", NS, "vllm-decode")
    assert stored is not None
    conds = {c.type: c for c in parse_conditions(stored["metadata"]["annotations"], "decode")}
    assert (conds[ConditionType.ABLE_TO_SCALE].status, conds[ConditionType.ABLE_TO_SCALE].reason) == (
        "False",
        "FailedRescale",
    )
    assert conds[ConditionType.SCALING_LIMITED].reason == "TooManyReplicas"


@pytest.mark.kubernetes
def test_pause_puts_an_event_and_a_condition(emulator: K8sApiEmulator, api: k8s.ApiClient) -> None:
    from tests.k8s.k8s_support import deployment

    emulator.put(deployment("vllm-decode", 2))
    sink = KubeStatusSink(
        api, NS, {"decode": ScaleTarget(service="decode", kind=TargetKind.DEPLOYMENT, name="vllm-decode")}
    )
    ops = operations(sink=sink)
    ops.pause("decode", who="alice", reason="load test")
    fleet = decode_fleet(2)
    fleet.publish_all(0.0, Load(decode=10))
    ops.after_tick([decide(fleet, 0.0)], [], leader=True, advisory=False)
    events = k8s.EventsV1Api(api).list_namespaced_event(NS).items
    assert [(e.reason, e.note) for e in events] == [("Paused", "scaling paused by alice: load test")]
    stored = emulator.get("deployments", NS, "vllm-decode")
    assert stored is not None
    conds = {c.type: c for c in parse_conditions(stored["metadata"]["annotations"], "decode")}
    assert conds[ConditionType.PAUSED].status == "True" and "alice" in conds[ConditionType.PAUSED].message
    assert conds[ConditionType.ABLE_TO_SCALE].reason == "Paused"


def test_configure_logging_json_writes_one_object_per_decision_line(capfd: pytest.CaptureFixture[str]) -> None:
    from planner.service.decision_log import configure_logging

    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        configure_logging("info", json_logs=True)
        DecisionLog().observe([capped_decision()], leader=False, advisory=False)
        err = capfd.readouterr().err.strip().splitlines()
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in saved[0]:
            root.addHandler(h)
        root.setLevel(saved[1])
    (line,) = [json.loads(x) for x in err if x.startswith("{")]
    assert line["level"] == "INFO" and line["name"] == "planner.decisions"
    assert line["final"] == 1 and line["recommended"] == 2 and line["leader"] is False
    assert "(follower: not applied)" in line["message"]


def test_a_stored_registration_is_taken_over_once_per_value() -> None:
    ops = operations()
    value = {"role": "decode", "service": "decode", "dp_size": 1, "fpm_endpoints": ["tcp://10.0.0.1:5557"]}
    stored = {"w-1": value, "w-2": dict(value, fpm_endpoints=["tcp://10.0.0.2:5557"])}
    assert [w for w, _ in ops.restorable(stored, known={"w-2"})] == ["w-1"]
    assert ops.restorable(stored, known=set()) == [("w-2", stored["w-2"])]  # w-1 lapsed here: not resurrected
    moved = dict(value, fpm_endpoints=["tcp://10.0.0.9:5557"])
    assert ops.restorable({"w-1": moved}, known=set()) == [("w-1", moved)]  # registered again elsewhere

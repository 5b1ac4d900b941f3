"""Events (``events.k8s.io/v1``) and status conditions on the scaled object: the correlator's dedup and rate
limit, the writes through the official client against the emulator, and what the real ``kubectl describe``
shows of them."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from planner.k8s.events import (
    ConditionType,
    ConditionWriter,
    CreateEvent,
    DropEvent,
    EventCorrelator,
    EventCorrelatorConfig,
    EventReason,
    EventRecorder,
    EventType,
    ObjectRef,
    PatchEvent,
    PlannedEvent,
    ScaleStatus,
    compute_conditions,
    parse_conditions,
)
from tests.fakes.k8s_api import Fault, K8sApiEmulator
from tests.k8s.k8s_support import NS, deployment, example_dgd

pytestmark = pytest.mark.kubernetes

T0 = 1_790_000_000.0
REF = ObjectRef(api_version="apps/v1", kind="Deployment", name="vllm-agg", namespace=NS)


def ev(reason: EventReason = EventReason.SUCCESSFUL_RESCALE, note: str = "New size: 3", ref: ObjectRef = REF) -> Any:
    return PlannedEvent(regarding=ref, type=EventType.NORMAL, reason=reason, note=note)


def correlator(**kw: Any) -> EventCorrelator:
    counter = itertools.count()
    return EventCorrelator(EventCorrelatorConfig(**kw), name_suffix=lambda: f"e{next(counter)}")


# ------------------------------------------------------------------------------------------------ pure correlator
def test_a_repeated_event_becomes_a_series_on_one_object() -> None:
    c = correlator()
    first = c.observe(ev(), T0)
    assert isinstance(first, CreateEvent) and first.body["metadata"]["name"] == "vllm-agg.e0"
    second = c.observe(ev(), T0 + 30)
    third = c.observe(ev(), T0 + 60)
    assert isinstance(second, PatchEvent) and second.name == "vllm-agg.e0" and second.patch["series"]["count"] == 2
    assert isinstance(third, PatchEvent) and third.patch["series"]["count"] == 3
    assert third.patch["series"]["lastObservedTime"].endswith("Z")


def test_a_different_note_or_reason_is_a_new_event() -> None:
    c = correlator()
    assert isinstance(c.observe(ev(note="New size: 3"), T0), CreateEvent)
    assert isinstance(c.observe(ev(note="New size: 4"), T0 + 1), CreateEvent)
    assert isinstance(c.observe(ev(reason=EventReason.BLIND_HOLD, note="New size: 4"), T0 + 2), CreateEvent)


def test_a_series_ends_after_its_window() -> None:
    c = correlator(series_window_s=600)
    c.observe(ev(), T0)
    again = c.observe(ev(), T0 + 601)
    assert isinstance(again, CreateEvent) and again.body["metadata"]["name"] == "vllm-agg.e1"


def test_the_token_bucket_is_per_object_and_refills() -> None:
    c = correlator(burst=3, refill_interval_s=300)
    other = ObjectRef(api_version="apps/v1", kind="Deployment", name="other", namespace=NS)
    out = [c.observe(ev(note=f"n{i}"), T0) for i in range(4)]
    assert [type(o) for o in out] == [CreateEvent, CreateEvent, CreateEvent, DropEvent]
    assert isinstance(c.observe(ev(note="x", ref=other), T0), CreateEvent)  # another object's bucket is full
    assert isinstance(c.observe(ev(note="n9"), T0 + 299), DropEvent)  # 299 s: not yet one token back
    assert isinstance(c.observe(ev(note="n9"), T0 + 301), CreateEvent)


def test_occurrences_dropped_by_the_rate_limit_are_counted_in_the_next_write() -> None:
    c = correlator(burst=1, refill_interval_s=100)
    assert isinstance(c.observe(ev(), T0), CreateEvent)
    assert isinstance(c.observe(ev(), T0 + 10), DropEvent)
    assert isinstance(c.observe(ev(), T0 + 20), DropEvent)
    patch = c.observe(ev(), T0 + 110)
    assert isinstance(patch, PatchEvent) and patch.patch["series"]["count"] == 4


def test_conditions_keep_their_transition_time_while_unchanged() -> None:
    first = compute_conditions(ScaleStatus(), (), T0)
    same = compute_conditions(ScaleStatus(), first, T0 + 60)
    assert same == first
    capped = compute_conditions(ScaleStatus(capped_at_max=True, predicted_miss=True), same, T0 + 120)
    by_type = {c.type: c for c in capped}
    limited = by_type[ConditionType.SCALING_LIMITED]
    assert (limited.status, limited.reason) == ("True", "TooManyReplicas")
    assert "predicted to be missed" in limited.message
    assert limited.last_transition_time != first[2].last_transition_time
    assert by_type[ConditionType.ABLE_TO_SCALE].last_transition_time == first[0].last_transition_time


def test_every_event_reason_has_a_row_in_docs_reasons() -> None:
    docs = Path(__file__).resolve().parents[2] / "docs" / "reasons.md"
    import re

    rows = set(re.findall(r"^\| event \| `([A-Za-z]+)` \|", docs.read_text(), flags=re.MULTILINE))
    assert rows == {r.value for r in EventReason}


# ------------------------------------------------------------------------------------------------ emulator + client
@pytest.fixture
def agg(emulator: K8sApiEmulator) -> dict[str, Any]:
    return emulator.put(deployment("vllm-agg", 2))


def ref_of(obj: dict[str, Any]) -> ObjectRef:
    m = obj["metadata"]
    return ObjectRef(api_version=obj["apiVersion"], kind=obj["kind"], name=m["name"], namespace=NS, uid=m["uid"])


def test_recorded_events_are_listed_by_regarding_with_their_series(
    agg: dict[str, Any], api_client: k8s.ApiClient
) -> None:
    rec = EventRecorder(api_client)
    for t in (T0, T0 + 15, T0 + 30):
        rec.record(ev(ref=ref_of(agg)), t)
    rec.record(ev(EventReason.BLIND_HOLD, "no attributable FPM: holding at 2", ref_of(agg)), T0 + 45)
    items = k8s.EventsV1Api(api_client).list_namespaced_event(NS, field_selector="regarding.name=vllm-agg").items
    by_reason = {e.reason: e for e in items}
    assert set(by_reason) == {"SuccessfulRescale", "BlindHold"}
    assert by_reason["SuccessfulRescale"].series.count == 3
    assert by_reason["SuccessfulRescale"].regarding.uid == agg["metadata"]["uid"]
    assert by_reason["SuccessfulRescale"].reporting_controller == "fpm-planner"
    assert rec.written == 4 and rec.failures == 0
    none = k8s.EventsV1Api(api_client).list_namespaced_event(NS, field_selector="regarding.name=other")
    assert none.items == []


def test_a_failed_event_write_is_counted_and_the_next_one_creates_it(
    emulator: K8sApiEmulator, agg: dict[str, Any], api_client: k8s.ApiClient
) -> None:
    emulator.inject(Fault("POST", r"/events$", status=500))
    rec = EventRecorder(api_client)
    assert isinstance(rec.record(ev(ref=ref_of(agg)), T0), CreateEvent)
    assert rec.failures == 1
    assert isinstance(rec.record(ev(ref=ref_of(agg)), T0 + 1), CreateEvent)
    assert rec.written == 1
    assert len(k8s.EventsV1Api(api_client).list_namespaced_event(NS).items) == 1


def test_conditions_are_written_to_the_deployment_once_per_change(
    emulator: K8sApiEmulator, agg: dict[str, Any], api_client: k8s.ApiClient
) -> None:
    writer = ConditionWriter.for_object(api_client, NS, "Deployment")
    writer.update("vllm-agg", "agg", ScaleStatus(), T0)
    writer.update("vllm-agg", "agg", ScaleStatus(), T0 + 15)  # unchanged: no write
    writer.update("vllm-agg", "agg", ScaleStatus(blind=True), T0 + 30)
    assert writer.writes == 2
    patches = [p for m, p in emulator.requests if m == "PATCH"]
    assert patches == ["/apis/apps/v1/namespaces/llm/deployments/vllm-agg"] * 2
    stored = emulator.get("deployments", NS, "vllm-agg")
    assert stored is not None and stored["spec"]["replicas"] == 2  # only the annotation changed
    conds = {c.type: c for c in parse_conditions(stored["metadata"]["annotations"], "agg")}
    assert (conds[ConditionType.SCALING_ACTIVE].status, conds[ConditionType.SCALING_ACTIVE].reason) == (
        "False",
        "Blind",
    )


def test_conditions_on_a_dgd_are_kept_per_service(emulator: K8sApiEmulator, api_client: k8s.ApiClient) -> None:
    dgd = emulator.put(example_dgd())
    name = dgd["metadata"]["name"]
    writer = ConditionWriter.for_object(api_client, NS, "DynamoGraphDeployment")
    writer.update(name, "decode", ScaleStatus(paused=True, paused_by="alice"), T0)
    writer.update(name, "prefill", ScaleStatus(capped_at_max=True, predicted_miss=True), T0)
    stored = emulator.get("dynamographdeployments", NS, name)
    assert stored is not None
    decode = {c.type: c for c in parse_conditions(stored["metadata"]["annotations"], "decode")}
    prefill = {c.type: c for c in parse_conditions(stored["metadata"]["annotations"], "prefill")}
    assert decode[ConditionType.PAUSED].status == "True" and "alice" in decode[ConditionType.PAUSED].message
    assert prefill[ConditionType.SCALING_LIMITED].reason == "TooManyReplicas"
    assert prefill[ConditionType.PAUSED].status == "False"


# ------------------------------------------------------------------------------------------------ kubectl
def kubectl(emulator: K8sApiEmulator, tmp_path: Path, *args: str) -> str:
    env = dict(os.environ, HOME=str(tmp_path), KUBECONFIG=str(tmp_path / "none"))
    done = subprocess.run(
        ["kubectl", "--server", emulator.url, "-n", NS, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_kubectl_describe_deployment_shows_the_events_and_conditions(
    emulator: K8sApiEmulator, agg: dict[str, Any], api_client: k8s.ApiClient, tmp_path: Path
) -> None:
    import time

    now = time.time()  # kubectl prints ages against the wall clock
    rec = EventRecorder(api_client)
    for i in range(3):
        rec.record(ev(note="New size: 3 (sla_needs_more)", ref=ref_of(agg)), now - 60 + i)
    rec.record(
        PlannedEvent(
            regarding=ref_of(agg),
            type=EventType.WARNING,
            reason=EventReason.CAPPED_AT_MAX,
            note="at max_replicas=4; predicted TTFT p90 900 ms > 500 ms",
        ),
        now,
    )
    ConditionWriter.for_object(api_client, NS, "Deployment").update(
        "vllm-agg", "agg", ScaleStatus(capped_at_max=True, predicted_miss=True), now
    )
    out = kubectl(emulator, tmp_path, "describe", "deployment/vllm-agg")
    events = out.split("Events:", 1)[1]
    assert "SuccessfulRescale" in events and "(x3 over" in events and "New size: 3 (sla_needs_more)" in events
    assert "Warning  CappedAtMaxWithPredictedMiss" in events and "fpm-planner" in events
    annotations = out.split("Annotations:", 1)[1].split("Selector:", 1)[0]
    assert "status.fpm-planner.io/agg: AbleToScale=True ScalingActive=True ScalingLimited=True(TooManyReplicas)" in (
        " ".join(annotations.split())
    )


def test_kubectl_describe_dgd_shows_the_events_and_conditions(
    emulator: K8sApiEmulator, api_client: k8s.ApiClient, tmp_path: Path
) -> None:
    import time

    dgd = emulator.put(example_dgd())
    name = dgd["metadata"]["name"]
    now = time.time()
    EventRecorder(api_client).record(
        PlannedEvent(
            regarding=ref_of(dgd),
            type=EventType.WARNING,
            reason=EventReason.BLIND_HOLD,
            note="decode: no attributable FPM for 3 ticks; holding at 2",
        ),
        now,
    )
    ConditionWriter.for_object(api_client, NS, "DynamoGraphDeployment").update(
        name, "decode", ScaleStatus(blind=True), now
    )
    out = kubectl(emulator, tmp_path, "describe", "dgd", name)
    assert "Warning  BlindHold" in out.split("Events:", 1)[1]
    assert "ScalingActive=False(Blind)" in out.split("Annotations:", 1)[1].split("API Version:", 1)[0]
    raw = kubectl(emulator, tmp_path, "get", "dgd", name, "-o", "json")
    conds = json.loads(json.loads(raw)["metadata"]["annotations"]["conditions.fpm-planner.io/decode"])["conditions"]
    assert {c["type"]: c["reason"] for c in conds}["ScalingActive"] == "Blind"

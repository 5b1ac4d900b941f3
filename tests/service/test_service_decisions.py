"""Decisions over HTTP: latest, list, explain, what-if (no action), leadership, metrics; the runner acting
through the local actuator on a simulated fleet."""

from __future__ import annotations

from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import msgspec
import pytest

from planner.actuators.local import LocalActuator
from planner.service.config import DiscoveryConfig, ServiceConfig
from planner.sim.fleet import FleetConfig, SimFleet
from planner.sim.realtime import RealtimeReplay
from planner.sim.timing import ProfileFitTimer
from planner.sim.traces import load_trace
from tests.fakes.leader import SwitchableElector
from tests.service.support import AUTH, Served, free_port, make_config, registration, serve, wait_for
from worker_shim.fpm import QueuedRequests, ScheduledRequests
from worker_shim.publisher import FpmPublisher


def sim_actuator() -> tuple[LocalActuator, SimFleet]:
    """A simulated fleet (no replay thread, no FPM) behind the local actuator: one 'sim-agg' replica."""
    timer = ProfileFitTimer(base_s=0.005, a_p=1.5e-5, a_attn=8e-10, a_d=3.5e-5, a_kv=3e-8)
    fleet = SimFleet(FleetConfig(cold_start_s=0.0), timer)
    trace = load_trace(str(resources.files("planner.service").joinpath("data/demo_trace.csv")))
    replay = RealtimeReplay(fleet, trace, speed=1.0, initial_replicas=1)
    return LocalActuator(replay, max_replicas=8), fleet


def sim_config() -> ServiceConfig:
    """Fast ticks; the agg role decides the fleet's 'sim-agg' service even with no worker discovered."""
    return msgspec.structs.replace(make_config(), tick_interval_s=0.1, core={"roles": {"agg": {"service": "sim-agg"}}})


def slow_ticks() -> ServiceConfig:
    """One tick at start, then none for an hour: what the test sees is what that tick decided."""
    return make_config(FPM_PLANNER_TICK_INTERVAL_S="3600")


@pytest.fixture()
def one_tick(tmp_path: Path) -> Iterator[Served]:
    """A planner that ticked once, with one decode worker from a static workers file, silent."""
    workers = tmp_path / "workers.yaml"
    port = free_port()
    workers.write_text(
        f"workers:\n  - {{worker_id: w-1, role: decode, service: decode, host: 127.0.0.1, fpm_port_base: {port}}}\n"
    )
    config = msgspec.structs.replace(slow_ticks(), discovery=DiscoveryConfig(static_file=str(workers)))
    with serve(config) as served:
        wait_for(lambda: served.http.get("/readyz").status_code == 200)
        yield served


def test_latest_list_and_explain(service: Served) -> None:
    service.http.put(
        "/v1/workers/w-1", json=registration([f"tcp://127.0.0.1:{free_port()}"]), headers=AUTH
    ).raise_for_status()
    latest = wait_for(
        lambda: [d for d in service.http.get("/v1/decisions/latest").json()["decisions"] if d["service"] == "decode"]
    )
    (decision,) = latest
    assert decision["role"] == "decode"
    assert decision["reasons"][-1] in ("hold", "scale_up", "scale_down")
    assert decision["summary"]

    listed = service.http.get("/v1/decisions", params={"role": "decode", "limit": 3}).json()["decisions"]
    assert 1 <= len(listed) <= 3
    assert all(d["role"] == "decode" for d in listed)
    assert [d["id"] for d in listed] == sorted((d["id"] for d in listed), reverse=True)  # newest first
    newest = listed[0]
    since = newest["decided_at_s"]
    later = wait_for(lambda: service.http.get("/v1/decisions", params={"since": since}).json()["decisions"])
    assert all(d["decided_at_s"] > since for d in later)  # non-empty: wait_for returns only a truthy list
    assert newest["id"] not in {d["id"] for d in later}
    assert service.http.get("/v1/decisions", params={"role": "prefill"}).json()["decisions"] == []

    explained = service.http.get(f"/v1/decisions/{decision['id']}/explain").json()
    stages = [s["stage"] for s in explained["stages"]]
    assert stages and stages[0] == "recommend" and "bounds" in stages and "stabilize" in stages
    assert all({"stage", "replicas", "reason", "detail"} <= set(s) for s in explained["stages"])
    assert explained["coverage"]["discovered"] == 1
    assert explained["coverage"]["silent"] == 1  # registered, never published
    assert explained["inputs"]["engines_expected"] == 1
    assert explained["final"] == decision["final"]


def test_what_if_answers_without_acting(one_tick: Served) -> None:
    served = one_tick
    decisions_before = len(served.runner.history)
    outcomes_before = served.http.get("/v1/outcomes").json()["outcomes"]
    state_before = served.runner.core_state
    response = served.http.post(
        "/v1/what-if",
        json={"roles": {"decode": {"decode_requests": 5000, "decode_kv_tokens": 4.0e6, "itl_ms": 20}}},
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["applied"] is False
    (decode,) = [d for d in body["decisions"] if d["service"] == "decode"]
    assert decode["inputs"]["overridden"] is True
    assert decode["recommended_replicas"] > decode["current_replicas"]
    assert "load_overridden" in decode["reasons"]
    # Nothing was kept or sent.
    assert len(served.runner.history) == decisions_before
    assert served.http.get("/v1/outcomes").json()["outcomes"] == outcomes_before
    assert served.runner.core_state is state_before


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"roles": {"decode": {"load": 3}}}, 400),
        ({"role": "decode"}, 400),
        ({"roles": {"decode": {"itl_ms": 0}}}, 422),
        ({"roles": {"decode": {"load_scale": -1}}}, 422),
        ({"roles": {"router": {"load_scale": 2}}}, 422),
    ],
    ids=["unknown role field", "unknown top-level field", "zero itl", "negative scale", "unknown role"],
)
def test_what_if_rejects_bad_input(one_tick: Served, body: dict[str, object], expected: int) -> None:
    assert one_tick.http.post("/v1/what-if", json=body).status_code == expected


def test_a_follower_decides_but_never_acts_and_a_leader_acts() -> None:
    actuator, fleet = sim_actuator()
    elector = SwitchableElector(leader=False)
    config = sim_config()
    with serve(config, actuator=actuator, elector=elector) as served:
        assert served.http.get("/v1/diagnostics").json()["leadership"] == "follower"
        # min 3 forces a scale-up from the one replica the fleet has
        served.http.patch("/v1/bounds", json={"roles": {"agg": {"min_replicas": 3}}}, headers=AUTH).raise_for_status()
        outcomes = wait_for(lambda: served.http.get("/v1/outcomes").json()["outcomes"])
        assert {o["kind"] for o in outcomes} == {"not_leader"}
        assert all(not o["applied"] and o["service"] == "sim-agg" and o["requested"] == 3 for o in outcomes)
        assert fleet.desired(fleet.config.roles[0]) == 1  # never touched
        decision = served.http.get("/v1/decisions/latest").json()["decisions"][0]
        assert decision["leader"] is False and decision["action"] == "scale_up"

        elector.is_leader = True
        applied = wait_for(
            lambda: [o for o in served.http.get("/v1/outcomes").json()["outcomes"] if o["kind"] == "applied"]
        )
        assert applied[0]["requested"] == 3 and applied[0]["applied"] is True
        assert fleet.desired(fleet.config.roles[0]) == 3
        assert served.http.get("/v1/diagnostics").json()["leadership"] == "leader"
        metrics = served.http.get("/metrics").text
        assert 'fpm_planner_actuator_outcomes_total{outcome="not_leader",service="sim-agg"}' in metrics
        assert 'fpm_planner_actuator_outcomes_total{outcome="applied",service="sim-agg"} 1.0' in metrics


def test_metrics_follow_decisions(one_tick: Served) -> None:
    text = one_tick.http.get("/metrics").text
    assert 'fpm_planner_replicas{kind="final",role="decode",service="decode"}' in text
    assert 'fpm_planner_replicas{kind="current",role="decode",service="decode"}' in text
    assert 'fpm_planner_replicas{kind="recommended",role="decode",service="decode"}' in text
    assert 'fpm_planner_decision_reasons_total{reason="hold",role="decode",service="decode"} 1.0' in text
    assert "fpm_planner_tick_duration_seconds_count 1.0" in text


def test_bounds_patch_reaches_the_next_decision() -> None:
    actuator, fleet = sim_actuator()
    config = sim_config()
    with serve(config, actuator=actuator) as served:
        served.http.patch(
            "/v1/bounds", json={"roles": {"agg": {"min_replicas": 2, "max_replicas": 2}}}, headers=AUTH
        ).raise_for_status()
        wait_for(lambda: fleet.desired(fleet.config.roles[0]) == 2)
        decision = served.http.get("/v1/decisions/latest").json()["decisions"][0]
        explained = served.http.get(f"/v1/decisions/{decision['id']}/explain").json()
        assert decision["final"] == 2
        assert explained["final"] == 2


def test_a_static_worker_is_listed_and_cannot_be_registered_over(one_tick: Served) -> None:
    (worker,) = one_tick.http.get("/v1/workers").json()["workers"]
    assert worker["worker_id"] == "w-1" and worker["source"] == "static" and worker["expires_at_s"] is None
    body = registration([f"tcp://127.0.0.1:{free_port()}"])
    response = one_tick.http.put("/v1/workers/w-1", json=body, headers=AUTH)
    assert response.status_code == 422
    assert "static workers file" in response.json()["detail"]


def test_the_perf_model_learns_from_the_fleets_samples(service: Served) -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    with FpmPublisher(worker_id="w-learn", endpoint=endpoint, heartbeat_interval_s=0.05) as publisher:
        service.http.put("/v1/workers/w-learn", json=registration([endpoint]), headers=AUTH).raise_for_status()

        def learned() -> bool:
            for batch in range(1, 9):  # decode steps of varying batch: 5 ms + 0.1 ms per sequence
                publisher.publish(
                    0.005 + 0.0001 * batch * 8,
                    ScheduledRequests(num_decode_requests=batch * 8, sum_decode_kv_tokens=batch * 8000),
                    QueuedRequests(),
                )
            roles = service.http.get("/v1/diagnostics").json()["perf_model"]["roles"]
            return int(roles["decode"]["accepted"]) >= 32

        wait_for(learned)
        roles = service.http.get("/v1/diagnostics").json()["perf_model"]["roles"]
        assert roles["prefill"]["accepted"] == 0 and roles["agg"]["accepted"] == 0


def test_latest_holds_one_decision_per_service_of_the_last_tick(service: Served) -> None:
    for wid, svc in (("w-a", "decode-a"), ("w-b", "decode-b")):
        body = registration([f"tcp://127.0.0.1:{free_port()}"], service=svc)
        service.http.put(f"/v1/workers/{wid}", json=body, headers=AUTH).raise_for_status()

    def latest_services() -> list[str]:
        return [d["service"] for d in service.http.get("/v1/decisions/latest").json()["decisions"]]

    wait_for(lambda: latest_services() == ["decode-a", "decode-b"])
    service.http.delete("/v1/workers/w-b", headers=AUTH).raise_for_status()
    wait_for(lambda: latest_services() == ["decode-a"])
    assert [d["service"] for d in service.http.get("/v1/diagnostics").json()["latest_decisions"]] == ["decode-a"]


def test_the_perf_model_is_offered_at_most_its_per_tick_budget() -> None:
    config = make_config()
    config = msgspec.structs.replace(
        config, perf_model=msgspec.structs.replace(config.perf_model, max_samples_per_tick=8)
    )
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    with serve(config) as served, FpmPublisher(worker_id="w-busy", endpoint=endpoint) as publisher:
        served.http.put("/v1/workers/w-busy", json=registration([endpoint]), headers=AUTH).raise_for_status()

        def offered() -> int:
            for _ in range(200):  # far more samples per tick than the budget
                publisher.publish(0.01, ScheduledRequests(num_decode_requests=4), QueuedRequests())
            return int(served.http.get("/v1/diagnostics").json()["perf_model"]["roles"]["decode"]["offered"])

        wait_for(lambda: offered() >= 24)
        diag = served.http.get("/v1/diagnostics").json()
        ticks, total = diag["ticks"], diag["perf_model"]["roles"]["decode"]["offered"]
        assert 0 < total <= 8 * (ticks + 1)
        assert diag["workers"][0]["ranks"][0]["samples"] > total  # the store kept more than the model was offered

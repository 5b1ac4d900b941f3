"""The planner's HTTP API against a real uvicorn server, over HTTP."""

from __future__ import annotations

from typing import Any

import pytest

from tests.service.support import AUTH, TOKEN, Served, free_port, make_config, registration, serve, wait_for


def endpoints(n: int) -> list[str]:
    return [f"tcp://127.0.0.1:{free_port()}" for _ in range(n)]


# -- registration ----------------------------------------------------------------


def test_register_renew_list_deregister(service: Served) -> None:
    body = registration(endpoints(2), ttl_s=60.0)
    first = service.http.put("/v1/workers/w-1", json=body, headers=AUTH)
    assert first.status_code == 200, first.text
    assert set(first.json()) == {"worker_id", "expires_at_s"}
    assert first.json()["worker_id"] == "w-1"

    listed = service.http.get("/v1/workers").json()["workers"]
    assert [w["worker_id"] for w in listed] == ["w-1"]
    assert listed[0]["fpm_endpoints"] == body["fpm_endpoints"]
    assert listed[0]["capacity"]["kv_capacity_tokens"] == 100_000
    assert listed[0]["source"] == "registration"

    renewed = service.http.put("/v1/workers/w-1", json=body, headers=AUTH)
    assert renewed.status_code == 200
    assert renewed.json()["expires_at_s"] >= first.json()["expires_at_s"]

    gone = service.http.delete("/v1/workers/w-1", headers=AUTH)
    assert gone.status_code == 200 and gone.json() == {"worker_id": "w-1", "deregistered": True}
    assert service.http.get("/v1/workers").json()["workers"] == []
    assert service.http.delete("/v1/workers/w-1", headers=AUTH).status_code == 404


def test_registration_appears_in_diagnostics_as_silent(service: Served) -> None:
    service.http.put("/v1/workers/w-2", json=registration(endpoints(1)), headers=AUTH).raise_for_status()
    diag = service.http.get("/v1/diagnostics").json()
    (worker,) = diag["workers"]
    assert worker["worker_id"] == "w-2"
    assert worker["classification"] == "silent"
    assert worker["ranks"][0]["last_sample_age_s"] is None
    assert diag["roles"]["decode"]["discovered"] == 1
    assert diag["roles"]["decode"]["fpm_covered"] == 0


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({}, 401),
        ({"Authorization": "Bearer wrong"}, 401),
        ({"Authorization": f"Basic {TOKEN}"}, 401),
        ({"Authorization": TOKEN}, 401),
    ],
    ids=["missing token", "wrong token", "wrong scheme", "no scheme"],
)
def test_mutating_endpoints_refuse_a_missing_or_wrong_token(
    service: Served, headers: dict[str, str], expected: int
) -> None:
    body = registration(endpoints(1))
    assert service.http.put("/v1/workers/w-3", json=body, headers=headers).status_code == expected
    assert service.http.get("/v1/workers").json()["workers"] == []  # nothing registered
    service.http.put("/v1/workers/w-3", json=body, headers=AUTH).raise_for_status()
    assert service.http.delete("/v1/workers/w-3", headers=headers).status_code == expected
    assert len(service.http.get("/v1/workers").json()["workers"]) == 1  # still there
    patch = {"roles": {"decode": {"max_replicas": 3}}}
    assert service.http.patch("/v1/bounds", json=patch, headers=headers).status_code == expected
    assert service.http.get("/v1/bounds").json()["roles"]["decode"]["max_replicas"] != 3


def test_mutations_are_disabled_without_a_configured_token() -> None:
    with serve(make_config(FPM_PLANNER_TOKEN="")) as served:
        response = served.http.put("/v1/workers/w", json=registration(endpoints(1)), headers=AUTH)
        assert response.status_code == 403
        assert "FPM_PLANNER_TOKEN" in response.json()["detail"]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"ttl": 5}, 400),  # unknown field
        ({"capacity": {"max_num_seqs": 4, "kv_tokens": 1}}, 400),  # unknown nested field
        ({"role": "router"}, 422),
        ({"dp_size": 0}, 422),
        ({"dp_size": 3}, 422),  # 3 ranks, 1 endpoint
        ({"fpm_endpoints": ["http://127.0.0.1:1"]}, 422),
        ({"ttl_s": -1}, 422),
        ({"ttl_s": 1e9}, 422),  # over the registry's max TTL
        ({"capacity": {"max_num_seqs": -4}}, 422),
        ({"service": ""}, 422),
    ],
    ids=[
        "unknown field",
        "unknown capacity field",
        "bad role",
        "dp_size 0",
        "endpoints do not match dp_size",
        "not a zmq endpoint",
        "negative ttl",
        "ttl over the maximum",
        "negative capacity",
        "empty service",
    ],
)
def test_bad_registrations_are_refused_and_lose_nothing(service: Served, change: dict[str, Any], expected: int) -> None:
    service.http.put("/v1/workers/keep", json=registration(endpoints(1)), headers=AUTH).raise_for_status()
    body = {**registration(endpoints(1)), **change}
    response = service.http.put("/v1/workers/bad", json=body, headers=AUTH)
    assert response.status_code == expected, response.text
    assert response.json()["detail"]
    assert [w["worker_id"] for w in service.http.get("/v1/workers").json()["workers"]] == ["keep"]


def test_malformed_json_is_a_400(service: Served) -> None:
    response = service.http.put(
        "/v1/workers/x", content=b"{not json", headers={**AUTH, "Content-Type": "application/json"}
    )
    assert response.status_code == 400


def test_an_endpoint_held_by_another_worker_is_a_409(service: Served) -> None:
    shared = endpoints(1)
    service.http.put("/v1/workers/a", json=registration(shared), headers=AUTH).raise_for_status()
    response = service.http.put("/v1/workers/b", json=registration(shared), headers=AUTH)
    assert response.status_code == 409
    assert "'a'" in response.json()["detail"]


# -- bounds ----------------------------------------------------------------


def test_bounds_patch_applies_and_validates(service: Served) -> None:
    before = service.http.get("/v1/bounds").json()
    assert set(before["roles"]) == {"agg", "decode", "prefill"}
    response = service.http.patch(
        "/v1/bounds",
        json={"roles": {"decode": {"min_replicas": 2, "max_replicas": 9}}, "max_total_gpus": 40},
        headers=AUTH,
    )
    assert response.status_code == 200, response.text
    after = service.http.get("/v1/bounds").json()
    assert after["roles"]["decode"]["min_replicas"] == 2
    assert after["roles"]["decode"]["max_replicas"] == 9
    assert after["max_total_gpus"] == 40
    assert after["roles"]["prefill"] == before["roles"]["prefill"]

    # only max: min is kept
    service.http.patch("/v1/bounds", json={"roles": {"decode": {"max_replicas": 5}}}, headers=AUTH).raise_for_status()
    assert service.http.get("/v1/bounds").json()["roles"]["decode"] == {
        **after["roles"]["decode"],
        "max_replicas": 5,
    }

    bad = [
        ({"gpu_budget": 3}, 400),
        ({"roles": {"decode": {"max": 3}}}, 400),
        ({"roles": {"decoder": {"max_replicas": 3}}}, 422),
        ({"roles": {"decode": {"min_replicas": 6, "max_replicas": 3}}}, 422),
        ({"roles": {"decode": {"min_replicas": 7}}}, 422),  # above the current max 5
        ({"roles": {"decode": {"max_replicas": -1}}}, 422),
        ({"max_total_gpus": "many"}, 422),
    ]
    for body, expected in bad:
        response = service.http.patch("/v1/bounds", json=body, headers=AUTH)
        assert response.status_code == expected, (body, response.text)
    assert service.http.get("/v1/bounds").json()["roles"]["decode"]["max_replicas"] == 5  # nothing changed

    service.http.patch("/v1/bounds", json={"max_total_gpus": None}, headers=AUTH).raise_for_status()
    assert service.http.get("/v1/bounds").json()["max_total_gpus"] is None


# -- health, metrics, openapi ----------------------------------------------------------------


def test_health_and_openapi(service: Served) -> None:
    assert service.http.get("/healthz").json()["status"] == "ok"
    spec = service.http.get("/openapi.json").json()
    paths = set(spec["paths"])
    assert {
        "/v1/workers",
        "/v1/workers/{worker_id}",
        "/v1/decisions",
        "/v1/decisions/latest",
        "/v1/decisions/{decision_id}/explain",
        "/v1/what-if",
        "/v1/bounds",
        "/v1/diagnostics",
        "/healthz",
        "/readyz",
        "/metrics",
    } <= paths
    assert "HTTPBearer" in spec["components"]["securitySchemes"]


def test_metrics_exports_the_dashboard_series(service: Served) -> None:
    text = service.http.get("/metrics").text
    wait_for(lambda: "fpm_planner_tick_duration_seconds_bucket" in service.http.get("/metrics").text)
    wait_for(lambda: "fpm_planner_fpm_drops_total" in service.http.get("/metrics").text)
    assert "# TYPE fpm_planner_replicas gauge" in text
    assert "# TYPE fpm_planner_decision_reasons_total counter" in text
    assert "# TYPE fpm_planner_actuator_outcomes_total counter" in text
    assert "# TYPE fpm_planner_estimated_ttft_ms gauge" in text
    assert "# TYPE fpm_planner_estimated_itl_ms gauge" in text


def test_unknown_decision_is_a_404(service: Served) -> None:
    assert service.http.get("/v1/decisions/999999/explain").status_code == 404

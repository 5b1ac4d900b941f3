"""Credentials, the body limit and endpoint validation, against a real uvicorn server over HTTP (issue 12, items
10 and 11)."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import httpx
import pytest

from planner.discovery import StaticFileDiscovery
from planner.errors import ConfigError
from planner.service.auth import TokenRole
from planner.service.runner import PlannerRunner
from tests.service.support import AUTH, free_port, make_config, registration, serve, serve_runner

WORKER_TOKEN = "worker-token-0123456789abcdef0123456789"
READ_TOKEN = "read-token-0123456789abcdef0123456789ab"
WORKER = {"Authorization": f"Bearer {WORKER_TOKEN}"}
READ = {"Authorization": f"Bearer {READ_TOKEN}"}


def endpoint() -> str:
    return f"tcp://127.0.0.1:{free_port()}"


# -- credentials -------------------------------------------------------------------------------------------


def test_worker_token_registers_but_cannot_change_bounds_and_read_token_cannot_mutate() -> None:
    config = make_config(FPM_PLANNER_WORKER_TOKEN=WORKER_TOKEN, FPM_PLANNER_READ_TOKEN=READ_TOKEN)
    with serve(config) as served:
        http = served.http
        assert http.put("/v1/workers/w-1", json=registration([endpoint()]), headers=WORKER).status_code == 200
        patch = {"roles": {"decode": {"max_replicas": 3}}}
        refused = http.patch("/v1/bounds", json=patch, headers=WORKER)
        assert refused.status_code == 403
        assert "'worker' (worker)" in refused.json()["detail"]
        assert http.put("/v1/workers/w-2", json=registration([endpoint()]), headers=READ).status_code == 403
        assert http.delete("/v1/workers/w-1", headers=READ).status_code == 403
        assert http.patch("/v1/bounds", json=patch, headers=READ).status_code == 403
        assert http.get("/v1/bounds").json()["roles"]["decode"]["max_replicas"] != 3
        assert [w["worker_id"] for w in http.get("/v1/workers").json()["workers"]] == ["w-1"]
        # the operator token (FPM_PLANNER_TOKEN, named "default") does both
        assert http.patch("/v1/bounds", json=patch, headers=AUTH).status_code == 200
        assert http.delete("/v1/workers/w-1", headers=WORKER).status_code == 200


def test_named_tokens_from_a_file_resolve_to_their_principal(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text(
        f"tokens:\n  - {{name: alice, role: operator, token: {'a' * 40}}}\n"
        f"  - {{name: fleet-1, role: worker, token: {'w' * 40}}}\n"
    )
    runner = PlannerRunner(make_config(FPM_PLANNER_TOKEN="", FPM_PLANNER_TOKENS_FILE=str(path)))
    alice = runner.credentials.resolve("a" * 40)
    assert alice is not None and (alice.name, alice.role) == ("alice", TokenRole.OPERATOR)
    fleet = runner.credentials.resolve("w" * 40)
    assert fleet is not None and (fleet.name, fleet.role) == ("fleet-1", TokenRole.WORKER)
    assert runner.credentials.resolve("a" * 39) is None
    with serve_runner(runner) as served:
        body = registration([endpoint()])
        assert served.http.put("/v1/workers/w", json=body, headers={"Authorization": f"Bearer {'w' * 40}"}).is_success
        patch = {"roles": {"decode": {"max_replicas": 3}}}
        assert (
            served.http.patch("/v1/bounds", json=patch, headers={"Authorization": f"Bearer {'w' * 40}"}).status_code
            == 403
        )
        assert served.http.patch("/v1/bounds", json=patch, headers={"Authorization": f"Bearer {'a' * 40}"}).is_success


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"FPM_PLANNER_TOKEN": "s3cret"}, "FPM_PLANNER_TOKEN: the token of 'default' is 6 bytes; at least 32"),
        ({"FPM_PLANNER_WORKER_TOKEN": "x" * 31}, "FPM_PLANNER_WORKER_TOKEN: the token of 'worker' is 31 bytes"),
        (
            {"FPM_PLANNER_TOKEN": "x" * 32, "FPM_PLANNER_READ_TOKEN": "x" * 32},
            "the token of 'read' is also used by another credential",
        ),
    ],
    ids=["operator token short", "worker token short", "same token twice"],
)
def test_the_service_refuses_to_start_with_a_weak_token(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        PlannerRunner(make_config(**env))
    assert message in str(err.value)
    for token in env.values():
        assert token not in str(err.value)  # the token itself is never shown


def test_a_tokens_file_with_bad_yaml_never_quotes_its_content(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    secret = "s" * 40
    path.write_text(f"tokens: [{{name: a, role: operator, token: {secret}]\n")
    with pytest.raises(ConfigError) as err:
        PlannerRunner(make_config(FPM_PLANNER_TOKENS_FILE=str(path)))
    assert "not valid YAML" in str(err.value) and secret not in str(err.value)


def test_disabled_mutations_are_logged_loudly_at_start(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="planner.service.app")
    with serve(make_config(FPM_PLANNER_TOKEN="")):
        pass
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "MUTATIONS DISABLED" in r.message]
    assert len(warnings) == 1


# -- body limit --------------------------------------------------------------------------------------------


def test_a_body_past_the_limit_is_413_before_authentication() -> None:
    with serve(make_config(FPM_PLANNER_MAX_BODY_BYTES="4096")) as served:
        big = b'{"roles": {}, "pad": "' + b"x" * 10_000 + b'"}'
        # no token at all: the size answers first (413, not 401)
        response = served.http.patch("/v1/bounds", content=big, headers={"content-type": "application/json"})
        assert response.status_code == 413
        assert "4096" in response.json()["detail"]
        assert served.http.post("/v1/what-if", content=big).status_code == 413

        def chunks() -> object:
            for _ in range(10):
                yield b"x" * 1000

        chunked = httpx.post(f"{served.base_url}/v1/what-if", content=chunks(), timeout=10.0)  # type: ignore[arg-type]
        assert chunked.status_code == 413
        # within the limit everything works as before
        assert served.http.post("/v1/what-if", json={"roles": {}}).status_code == 200


def test_a_declared_length_past_the_limit_is_refused_without_reading_the_body() -> None:
    with serve(make_config(FPM_PLANNER_MAX_BODY_BYTES="1024")) as served:
        host, port = served.base_url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10.0) as sock:
            sock.sendall(
                b"POST /v1/what-if HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 1073741824\r\n\r\n{"
            )  # announces 1 GiB, sends one byte
            answer = sock.recv(4096)
        assert answer.startswith(b"HTTP/1.1 413")


# -- endpoints ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        "ipc:///tmp/fpm-0",
        "inproc://fpm",
        "tcp://*:20380",
        "tcp://0.0.0.0:20380",
        "tcp://[::]:20380",
        "tcp://127.0.0.1:0",
        "tcp://127.0.0.1:70000",
        "tcp://127.0.0.1",
        "tcp://eth0;127.0.0.1:5",
        "tcp://::1:5",
        "tcp://999.1.1.1:5",
        "tcp://224.0.0.1:5",
    ],
)
def test_registration_refuses_an_endpoint_that_is_not_a_connectable_tcp_address(bad: str) -> None:
    with serve(make_config()) as served:
        response = served.http.put("/v1/workers/w", json=registration([bad]), headers=AUTH)
        assert response.status_code == 422, response.text
        assert served.http.get("/v1/workers").json()["workers"] == []


@pytest.mark.parametrize("good", ["tcp://10.0.0.7:20380", "tcp://vllm-0.vllm.ns.svc:20380", "tcp://[fd00::7]:1"])
def test_registration_accepts_connectable_tcp_endpoints(good: str) -> None:
    with serve(make_config()) as served:
        assert served.http.put("/v1/workers/w", json=registration([good]), headers=AUTH).status_code == 200


def test_a_registration_cannot_take_over_an_endpoint_a_discovery_source_holds(tmp_path: Path) -> None:
    """A pod (any discovery source) owns its FPM endpoint: a token holder registering another id on it is
    refused (409) and the pod's worker stays the one listened to."""
    taken = endpoint()
    path = tmp_path / "pods.yaml"
    path.write_text(f"workers:\n  - {{worker_id: pod-0, role: decode, service: decode, fpm_endpoints: [{taken}]}}\n")
    runner = PlannerRunner(make_config(), sources=(StaticFileDiscovery(path),))
    with serve_runner(runner) as served:
        response = served.http.put("/v1/workers/thief", json=registration([taken]), headers=AUTH)
        assert response.status_code == 409, response.text
        assert "pod-0" in response.json()["detail"]
        workers = served.http.get("/v1/workers").json()["workers"]
        assert [(w["worker_id"], w["fpm_endpoints"]) for w in workers] == [("pod-0", [taken])]

"""Registration clients: the API client against a stand-in HTTP server, the static file against discovery."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from planner.discovery import EngineCapacity, Role, StaticFileDiscovery, WorkerRecord
from planner.errors import DiscoveryError, LeaseError
from tests.fakes.registration_server import RegistrationServer
from tests.fakes.tiny_vllm import free_port
from worker_shim.registration import ApiRegistrar, StaticFileRegistrar, registration_body

RECORD = WorkerRecord(
    worker_id="w-1",
    role=Role.DECODE,
    service="llama",
    dp_size=2,
    fpm_endpoints=("tcp://10.0.0.1:20380", "tcp://10.0.0.1:20381"),
    capacity=EngineCapacity(
        max_num_batched_tokens=2048, max_num_seqs=64, max_model_len=4096, kv_capacity_tokens=100_000
    ),
)


def test_put_carries_the_contract_body_and_token() -> None:
    with RegistrationServer(token="s3cret") as api:
        registrar = ApiRegistrar(api.url, "s3cret", ttl_s=12.0)
        expires = registrar.register(RECORD)
        registrar.deregister("w-1")
        methods = api.methods()
        first = api.requests[0]
    assert methods == ["PUT", "DELETE"]
    assert first.path == "/v1/workers/w-1"
    assert first.authorization == "Bearer s3cret"
    assert first.body == {
        "role": "decode",
        "service": "llama",
        "dp_size": 2,
        "fpm_endpoints": ["tcp://10.0.0.1:20380", "tcp://10.0.0.1:20381"],
        "capacity": {
            "max_num_batched_tokens": 2048,
            "max_num_seqs": 64,
            "max_model_len": 4096,
            "kv_capacity_tokens": 100_000,
        },
        "ttl_s": 12.0,
    }
    assert expires > time.time()


def test_worker_id_is_escaped_in_the_path() -> None:
    record = WorkerRecord(worker_id="pod/a b", role=Role.AGG, service="s", fpm_endpoints=("tcp://h:1",))
    with RegistrationServer(token="t") as api:
        ApiRegistrar(api.url, "t").register(record)
    assert api.requests[0].path == "/v1/workers/pod%2Fa%20b"


def test_a_refused_token_is_a_lease_error() -> None:
    with RegistrationServer(token="right") as api, pytest.raises(LeaseError, match="401"):
        ApiRegistrar(api.url, "wrong").register(RECORD)


def test_a_server_error_is_a_discovery_error_not_a_lease_error() -> None:
    with RegistrationServer(token="t", fail_status=503) as api, pytest.raises(DiscoveryError, match="503") as info:
        ApiRegistrar(api.url, "t").register(RECORD)
    assert not isinstance(info.value, LeaseError)


def test_an_unreachable_server_is_a_discovery_error() -> None:
    registrar = ApiRegistrar(f"http://127.0.0.1:{free_port()}", "t", timeout_s=2.0)
    with pytest.raises(DiscoveryError, match="failed"):
        registrar.register(RECORD)


def test_deregistering_an_unknown_worker_is_not_an_error() -> None:
    with RegistrationServer(token="t") as api:
        ApiRegistrar(api.url, "t").deregister("never-registered")
    assert api.methods() == ["DELETE"]


def test_a_bad_url_is_refused_up_front() -> None:
    with pytest.raises(DiscoveryError, match="http"):
        ApiRegistrar("planner:8080", "t")


def test_registration_body_is_what_the_registry_parses() -> None:
    body = registration_body(RECORD, 30.0)
    assert set(body) == {"role", "service", "dp_size", "fpm_endpoints", "capacity", "ttl_s"}


def test_static_file_entry_is_read_back_by_discovery(tmp_path: Path) -> None:
    path = tmp_path / "workers.yaml"
    StaticFileRegistrar(path).register(RECORD)
    assert StaticFileDiscovery(path).workers(0.0) == {"w-1": RECORD}


def test_static_file_keeps_other_workers_and_replaces_its_own(tmp_path: Path) -> None:
    path = tmp_path / "workers.yaml"
    other = {
        "worker_id": "w-other",
        "role": "prefill",
        "service": "llama",
        "dp_size": 1,
        "fpm_endpoints": ["tcp://10.0.0.2:20380"],
    }
    path.write_text(yaml.safe_dump({"workers": [other]}))
    registrar = StaticFileRegistrar(path)
    registrar.register(RECORD)
    moved = WorkerRecord(
        worker_id="w-1", role=Role.DECODE, service="llama", dp_size=1, fpm_endpoints=("tcp://10.0.0.9:20380",)
    )
    registrar.register(moved)
    workers = StaticFileDiscovery(path).workers(0.0)
    assert set(workers) == {"w-other", "w-1"}
    assert workers["w-1"] == moved
    registrar.deregister("w-1")
    assert set(StaticFileDiscovery(path).workers(0.0)) == {"w-other"}
    assert not list(tmp_path.glob(".workers.yaml.*.tmp"))


def test_static_file_that_does_not_parse_is_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "workers.yaml"
    path.write_text("workers: [unclosed\n")
    with pytest.raises(DiscoveryError, match="left untouched"):
        StaticFileRegistrar(path).register(RECORD)
    assert path.read_text() == "workers: [unclosed\n"


def test_static_file_deregister_of_a_missing_file_is_a_no_op(tmp_path: Path) -> None:
    StaticFileRegistrar(tmp_path / "none.yaml").deregister("w-1")
    assert not (tmp_path / "none.yaml").exists()

"""The registration contract from both sides: the worker launcher's own client (worker_shim.registration.
ApiRegistrar) against the real planner service."""

from __future__ import annotations

import time

import pytest

from planner.discovery import EngineCapacity, Role, WorkerRecord
from planner.errors import LeaseError
from tests.service.support import TOKEN, Served, free_port
from worker_shim.registration import ApiRegistrar


@pytest.mark.parametrize("worker_id", ["worker_1", "vllm-decode-7f9c4-abcde", "host.example:0", "w@node+1"])
def test_the_launchers_client_registers_renews_and_deregisters(service: Served, worker_id: str) -> None:
    record = WorkerRecord(
        worker_id=worker_id,
        role=Role.DECODE,
        service="decode",
        dp_size=2,
        fpm_endpoints=(f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"),
        capacity=EngineCapacity(kv_capacity_tokens=945029),
    )
    registrar = ApiRegistrar(service.base_url, TOKEN, ttl_s=20.0)
    before = time.time()
    expires = registrar.register(record)
    assert before + 19.0 <= expires <= time.time() + 21.0  # Unix seconds, now + ttl_s
    (listed,) = service.http.get("/v1/workers").json()["workers"]
    assert listed["worker_id"] == worker_id
    assert listed["fpm_endpoints"] == list(record.fpm_endpoints)
    assert listed["capacity"]["kv_capacity_tokens"] == 945029
    assert registrar.register(record) >= expires  # renewal
    registrar.deregister(worker_id)
    assert service.http.get("/v1/workers").json()["workers"] == []
    registrar.deregister(worker_id)  # already gone: not an error for the launcher


def test_the_launchers_client_with_a_wrong_token_is_refused(service: Served) -> None:
    record = WorkerRecord(
        worker_id="w", role=Role.AGG, service="agg", fpm_endpoints=(f"tcp://127.0.0.1:{free_port()}",)
    )
    with pytest.raises(LeaseError, match="answered 401"):
        ApiRegistrar(service.base_url, "not-the-token").register(record)
    assert service.http.get("/v1/workers").json()["workers"] == []

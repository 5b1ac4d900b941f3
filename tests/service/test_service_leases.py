"""Registration leases end to end: a real FpmPublisher over ZMQ, the planner's subscriber behind the API."""

from __future__ import annotations

import time
from collections.abc import Iterator

import msgspec
import pytest

from planner.ingest.store import DropReason
from planner.service.config import DiscoveryConfig
from tests.service.support import AUTH, Served, free_port, make_config, registration, serve, wait_for
from worker_shim.fpm import QueuedRequests, ScheduledRequests
from worker_shim.publisher import FpmPublisher

STEP = ScheduledRequests(num_decode_requests=4, sum_decode_kv_tokens=4096)


@pytest.fixture()
def fast_leases() -> Iterator[Served]:
    config = make_config()
    config = msgspec.structs.replace(
        config, discovery=DiscoveryConfig(refresh_interval_s=0.05, default_ttl_s=1.0, max_ttl_s=60.0)
    )
    with serve(config) as served:
        yield served


def rank_samples(served: Served, worker_id: str) -> int:
    for worker in served.http.get("/v1/diagnostics").json()["workers"]:
        if worker["worker_id"] == worker_id:
            return int(worker["ranks"][0]["samples"])
    return -1


def test_a_lapsed_lease_drops_out_of_discovery_and_its_samples_are_dropped(fast_leases: Served) -> None:
    served = fast_leases
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    with FpmPublisher(worker_id="w-lease", endpoint=endpoint, heartbeat_interval_s=0.05) as publisher:

        def publish_and(count: int) -> int:
            publisher.publish(0.01, STEP, QueuedRequests())
            return rank_samples(served, "w-lease") >= count

        body = registration([endpoint], ttl_s=1.0)
        served.http.put("/v1/workers/w-lease", json=body, headers=AUTH).raise_for_status()
        wait_for(lambda: publish_and(5))
        worker = served.http.get("/v1/diagnostics").json()["workers"][0]
        assert worker["classification"] == "healthy"
        assert worker["ranks"][0]["endpoint_publishes_as"] == "w-lease"

        # Renewing keeps it: three renewals spread over more than one TTL.
        started = time.monotonic()
        while time.monotonic() - started < 1.5:
            served.http.put("/v1/workers/w-lease", json=body, headers=AUTH).raise_for_status()
            publisher.publish(0.01, STEP, QueuedRequests())
            time.sleep(0.3)
        assert [w["worker_id"] for w in served.http.get("/v1/workers").json()["workers"]] == ["w-lease"]

        # Stop renewing: the lease lapses, the worker leaves discovery and the subscriber stops listening.
        wait_for(lambda: served.http.get("/v1/workers").json()["workers"] == [], timeout_s=10.0)
        diag = wait_for(
            lambda: (d := served.http.get("/v1/diagnostics").json())["ingest"]["endpoints_connected"] == 0 and d
        )
        assert diag["workers"] == []
        assert diag["ingest"]["leases_expired"] == 1
        assert diag["roles"]["decode"]["discovered"] == 0

        # The publisher carries on; none of its samples is kept any more.
        for _ in range(20):
            publisher.publish(0.01, STEP, QueuedRequests())
        assert publisher.flush()
        time.sleep(0.3)
        runner = served.runner
        assert runner.store.window("w-lease", 0) == ()
        assert ("w-lease", 0) not in runner.snapshot().ranks
        assert "w-lease" not in runner.store.workers


def test_deregistration_stops_ingest_at_once(fast_leases: Served) -> None:
    served = fast_leases
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    with FpmPublisher(worker_id="w-gone", endpoint=endpoint, heartbeat_interval_s=0.05) as publisher:
        served.http.put("/v1/workers/w-gone", json=registration([endpoint], ttl_s=30.0), headers=AUTH)
        wait_for(lambda: publisher.publish(0.01, STEP, QueuedRequests()) and rank_samples(served, "w-gone") >= 3)
        served.http.delete("/v1/workers/w-gone", headers=AUTH).raise_for_status()
        assert "w-gone" not in served.runner.store.workers
        assert served.runner.store.window("w-gone", 0) == ()


def test_samples_under_a_lapsed_id_are_dropped_as_unknown_worker(fast_leases: Served) -> None:
    """The endpoint is taken over by a new registration while the old engine still publishes its lapsed id."""
    served = fast_leases
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    with FpmPublisher(worker_id="w-old", endpoint=endpoint, heartbeat_interval_s=0.05) as publisher:
        served.http.put("/v1/workers/w-old", json=registration([endpoint], ttl_s=0.5), headers=AUTH)
        wait_for(lambda: publisher.publish(0.01, STEP, QueuedRequests()) and rank_samples(served, "w-old") >= 3)
        wait_for(lambda: served.http.get("/v1/workers").json()["workers"] == [])
        served.http.put("/v1/workers/w-new", json=registration([endpoint], ttl_s=30.0), headers=AUTH)

        def dropped() -> bool:
            publisher.publish(0.01, STEP, QueuedRequests())
            workers = served.http.get("/v1/diagnostics").json()["workers"]
            return bool(workers) and int(workers[0]["drops"].get("unknown_worker", 0)) >= 5

        wait_for(dropped)
        (worker,) = served.http.get("/v1/diagnostics").json()["workers"]
        assert worker["worker_id"] == "w-new"
        assert worker["ranks"][0]["samples"] == 0
        assert worker["drops"]["unknown_worker"] >= 5
        assert worker["classification"] == "identity_not_synced"
        assert "w-old" in worker["cause"]

        def exported() -> float:
            prefix = 'fpm_planner_fpm_drops_total{reason="unknown_worker"} '
            lines = served.http.get("/metrics").text.splitlines()
            return next((float(line.removeprefix(prefix)) for line in lines if line.startswith(prefix)), 0.0)

        value = wait_for(lambda: (v := exported()) >= 5 and v)
        # The counter follows the store's count, never past it (re-adding the running total each tick would be).
        assert 5 <= value <= served.runner.store.drops[DropReason.UNKNOWN_WORKER]


def test_the_subscriber_follows_more_endpoints_than_one_default_zmq_context_allows(service: Served) -> None:
    """Each endpoint costs three ZMQ sockets; a default context (1023 sockets) would stop at 341."""
    workers = 200
    for i in range(workers):
        endpoints = [f"tcp://127.0.0.1:{30000 + 2 * i}", f"tcp://127.0.0.1:{30001 + 2 * i}"]
        service.http.put(f"/v1/workers/many-{i}", json=registration(endpoints), headers=AUTH).raise_for_status()
    wait_for(lambda: service.http.get("/v1/diagnostics").json()["ingest"]["endpoints_connected"] == 2 * workers)
    diag = service.http.get("/v1/diagnostics").json()
    assert diag["ingest"]["loop_errors"] == 0
    assert service.http.get("/healthz").json()["status"] == "ok"

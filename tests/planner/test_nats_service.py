"""``ingest.transport: nats`` switches the planner service's ingest to NATS (direct ZMQ stays the default): a
real service, a real nats-server, a shim publisher and its relay."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from planner.ingest.subscriber import FpmSubscriber
from planner.service.config import load_config
from planner.service.runner import PlannerRunner
from planner.transport.nats_config import render_server_config
from planner.transport.nats_source import NatsFpmSource
from tests.planner.nats_support import NatsServer, free_port, wait_until
from tests.service.support import AUTH, TOKEN, serve_runner
from worker_shim.publisher import FpmPublisher
from worker_shim.relay import FpmRelay

NS = "prod"


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[NatsServer]:
    def config(port: int) -> str:
        return render_server_config(port=port, namespace=NS, workers={"w1": "pw1"}, consumers={"planner": "pp"})

    with NatsServer(config, tmp_path) as srv:
        yield srv


def test_direct_zmq_stays_the_default_transport() -> None:
    runner = PlannerRunner(load_config(None, {"FPM_PLANNER_TOKEN": TOKEN}))
    assert isinstance(runner.subscriber, FpmSubscriber)
    runner.subscriber.close()


def test_transport_nats_feeds_the_service_from_nats(server: NatsServer, tmp_path: Path) -> None:
    port = free_port()
    workers = tmp_path / "workers.yaml"
    workers.write_text(
        yaml.safe_dump(
            {
                "workers": [
                    {
                        "worker_id": "w1",
                        "role": "agg",
                        "service": "agg",
                        "dp_size": 1,
                        "fpm_endpoints": [f"tcp://127.0.0.1:{port}"],
                    }
                ]
            }
        )
    )
    (tmp_path / "nats-password").write_text("pp\n")
    config_file = tmp_path / "planner.yaml"
    config_file.write_text(
        yaml.safe_dump(
            {
                "tick_interval_s": 0.2,
                "discovery": {"static_file": str(workers)},
                "ingest": {
                    "transport": "nats",
                    "nats": {
                        "servers": [server.url],
                        "namespace": NS,
                        "user": "planner",
                        "password_file": str(tmp_path / "nats-password"),
                    },
                },
            }
        )
    )
    runner = PlannerRunner(load_config(config_file, {"FPM_PLANNER_TOKEN": TOKEN}))
    assert isinstance(runner.subscriber, NatsFpmSource)
    publisher = FpmPublisher(worker_id="w1", endpoint=f"tcp://127.0.0.1:{port}", heartbeat_interval_s=0.05).start()
    relay = FpmRelay(
        endpoints=[f"tcp://127.0.0.1:{port}"],
        servers=[server.url],
        namespace=NS,
        service="agg",
        worker_id="w1",
        password="pw1",
    ).start()
    try:
        with serve_runner(runner) as served:
            wait_until(lambda: runner.snapshot().ranks[("w1", 0)].heartbeats > 0, timeout_s=30, what="FPM via NATS")
            assert runner.snapshot().ranks[("w1", 0)].fresh
            diagnostics = served.http.get("/v1/diagnostics", headers=AUTH)
            assert diagnostics.status_code == 200
            ingest = diagnostics.json()["ingest"]
            assert ingest["endpoints_connected"] == 1 and ingest["received"] > 0 and ingest["links_troubled"] == []
    finally:
        relay.close()
        publisher.close()

"""``transport`` selects the ingest source: direct ZMQ by default, NATS with a password read from a file."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import nats
import pytest

from planner.discovery import Role, WorkerRecord
from planner.errors import ConfigError
from planner.ingest.store import FleetStore
from planner.ingest.subscriber import FpmSubscriber
from planner.transport.nats_config import render_server_config
from planner.transport.nats_source import NatsFpmSource
from planner.transport.settings import NatsSettings, Transport, make_ingest_source
from planner.transport.subjects import subject
from tests.planner.nats_support import NatsServer, wait_until
from worker_shim import fpm


def test_zmq_stays_the_default_source() -> None:
    source = make_ingest_source(FleetStore(), Transport.ZMQ, NatsSettings(), max_msg_bytes=1024)
    assert isinstance(source, FpmSubscriber)
    source.close()


def test_a_missing_password_file_is_a_config_error_naming_it(tmp_path: Path) -> None:
    settings = NatsSettings(password_file=str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match="password_file"):
        make_ingest_source(FleetStore(), Transport.NATS, settings, max_msg_bytes=1024)
    with pytest.raises(ConfigError, match="namespace"):
        make_ingest_source(FleetStore(), Transport.NATS, NatsSettings(namespace=""), max_msg_bytes=1024)


def test_the_nats_source_from_settings_authenticates_with_the_file_and_ingests(tmp_path: Path) -> None:
    def config(port: int) -> str:
        return render_server_config(port=port, namespace="ns", workers={"w1": "pw1"}, consumers={"planner": "pp"})

    (tmp_path / "password").write_text("pp\n")
    store = FleetStore()
    record = WorkerRecord(worker_id="w1", role=Role.AGG, service="agg", dp_size=1, fpm_endpoints=("tcp://h:1",))
    with NatsServer(config, tmp_path) as server:
        settings = NatsSettings(
            servers=(server.url,), namespace="ns", user="planner", password_file=str(tmp_path / "password")
        )
        source = make_ingest_source(store, Transport.NATS, settings, max_msg_bytes=1024)
        assert isinstance(source, NatsFpmSource)
        source.set_workers({"w1": record})
        source.start()
        try:
            assert source.connected or source.wait_subscribed(15)

            async def publish() -> None:
                nc = await nats.connect(server.url, user="w1", password="pw1")
                await nc.publish(subject("ns", "agg", "w1", 0), fpm.encode(fpm.heartbeat("w1", 0, 1)))
                await nc.flush()
                await nc.close()

            asyncio.run(publish())
            wait_until(lambda: source.snapshot(time.monotonic()).ranks[("w1", 0)].heartbeats == 1)
        finally:
            source.close()

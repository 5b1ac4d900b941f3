"""Owners of a NATS connection start and stop cleanly over a real nats-server: the NATS ingest source closed while
NATS is down ends its thread (whether it never connected or lost its connection), and the shard's membership
follower is a context manager like the leader's summary listener."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from planner.discovery import Role, WorkerRecord
from planner.ingest.store import FleetStore
from planner.shard.membership import membership_parts, membership_subject
from planner.shard.process import MembershipFollower
from planner.transport.nats_source import NatsFpmSource
from tests.planner.nats_support import NatsServer, sharded_config, wait_until

NS = "prod"


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[NatsServer]:
    with NatsServer(
        sharded_config(NS, workers={"w0": "pw0"}, consumers={"s0": "p0", "planner": "pp"}), tmp_path
    ) as srv:
        yield srv


def _threads(name: str) -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == name}


def _source(server: NatsServer) -> NatsFpmSource:
    return NatsFpmSource(
        FleetStore(), servers=[server.url], namespace=NS, user="planner", password="pp", reconnect_wait_s=0.05
    )


def test_a_nats_source_closed_while_nats_is_down_before_it_connected_ends_its_thread(
    server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    # Old code: nats-py retried the down server inside connect() forever, close() gave up its join after 10 s
    # and the thread stayed alive.
    server.stop()
    caplog.set_level(logging.WARNING, logger="planner.transport.nats_source")
    before = _threads("fpm-nats")
    source = _source(server).start()
    wait_until(  # a failed attempt: the source is connecting to the down server now
        lambda: any(r.name == "planner.transport.nats_source" for r in caplog.records),
        timeout_s=60,
        what="a failed connect",
    )
    started = _threads("fpm-nats") - before
    assert len(started) == 1
    source.close()
    assert not [t for t in started if t.is_alive()]
    assert not source.connected


def test_a_nats_source_closed_while_nats_is_down_after_it_connected_ends_its_thread(server: NatsServer) -> None:
    before = _threads("fpm-nats")
    source = _source(server).start()
    assert source.wait_subscribed(30)
    started = _threads("fpm-nats") - before
    assert len(started) == 1
    server.stop()
    wait_until(lambda: source.disconnects >= 1, timeout_s=60, what="the source's disconnect")
    source.close()
    assert not [t for t in started if t.is_alive()]
    assert not source.connected


def test_the_membership_follower_is_a_context_manager(server: NatsServer) -> None:
    record = WorkerRecord(
        worker_id="w0", role=Role.DECODE, service="decode", dp_size=1, fpm_endpoints=("tcp://127.0.0.1:20380",)
    )
    parts = membership_parts(leader="leader-0", seq=1, taken_at=1000.0, shards=["s0"], workers={"w0": record})
    before = _threads("fpm-shard-membership")
    with MembershipFollower(servers=[server.url], namespace=NS, user="s0", password="p0") as follower:
        assert follower.wait_ready(15)  # started by `with`
        started = _threads("fpm-shard-membership") - before
        assert len(started) == 1
        for part in parts:
            assert follower.publish(membership_subject(NS), part)
        wait_until(follower.arrived.is_set, what="the membership")
    assert not [t for t in started if t.is_alive()]  # closed by `with`
    assert not follower.connected
    taken = follower.take()
    assert taken is not None and list(taken[0]) == ["w0"]

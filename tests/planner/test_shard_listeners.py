"""The shard listeners' shared decode-count-log path and the shared first connection to NATS, over a real
nats-server: a message that is not a summary (not a membership part) is counted and never merged (applied), one
that is goes in under the lock; ``connect_retrying`` waits for a server that is not up yet and gives up only
when stopped."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from planner.discovery import Role, WorkerRecord
from planner.shard.membership import membership_parts, membership_subject
from planner.shard.merge import SummaryMerger
from planner.shard.process import IngestShard, MembershipFollower, SummaryListener, summary_subject
from planner.shard.summary import encode_summary
from planner.transport.nats_connect import connect_retrying
from tests.planner.nats_support import NatsServer, sharded_config, wait_until
from worker_shim.relay import FpmRelay

NS = "prod"


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[NatsServer]:
    with NatsServer(sharded_config(NS, workers={"w0": "pw0"}, consumers={"s0": "p0", "leader": "pl"}), tmp_path) as srv:
        yield srv


def test_the_summary_listener_counts_a_bad_message_and_merges_a_summary(server: NatsServer) -> None:
    merger = SummaryMerger(ttl_s=10.0, max_summary_age_s=5.0)
    shard = IngestShard("s0", servers=[server.url], namespace=NS, user="s0", password="p0")  # never started
    with SummaryListener(merger, servers=[server.url], namespace=NS, user="leader", password="pl") as listener:
        assert listener.wait_ready(15)
        assert listener.publish(summary_subject(NS, "s0"), b"\x93not a summary")
        assert listener.publish(summary_subject(NS, "s0"), encode_summary(shard.summary()))
        wait_until(lambda: listener.received == 1 and listener.bad_summaries == 1, what="one bad, one summary")
        with listener.lock:
            assert list(merger.summaries()) == ["s0"]
    shard.close()


def test_the_membership_follower_counts_a_bad_part_and_applies_a_membership(server: NatsServer) -> None:
    record = WorkerRecord(
        worker_id="w0", role=Role.DECODE, service="decode", dp_size=1, fpm_endpoints=("tcp://127.0.0.1:20380",)
    )
    parts = membership_parts(leader="leader-0", seq=1, taken_at=1000.0, shards=["s0"], workers={"w0": record})
    follower = MembershipFollower(servers=[server.url], namespace=NS, user="s0", password="p0").start()
    try:
        assert follower.wait_ready(15)
        assert follower.publish(membership_subject(NS), b"garbage")
        for part in parts:
            assert follower.publish(membership_subject(NS), part)
        wait_until(lambda: follower.received == len(parts) and follower.bad_memberships == 1, what="bad + parts")
        assert follower.arrived.is_set()
        taken = follower.take()
        assert taken is not None
        workers, shards = taken
        assert list(workers) == ["w0"] and shards == ("s0",)
        assert follower.latest_at == 1000.0
    finally:
        follower.close()


def test_connect_retrying_waits_for_a_server_that_is_not_up_yet(server: NatsServer) -> None:
    server.stop()
    failed = threading.Event()

    async def on_error(exc: Exception) -> None:  # nats-py reports each failed attempt here
        failed.set()

    def start_after_a_failure() -> None:
        if failed.wait(60):
            server.start()  # the same port

    async def connect() -> bool:
        nc = await connect_retrying(
            asyncio.Event(),
            servers=[server.url],
            user="leader",
            password="pl",
            name="test",
            retry_wait_s=0.05,
            error_cb=on_error,
        )
        assert nc is not None
        connected = bool(nc.is_connected)
        await nc.close()
        return connected

    starter = threading.Thread(target=start_after_a_failure)
    starter.start()
    try:
        assert asyncio.run(asyncio.wait_for(connect(), 120))
        assert failed.is_set()
    finally:
        failed.set()
        starter.join(120)


def test_connect_retrying_gives_up_only_when_stopped(server: NatsServer) -> None:
    server.stop()

    async def connect() -> object:
        stopping = asyncio.Event()

        async def on_error(exc: Exception) -> None:  # a failed attempt: the server is down; now stop
            stopping.set()

        return await connect_retrying(
            stopping, servers=[server.url], user="leader", password="pl", name="test", retry_wait_s=0.05,
            error_cb=on_error,
        )  # fmt: skip

    assert asyncio.run(asyncio.wait_for(connect(), 120)) is None


def _threads(name: str) -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == name}


def test_a_relay_or_listener_closed_while_nats_is_down_ends_its_thread(server: NatsServer) -> None:
    # nats-py retries a server that is down inside connect() itself: close() used to give up its join after
    # 10 s and leave the thread connecting forever
    server.stop()
    before = _threads("fpm-relay") | _threads("fpm-shard-summaries")
    relay = FpmRelay(
        endpoints=["tcp://127.0.0.1:20380"], servers=[server.url], namespace=NS, service="decode", worker_id="w0"
    ).start()
    listener = SummaryListener(SummaryMerger(), servers=[server.url], namespace=NS, user="leader", password="pl")
    listener.start()
    wait_until(lambda: relay.stats().nats_errors >= 1, timeout_s=60, what="the relay's failed connect")
    started = (_threads("fpm-relay") | _threads("fpm-shard-summaries")) - before
    assert len(started) == 2
    relay.close()
    listener.close()
    assert not [t for t in started if t.is_alive()]

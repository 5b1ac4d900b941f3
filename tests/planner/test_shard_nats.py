"""Sharded ingest over a real nats-server: relays publish, two shards each ingest their own partition, the
leader merges their summaries; a third shard joins and the moved workers come back within a heartbeat."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from planner.discovery import Role, WorkerRecord
from planner.shard.merge import SummaryMerger
from planner.shard.partition import partition
from planner.shard.process import IngestShard, SummaryListener
from planner.transport.nats_config import render_server_config
from tests.planner.nats_support import NatsServer, free_port, wait_until
from worker_shim.fpm import QueuedRequests, ScheduledRequests
from worker_shim.publisher import FpmPublisher
from worker_shim.relay import FpmRelay

NS = "prod"
WORKERS = [f"w.{i}" for i in range(4)]
SHARDS = {"s0": "p0", "s1": "p1", "s2": "p2"}


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[NatsServer]:
    def config(port: int) -> str:
        return render_server_config(
            port=port,
            namespace=NS,
            workers={w: f"secret-{w}" for w in WORKERS},
            consumers={**SHARDS, "leader": "pl"},
            consumer_publish=[f"fpm-shard.{NS}.>"],
        )

    with NatsServer(config, tmp_path) as srv:
        yield srv


def test_two_shards_ingest_their_partitions_and_the_leader_sees_every_rank_then_a_third_joins(
    server: NatsServer,
) -> None:
    ports = {w: [free_port(), free_port()] for w in WORKERS}
    records = {
        w: WorkerRecord(
            worker_id=w,
            role=Role.DECODE,
            service="decode",
            dp_size=2,
            fpm_endpoints=tuple(f"tcp://127.0.0.1:{p}" for p in ports[w]),
        )
        for w in WORKERS
    }
    publishers = [
        FpmPublisher(worker_id=w, dp_rank=r, endpoint=f"tcp://127.0.0.1:{p}", heartbeat_interval_s=0.05).start()
        for w in WORKERS
        for r, p in enumerate(ports[w])
    ]
    relays = [
        FpmRelay(
            endpoints=[f"tcp://127.0.0.1:{p}" for p in ports[w]],
            servers=[server.url],
            namespace=NS,
            service="decode",
            worker_id=w,
            password=f"secret-{w}",
        ).start()
        for w in WORKERS
    ]
    shards = {
        s: IngestShard(s, servers=[server.url], namespace=NS, user=s, password=pw, ttl_s=10.0)
        for s, pw in SHARDS.items()
    }
    merger = SummaryMerger(ttl_s=10.0, max_summary_age_s=5.0)
    merger.set_workers(records)
    listener = SummaryListener(merger, servers=[server.url], namespace=NS, user="leader", password="pl").start()
    stop = threading.Event()

    def steps() -> None:
        while not stop.is_set():
            for pub in publishers:
                pub.publish(0.02, ScheduledRequests(num_decode_requests=7), QueuedRequests())
            time.sleep(0.01)

    stepper = threading.Thread(target=steps, daemon=True)
    try:
        members = ["s0", "s1"]
        for s in members:
            shards[s].set_membership(records, members)
            shards[s].start()
            assert shards[s].source.wait_subscribed(15)
        assert listener.wait_ready(15)
        parts = partition(records, members)
        assert shards["s0"].owned == tuple(parts["s0"]) and shards["s1"].owned == tuple(parts["s1"])

        def all_fresh(names: list[str]) -> bool:
            now = time.monotonic()
            return all(
                shards[s].source.snapshot(now).totals.fresh_ranks.tolist() == [2] * len(shards[s].owned) for s in names
            )

        wait_until(lambda: all_fresh(members), what="every owned rank fresh in its shard")
        stepper.start()  # every rank steps with 7 decode requests from now on (no heartbeats in between)

        def merged_load() -> float:
            for s in members:
                shards[s].publish_summary()
            time.sleep(0.05)
            with listener.lock:
                snap = merger.snapshot(time.time())
            return float(snap.totals.load["decode"][2]) if snap.totals.fresh.all() else -1.0

        wait_until(lambda: merged_load() == 7 * 8, what="the leader's merged load")  # 8 ranks x 7 decode reqs
        # Each shard received only its own workers' messages: no sample was ingested twice.
        for s in members:
            snap = shards[s].source.snapshot(time.monotonic())
            assert {wid for wid, _ in snap.ranks} == set(shards[s].owned)
            assert sum(snap.drops.values()) == 0

        # A third shard joins: the workers rendezvous hashing now gives it move, the others stay.
        members = ["s0", "s1", "s2"]
        shards["s2"].set_membership(records, members)
        shards["s2"].start()
        assert shards["s2"].source.wait_subscribed(15)
        for s in ("s0", "s1"):
            shards[s].set_membership(records, members)
        assert shards["s2"].owned == tuple(partition(records, members)["s2"]) and shards["s2"].owned
        wait_until(lambda: all_fresh(members), what="the moved workers fresh in their new shard")
        wait_until(lambda: merged_load() == 7 * 8, what="the leader's merged load after the rebalance")
        assert listener.bad_summaries == 0
    finally:
        stop.set()
        if stepper.is_alive():
            stepper.join(5)
        listener.close()
        for shard in shards.values():
            shard.close()
        for relay in relays:
            relay.close()
        for pub in publishers:
            pub.close()

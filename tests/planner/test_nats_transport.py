"""The NATS transport end to end against a real nats-server: shim publisher -> relay -> NATS -> NatsFpmSource ->
FleetStore, the server's per-worker permissions, and a server restart."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner.discovery import Role, WorkerRecord
from planner.ingest.store import DropReason, FleetStore
from planner.transport.nats_config import render_server_config
from planner.transport.nats_source import NatsFpmSource
from planner.transport.subjects import escape, parse, subject, unescape
from tests.planner.nats_support import NatsServer, free_port, wait_until
from worker_shim.fpm import QueuedRequests, ScheduledRequests
from worker_shim.publisher import FpmPublisher
from worker_shim.relay import FpmRelay

NS = "prod"
STEP = ScheduledRequests(num_decode_requests=4, sum_decode_kv_tokens=512)
QUEUE = QueuedRequests()
WORKERS = {"w.1": "secret-1", "w*2": "secret-2"}  # ids that need escaping in a subject
CONSUMER = ("planner", "secret-p")


@given(st.text(min_size=1, max_size=40))
def test_a_subject_token_is_escaped_injectively_and_holds_no_separator_or_wildcard(token: str) -> None:
    escaped = escape(token)
    assert not set(escaped) & {".", "*", ">", " ", "\t", "\r", "\n"}
    assert unescape(escaped) == token


def test_a_subject_names_namespace_service_worker_and_rank_and_parses_back() -> None:
    subj = subject("prod", "decode", "pod.a>b", 3)
    assert subj == "fpm.prod.decode.pod%2Ea%3Eb.3"
    assert parse(subj) == ("prod", "decode", "pod.a>b", 3)
    for bad in ("fpm.prod.decode.w1", "fpm.prod.decode.w1.x", "fpm.prod.decode.a.b.1", "fpm.prod.decode.%2e.1"):
        with pytest.raises(ValueError):
            parse(bad)


def record(worker_id: str, ports: list[int]) -> WorkerRecord:
    return WorkerRecord(
        worker_id=worker_id,
        role=Role.AGG,
        service="agg",
        dp_size=len(ports),
        fpm_endpoints=tuple(f"tcp://127.0.0.1:{p}" for p in ports),
    )


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[NatsServer]:
    def config(port: int) -> str:
        return render_server_config(port=port, namespace=NS, workers=WORKERS, consumers=dict([CONSUMER]))

    with NatsServer(config, tmp_path) as srv:
        yield srv


class Worker:
    """One worker's shim publishers (one per rank) and its relay, with the worker's own NATS credentials."""

    def __init__(self, server: NatsServer, worker_id: str, dp_size: int, publish_as: str | None = None) -> None:
        self.ports: list[int] = []
        while len(self.ports) < dp_size:  # the OS may hand out a just-released port twice
            port = free_port()
            if port not in self.ports:
                self.ports.append(port)
        self.record = record(worker_id, self.ports)
        self.publishers = [
            FpmPublisher(
                worker_id=worker_id if publish_as is None else publish_as,
                dp_rank=rank,
                endpoint=f"tcp://127.0.0.1:{port}",
                heartbeat_interval_s=0.05,
            ).start()
            for rank, port in enumerate(self.ports)
        ]
        self.relay = FpmRelay(
            endpoints=[f"tcp://127.0.0.1:{p}" for p in self.ports],
            servers=[server.url],
            namespace=NS,
            service="agg",
            worker_id=worker_id,
            password=WORKERS[worker_id],
            reconnect_wait_s=0.05,
        ).start()

    def step(self) -> None:
        for pub in self.publishers:
            pub.publish(0.02, STEP, QUEUE)

    def close(self) -> None:
        self.relay.close()
        for pub in self.publishers:
            pub.close()


def source(store: FleetStore, server: NatsServer) -> NatsFpmSource:
    src = NatsFpmSource(
        store, servers=[server.url], namespace=NS, user=CONSUMER[0], password=CONSUMER[1], reconnect_wait_s=0.05
    )
    return src


def test_relay_to_nats_to_store_end_to_end_on_every_rank(server: NatsServer) -> None:
    store = FleetStore(ttl_s=30.0, window_size=16)
    worker = Worker(server, "w.1", dp_size=2)
    src = source(store, server)
    src.set_workers({"w.1": worker.record})
    with src:
        assert src.wait_subscribed(15) and worker.relay.wait_connected(15)
        wait_until(lambda: src.snapshot(time.monotonic()).ranks[("w.1", 1)].heartbeats > 0, what="heartbeats")
        for _ in range(5):
            worker.step()
        wait_until(lambda: all(src.snapshot(time.monotonic()).ranks[("w.1", r)].samples == 5 for r in (0, 1)))
        snap = src.snapshot(time.monotonic())
        assert all(snap.ranks[("w.1", r)].fresh for r in (0, 1))
        assert snap.ranks[("w.1", 1)].latest is not None and snap.ranks[("w.1", 1)].latest.dp_rank == 1
        assert snap.ranks[("w.1", 0)].gaps == 0 and sum(snap.drops.values()) == 0
    worker.close()
    assert worker.relay.stats().forwarded > 10 and worker.relay.stats().nats_errors == 0


def test_a_payload_under_another_id_than_its_subject_is_not_attributed(server: NatsServer) -> None:
    store = FleetStore(ttl_s=30.0)
    unsynced = Worker(server, "w.1", dp_size=1, publish_as="")  # identity never synced
    foreign = Worker(server, "w*2", dp_size=1, publish_as="w.1")  # publishes w.1's samples on its own subject
    src = source(store, server)
    src.set_workers({"w.1": unsynced.record, "w*2": foreign.record})
    with src:
        assert src.wait_subscribed(15)
        wait_until(lambda: store.drops[DropReason.EMPTY_WORKER_ID] > 0 and store.drops[DropReason.FOREIGN_ENDPOINT] > 0)
        snap = src.snapshot(time.monotonic())
        assert snap.ranks[("w.1", 0)].heartbeats == 0 and snap.ranks[("w*2", 0)].heartbeats == 0
        assert snap.drops_by_worker["w.1"][DropReason.EMPTY_WORKER_ID] > 0
        assert snap.drops_by_worker["w*2"][DropReason.FOREIGN_ENDPOINT] > 0
        # what each subject's worker last published under, as the ZMQ path records per endpoint
        assert snap.endpoints[unsynced.record.fpm_endpoints[0]].worker_id == ""
        assert snap.endpoints[foreign.record.fpm_endpoints[0]].worker_id == "w.1"
    unsynced.close()
    foreign.close()


def test_a_worker_cannot_publish_under_another_workers_subject(server: NatsServer) -> None:
    store = FleetStore(ttl_s=30.0)
    victim = record("w*2", [1])  # endpoints nobody connects to: the samples come over NATS
    own = record("w.1", [2])
    src = source(store, server)
    src.set_workers({"w.1": own, "w*2": victim})
    errors: list[str] = []
    payload_forged = _payload("w*2", 7)
    payload_own = _payload("w.1", 1)

    async def forge() -> None:
        async def on_error(exc: Exception) -> None:
            errors.append(str(exc))

        nc = await nats.connect(server.url, user="w.1", password=WORKERS["w.1"], error_cb=on_error)
        await nc.publish(subject(NS, "agg", "w*2", 0), payload_forged)  # w.1's credentials, w*2's subject
        await nc.publish(subject(NS, "agg", "w.1", 0), payload_own)  # then one on its own subject
        await nc.flush()
        await asyncio.sleep(0.2)  # let the server's -ERR reach the error callback
        await nc.close()

    with src:
        assert src.wait_subscribed(15)
        asyncio.run(forge())
        # The legitimate message arrives; the forged one, published before it on the same connection, never does.
        wait_until(lambda: src.snapshot(time.monotonic()).ranks[("w.1", 0)].samples == 1, what="own sample")
        snap = src.snapshot(time.monotonic())
        assert snap.ranks[("w*2", 0)].samples == 0 and snap.ranks[("w*2", 0)].heartbeats == 0
        assert src.received == 1
    assert any("permissions violation" in e.lower() for e in errors), errors


def _payload(worker_id: str, counter: int) -> bytes:
    from worker_shim import fpm
    from worker_shim.fpm import ForwardPassMetrics

    return fpm.encode(
        ForwardPassMetrics(worker_id=worker_id, dp_rank=0, counter_id=counter, wall_time=0.02, scheduled_requests=STEP)
    )


def test_after_a_server_restart_ingest_resumes_and_the_gap_is_counted(server: NatsServer) -> None:
    store = FleetStore(ttl_s=60.0)
    worker = Worker(server, "w.1", dp_size=1)
    src = source(store, server)
    src.set_workers({"w.1": worker.record})
    stop = threading.Event()

    def steps() -> None:  # the engine keeps stepping whatever happens to NATS
        while not stop.is_set():
            worker.step()
            time.sleep(0.01)

    stepper = threading.Thread(target=steps, daemon=True)
    with src:
        assert src.wait_subscribed(15) and worker.relay.wait_connected(15)
        stepper.start()
        wait_until(lambda: src.snapshot(time.monotonic()).ranks[("w.1", 0)].samples >= 10, what="samples")
        server.stop()
        wait_until(lambda: worker.relay.stats().dropped_disconnected >= 5, what="samples lost while down")
        before = src.snapshot(time.monotonic()).ranks[("w.1", 0)].samples
        server.start()
        wait_until(lambda: src.snapshot(time.monotonic()).ranks[("w.1", 0)].samples >= before + 10, what="resumed")
        stop.set()
        stepper.join(5)
        view = src.snapshot(time.monotonic()).ranks[("w.1", 0)]
        assert view.gaps >= 1 and view.lost_samples >= 5  # what was lost is counted, not silently skipped
        assert view.restarts == 0  # the same publisher run carried on
        assert src.disconnects >= 1 and src.connects >= 2
        totals = src.link_totals()  # in the ZMQ subscriber's terms, for /metrics and diagnostics
        assert totals.disconnects == src.disconnects and totals.reconnects >= 1
        assert [link.endpoint for link in src.troubled_links()] == [server.url]
        assert store.drops[DropReason.OVERSIZED] == 0 and store.drops[DropReason.OUT_OF_ORDER] == 0
    worker.close()


def test_a_worker_discovery_does_not_list_is_counted_as_unknown_and_gets_no_state(server: NatsServer) -> None:
    store = FleetStore(ttl_s=30.0)
    src = source(store, server)
    src.set_workers({"w.1": record("w.1", [free_port()])})  # w*2 has credentials but is not discovered

    async def publish() -> None:
        nc = await nats.connect(server.url, user="w*2", password=WORKERS["w*2"])
        await nc.publish(subject(NS, "agg", "w*2", 0), _payload("w*2", 1))
        await nc.flush()
        await nc.close()

    with src:
        assert src.wait_subscribed(15)
        asyncio.run(publish())
        wait_until(lambda: store.drops[DropReason.UNKNOWN_WORKER] == 1, what="the unknown worker's drop")
        snap = src.snapshot(time.monotonic())
        assert list(snap.ranks) == [("w.1", 0)] and snap.drops_by_worker == {}

"""The batched form of FPM on NATS against a real nats-server: shim publishers -> relay with ``batch_ms`` -> one
NATS message per batch -> NatsFpmSource -> FleetStore; malformed batches, both forms on one source, and the
server's per-worker permission on the batch subject."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import nats
import pytest

from planner.discovery import Role, WorkerRecord
from planner.ingest.store import DropReason, FleetStore
from planner.transport.batch import batch_subject, decode_batch, encode_batch
from planner.transport.nats_config import render_server_config
from planner.transport.nats_source import NatsFpmSource
from tests.planner.nats_support import NatsServer, free_port, wait_until
from worker_shim import fpm
from worker_shim.fpm import ForwardPassMetrics, LogHistogram, QueuedRequests, ScheduledRequests, StepTraffic
from worker_shim.publisher import FpmPublisher
from worker_shim.relay import FpmRelay

NS = "prod"
STEP = ScheduledRequests(num_decode_requests=4, sum_decode_kv_tokens=512)
QUEUE = QueuedRequests()
WORKERS = {"w.1": "secret-1", "w*2": "secret-2"}
CONSUMER = ("planner", "secret-p")


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


def source(server: NatsServer, workers: dict[str, WorkerRecord]) -> NatsFpmSource:
    src = NatsFpmSource(
        FleetStore(ttl_s=30.0, window_size=16),
        servers=[server.url],
        namespace=NS,
        user=CONSUMER[0],
        password=CONSUMER[1],
        reconnect_wait_s=0.05,
    )
    src.set_workers(workers)
    return src


class Worker:
    """One worker's shim publishers (a real ZMQ PUB per rank) and its relay, batched or not."""

    def __init__(self, server: NatsServer, worker_id: str, dp_size: int, **relay_kw: float) -> None:
        self.ports: list[int] = []
        while len(self.ports) < dp_size:  # the OS may hand out a just-released port twice
            port = free_port()
            if port not in self.ports:
                self.ports.append(port)
        self.record = record(worker_id, self.ports)
        self.publishers = [
            FpmPublisher(
                worker_id=worker_id, dp_rank=rank, endpoint=f"tcp://127.0.0.1:{port}", heartbeat_interval_s=0.05
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
            **relay_kw,  # type: ignore[arg-type]
        ).start()

    def step(self, traffic: StepTraffic | None = None) -> None:
        for pub in self.publishers:
            if traffic is None:
                pub.publish(0.02, STEP, QUEUE)
            else:
                pub.publish(0.02, STEP, QUEUE, traffic)

    def close(self) -> None:
        for pub in self.publishers:
            pub.close()
        self.relay.close()


def payload(worker_id: str, rank: int, counter: int) -> bytes:
    sample = ForwardPassMetrics(
        worker_id=worker_id, dp_rank=rank, counter_id=counter, wall_time=0.02, scheduled_requests=STEP
    )
    return fpm.encode(sample)


def test_the_batch_frame_keeps_each_payload_byte_for_byte_with_its_rank() -> None:
    payloads = [payload("w.1", 1, 1), b"", payload("w.1", 0, 9)]
    assert decode_batch(encode_batch([1, 3, 0], payloads)) == ([1, 3, 0], payloads, 0)


def test_a_batched_relay_delivers_every_sample_of_every_rank_and_a_gap_across_batches_is_counted(
    server: NatsServer,
) -> None:
    # 1 KiB cap: a step with a large traffic extension (~2.4 KB) is dropped by the relay as oversized, so its
    # counter is missing from the stream; a plain step (~370 B) fits, two of them to a batch at most.
    worker = Worker(server, "w.1", dp_size=2, batch_ms=30.0, batch_max=3, max_payload_bytes=1024)
    big = StepTraffic(arrivals=LogHistogram(count=600, sum=6e5, buckets={i: 1 for i in range(600)}))
    src = source(server, {"w.1": worker.record})
    with src:
        assert src.wait_subscribed(15) and worker.relay.wait_connected(15)
        wait_until(
            lambda: all(src.snapshot(time.monotonic()).ranks[("w.1", r)].heartbeats > 0 for r in (0, 1)),
            what="both ranks heard through the relay",
        )
        for _ in range(3):
            worker.step()
        worker.step(big)
        worker.step(big)
        for _ in range(4):
            worker.step()
        wait_until(lambda: all(src.snapshot(time.monotonic()).ranks[("w.1", r)].samples == 7 for r in (0, 1)))
        time.sleep(0.2)  # anything extra (a duplicate) would have arrived by now
        snap = src.snapshot(time.monotonic())
        for rank in (0, 1):
            view = snap.ranks[("w.1", rank)]
            assert view.samples == 7 and view.fresh
            assert view.latest is not None and view.latest.dp_rank == rank  # attributed to its own rank
            assert view.gaps == 1 and view.lost_samples == 2 and view.restarts == 0
        assert sum(snap.drops.values()) == 0
        worker.close()
        stats = worker.relay.stats()
        wait_until(lambda: src.batches_received == stats.batches, what="every batch the relay sent")
        assert src.received == stats.forwarded  # every payload the relay sent, and only those
    assert stats.dropped_oversized == 4 and stats.nats_errors == 0
    assert 0 < stats.batches < stats.forwarded  # several payloads per NATS message


def test_a_payload_that_fits_the_cap_alone_but_not_in_a_frame_goes_out_unbatched_and_in_order(
    server: NatsServer,
) -> None:
    worker = Worker(server, "w.1", dp_size=1, batch_ms=30.0, batch_max=3, max_payload_bytes=1024)
    # ~1,011 bytes: under the 1 KiB cap, over it once framed (array, version and length headers)
    mid = StepTraffic(arrivals=LogHistogram(count=240, sum=240.0, buckets={i: 1 for i in range(240)}))
    src = source(server, {"w.1": worker.record})
    with src:
        assert src.wait_subscribed(15) and worker.relay.wait_connected(15)
        wait_until(lambda: src.snapshot(time.monotonic()).ranks[("w.1", 0)].heartbeats > 0, what="heard")
        worker.step()
        worker.step()
        worker.step(mid)
        worker.step()
        worker.step()
        wait_until(lambda: src.snapshot(time.monotonic()).ranks[("w.1", 0)].samples == 5)
        view = src.snapshot(time.monotonic()).ranks[("w.1", 0)]
        assert view.gaps == 0 and view.lost_samples == 0 and sum(src.store.drops.values()) == 0
        worker.close()
        stats = worker.relay.stats()
        wait_until(lambda: src.received == stats.forwarded, what="every payload the relay sent")
    assert stats.dropped_oversized == 0 and 0 < stats.batches and src.batches_received == stats.batches


def test_a_malformed_batch_counts_one_decode_error_per_unreadable_payload_and_keeps_the_rest(
    server: NatsServer,
) -> None:
    w1 = record("w.1", [1, 2])  # endpoints nobody connects to: the samples come over NATS
    src = source(server, {"w.1": w1})
    subj = batch_subject(NS, "agg", "w.1")
    frames = [
        encode_batch([0, 1, 0], [payload("w.1", 0, 1), b"\xc1 not fpm", payload("w.1", 0, 2)]),  # 1 unreadable
        msgspec.msgpack.encode([1, [1, "x", 1], [payload("w.1", 1, 1), payload("w.1", 1, 2), "not bin"]]),  # 2
        msgspec.msgpack.encode([1, [0, 0, 0], [payload("w.1", 0, 3)]]),  # 2 ranks without a payload
        b"\xc1\xc1\xc1",  # not msgpack: 1
        msgspec.msgpack.encode([2, [0], [payload("w.1", 0, 4)]]),  # another version: 1
        msgspec.msgpack.encode({"v": 1}),  # not the array: 1
        encode_batch([0, 1], [payload("w.1", 0, 5), payload("w.1", 1, 3)]),  # after all that: both kept
    ]

    async def publish() -> None:
        nc = await nats.connect(server.url, user="w.1", password=WORKERS["w.1"])
        for frame in frames:
            await nc.publish(subj, frame)
        await nc.flush()
        await nc.close()

    with src:
        assert src.wait_subscribed(15)
        asyncio.run(publish())
        wait_until(lambda: src.batches_received == len(frames), what="every batch handled")
        snap = src.snapshot(time.monotonic())
        assert snap.ranks[("w.1", 0)].samples == 4 and snap.ranks[("w.1", 1)].samples == 2
        assert snap.drops[DropReason.DECODE_ERROR] == 1 + 2 + 2 + 1 + 1 + 1
        assert snap.drops_by_worker["w.1"] == {DropReason.DECODE_ERROR: 8}  # pinned on the subject's worker
        assert sum(snap.drops.values()) == 8 and src.loop_errors == 0
        assert src.connected and src.disconnects == 0


def test_one_source_reads_an_unbatched_relay_and_a_batched_one(server: NatsServer) -> None:
    old = Worker(server, "w.1", dp_size=2)  # no batch_ms: today's form, one message per payload
    new = Worker(server, "w*2", dp_size=2, batch_ms=20.0)
    src = source(server, {"w.1": old.record, "w*2": new.record})
    with src:
        assert src.wait_subscribed(15) and old.relay.wait_connected(15) and new.relay.wait_connected(15)
        wait_until(
            lambda: all(src.snapshot(time.monotonic()).ranks[(w, r)].heartbeats > 0 for w in WORKERS for r in (0, 1)),
            what="every rank of both workers heard",
        )
        for _ in range(6):
            old.step()
            new.step()
        wait_until(
            lambda: all(src.snapshot(time.monotonic()).ranks[(w, r)].samples == 6 for w in WORKERS for r in (0, 1))
        )
        snap = src.snapshot(time.monotonic())
        assert all(snap.ranks[(w, r)].gaps == 0 for w in WORKERS for r in (0, 1))
        assert sum(snap.drops.values()) == 0
        old.close()
        new.close()
        batches = new.relay.stats().batches
        wait_until(lambda: src.batches_received == batches, what="every batch the batched relay sent")
    assert old.relay.stats().batches == 0 and old.relay.stats().forwarded > 0
    assert batches > 0


def test_a_worker_cannot_publish_a_batch_under_another_workers_subject(server: NatsServer) -> None:
    src = source(server, {"w.1": record("w.1", [1]), "w*2": record("w*2", [2])})
    errors: list[str] = []

    async def forge() -> None:
        async def on_error(exc: Exception) -> None:
            errors.append(str(exc))

        nc = await nats.connect(server.url, user="w.1", password=WORKERS["w.1"], error_cb=on_error)
        forged = encode_batch([0, 0], [payload("w*2", 0, 1), payload("w*2", 0, 2)])
        await nc.publish(batch_subject(NS, "agg", "w*2"), forged)  # w.1's credentials, w*2's batch subject
        await nc.publish(batch_subject(NS, "agg", "w.1"), encode_batch([0], [payload("w.1", 0, 1)]))
        await nc.flush()
        await asyncio.sleep(0.2)  # let the server's -ERR reach the error callback
        await nc.close()

    with src:
        assert src.wait_subscribed(15)
        asyncio.run(forge())
        # Its own batch arrives; the forged one, published before it on the same connection, never does.
        wait_until(lambda: src.snapshot(time.monotonic()).ranks[("w.1", 0)].samples == 1, what="own batch")
        snap = src.snapshot(time.monotonic())
        assert snap.ranks[("w*2", 0)].samples == 0 and src.batches_received == 1 and src.received == 1
    assert any("permissions violation" in e.lower() for e in errors), errors

"""The relay on its own: what it refuses to forward (counted, never passed on), and its sidecar entry point
(``python -m worker_shim.relay``) against a real nats-server, stopped by SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from planner.discovery import Role, WorkerRecord
from planner.ingest.store import FleetStore
from planner.transport.nats_config import render_server_config
from planner.transport.nats_source import NatsFpmSource
from tests.planner.nats_support import NatsServer, free_port, wait_until
from worker_shim import fpm
from worker_shim.publisher import FpmPublisher
from worker_shim.relay import FpmRelay

NS = "ns"


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[NatsServer]:
    def config(port: int) -> str:
        return render_server_config(port=port, namespace=NS, workers={"w1": "pw1"}, consumers={"planner": "pp"})

    with NatsServer(config, tmp_path) as srv:
        yield srv


def _source(server: NatsServer, port: int) -> tuple[NatsFpmSource, FleetStore]:
    store = FleetStore(ttl_s=30.0)
    src = NatsFpmSource(store, servers=[server.url], namespace=NS, user="planner", password="pp")
    src.set_workers(
        {
            "w1": WorkerRecord(
                worker_id="w1", role=Role.AGG, service="agg", dp_size=1, fpm_endpoints=(f"tcp://127.0.0.1:{port}",)
            )
        }
    )
    return src, store


def test_malformed_and_oversized_messages_are_counted_and_not_forwarded(server: NatsServer) -> None:
    port = free_port()
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.bind(f"tcp://127.0.0.1:{port}")
    src, store = _source(server, port)
    relay = FpmRelay(
        endpoints=[f"tcp://127.0.0.1:{port}"],
        servers=[server.url],
        namespace=NS,
        service="agg",
        worker_id="w1",
        password="pw1",
        max_payload_bytes=1024,
    )
    try:
        with src, relay:
            assert src.wait_subscribed(15) and relay.wait_connected(15)
            counter = 0

            def heartbeat() -> bool:  # until the relay's SUB has joined (ZMQ's slow joiner)
                nonlocal counter
                counter += 1
                pub.send_multipart(fpm.frames(fpm.heartbeat("w1", 0, counter)))
                return relay.stats().forwarded > 0

            wait_until(heartbeat, what="the relay joined")
            pub.send_multipart([b"", fpm.frames(fpm.heartbeat("w1", 0, counter + 1))[2]])  # no seq frame
            pub.send_multipart([b"", b"\x00" * 8, b"\x80" * 4096])  # over the 1 KiB cap
            pub.send_multipart(fpm.frames(fpm.heartbeat("w1", 0, counter + 2)))
            last = counter + 2

            def last_stored() -> bool:  # one connection, in order: the two before it were handled first
                latest = store.rank_view("w1", 0, time.monotonic()).latest
                return latest is not None and latest.counter_id == last

            wait_until(last_stored, what="the valid message after the bad ones")
            stats = relay.stats()
            assert stats.dropped_bad_frame == 1 and stats.dropped_oversized == 1 and stats.nats_errors == 0
            assert sum(store.drops.values()) == 0  # nothing malformed reached the planner
    finally:
        pub.close(linger=0)
        ctx.term()


def test_the_sidecar_relays_with_its_password_from_the_environment_and_stops_on_sigterm(server: NatsServer) -> None:
    port = free_port()
    src, store = _source(server, port)
    publisher = FpmPublisher(worker_id="w1", endpoint=f"tcp://127.0.0.1:{port}", heartbeat_interval_s=0.05).start()
    cmd = [sys.executable, "-m", "worker_shim.relay", "--nats-url", server.url, "--namespace", NS, "--service", "agg"]
    cmd += ["--worker-id", "w1", "--dp-size", "1", "--host", "127.0.0.1", "--port-base", str(port)]
    env = {**os.environ, "FPM_NATS_PASSWORD": "pw1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        with src:
            assert src.wait_subscribed(15)
            wait_until(lambda: store.rank_view("w1", 0, time.monotonic()).heartbeats >= 3, timeout_s=30)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        publisher.close()


def test_the_sidecar_batches_with_batch_ms(server: NatsServer) -> None:
    port = free_port()
    src, store = _source(server, port)
    publisher = FpmPublisher(worker_id="w1", endpoint=f"tcp://127.0.0.1:{port}", heartbeat_interval_s=0.01).start()
    cmd = [sys.executable, "-m", "worker_shim.relay", "--nats-url", server.url, "--namespace", NS, "--service", "agg"]
    cmd += ["--worker-id", "w1", "--host", "127.0.0.1", "--port-base", str(port), "--batch-ms", "100"]
    proc = subprocess.Popen(cmd, env={**os.environ, "FPM_NATS_PASSWORD": "pw1"}, stderr=subprocess.PIPE)
    try:
        with src:
            assert src.wait_subscribed(15)
            wait_until(lambda: store.rank_view("w1", 0, time.monotonic()).heartbeats >= 20, timeout_s=30)
            # ~10 heartbeats per 100 ms window: far fewer NATS messages than payloads
            assert 0 < src.batches_received < src.received / 3 and sum(store.drops.values()) == 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        publisher.close()


@pytest.mark.parametrize("flags", [["--batch-ms", "0"], ["--batch-ms", "20", "--batch-max", "0"]])
def test_the_sidecar_refuses_a_bad_batch(flags: list[str]) -> None:
    cmd = [sys.executable, "-m", "worker_shim.relay", "--nats-url", "nats://127.0.0.1:1", "--namespace", NS]
    cmd += ["--service", "agg", "--worker-id", "w1", *flags]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--batch-ms must be > 0 and --batch-max >= 1" in done.stderr


def test_the_sidecar_refuses_a_bad_rank_count() -> None:
    cmd = [sys.executable, "-m", "worker_shim.relay", "--nats-url", "nats://127.0.0.1:1", "--namespace", NS]
    cmd += ["--service", "agg", "--worker-id", "w1", "--dp-size", "0"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--dp-size" in done.stderr

"""``fpm-worker --relay-nats-url``: a real launcher with a real vLLM engine (CPU) relays its FPM onto a real
nats-server, where a ``NatsFpmSource`` store receives it under the worker's subject; SIGTERM stops the engine and
the relay with it (no process of the launcher's group is left)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

pytest.importorskip("vllm")

from planner.discovery import Role, WorkerRecord
from planner.ingest.store import FleetStore
from planner.transport.nats_source import NatsFpmSource
from tests.fakes.tiny_vllm import free_port_base, write_tiny_llama
from tests.planner.nats_support import NatsServer, server_config, wait_until
from tests.worker_shim.test_shim_launcher import Launched, _engine_args

pytestmark = pytest.mark.vllm

NS = "prod"
WORKER = "w-relayed"


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[NatsServer]:
    with NatsServer(server_config(NS, workers={WORKER: "pw1"}, consumers={"planner": "pp"}), tmp_path) as srv:
        yield srv


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_fpm_worker_relays_its_fpm_to_nats_and_stops_the_relay_with_the_engine(
    server: NatsServer, tmp_path: Path
) -> None:
    base = free_port_base(2)  # base: the shim's FPM port, base + 1: the OpenAI server's (never the same port)
    password = tmp_path / "nats-password"
    password.write_text("pw1\n")
    store = FleetStore(ttl_s=30.0)
    source = NatsFpmSource(store, servers=[server.url], namespace=NS, user="planner", password="pp")
    record = WorkerRecord(
        worker_id=WORKER, role=Role.AGG, service="tiny", dp_size=1, fpm_endpoints=(f"tcp://127.0.0.1:{base}",)
    )
    source.set_workers({WORKER: record})
    args = [*_engine_args(write_tiny_llama(tmp_path / "tiny-llama"), base + 1), "--worker-id", WORKER]
    args += ["--service", "tiny", "--register-file", str(tmp_path / "workers.yaml"), "--advertise-host", "127.0.0.1"]
    args += ["--relay-nats-url", server.url, "--relay-namespace", NS, "--relay-password-file", str(password)]
    launched = Launched(args, base, tmp_path / "launcher.log")
    try:
        with source:
            assert source.wait_subscribed(15)
            assert launched.wait_for_log("fpm-worker: registered", 600), launched.log()[-3000:]
            assert "relaying FPM of 1 rank(s) to NATS" in launched.log()
            wait_until(
                lambda: store.rank_view(WORKER, 0, time.monotonic()).heartbeats >= 3,
                timeout_s=120,
                what="the engine's heartbeats through the launcher's relay",
            )
            latest = store.rank_view(WORKER, 0, time.monotonic()).latest
            assert latest is not None and latest.worker_id == WORKER
            assert sum(store.drops.values()) == 0
        # the OpenAI server is up (its SIGTERM handler with it) before the engine is asked to stop
        wait_until(lambda: _healthy(base + 1), timeout_s=300, what="the OpenAI server's /health")
        launched.proc.send_signal(signal.SIGTERM)
        assert launched.proc.wait(120) == 0, launched.log()[-3000:]
        wait_until(lambda: not _group_alive(launched.proc.pid), timeout_s=30, what="no relay or engine left")
    finally:
        launched.stop()
        if _group_alive(launched.proc.pid):  # a relay left behind: the test has failed, clean up after it
            os.killpg(launched.proc.pid, signal.SIGKILL)

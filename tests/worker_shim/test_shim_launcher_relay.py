"""``fpm-worker --relay-nats-url``: a real launcher with a real vLLM engine (CPU) relays its FPM onto a real
nats-server, where a ``NatsFpmSource`` store receives it under the worker's subject. Then, outside Kubernetes
(nobody reaps its children), the launcher alone is SIGKILLed and its relay child must be gone
(``worker_shim.parent_watch``), not left running orphaned.

One launcher serves both (an engine start is the cost of these tests). That SIGTERM stops the relay with the
engine is checked on the restore launcher of ``test_shim_launcher.py``, which runs a relay too."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from planner.discovery import Role, WorkerRecord
from planner.ingest.store import FleetStore
from planner.transport.nats_source import NatsFpmSource
from tests.fakes.tiny_vllm import free_port_base, write_tiny_llama
from tests.planner.nats_support import NatsServer, server_config, wait_until
from tests.worker_shim.test_shim_launcher import Launched, _engine_args, relay_children
from tests.worker_shim.test_shim_relay_orphan import process_gone, start_time

pytestmark = pytest.mark.vllm

NS = "prod"
WORKER = "w-relayed"


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[NatsServer]:
    with NatsServer(server_config(NS, workers={WORKER: "pw1"}, consumers={"planner": "pp"}), tmp_path) as srv:
        yield srv


def test_fpm_worker_relays_its_fpm_to_nats_and_a_sigkill_leaves_no_relay_behind(
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
    launched = Launched(args, base, tmp_path / "launcher.log")  # its own process group, for the cleanup below
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
        wait_until(lambda: bool(relay_children(launched.proc.pid)), timeout_s=60, what="the launcher's relay child")
        [relay] = relay_children(launched.proc.pid)
        started = start_time(relay)
        launched.proc.send_signal(signal.SIGKILL)  # the launcher only: no handler, no close(), no reaper
        assert launched.proc.wait(60) == -signal.SIGKILL
        wait_until(lambda: process_gone(relay, started), timeout_s=60, what="the orphaned relay gone")
    finally:
        launched.stop()  # the engine and anything else left of the launcher's group

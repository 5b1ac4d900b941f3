"""A relay child never outlives the process that supervises it (``worker_shim.parent_watch``): a real process runs
the ``RelaySupervisor`` fpm-worker runs, its relay forwards a real shim publisher's FPM onto a real nats-server
(read by a real ``NatsFpmSource``); the supervising process is SIGKILLed (no ``close()``, no Kubernetes to reap
anything) and the relay must be gone. (tests/worker_shim/test_shim_launcher_relay.py does the same to a real
``fpm-worker`` with a vLLM engine.) Plus the relay's refusal to start when its named parent is already gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from planner.discovery import Role, WorkerRecord
from planner.ingest.store import FleetStore
from planner.transport.nats_source import NatsFpmSource
from tests.fakes.tiny_vllm import free_port_base
from tests.planner.nats_support import NatsServer, server_config, wait_until
from worker_shim.parent_watch import ENV_PARENT_PID
from worker_shim.publisher import FpmPublisher

NS = "prod"
WORKER = "w-orphan"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[NatsServer]:
    with NatsServer(server_config(NS, workers={WORKER: "pw1"}, consumers={"planner": "pp"}), tmp_path) as srv:
        yield srv


def process_gone(pid: int, started: str) -> bool:
    """``pid`` (started at ``started``, /proc's start time: never another process reusing the pid) has exited:
    no such process, or a zombie left for whoever adopted it to reap."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    fields = stat.rsplit(")", 1)[1].split()
    return fields[19] != started or fields[0] in ("Z", "X")


def start_time(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]


SUPERVISING = textwrap.dedent(
    """
    import sys, time
    from worker_shim.relay_supervisor import RelaySettings, RelaySupervisor

    url, worker, port_base, log = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    settings = RelaySettings(
        nats_urls=(url,), namespace="prod", service="agg", worker_id=worker, user=None, password="pw1",
        host="127.0.0.1", port_base=port_base,
    )
    from pathlib import Path
    supervisor = RelaySupervisor(settings, 1, log_path=Path(log)).start()
    while supervisor.pid is None:
        time.sleep(0.05)
    print(supervisor.pid, flush=True)
    time.sleep(3600)
    """
)


def test_the_relay_dies_with_its_sigkilled_supervising_process(server: NatsServer, tmp_path: Path) -> None:
    base = free_port_base(1)
    publisher = FpmPublisher(worker_id=WORKER, dp_rank=0, host="127.0.0.1", base_port=base, heartbeat_interval_s=0.05)
    store = FleetStore(ttl_s=30.0)
    source = NatsFpmSource(store, servers=[server.url], namespace=NS, user="planner", password="pp")
    record = WorkerRecord(
        worker_id=WORKER, role=Role.AGG, service="agg", dp_size=1, fpm_endpoints=(f"tcp://127.0.0.1:{base}",)
    )
    source.set_workers({WORKER: record})
    parent = subprocess.Popen(
        [sys.executable, "-c", SUPERVISING, server.url, WORKER, str(base), str(tmp_path / "relay.log")],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    relay_pid: int | None = None
    try:
        publisher.start()
        with source:
            assert source.wait_subscribed(15)
            assert parent.stdout is not None
            relay_pid = int(parent.stdout.readline())
            started = start_time(relay_pid)
            # the relay is up and forwarding: heartbeats reach the planner's store through it
            wait_until(
                lambda: store.rank_view(WORKER, 0, time.monotonic()).heartbeats >= 3,
                timeout_s=60,
                what="heartbeats through the supervised relay",
            )
            parent.send_signal(signal.SIGKILL)
            assert parent.wait(30) == -signal.SIGKILL
            wait_until(lambda: process_gone(relay_pid, started), timeout_s=30, what="the orphaned relay gone")
    finally:
        publisher.close()
        if parent.poll() is None:
            parent.kill()
            parent.wait(30)
        if relay_pid is not None and not process_gone(relay_pid, started):  # the test failed: clean up
            os.kill(relay_pid, signal.SIGKILL)


def test_a_relay_whose_named_parent_is_already_gone_does_not_start() -> None:
    # this test's process is the relay's parent, never pid 1: a relay told its parent is pid 1 finds it is not
    env = {**os.environ, ENV_PARENT_PID: "1"}
    cmd = [sys.executable, "-m", "worker_shim.relay", "--nats-url", "nats://127.0.0.1:1", "--namespace", NS]
    cmd += ["--service", "agg", "--worker-id", WORKER]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0
    assert "the process that started it (pid 1) is gone: not starting" in done.stderr


def test_a_bad_parent_pid_is_refused_by_name() -> None:
    env = {**os.environ, ENV_PARENT_PID: "abc"}
    cmd = [sys.executable, "-m", "worker_shim.relay", "--nats-url", "nats://127.0.0.1:1", "--namespace", NS]
    cmd += ["--service", "agg", "--worker-id", WORKER]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2 and "$FPM_RELAY_PARENT_PID must be a positive pid" in done.stderr

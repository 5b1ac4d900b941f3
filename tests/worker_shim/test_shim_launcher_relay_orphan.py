"""``fpm-worker --relay-nats-url`` SIGKILLed outside Kubernetes (nobody reaps its children): a real launcher with a
real vLLM engine (CPU) starts its relay child against a real nats-server; the launcher alone is SIGKILLed and the
relay child must be gone (``worker_shim.parent_watch``), not left running orphaned."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from tests.fakes.tiny_vllm import free_port_base, write_tiny_llama
from tests.planner.nats_support import NatsServer, server_config, wait_until
from tests.worker_shim.test_shim_launcher import Launched, _engine_args
from tests.worker_shim.test_shim_relay_orphan import process_gone, start_time

pytestmark = pytest.mark.vllm

NS = "prod"
WORKER = "w-killed"


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[NatsServer]:
    with NatsServer(server_config(NS, workers={WORKER: "pw1"}, consumers={"planner": "pp"}), tmp_path) as srv:
        yield srv


def relay_children(parent_pid: int) -> list[int]:
    """Processes whose parent is ``parent_pid`` and that run ``worker_shim.relay``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            continue
        if ppid == parent_pid and b"worker_shim.relay" in cmdline:
            found.append(int(entry.name))
    return found


def test_a_sigkilled_fpm_worker_leaves_no_relay_behind(server: NatsServer, tmp_path: Path) -> None:
    base = free_port_base(2)  # base: the shim's FPM port, base + 1: the OpenAI server's
    password = tmp_path / "nats-password"
    password.write_text("pw1\n")
    args = [*_engine_args(write_tiny_llama(tmp_path / "tiny-llama"), base + 1), "--worker-id", WORKER]
    args += ["--service", "tiny", "--register-file", str(tmp_path / "workers.yaml"), "--advertise-host", "127.0.0.1"]
    args += ["--relay-nats-url", server.url, "--relay-namespace", NS, "--relay-password-file", str(password)]
    launched = Launched(args, base, tmp_path / "launcher.log")  # its own process group, for the cleanup below
    try:
        assert launched.wait_for_log("fpm-worker: registered", 600), launched.log()[-3000:]
        wait_until(lambda: bool(relay_children(launched.proc.pid)), timeout_s=60, what="the launcher's relay child")
        [relay] = relay_children(launched.proc.pid)
        started = start_time(relay)
        launched.proc.send_signal(signal.SIGKILL)  # the launcher only: no handler, no close(), no reaper
        assert launched.proc.wait(60) == -signal.SIGKILL
        wait_until(lambda: process_gone(relay, started), timeout_s=60, what="the orphaned relay gone")
    finally:
        launched.stop()
        with contextlib.suppress(ProcessLookupError):  # the engine and anything else left of the launcher's group
            os.killpg(launched.proc.pid, signal.SIGKILL)

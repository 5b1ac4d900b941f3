"""``fpm-worker`` as a real process: a real vLLM engine, a stand-in registration API over HTTP.

- restore + shim, relaying to a real nats-server: the id is synced to the engine before the worker registers; the
  lease is renewed; the FPM endpoint publishes under the id; SIGTERM deregisters, exits 0 and stops the relay with
  the engine (no process of the launcher's group is left);
- restore against an engine without the shim's scheduler: the sync fails with a clear error, the launcher shuts
  the engine down and exits 3 without a single request to the registration API;
- bad arguments exit 2 before any engine starts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

pytest.importorskip("vllm")

from tests.fakes.registration_server import RegistrationServer
from tests.fakes.tiny_vllm import FpmCollector, free_port, free_port_base, tiny_engine_env, write_tiny_llama
from tests.planner.nats_support import NatsServer, server_config, wait_until
from worker_shim.launcher import EXIT_BAD_CONFIG, EXIT_SYNC_FAILED

pytestmark = pytest.mark.vllm

TOKEN = "test-token"
NS = "prod"


def _command() -> list[str]:
    script = Path(sys.executable).with_name("fpm-worker")
    return [str(script)] if script.exists() else [sys.executable, "-m", "worker_shim.launcher"]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture()
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return path


class Launched:
    def __init__(self, args: list[str], port_base: int, log_path: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FPM_")}
        env.update(tiny_engine_env(worker_id=None, port_base=port_base))
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(
            [*_command(), *args], env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def log(self) -> str:
        return self.log_path.read_text()

    def wait_for_log(self, text: str, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if text in self.log():
                return True
            if self.proc.poll() is not None:
                return text in self.log()
            time.sleep(0.2)
        return False

    def stop(self) -> None:
        """Kills what is left of our own launcher's process group (the launcher, or a relay or engine it left)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(30)
        self._log.close()


@pytest.fixture()
def launch(tmp_path: Path) -> Iterator[list[Launched]]:
    started: list[Launched] = []
    yield started
    for launched in started:
        launched.stop()


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


def _engine_args(model: Path, port: int) -> list[str]:
    return [
        "--model",
        str(model),
        "--load-format",
        "dummy",
        "--dtype",
        "bfloat16",
        "--max-model-len",
        "512",
        "--max-num-seqs",
        "16",
        "--no-enable-prefix-caching",
        "--enforce-eager",  # as tests.fakes.tiny_vllm.ENFORCE_EAGER: no Inductor compile per engine start
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
    ]


def test_restore_syncs_then_registers_renews_and_deregisters_and_stops_the_relay(
    tiny_model: Path, token_file: Path, tmp_path: Path, launch: list[Launched]
) -> None:
    base = free_port_base(2)  # base: the shim's FPM port, base + 1: the OpenAI server's
    password = tmp_path / "nats-password"
    password.write_text("pw1\n")
    server_cfg = server_config(NS, workers={"w-launched": "pw1"}, consumers={"planner": "pp"})
    with RegistrationServer(token=TOKEN) as api, NatsServer(server_cfg, tmp_path) as nats:
        launched = Launched(
            [
                *_engine_args(tiny_model, base + 1),
                "--worker-id",
                "w-launched",
                "--role",
                "decode",
                "--service",
                "tiny",
                "--restore",
                "--register-url",
                api.url,
                "--register-token-file",
                str(token_file),
                "--lease-ttl-s",
                "1.5",
                "--advertise-host",
                "127.0.0.1",
                "--relay-nats-url",
                nats.url,
                "--relay-namespace",
                NS,
                "--relay-password-file",
                str(password),
            ],
            base,
            tmp_path / "launcher.log",
        )
        launch.append(launched)
        assert launched.wait_for_log("fpm-worker: registered", 600), launched.log()[-3000:]
        log = launched.log()
        assert log.index("synced on DP ranks [0]") < log.index("fpm-worker: registered")
        assert "relaying FPM of 1 rank(s) to NATS" in log
        wait_until(lambda: bool(relay_children(launched.proc.pid)), timeout_s=60, what="the launcher's relay child")
        with FpmCollector([f"tcp://127.0.0.1:{base}"]) as collector:
            assert collector.wait_for(lambda c: len(c.samples()) >= 3, timeout_s=30)
            assert {s.worker_id for s in collector.samples()} == {"w-launched"}
        deadline = time.monotonic() + 30
        while api.methods().count("PUT") < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        first = api.requests[0]
        assert first.method == "PUT" and first.path == "/v1/workers/w-launched"
        assert first.authorization == f"Bearer {TOKEN}"
        assert first.body["role"] == "decode" and first.body["service"] == "tiny" and first.body["dp_size"] == 1
        assert first.body["fpm_endpoints"] == [f"tcp://127.0.0.1:{base}"]
        assert first.body["ttl_s"] == 1.5
        assert first.body["capacity"]["max_num_seqs"] == 16 and first.body["capacity"]["max_model_len"] == 512
        assert first.body["capacity"]["kv_capacity_tokens"] > 0
        assert api.methods().count("PUT") >= 3  # renewed every ttl/3
        # the OpenAI server is up (its SIGTERM handler with it) before the engine is asked to stop
        wait_until(lambda: _healthy(base + 1), timeout_s=300, what="the OpenAI server's /health")
        launched.proc.send_signal(signal.SIGTERM)
        assert launched.proc.wait(120) == 0, launched.log()[-3000:]
        assert api.methods()[-1] == "DELETE"
        assert "w-launched" not in api.workers
        wait_until(lambda: not _group_alive(launched.proc.pid), timeout_s=30, what="no relay or engine left")


def test_failed_sync_shuts_the_engine_down_and_never_registers(
    tiny_model: Path, token_file: Path, tmp_path: Path, launch: list[Launched]
) -> None:
    with RegistrationServer(token=TOKEN) as api:
        launched = Launched(
            [
                *_engine_args(tiny_model, free_port()),
                "--scheduler-cls",
                "vllm.v1.core.sched.scheduler.Scheduler",
                "--worker-id",
                "w-never",
                "--restore",
                "--sync-timeout-s",
                "20",
                "--register-url",
                api.url,
                "--register-token-file",
                str(token_file),
            ],
            free_port_base(1),
            tmp_path / "launcher.log",
        )
        launch.append(launched)
        code = launched.proc.wait(600)
        log = launched.log()
        assert code == EXIT_SYNC_FAILED, log[-3000:]
        assert api.requests == []
    assert "identity sync failed" in log and "not registering" in log
    assert "rank [0]" in log or "rank(s) [0]" in log
    assert "start vLLM with --scheduler-cls worker_shim.InstrumentedScheduler" in log
    assert "fpm-worker: registered" not in log


def test_missing_registration_target_exits_before_starting_an_engine(
    tiny_model: Path, tmp_path: Path, launch: list[Launched]
) -> None:
    launched = Launched(
        [*_engine_args(tiny_model, free_port()), "--worker-id", "w-1"], free_port_base(1), tmp_path / "launcher.log"
    )
    launch.append(launched)
    assert launched.proc.wait(300) == EXIT_BAD_CONFIG
    assert "--register-url (registration API) or --register-file" in launched.log()

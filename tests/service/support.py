"""A real planner service (uvicorn on a free loopback port, in a thread) for the API tests, and helpers."""

from __future__ import annotations

import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import uvicorn

from planner.actuators.base import Actuator
from planner.service.app import create_app
from planner.service.config import ServiceConfig, load_config
from planner.service.runner import LeaderElector, PlannerRunner

TOKEN = "test-token-7f3a-0123456789abcdef0123"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A free TCP port on 127.0.0.1 that this process has not been given before (the kernel may hand the same
    ephemeral port to two calls in a row while neither is bound yet)."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """End a child process that still runs: SIGTERM, SIGKILL when it has not exited within 10 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def wait_for(condition: Callable[[], Any], timeout_s: float = 20.0, interval_s: float = 0.05) -> Any:
    """Poll ``condition`` until it returns something truthy; fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached within {timeout_s} s")
        time.sleep(interval_s)


class Served:
    def __init__(self, runner: PlannerRunner, base_url: str) -> None:
        self.runner = runner
        self.base_url = base_url
        self.http = httpx.Client(base_url=base_url, timeout=10.0)


@contextmanager
def serve(
    config: ServiceConfig, *, actuator: Actuator | None = None, elector: LeaderElector | None = None
) -> Iterator[Served]:
    """Run the planner service on a free port until the block ends."""
    with serve_runner(PlannerRunner(config, actuator=actuator, elector=elector)) as served:
        yield served


@contextmanager
def serve_runner(runner: PlannerRunner) -> Iterator[Served]:
    """Run ``runner``'s service on a free port until the block ends."""
    app = create_app(runner)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    served = Served(runner, f"http://127.0.0.1:{port}")
    try:
        wait_for(lambda: server.started or not thread.is_alive())
        if not thread.is_alive():
            raise RuntimeError("the planner service did not start")
        yield served
    finally:
        served.http.close()
        server.should_exit = True
        thread.join(15.0)
        sock.close()


def make_config(**env: str) -> ServiceConfig:
    """Defaults plus a token and a fast tick; ``env`` adds FPM_PLANNER_* overrides."""
    return load_config(None, {"FPM_PLANNER_TOKEN": TOKEN, "FPM_PLANNER_TICK_INTERVAL_S": "0.2", **env})


def registration(
    endpoints: list[str], *, role: str = "decode", ttl_s: float = 30.0, service: str = "decode"
) -> dict[str, Any]:
    return {
        "role": role,
        "service": service,
        "dp_size": len(endpoints),
        "fpm_endpoints": endpoints,
        "capacity": {
            "max_num_batched_tokens": 8192,
            "max_num_seqs": 256,
            "max_model_len": 8192,
            "kv_capacity_tokens": 100_000,
        },
        "ttl_s": ttl_s,
    }

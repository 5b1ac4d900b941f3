"""A runner that is never started still owns real ZMQ sockets once a worker registers (the subscriber connects
without its thread). Dropping it must never block: left to the garbage collector, the subscriber's ZMQ context
could be finalized before its sockets and wait in ``term()`` forever. ``stop()``/``close()`` release it too."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from pathlib import Path

from planner.discovery import EngineCapacity, Role
from planner.service.config import load_config
from planner.service.runner import PlannerRunner
from tests.service.support import TOKEN, free_port

ROOT = Path(__file__).resolve().parents[2]


def _registered_runner() -> PlannerRunner:
    runner = PlannerRunner(load_config(None, {"FPM_PLANNER_TOKEN": TOKEN}))
    endpoints = tuple(f"tcp://127.0.0.1:{free_port()}" for _ in range(4))
    runner.register(
        "w1", role=Role.AGG, service="agg", dp_size=4, fpm_endpoints=endpoints, capacity=EngineCapacity(), ttl_s=30.0
    )
    runner.refresh_discovery(runner.now())
    assert sorted(runner.subscriber.endpoints) == sorted(endpoints)
    return runner


# In a child process: a runner stuck in the GC would hang this test's own process.
CHILD = textwrap.dedent(
    """
    import gc, weakref
    from tests.service.test_service_runner_release import _registered_runner

    for i in range(12):
        ref = weakref.ref(_registered_runner())
        gc.collect()
        assert ref() is None, "the runner was not collected"
        print("collected", i + 1, flush=True)
    """
)


def test_a_registered_runner_never_started_is_collected_without_blocking() -> None:
    # Old code: the 1st-3rd collection blocked in zmq Context.term() (seen every run). The bound only turns a
    # hang into a failure.
    done = subprocess.run(
        [sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "collected 12"


def test_stop_or_close_of_a_runner_never_started_releases_its_sockets() -> None:
    stopped = _registered_runner()
    asyncio.run(stopped.stop())
    assert stopped.subscriber.endpoints == ()
    closed = _registered_runner()
    closed.close()
    closed.close()  # once: a second close does nothing
    assert closed.subscriber.endpoints == ()

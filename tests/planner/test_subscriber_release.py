"""An FpmSubscriber owns its ZMQ context and sockets, whoever owns it: dropped without ``close()`` (here by an
owner the garbage collector takes apart, a reference cycle), it must release them without blocking. Left to the
GC, its context could be finalized before its sockets (their weak references are cleared first) and then wait
in ``term()`` forever. ``close()`` releases them once, as before."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from planner.discovery import Role, WorkerRecord
from planner.ingest.store import FleetStore
from planner.ingest.subscriber import FpmSubscriber
from tests.planner.nats_support import free_port

ROOT = Path(__file__).resolve().parents[2]


class Owner:
    """Something that holds a subscriber and is in a reference cycle (a callback of its own, say)."""

    def __init__(self, endpoints: int) -> None:
        self.subscriber = FpmSubscriber(FleetStore())
        self.myself = self
        ports = [free_port() for _ in range(endpoints)]
        worker = WorkerRecord(
            worker_id="w1",
            role=Role.AGG,
            service="agg",
            dp_size=endpoints,
            fpm_endpoints=tuple(f"tcp://127.0.0.1:{port}" for port in ports),
        )
        self.subscriber.set_workers({"w1": worker})  # no thread runs: the sockets are opened now
        assert len(self.subscriber.endpoints) == endpoints


# In a child process: a subscriber stuck in the GC would hang this test's own process.
CHILD = textwrap.dedent(
    """
    import gc, weakref
    from tests.planner.test_subscriber_release import Owner

    gc.disable()  # collect only where this says so
    for i in range(12):
        owner = Owner(4)
        ref = weakref.ref(owner.subscriber)
        del owner
        gc.collect()
        assert ref() is None, "the subscriber was not collected"
        print("collected", i + 1, flush=True)
    """
)


def test_a_subscriber_its_owner_drops_is_collected_without_blocking() -> None:
    # The bound only turns a hang into a failure.
    done = subprocess.run(
        [sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "collected 12"


def test_close_releases_the_sockets_and_the_context_once() -> None:
    owner = Owner(3)
    sub = owner.subscriber
    context = sub._ctx
    sub.close()
    sub.close()  # once: a second close does nothing
    assert sub.endpoints == ()
    assert context.closed

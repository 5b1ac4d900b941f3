"""Cut connections must never abort the planner (issue 12, item 1).

A publisher connection reset in the middle of a message, again and again, and a peer that answers the ZMTP
greeting with garbage, on endpoints discovery lists. The subscriber runs in a child process, so an abort inside
libzmq shows as a signal (``returncode < 0``) instead of killing the test run; it must survive and keep
receiving from a healthy publisher on another endpoint. Real sockets throughout: a TCP proxy between one
publisher and the subscriber resets both sides after a random number of bytes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import zmq

from planner.bench.faults import GarbagePeer, ResettingProxy
from worker_shim.fpm import QueuedRequests, ScheduledRequests
from worker_shim.publisher import FpmPublisher

# The child: one subscriber on the given endpoints; on "stop" from stdin it waits until the healthy worker has
# sent more, then prints its counters as one JSON line.
CHILD = r"""
import json, sys, threading, time
from planner.discovery import WorkerRecord
from planner.ingest.store import FleetStore
from planner.ingest.subscriber import FpmSubscriber

path, endpoints = sys.argv[1], json.loads(sys.argv[2])
workers = {
    wid: WorkerRecord(worker_id=wid, role="agg", service="agg", dp_size=1, fpm_endpoints=(ep,))
    for wid, ep in endpoints.items()
}
store = FleetStore(ttl_s=60.0)
sub = FpmSubscriber(store, receive_path=path, max_msg_bytes=4096)
sub.set_workers(workers)
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
heard = lambda: store.rank_view("healthy", 0, 0.0).heartbeats + store.rank_view("healthy", 0, 0.0).samples
print("ready", flush=True)
while not stop.is_set():
    sub.poll_once(20)
at_stop = heard()
deadline = time.monotonic() + 30
while heard() < at_stop + 20 and time.monotonic() < deadline:
    sub.poll_once(20)
print(json.dumps({"at_stop": at_stop, "after": heard(), "loop_errors": sub.loop_errors}), flush=True)
sub.close()
"""

STEP = ScheduledRequests(num_prefill_requests=3, sum_prefill_tokens=2048, num_decode_requests=40)


def _wait(condition: object, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout_s} s: {what}")
        time.sleep(0.01)


@pytest.mark.parametrize("path", ["native", "pyzmq"])
def test_connections_cut_mid_message_and_garbage_peers_never_abort_the_subscriber(path: str) -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    healthy = FpmPublisher(worker_id="healthy", endpoint="tcp://127.0.0.1:*", heartbeat_interval_s=0.01, context=ctx)
    busy = FpmPublisher(worker_id="busy", endpoint="tcp://127.0.0.1:*", heartbeat_interval_s=0.001, context=ctx)
    healthy.start()
    busy.start()
    proxy = ResettingProxy(busy.bound_endpoint or "", seed=12)
    garbage = GarbagePeer(seed=12)
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            CHILD,
            path,
            json.dumps({"healthy": healthy.bound_endpoint, "busy": proxy.endpoint, "garbage": garbage.endpoint}),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "ready"

        def cut_enough() -> bool:
            for _ in range(50):  # keep the busy publisher's messages flowing through the proxy
                busy.publish(0.01, STEP, QueuedRequests(num_prefill_requests=7, sum_prefill_tokens=90_000))
            return (proxy.cuts_mid_stream >= 60 and garbage.served >= 3) or child.poll() is not None

        _wait(cut_enough, "60 cuts through the proxy and 3 garbage connections")
        if child.poll() is None:
            child.stdin.write("stop\n")
            child.stdin.flush()
        out, _ = child.communicate(timeout=60)
        assert child.returncode == 0, f"the subscriber died with {child.returncode} after {proxy.cuts_mid_stream} cuts"
        result = json.loads(out.strip().splitlines()[-1])
        assert result["after"] >= result["at_stop"] + 20  # still receiving from the healthy publisher
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        proxy.close()
        garbage.close()
        healthy.close()
        busy.close()
        ctx.destroy(linger=0)

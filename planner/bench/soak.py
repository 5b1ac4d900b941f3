"""Soak benchmark: the real planner service ingesting from publishers that die, get cut off and misbehave.

``fpm-planner bench soak --publishers 8 --hz 20 --seconds 30 --json`` starts the planner service in this process
(uvicorn on a free loopback port, the real runner, subscriber and tick loop), registers every endpoint over HTTP,
and for ``seconds``:

- ``publishers`` real :class:`~worker_shim.publisher.FpmPublisher` s publish step samples at ``hz`` each; every
  ``--kill-every-s`` one of them (in turn) is killed and a new run starts on its endpoint (a new ``run_id``);
- a quarter of them (at least one) are reached only through a
  :class:`~planner.bench.faults.ResettingProxy` that resets every connection mid-message;
- one more endpoint publishes a mix of good and malformed messages (short frames, garbage payloads, payloads
  nested too deep, counts beyond the plausibility limits), and one is a
  :class:`~planner.bench.faults.GarbagePeer` (not ZMQ at all);
- a client reads ``/healthz`` every 20 ms.

Then the publishers stop, the service drains and stops, and one JSON line gives: messages received by the
subscriber, accepted (stored samples and heartbeats), dropped by reason, whether ``received == accepted +
dropped`` holds (``oversized`` is a connection event, not a message, and is left out of the sum), reconnects and
disconnects, kills and the restarts the store saw, cuts, RSS at start and end, the longest tick and ``/healthz``
latency p50/p99 (the client, the publishers and the service share this process: the figures are upper bounds).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import httpx
import msgpack
import zmq

from planner.bench.faults import GarbagePeer, ResettingProxy
from planner.bench.percentile import p50_p99
from planner.ingest.store import DropReason
from planner.service.app import create_app
from planner.service.config import load_config
from planner.service.runner import PlannerRunner
from planner.service.server import serve_in_thread
from worker_shim import fpm
from worker_shim.fpm import QueuedRequests, ScheduledRequests
from worker_shim.publisher import FpmPublisher

__all__ = ["add_arguments", "main", "measure", "run"]

_TOKEN = "soak-token-0123456789abcdef0123456789abcd"
_STEP = ScheduledRequests(num_prefill_requests=1, sum_prefill_tokens=512, num_decode_requests=24)
_QUEUED = QueuedRequests(num_prefill_requests=2, sum_prefill_tokens=2048)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--publishers", type=int, default=8, help="well-behaved publishers (default 8)")
    parser.add_argument("--hz", type=float, default=20.0, help="step samples per second per publisher (default 20)")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long to publish (default 30)")
    parser.add_argument("--kill-every-s", type=float, default=3.0, help="kill one publisher this often (default 3)")
    parser.add_argument("--json", action="store_true", help="print one JSON line (the only output format)")


def _rss_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024.0, 1)
    return float("nan")


def _start(ctx: zmq.Context[zmq.Socket[bytes]], worker_id: str, endpoint: str, timeout_s: float = 10.0) -> FpmPublisher:
    """Start a publisher (a new run) on ``endpoint``, which one may just have closed (ZMQ releases it
    asynchronously)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return FpmPublisher(worker_id=worker_id, endpoint=endpoint, context=ctx).start()
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


class _Malformed:
    """A bare PUB socket publishing, per round, one good heartbeat and one of each kind of bad message."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], worker_id: str) -> None:
        self.worker_id = worker_id
        self.sock = ctx.socket(zmq.PUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.endpoint = f"tcp://127.0.0.1:{self.sock.bind_to_random_port('tcp://127.0.0.1')}"
        self.counter = 0
        self.run_id = 4242
        head = msgpack.packb({"worker_id": worker_id, "dp_rank": 0, "counter_id": 1, "wall_time": 0.0, "x": None})
        self._nested = head[:-1] + b"\x91" * 1000 + b"\xc0"

    def round(self) -> None:
        self.counter += 1
        good = fpm.heartbeat(self.worker_id, 0, self.counter, self.run_id)
        self.counter += 1
        huge = fpm.ForwardPassMetrics(
            worker_id=self.worker_id,
            dp_rank=0,
            counter_id=self.counter,
            wall_time=0.01,
            run_id=self.run_id,
            scheduled_requests=ScheduledRequests(num_decode_requests=2**64 - 1),
        )
        seq = (self.counter).to_bytes(8, "big")
        for parts in (
            list(fpm.frames(good)),
            [b"", seq],  # bad_frame
            [b"", seq, b"\xc1 not msgpack"],  # decode_error
            [b"", seq, self._nested],  # decode_error (RecursionError inside msgspec)
            list(fpm.frames(huge)),  # invalid_value
        ):
            self.sock.send_multipart(parts, flags=zmq.NOBLOCK)

    def close(self) -> None:
        self.sock.close()


def measure(publishers: int, hz: float, seconds: float, kill_every_s: float) -> dict[str, Any]:
    rss_start = _rss_mb()
    config = load_config(None, {"FPM_PLANNER_TOKEN": _TOKEN, "FPM_PLANNER_TICK_INTERVAL_S": "0.25"})
    runner = PlannerRunner(config)
    serving = contextlib.ExitStack()
    port = serving.enter_context(serve_in_thread(create_app(runner), log_level="error"))
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    endpoints = [f"tcp://127.0.0.1:{_free_port()}" for _ in range(publishers)]
    pubs: list[FpmPublisher] = []
    for i, endpoint in enumerate(endpoints):
        pubs.append(_start(ctx, f"soak-{i}", endpoint))
    n_cut = max(1, publishers // 4) if publishers else 0
    proxies = [ResettingProxy(endpoints[i], seed=i) for i in range(n_cut)]
    advertised = [p.endpoint for p in proxies] + endpoints[n_cut:]
    malformed = _Malformed(ctx, "soak-malformed")
    garbage = GarbagePeer(seed=1)
    registrations = {f"soak-{i}": advertised[i] for i in range(publishers)}
    registrations["soak-malformed"] = malformed.endpoint
    registrations["soak-garbage"] = garbage.endpoint
    stop = threading.Event()
    healthz_ms: list[float] = []
    kills = 0
    headers = {"Authorization": f"Bearer {_TOKEN}"}
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=base, timeout=30.0, headers=headers) as http:
            for worker_id, endpoint in registrations.items():
                body = {"role": "decode", "service": "decode", "dp_size": 1, "fpm_endpoints": [endpoint], "ttl_s": 3600}
                http.put(f"/v1/workers/{worker_id}", json=body).raise_for_status()

        def probe() -> None:
            with httpx.Client(base_url=base, timeout=30.0) as client:
                while not stop.is_set():
                    started = time.perf_counter()
                    client.get("/healthz")
                    healthz_ms.append((time.perf_counter() - started) * 1000.0)
                    stop.wait(0.02)

        prober = threading.Thread(target=probe, name="soak-healthz", daemon=True)
        prober.start()
        period_s = 1.0 / hz
        started = time.monotonic()
        next_step = started
        next_kill = started + kill_every_s
        victim = 0
        while time.monotonic() - started < seconds:
            now = time.monotonic()
            if publishers and now >= next_kill:
                i = victim % publishers
                victim += 1
                pubs[i].close(timeout_s=0.0)  # killed: what it had queued is lost
                pubs[i] = _start(ctx, f"soak-{i}", endpoints[i])
                kills += 1
                next_kill += kill_every_s
            for pub in pubs:
                pub.publish(0.02, _STEP, _QUEUED)
            malformed.round()
            next_step += period_s
            time.sleep(max(0.0, next_step - time.monotonic()))
        for pub in pubs:
            pub.flush(5.0)
        time.sleep(1.0)  # let the subscriber drain what is in flight
        links = list(runner.subscriber.links().values())
    finally:
        stop.set()
        for pub in pubs:
            pub.close()
        malformed.close()
        for proxy in proxies:
            proxy.close()
        garbage.close()
        serving.close()
        ctx.destroy(linger=0)
    sub = runner.subscriber
    store = runner.store
    snapshot = store.snapshot(time.monotonic())
    ranks = list(snapshot.ranks.values())
    accepted = sum(r.samples + r.heartbeats for r in ranks)
    drops = {str(reason): n for reason, n in snapshot.drops.items() if n}
    dropped = sum(n for reason, n in snapshot.drops.items() if reason is not DropReason.OVERSIZED)
    return {
        "publishers": publishers,
        "hz": hz,
        "seconds": seconds,
        "received": sub.received,
        "accepted": accepted,
        "dropped": dropped,
        "dropped_by_reason": drops,
        "accounting_ok": sub.received == accepted + dropped and sub.loop_errors == 0,
        "loop_errors": sub.loop_errors,
        "kills": kills,
        "restarts_seen": sum(r.restarts for r in ranks),
        "lost_samples": sum(r.lost_samples for r in ranks),
        "cuts": sum(p.cuts_mid_stream for p in proxies),
        "garbage_connections": garbage.served,
        "reconnects": sum(link.reconnects for link in links),
        "disconnects": sum(link.disconnects for link in links),
        "socket_replacements": sum(link.socket_replacements for link in links),
        "rss_start_mb": rss_start,
        "rss_end_mb": _rss_mb(),
        "ticks": runner.ticks,
        "max_tick_ms": round(max(runner.tick_durations_s, default=0.0) * 1000.0, 2),
        **p50_p99("healthz_ms", healthz_ms, 2),
        "healthz_probes": len(healthz_ms),
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def run(args: argparse.Namespace) -> int:
    if args.publishers < 0 or args.hz <= 0 or args.seconds <= 0 or args.kill_every_s <= 0:
        print("fpm-planner bench soak: --publishers >= 0, --hz, --seconds and --kill-every-s > 0", file=sys.stderr)
        return 2
    figures = measure(args.publishers, args.hz, args.seconds, args.kill_every_s)
    print(json.dumps(figures))
    return 0 if figures["accounting_ok"] else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m planner.bench.soak", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())

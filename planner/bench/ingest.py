"""``fpm-planner bench ingest``: FPM ingest rate over real ZMQ.

Two modes. The default, *saturation* (``--publishers M --samples S``, ``"mode": "saturation"``), is described
here: the ingest capacity of one core with few publishers. With ``--endpoints N --hz M --seconds T`` the bench
runs the *paced* mode instead (:mod:`planner.bench.ingest_paced`): N endpoints publishing at a realistic rate
into the real subscriber thread, with a decision tick running.

M publishers (PUB sockets on loopback, in a child process pinned to another core) send N samples each into one
:class:`~planner.ingest.subscriber.FpmSubscriber` + :class:`~planner.ingest.store.FleetStore` in this process,
pinned to one core. The publishers send everything before the clock starts (the queues hold it all), then the
subscriber drains at saturation: the figure is the ingest capacity of one core, not the speed of a Python sender.
Every sample is a distinct, valid FPM step with its own counter, so the store does its full work for each one.
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import sys
import time
from multiprocessing.connection import Connection
from typing import Any

import zmq

from planner.discovery import Role, WorkerRecord
from planner.ingest.native import NATIVE_UNAVAILABLE, ReceivePath, native_drain
from planner.ingest.store import DropReason, FleetStore
from planner.ingest.subscriber import FpmSubscriber
from worker_shim import fpm
from worker_shim.fpm import ForwardPassMetrics, QueuedRequests, ScheduledRequests

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--publishers", type=int, default=64, help="number of publishers (default 64)")
    parser.add_argument("--samples", type=int, default=8000, help="samples per publisher (default 8000)")
    parser.add_argument("--window", type=int, default=256, help="FleetStore window per rank (default 256)")
    parser.add_argument(
        "--receive-path",
        choices=("auto", "native", "pyzmq"),
        default="auto",
        help="the subscriber's receive path: the C batch drain, pyzmq's recv_multipart, or the best built (default)",
    )
    paced = parser.add_argument_group("paced mode (planner.bench.ingest_paced)")
    paced.add_argument("--endpoints", type=int, help="paced mode: N endpoints publishing at --hz (default: off)")
    paced.add_argument("--hz", type=float, default=10.0, help="paced mode: steps per second per endpoint (10)")
    paced.add_argument("--seconds", type=float, default=10.0, help="paced mode: how long to publish (10)")
    paced.add_argument("--dp", type=int, default=8, help="paced mode: ranks per worker; N is a multiple (8)")
    paced.add_argument("--publisher-procs", type=int, default=2, help="paced mode: publisher processes (2)")
    paced.add_argument("--tick-interval-s", type=float, default=0.5, help="paced mode: decision tick interval")
    paced.add_argument(
        "--min-poll-interval-s",
        type=float,
        default=0.1,
        help="paced mode: the subscriber's minimum round interval (0.1 s)",
    )
    paced.add_argument(
        "--readiness",
        choices=("auto", "epoll", "poller"),
        default="auto",
        help="paced mode: the subscriber's readiness (epoll on ZMQ_FD, or zmq.Poller as before issue 14)",
    )
    paced.add_argument(
        "--send-interval-s",
        type=float,
        default=None,
        help="paced mode: each endpoint sends its due steps back to back once per S, as the shim's publisher"
        " does (default: the publisher's default, 0.1 s; 0: one send per step)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON line (the only output format)")


def _pin(core: int) -> int | None:
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return None
    chosen = cores[core % len(cores)]
    os.sched_setaffinity(0, {chosen})
    return chosen


def _publish(publishers: int, samples: int, conn: Connection) -> None:
    """Child process: bind M PUB sockets, heartbeat until told to go, then send the pre-encoded samples."""
    _pin(1)
    _raise_fd_limit()
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    ctx.set(zmq.MAX_SOCKETS, ctx.get(zmq.SOCKET_LIMIT))  # beyond ~1,000 publishers
    socks = []
    for _ in range(publishers):
        sock = ctx.socket(zmq.PUB)
        sock.setsockopt(zmq.SNDHWM, samples + 1000)
        sock.bind("tcp://127.0.0.1:*")
        socks.append(sock)
    conn.send([s.getsockopt_string(zmq.LAST_ENDPOINT) for s in socks])
    step = ScheduledRequests(
        num_prefill_requests=1,
        sum_prefill_tokens=512,
        var_prefill_length=0.0,
        sum_prefill_kv_tokens=128,
        num_decode_requests=32,
        sum_decode_kv_tokens=40_000,
        var_decode_kv_tokens=900.0,
    )
    queued = QueuedRequests(num_prefill_requests=3, sum_prefill_tokens=1500, var_prefill_length=40.0)
    counters = [0] * publishers
    while not conn.poll(0.02):  # heartbeats until the subscriber has joined every socket
        for i, sock in enumerate(socks):
            sock.send_multipart(fpm.frames(fpm.heartbeat(f"w{i}", 0, counters[i])))
            counters[i] += 1
    conn.recv()
    payloads = [
        [
            fpm.frames(
                ForwardPassMetrics(
                    worker_id=f"w{i}",
                    dp_rank=0,
                    counter_id=counters[i] + n,
                    wall_time=0.015,
                    scheduled_requests=step,
                    queued_requests=queued,
                )
            )
            for n in range(samples)
        ]
        for i in range(publishers)
    ]
    conn.send("encoded")
    conn.recv()
    for n in range(samples):
        for i, sock in enumerate(socks):
            sock.send_multipart(payloads[i][n])
    conn.send("sent")
    conn.recv()
    for sock in socks:
        sock.close(linger=0)
    ctx.term()


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _recv(conn: Connection, proc: mp.process.BaseProcess) -> Any:
    """The next message from the publisher process; raises (instead of waiting forever) when it died."""
    while not conn.poll(1.0):
        if not proc.is_alive():
            raise RuntimeError(f"the publisher process exited ({proc.exitcode}); see its traceback above")
    return conn.recv()


def measure(publishers: int, samples: int, window: int, receive_path: ReceivePath = "auto") -> dict[str, Any]:
    """Run the publishers in a child process and ingest here; returns the figures."""
    _raise_fd_limit()
    parent, child = mp.Pipe()
    proc = mp.get_context("spawn").Process(target=_publish, args=(publishers, samples, child), daemon=True)
    proc.start()
    endpoints: list[str] = _recv(parent, proc)
    workers = {
        f"w{i}": WorkerRecord(worker_id=f"w{i}", role=Role.AGG, service="agg", dp_size=1, fpm_endpoints=(ep,))
        for i, ep in enumerate(endpoints)
    }
    store = FleetStore(ttl_s=30.0, window_size=window)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    ctx.set(zmq.MAX_SOCKETS, ctx.get(zmq.SOCKET_LIMIT))  # three sockets per endpoint
    sub = FpmSubscriber(store, context=ctx, rcvhwm=samples + 1000, receive_path=receive_path)
    sub.set_workers(workers)
    connect_s = max(60.0, publishers / 20)  # thousands of connections take a while on a busy machine
    deadline = time.monotonic() + connect_s
    while any(store.rank_view(w, 0, 0.0).heartbeats == 0 for w in workers):
        sub.poll_once(20)
        if time.monotonic() > deadline:
            raise RuntimeError(f"publishers did not connect within {connect_s:.0f} s")
    parent.send("go")
    while _recv(parent, proc) != "encoded":
        pass
    while sub.poll_once(0):  # drain the warm-up heartbeats before timing
        pass
    stored_before = sum(store.rank_view(w, 0, 0.0).samples for w in workers)
    received_before = sub.received
    parent.send("send")
    expected = publishers * samples
    # Saturation: the publishers send everything into ZMQ's queues first (high-water marks hold it all), then the
    # clock starts and the subscriber drains at full speed. A live sender on the other core would be the limit.
    if _recv(parent, proc) != "sent":
        raise RuntimeError("publisher process failed")
    time.sleep(1.0)  # let ZMQ's I/O thread move what is still in TCP buffers
    start = time.perf_counter()
    cpu_start = time.process_time()
    last_rx = start
    while True:
        got = sub.poll_once(200)
        if got:
            last_rx = time.perf_counter()
        elif sub.received - received_before >= expected or time.perf_counter() - last_rx > 2.0:
            break
    elapsed = last_rx - start
    cpu = time.process_time() - cpu_start
    parent.send("bye")
    proc.join(10)
    stored = sum(store.rank_view(w, 0, 0.0).samples for w in workers) - stored_before
    received = sub.received - received_before
    sub.close()
    ctx.term()
    drops = {str(reason): n for reason, n in store.drops.items() if n and reason is not DropReason.STALE}
    return {
        "bench": "ingest",
        "mode": "saturation",
        "publishers": publishers,
        "receive_path": sub.receive_path,
        "samples_sent": expected,
        "samples_stored": stored,
        "dropped": expected - stored,
        "drops_by_reason": drops,
        "samples_per_s": round(stored / elapsed) if elapsed > 0 else None,
        "elapsed_s": round(elapsed, 3),
        "subscriber_cpu_s": round(cpu, 3),
        "subscriber_cores": sorted(os.sched_getaffinity(0)),
        "window": window,
        "window_samples_held": sum(len(w) for _, w in store.iter_windows()),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "received": received,
        "python": sys.version.split()[0],
    }


def run(args: argparse.Namespace) -> int:
    if args.endpoints is not None:
        return _run_paced(args)
    if args.publishers < 1 or args.samples < 1 or args.window < 1:
        print("fpm-planner bench ingest: --publishers, --samples and --window must be >= 1", file=sys.stderr)
        return 2
    _pin(0)  # the subscriber on one core, the publishers' process on the other
    if args.receive_path == "native" and native_drain() is None:
        print(f"fpm-planner bench ingest: no native receive path: {NATIVE_UNAVAILABLE}", file=sys.stderr)
        return 2
    print(json.dumps(measure(args.publishers, args.samples, args.window, args.receive_path)))
    return 0


def _run_paced(args: argparse.Namespace) -> int:
    from planner.bench.ingest_paced import measure_paced

    try:
        figures = measure_paced(
            args.endpoints,
            args.hz,
            args.seconds,
            dp=args.dp,
            publisher_procs=args.publisher_procs,
            window=args.window,
            tick_interval_s=args.tick_interval_s,
            receive_path=args.receive_path,
            min_poll_interval_s=args.min_poll_interval_s,
            readiness=args.readiness,
            **({} if args.send_interval_s is None else {"send_interval_s": args.send_interval_s}),
        )
    except ValueError as exc:
        print(f"fpm-planner bench ingest: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(figures))
    return 0

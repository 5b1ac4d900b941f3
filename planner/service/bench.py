"""Service benchmark: the HTTP API and the tick loop of a real planner service with a large registered fleet.

``python -m planner.service.bench --workers 256 --dp-size 8 --json`` starts the service on a free loopback
port (uvicorn, in this process), registers ``workers`` x ``dp_size`` ranks over HTTP (FPM endpoints on
loopback ports nobody publishes on: every rank is silent, so each tick reconciles the whole fleet), renews
every lease, lets the planner tick, and reads ``/v1/diagnostics`` and ``/v1/decisions/latest``. Prints one
JSON line of figures (milliseconds; the client runs in the same process, so these are upper bounds).

With ``--hz M --seconds T`` the fleet is live instead: the paced publishers of :mod:`planner.bench.ingest_paced`
(child processes, one PUB socket per rank, ``--send-interval-s`` bursts as there) bind first, the workers are
registered with those endpoints, and once the service's own subscriber has heard every rank they publish one
step per rank at M Hz for T seconds into the real service (its subscriber, store and tick loop). Added figures:
the publishers' ``offered_samples_per_s``/``sent_samples_per_s``/``sent``; ``samples_per_s_held`` (samples the
service's store holds from the T seconds / T), ``stored``, ``lost`` (sent - stored after a drain), the store's
``gaps``/``lost_samples``; ``process_cpu_share`` and ``process_cpu_us_per_sample`` (this whole process over the T
seconds: the service's threads and libzmq's; the bench client is idle then), ``rss_mb``; and ``tick_ms_p50/p99``
are then the ticks the service ran during the T seconds (``--ticks`` is not waited for).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial

import httpx

from planner.bench.ingest_paced import (
    PacedPublishers,
    process_cpu_s,
    publisher_figures,
    raise_fd_limit,
    rss_mb,
    start_publishers,
)
from planner.bench.percentile import p50_p99
from planner.service.app import create_app
from planner.service.config import load_config
from planner.service.runner import PlannerRunner
from planner.service.server import serve_in_thread
from worker_shim.publisher import DEFAULT_SEND_INTERVAL_S

__all__ = ["add_arguments", "main", "run"]

_TOKEN = "bench-token-0123456789abcdef0123456789"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=int, default=256, help="registered workers (default 256)")
    parser.add_argument("--dp-size", type=int, default=8, help="DP ranks per worker (default 8)")
    parser.add_argument("--ticks", type=int, default=20, help="ticks to time (default 20)")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON line")
    live = parser.add_argument_group("live fleet (paced publishers, planner.bench.ingest_paced)")
    live.add_argument("--hz", type=float, default=0.0, help="steps per rank per second (default 0: silent fleet)")
    live.add_argument("--seconds", type=float, default=10.0, help="paced seconds with --hz (default 10)")
    live.add_argument(
        "--send-interval-s",
        type=float,
        default=DEFAULT_SEND_INTERVAL_S,
        help=f"each rank's due steps back to back once per this many seconds (default {DEFAULT_SEND_INTERVAL_S})",
    )
    live.add_argument("--publisher-procs", type=int, default=2, help="publisher child processes (default 2)")


def _timed(call: Callable[[], httpx.Response]) -> tuple[float, httpx.Response]:
    started = time.perf_counter()
    response = call()
    elapsed_ms = (time.perf_counter() - started) * 1000.0
    response.raise_for_status()
    return elapsed_ms, response


def run(args: argparse.Namespace) -> int:
    if args.workers < 1 or args.dp_size < 1 or args.ticks < 1:
        print("fpm-planner bench service: --workers, --dp-size and --ticks must be >= 1", file=sys.stderr)
        return 2
    live = args.hz > 0
    if live and (args.seconds <= 0 or not 0 <= args.send_interval_s < args.seconds or args.publisher_procs < 1):
        print(
            "fpm-planner bench service: with --hz, need --seconds > 0, 0 <= --send-interval-s < --seconds and "
            "--publisher-procs >= 1",
            file=sys.stderr,
        )
        return 2
    if args.hz < 0:
        print("fpm-planner bench service: --hz must be >= 0", file=sys.stderr)
        return 2
    names = [f"bench-{i:05d}" for i in range(args.workers)]
    keys = [(w, r) for w in names for r in range(args.dp_size)]
    publishers: PacedPublishers | None = None
    if live:
        raise_fd_limit()
        publishers = start_publishers(keys, args.hz, args.seconds, args.send_interval_s, args.publisher_procs)
        endpoints = dict(publishers.endpoints)
    else:  # loopback ports nobody publishes on
        endpoints = dict(zip(keys, (f"tcp://127.0.0.1:{p}" for p in range(21000, 65000)), strict=False))
    config = load_config(None, {"FPM_PLANNER_TOKEN": _TOKEN, "FPM_PLANNER_TICK_INTERVAL_S": "0.25"})
    runner = PlannerRunner(config)
    serving = contextlib.ExitStack()
    port = serving.enter_context(serve_in_thread(create_app(runner)))
    headers = {"Authorization": f"Bearer {_TOKEN}"}
    bodies = {
        w: {
            "role": "decode",
            "service": "decode",
            "dp_size": args.dp_size,
            "fpm_endpoints": [endpoints[(w, r)] for r in range(args.dp_size)],
            "ttl_s": 600.0,
        }
        for w in names
    }
    live_figures: dict[str, object] = {}
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30.0, headers=headers) as http:
            register_ms = [_timed(partial(http.put, f"/v1/workers/{w}", json=b))[0] for w, b in bodies.items()]
            renew_ms = [_timed(partial(http.put, f"/v1/workers/{w}", json=b))[0] for w, b in bodies.items()]
            if publishers is not None:
                live_figures, ticks_ms = _live(runner, publishers, keys, args)
            else:
                first = runner.ticks
                while runner.ticks < first + args.ticks:
                    time.sleep(0.05)
                ticks_ms = [d * 1000.0 for d in list(runner.tick_durations_s)[-args.ticks :]]
            diag = [_timed(partial(http.get, "/v1/diagnostics")) for _ in range(20)]
            latest_ms = [_timed(partial(http.get, "/v1/decisions/latest"))[0] for _ in range(20)]
            workers_ms = [_timed(partial(http.get, "/v1/workers"))[0] for _ in range(20)]
            diag_ms = [ms for ms, _ in diag]
            ranks = sum(len(w["ranks"]) for w in diag[-1][1].json()["workers"])
            figures = {
                "workers": args.workers,
                "ranks": ranks,
                **p50_p99("register_ms", register_ms, 2),
                **p50_p99("renew_ms", renew_ms, 2),
                **p50_p99("tick_ms", ticks_ms, 2),
                **p50_p99("diagnostics_ms", diag_ms, 2),
                "diagnostics_bytes": len(diag[-1][1].content),
                "decisions_latest_ms_p50": round(statistics.median(latest_ms), 2),
                "workers_list_ms_p50": round(statistics.median(workers_ms), 2),
                "endpoints_connected": len(runner.subscriber.endpoints),
                **live_figures,
            }
    finally:
        serving.close()
        if publishers is not None:
            publishers.close()
    if args.json:
        print(json.dumps(figures))
    else:
        for key, value in figures.items():
            print(f"{key}: {value}")
    return 0


def _live(
    runner: PlannerRunner, publishers: PacedPublishers, keys: list[tuple[str, int]], args: argparse.Namespace
) -> tuple[dict[str, object], list[float]]:
    """Once the service has heard every rank: the paced seconds, a drain, and what the service's store holds."""
    sub, store = runner.subscriber, runner.store
    deadline = time.monotonic() + 120
    while int(sub.snapshot(time.monotonic()).totals.fresh.sum()) < len(keys):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the service did not hear all {len(keys)} ranks within 120 s")
        time.sleep(0.2)
    time.sleep(0.3)  # the last warm-up heartbeats

    def stored_now() -> int:
        with sub.lock:
            return sum(store.rank_view(w, r, 0.0).samples for w, r in keys)

    stored0, cpu0, ticks0 = stored_now(), process_cpu_s(), runner.ticks
    publishers.go()
    start = time.monotonic()
    time.sleep(args.seconds)
    span_s = time.monotonic() - start
    stored_in_span, cpu_s, ticks = stored_now() - stored0, process_cpu_s() - cpu0, runner.ticks - ticks0
    while not ticks:  # a paced span shorter than a tick interval: the next tick
        time.sleep(0.05)
        ticks = runner.ticks - ticks0
    ticks_ms = [d * 1000.0 for d in list(runner.tick_durations_s)[-ticks:]]
    reports = publishers.reports()
    pub = publisher_figures(reports, len(keys), args.hz)
    sent = int(pub["sent"])
    # drain: until every sample is stored, or nothing arrived for 3 s (120 s at most)
    last, quiet_since, drain_end = -1, time.monotonic(), time.monotonic() + 120
    while stored_now() - stored0 < sent and time.monotonic() - quiet_since < 3.0 and time.monotonic() < drain_end:
        time.sleep(0.2)
        if sub.received != last:
            last, quiet_since = sub.received, time.monotonic()
    stored = stored_now() - stored0
    with sub.lock:
        views = [store.rank_view(w, r, 0.0) for w, r in keys]
    return {
        "hz": args.hz,
        "seconds": args.seconds,
        "send_interval_s": args.send_interval_s,
        **pub,
        "samples_per_s_held": round(stored_in_span / span_s),
        "stored": stored,
        "lost": sent - stored,
        "gaps": sum(v.gaps for v in views),
        "lost_samples": sum(v.lost_samples for v in views),
        "process_cpu_share": round(cpu_s / span_s, 3),
        "process_cpu_us_per_sample": round(cpu_s * 1e6 / stored_in_span, 2) if stored_in_span else None,
        "rss_mb": round(rss_mb(), 1),
        "ticks_live": ticks,
        "loop_errors": sub.loop_errors,
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }, ticks_ms


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m planner.service.bench", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())

"""Service benchmark: the HTTP API and the tick loop of a real planner service with a large registered fleet.

``python -m planner.service.bench --workers 256 --dp-size 8 --json`` starts the service on a free loopback
port (uvicorn, in this process), registers ``workers`` x ``dp_size`` ranks over HTTP (FPM endpoints on
loopback ports nobody publishes on: every rank is silent, so each tick reconciles the whole fleet), renews
every lease, lets the planner tick, and reads ``/v1/diagnostics`` and ``/v1/decisions/latest``. Prints one
JSON line of figures (milliseconds; the client runs in the same process, so these are upper bounds).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial

import httpx

from planner.bench.percentile import p50_p99
from planner.service.app import create_app
from planner.service.config import load_config
from planner.service.runner import PlannerRunner
from planner.service.server import serve_in_thread

__all__ = ["add_arguments", "main", "run"]

_TOKEN = "bench-token-0123456789abcdef0123456789"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=int, default=256, help="registered workers (default 256)")
    parser.add_argument("--dp-size", type=int, default=8, help="DP ranks per worker (default 8)")
    parser.add_argument("--ticks", type=int, default=20, help="ticks to time (default 20)")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON line")


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
    config = load_config(None, {"FPM_PLANNER_TOKEN": _TOKEN, "FPM_PLANNER_TICK_INTERVAL_S": "0.25"})
    runner = PlannerRunner(config)
    serving = contextlib.ExitStack()
    port = serving.enter_context(serve_in_thread(create_app(runner)))
    ports = iter(range(21000, 65000))
    headers = {"Authorization": f"Bearer {_TOKEN}"}
    bodies = {
        f"bench-{i:05d}": {
            "role": "decode",
            "service": "decode",
            "dp_size": args.dp_size,
            "fpm_endpoints": [f"tcp://127.0.0.1:{next(ports)}" for _ in range(args.dp_size)],
            "ttl_s": 600.0,
        }
        for i in range(args.workers)
    }
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30.0, headers=headers) as http:
            register_ms = [_timed(partial(http.put, f"/v1/workers/{w}", json=b))[0] for w, b in bodies.items()]
            renew_ms = [_timed(partial(http.put, f"/v1/workers/{w}", json=b))[0] for w, b in bodies.items()]
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
            }
    finally:
        serving.close()
    if args.json:
        print(json.dumps(figures))
    else:
        for key, value in figures.items():
            print(f"{key}: {value}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m planner.service.bench", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())

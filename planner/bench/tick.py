"""``fpm-planner bench tick --json``: decision time per tick for a large fleet.

A real :class:`planner.ingest.store.FleetStore` holds ``--workers`` discovered workers of ``--dp`` ranks each
(a quarter prefill, the rest decode, two services), every rank publishing one FPM sample before each tick with
varying load. Timed per tick, on one thread:

- ``tick_ms``: build the :class:`planner.core.Observation` from the snapshot + discovered workers +
  deployment status + traffic, then run :func:`planner.core.step` (reconcile every rank of every worker,
  recommend, clamp, decide). This is the figure with the <= 20 ms target.
- ``tick_cpu_ms``: the same span in thread CPU time (``time.thread_time``), which a shared machine inflates
  less than wall time.
- ``snapshot_ms``: ``FleetStore.snapshot(now)`` itself (the store's cost, not the core's), reported apart.
- ``tick_with_snapshot_ms``: the two together.

Ingesting the samples between ticks is not timed.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import time

from planner.bench.percentile import p50_p99
from planner.core import CoreConfig, CoreState, DeploymentStatus, Observation, RoleConfig, Traffic, step
from planner.discovery import EngineCapacity, Role, WorkerRecord
from planner.ingest.store import FleetStore
from worker_shim.fpm import ForwardPassMetrics, QueuedRequests, ScheduledRequests

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=int, default=4096, help="discovered workers (default 4096)")
    parser.add_argument("--dp", type=int, default=8, help="data-parallel ranks per worker (default 8)")
    parser.add_argument("--ticks", type=int, default=60, help="timed ticks (default 60)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed ticks first (default 3)")
    parser.add_argument("--interval-s", type=float, default=5.0, help="simulated tick interval (default 5)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="print one JSON line (the default output anyway)")


def run(args: argparse.Namespace) -> int:
    if args.workers < 1 or args.dp < 1 or args.ticks < 1 or args.warmup < 0 or args.interval_s <= 0:
        raise SystemExit("need --workers >= 1, --dp >= 1, --ticks >= 1, --warmup >= 0, --interval-s > 0")
    rng = random.Random(args.seed)
    capacity = EngineCapacity(max_num_batched_tokens=8192, max_num_seqs=256, kv_capacity_tokens=500_000)
    workers: dict[str, WorkerRecord] = {}
    n_prefill = max(args.workers // 4, 1) if args.workers > 1 else 0
    for i in range(args.workers):
        role = Role.PREFILL if i < n_prefill else Role.DECODE
        host = f"10.{i // 65536}.{(i // 256) % 256}.{i % 256}"
        workers[f"w{i}"] = WorkerRecord(
            worker_id=f"w{i}",
            role=role,
            service=role.value,
            dp_size=args.dp,
            fpm_endpoints=tuple(f"tcp://{host}:{20380 + r}" for r in range(args.dp)),
            capacity=capacity,
        )
    store = FleetStore(ttl_s=2 * args.interval_s, window_size=8)
    store.set_workers(workers)
    n_decode = args.workers - n_prefill
    deployments = {
        "prefill": DeploymentStatus(service="prefill", desired=n_prefill, ready=n_prefill),
        "decode": DeploymentStatus(service="decode", desired=n_decode, ready=n_decode),
    }
    roles = {role: RoleConfig(min_replicas=1, max_replicas=2 * args.workers) for role in Role}
    config = CoreConfig(roles=roles)
    traffic = {
        Role.PREFILL: Traffic(request_rate_per_s=400.0, isl_tokens=3000, osl_tokens=300),
        Role.DECODE: Traffic(request_rate_per_s=400.0, isl_tokens=3000, osl_tokens=300),
    }
    endpoints = [
        (wid, rank, rec.fpm_endpoints[rank], rec.role) for wid, rec in workers.items() for rank in range(rec.dp_size)
    ]
    counter = 0
    state = CoreState()
    tick_ms: list[float] = []
    snap_ms: list[float] = []
    cpu_ms: list[float] = []  # thread CPU time of the same span: less inflated when the machine is shared
    total = args.warmup + args.ticks
    for t in range(total):
        now = 1000.0 + t * args.interval_s
        counter += 1
        scale = 0.5 + 0.5 * rng.random()
        for wid, rank, endpoint, role in endpoints:
            if role == Role.PREFILL:
                sched = ScheduledRequests(num_prefill_requests=2, sum_prefill_tokens=int(6000 * scale))
                queued = QueuedRequests(num_prefill_requests=1, sum_prefill_tokens=int(2000 * scale))
            else:
                sched = ScheduledRequests(num_decode_requests=int(120 * scale), sum_decode_kv_tokens=int(2e5 * scale))
                queued = QueuedRequests()
            store.ingest(
                endpoint,
                ForwardPassMetrics(
                    worker_id=wid,
                    dp_rank=rank,
                    counter_id=counter,
                    wall_time=0.03,
                    scheduled_requests=sched,
                    queued_requests=queued,
                ),
                now - 0.5,
                now,
            )
        gc.collect()
        t0 = time.perf_counter()
        snapshot = store.snapshot(now)
        t1 = time.perf_counter()
        c1 = time.thread_time()
        observation = Observation(workers=workers, fleet=snapshot, deployments=deployments, traffic=traffic)
        state, decisions = step(state, observation, now, config)
        c2 = time.thread_time()
        t2 = time.perf_counter()
        if t >= args.warmup:
            snap_ms.append((t1 - t0) * 1000)
            tick_ms.append((t2 - t1) * 1000)
            cpu_ms.append((c2 - c1) * 1000)
        if len(decisions) != 2:
            raise SystemExit(f"expected 2 decisions, got {len(decisions)}")
    both = [a + b for a, b in zip(tick_ms, snap_ms, strict=True)]
    print(
        json.dumps(
            {
                "bench": "tick",
                "workers": args.workers,
                "dp": args.dp,
                "engines": args.workers * args.dp,
                "ticks": args.ticks,
                **p50_p99("tick_ms", tick_ms, 3),
                **p50_p99("tick_cpu_ms", cpu_ms, 3),
                **p50_p99("snapshot_ms", snap_ms, 3),
                **p50_p99("tick_with_snapshot_ms", both, 3),
                "measured": "tick_ms: Observation + step(); snapshot_ms: FleetStore.snapshot()",
            }
        )
    )
    return 0

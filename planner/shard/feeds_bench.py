"""``python -m planner.shard.feeds_bench [--workers W] [--dp D] [--rate R] [--shards S] [--repeat N]``: what the
per-rank counters and the perf-model training points cost in sharded mode.

One shard owning ``W`` workers of ``D`` ranks, every rank with a full window of step samples: the summary's size
with and without the rank counters, the shard's CPU to take one (``summarize``), the leader's CPU to merge one
(``SummaryMerger.update``, which keeps the counters); and the training points: the shard's share of a fleet-wide
``R`` points/s over ``S`` live shards, its CPU to pick and encode one second of them, the bytes a point and the
messages they make. CPU time (``time.process_time``), so the figures hold on a busy machine better than wall time.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections.abc import Sequence

from planner.discovery import Role, WorkerRecord
from planner.ingest.store import FleetStore
from planner.shard.merge import SummaryMerger
from planner.shard.perf_points import PointPicker, encode_perf_points
from planner.shard.summary import encode_summary, summarize
from worker_shim.fpm import ForwardPassMetrics, ScheduledRequests

__all__ = ["main"]


def _store(workers: int, dp: int, steps: int) -> tuple[FleetStore, dict[str, WorkerRecord]]:
    records = {
        f"worker-{i:05d}": WorkerRecord(
            worker_id=f"worker-{i:05d}",
            role=Role.PREFILL if i % 4 == 0 else Role.DECODE,
            service="svc",
            dp_size=dp,
            fpm_endpoints=tuple(f"tcp://10.{i // 250}.{i % 250}.1:{20380 + r}" for r in range(dp)),
        )
        for i in range(workers)
    }
    store = FleetStore(window_size=steps)
    store.set_workers(records)
    for n in range(1, steps + 1):
        for wid, record in records.items():
            for rank, endpoint in enumerate(record.fpm_endpoints):
                load = 1 + (n * 7 + rank) % 64
                sample = ForwardPassMetrics(
                    worker_id=wid,
                    dp_rank=rank,
                    counter_id=n,
                    wall_time=0.005 + 0.0002 * load,
                    scheduled_requests=ScheduledRequests(num_decode_requests=load, sum_decode_kv_tokens=900 * load),
                )
                store.ingest(endpoint, sample, n * 0.01, n * 0.01)
    return store, records


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m planner.shard.feeds_bench")
    parser.add_argument("--workers", type=int, default=128)
    parser.add_argument("--dp", type=int, default=8)
    parser.add_argument("--rate", type=float, default=512.0)
    parser.add_argument("--shards", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args(argv)
    store, records = _store(args.workers, args.dp, 32)
    now = 32 * 0.01
    snapshot = store.snapshot(now)
    ranks = snapshot.totals.table.size
    bare = len(encode_summary(summarize("s0", 1, snapshot, 1e9, 0, rank_stats_per_summary=0)))
    started = time.process_time()
    summaries = [summarize("s0", seq, store.snapshot(now), 1e9 + seq, 0) for seq in range(1, args.repeat + 1)]
    summarize_ms = (time.process_time() - started) / args.repeat * 1e3
    full = len(encode_summary(summaries[0]))
    carried = len(summaries[0].rank_stats) // 24
    print(
        f"summary of {ranks} ranks: {bare} bytes without rank counters, {full} with ({carried} ranks a summary);"
        f" shard CPU to take one {summarize_ms:.2f} ms"
    )
    merger = SummaryMerger()
    merger.set_workers(records)
    started = time.process_time()
    for summary in summaries:
        merger.update(summary)
    update_us = (time.process_time() - started) / args.repeat * 1e6
    print(f"leader CPU to merge one summary (counters kept per slot): {update_us:.0f} us")

    picker = PointPicker(burst_s=1.0)
    lock = threading.Lock()
    picker.pick(store, lock, records, rate_per_s=args.rate, shards=args.shards, now=0.0)
    started = time.process_time()
    points = picker.pick(store, lock, records, rate_per_s=args.rate, shards=args.shards, now=1.0)
    payloads = encode_perf_points("s0", 1, points)
    pick_ms = (time.process_time() - started) * 1e3
    size = sum(map(len, payloads))
    per_point = size / max(1, len(points))
    print(
        f"perf points: {args.rate:g}/s over {args.shards} shards: {len(points)} a second from this shard,"
        f" {size} bytes in {len(payloads)} message(s) ({per_point:.0f} bytes a point, largest"
        f" {max(map(len, payloads), default=0)}); shard CPU to pick and encode them {pick_ms:.2f} ms;"
        f" load average {os.getloadavg()[0]:.1f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

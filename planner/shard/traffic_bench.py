"""``python -m planner.shard.traffic_bench [--samples N] [--shards S]``: what the FPM traffic costs in sharded mode.

Prints the size of one service's traffic counters in a summary (after ``N`` samples of lognormal ISL, OSL, TTFT
and ITL, and the worst case: every bucket of every histogram), the shard's CPU per sample (an empty extension, as
most steps carry, and the lognormal mix), and the leader's CPU to difference ``S`` shards x 2 services into its
windows once. CPU time (``time.process_time``), so the figures hold on a busy machine better than wall time.
"""

from __future__ import annotations

import argparse
import os
import random
import time
from collections.abc import Sequence

import msgspec

from planner.ingest.traffic import TrafficWindows
from planner.shard.summary import ShardSummary
from planner.shard.traffic import CumulativeTraffic, HistogramTotals, ServiceTraffic, TrafficDiffer
from worker_shim.fpm import HIST_MAX_BUCKET, StepTraffic
from worker_shim.metrics import TrafficAccumulator

__all__ = ["main"]


def _steps(rng: random.Random, n: int) -> list[StepTraffic]:
    out = []
    for _ in range(n):
        acc = TrafficAccumulator()
        for _ in range(rng.randrange(0, 4)):
            acc.arrival(int(rng.lognormvariate(7.0, 1.2)) + 1)
            acc.first_token(rng.lognormvariate(5.5, 1.0))
        for _ in range(rng.randrange(0, 3)):
            acc.completion(int(rng.lognormvariate(5.5, 1.0)) + 1, rng.lognormvariate(3.3, 0.5))
        out.append(acc.take())
    return out


def _summary(shard_id: str, seq: int, taken_at: float, traffic: dict[str, ServiceTraffic]) -> ShardSummary:
    return ShardSummary(
        shard_id=shard_id,
        seq=seq,
        taken_at=taken_at,
        ttl_s=10.0,
        workers=(),
        dp_size=(),
        fresh=b"",
        load={},
        drops={},
        drops_by_worker={},
        seen={},
        received=0,
        run_started_at=0.5,
        traffic=traffic,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m planner.shard.traffic_bench")
    parser.add_argument("--samples", type=int, default=500_000)
    parser.add_argument("--shards", type=int, default=64)
    args = parser.parse_args(argv)
    encoder = msgspec.msgpack.Encoder()
    steps = _steps(random.Random(1), 2000)
    counters = CumulativeTraffic()
    for i in range(args.samples):
        counters.add("decode", steps[i % len(steps)], i * 0.001)
    typical = counters.totals(args.samples * 0.001)["decode"]
    buckets = [len(h.buckets) for h in (typical.arrivals, typical.completions, typical.ttft_ms, typical.itl_ms)]
    print(f"one service after {args.samples} samples: buckets {buckets}, {len(encoder.encode(typical))} bytes")
    full = HistogramTotals(2**40, 1e15, {k: 2**32 for k in range(HIST_MAX_BUCKET + 1)})
    worst = ServiceTraffic(1e6, 2**40, full, full, full, full)
    print(f"worst case (every bucket of every histogram): {len(encoder.encode(worst))} bytes")

    empty = StepTraffic()
    n = max(args.samples, 1)
    started = time.process_time()
    for _ in range(n):
        counters.add("decode", empty, 1.0)
    empty_us = (time.process_time() - started) / n * 1e6
    started = time.process_time()
    for i in range(n):
        counters.add("decode", steps[i % len(steps)], 1.0)
    mix_us = (time.process_time() - started) / n * 1e6
    print(f"shard CPU per sample: empty extension {empty_us:.2f} us, lognormal mix {mix_us:.2f} us")

    base = counters.totals(1.0)["decode"]
    for step in steps:
        counters.add("decode", step, 1.0)
    after = counters.totals(2.0)["decode"]
    windows = TrafficWindows(window_s=60.0)
    differ = TrafficDiffer(started_at=0.0)
    ids = [f"s{i}" for i in range(args.shards)]
    differ.feed(
        windows, [_summary(s, 1, 1.0, {"decode": base, "prefill": base}) for s in ids], wall_now=1.0, local_now=1.0
    )
    second = [_summary(s, 2, 2.0, {"decode": after, "prefill": after}) for s in ids]
    started = time.process_time()
    differ.feed(windows, second, wall_now=2.0, local_now=2.0)
    feed_s = time.process_time() - started
    per_us = feed_s / max(args.shards * 2, 1) * 1e6
    print(
        f"leader CPU to difference {args.shards} shards x 2 services: {feed_s * 1e3:.1f} ms"
        f" ({per_us:.0f} us per shard and service); load average {os.getloadavg()[0]:.1f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``python -m planner.shard.bench tick``: the leader's tick at fleet size with synthetic shard summaries.

``--shards`` summaries of ``--workers`` x ``--dp`` ranks (taken from real shard stores, every rank publishing, load
varying) are re-published every tick; timed per tick: decoding the summaries (as the listener does),
``SummaryMerger.snapshot`` and the decision core's :func:`planner.core.step` over every worker.
"""

from __future__ import annotations

import gc
import random
import time
from typing import Any

from planner.bench.percentile import p50_p99
from planner.core import CoreConfig, CoreState, DeploymentStatus, Observation, RoleConfig, Traffic, step
from planner.discovery import Role
from planner.ingest.store import FleetStore
from planner.shard.bench import _fleet
from planner.shard.merge import SummaryMerger
from planner.shard.partition import partition
from planner.shard.summary import decode_summary, encode_summary, summarize
from worker_shim.fpm import ForwardPassMetrics, QueuedRequests, ScheduledRequests

__all__ = ["bench_tick"]


def bench_tick(workers: int, dp: int, shards: int, ticks: int, interval_s: float, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    records = _fleet(workers, dp)
    shard_ids = [f"s{i}" for i in range(shards)]
    parts = partition(records, shard_ids)
    stores = {}
    for sid in shard_ids:
        store = FleetStore(ttl_s=2 * interval_s, window_size=4)
        store.set_workers({wid: records[wid] for wid in parts[sid]})
        stores[sid] = store
    merger = SummaryMerger(ttl_s=2 * interval_s, max_summary_age_s=2 * interval_s)
    merger.set_workers(records)
    n_prefill = max(workers // 4, 1)
    deployments = {
        "prefill": DeploymentStatus(service="prefill", desired=n_prefill, ready=n_prefill),
        "decode": DeploymentStatus(service="decode", desired=workers - n_prefill, ready=workers - n_prefill),
    }
    config = CoreConfig(roles={role: RoleConfig(min_replicas=1, max_replicas=2 * workers) for role in Role})
    traffic = {role: Traffic(request_rate_per_s=400.0, isl_tokens=3000, osl_tokens=300) for role in Role}
    state = CoreState()
    tick_ms: list[float] = []
    decode_ms: list[float] = []
    merge_ms: list[float] = []
    cpu_ms: list[float] = []  # thread CPU time of the tick: less inflated on a shared machine
    summary_bytes = 0
    for t in range(ticks + 3):
        now = 1_700_000_000.0 + t * interval_s
        scale = 0.5 + 0.5 * rng.random()
        wires = []
        for sid, store in stores.items():  # the shards' side: not timed
            for wid in parts[sid]:
                record = records[wid]
                for rank, endpoint in enumerate(record.fpm_endpoints):
                    if record.role is Role.PREFILL:
                        sched = ScheduledRequests(num_prefill_requests=2, sum_prefill_tokens=int(6000 * scale))
                        queued = QueuedRequests(num_prefill_requests=1, sum_prefill_tokens=int(2000 * scale))
                    else:
                        sched = ScheduledRequests(
                            num_decode_requests=int(120 * scale), sum_decode_kv_tokens=int(2e5 * scale)
                        )
                        queued = QueuedRequests()
                    sample = ForwardPassMetrics(
                        worker_id=wid,
                        dp_rank=rank,
                        counter_id=t + 1,
                        wall_time=0.03,
                        scheduled_requests=sched,
                        queued_requests=queued,
                    )
                    store.ingest(endpoint, sample, now - 0.5, now - 0.5)
            wires.append(encode_summary(summarize(sid, t + 1, store.snapshot(now - 0.2), now - 0.2, received=0)))
        summary_bytes = sum(map(len, wires))
        gc.collect()
        t0 = time.perf_counter()
        for wire in wires:  # the listener's work, on its own thread in the service
            merger.update(decode_summary(wire))
        t1 = time.perf_counter()
        c1 = time.thread_time()
        snapshot = merger.snapshot(now)
        t2 = time.perf_counter()
        observation = Observation(workers=records, fleet=snapshot, deployments=deployments, traffic=traffic)
        state, decisions = step(state, observation, now, config)
        t3 = time.perf_counter()
        c3 = time.thread_time()
        if len(decisions) != 2:
            raise RuntimeError(f"expected 2 decisions, got {len(decisions)}")
        if t >= 3:
            decode_ms.append((t1 - t0) * 1000)
            merge_ms.append((t2 - t1) * 1000)
            tick_ms.append((t3 - t1) * 1000)
            cpu_ms.append((c3 - c1) * 1000)
    return {
        "bench": "shard-tick",
        "workers": workers,
        "dp": dp,
        "engines": workers * dp,
        "shards": shards,
        "ticks": ticks,
        "summary_bytes_per_tick": summary_bytes,
        **p50_p99("tick_ms", tick_ms, 3),
        **p50_p99("tick_cpu_ms", cpu_ms, 3),
        **p50_p99("merge_ms", merge_ms, 3),
        **p50_p99("decode_summaries_ms", decode_ms, 3),
        "measured": "tick_ms: SummaryMerger.snapshot + Observation + step(); decode_summaries_ms: the listener",
    }

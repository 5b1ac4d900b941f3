"""``python -m planner.shard.bench nats --drain``: the shards' ingest capacity with the cores to themselves.

The live bench (:func:`planner.shard.bench.bench_nats`) runs publishers, nats-server and shards at once, so on a
2-core machine the shards never have the cores to themselves. This mode takes the publishers and the server's
routing out of the timed part:

1. a nats-server whose per-client limits let a subscriber stop reading for a while without being cut off as a
   slow consumer (``max_pending``, ``write_deadline``, ``ping_interval``, :data:`DRAIN_SERVER_CONFIG`), with its
   HTTP monitoring port on;
2. ``S`` shard processes (:class:`~planner.shard.process.IngestShard` as it is), each subscribed to its
   rendezvous partition, then held: the bench blocks the event loop thread of the shard's NATS client (a
   callback that waits on an event), so the client reads nothing and its messages queue in the kernel socket
   buffer and the server's pending buffer for that connection, still subscribed;
3. the publishers send a fixed total, ``--drain-steps`` steps of every rank (in the relay's batched form with
   ``--batch-steps``), and exit; the bench waits until the server's ``/connz`` shows every message handed to the
   shards' connections (``out_msgs``) and their pending bytes settled;
4. all shards are released at one instant (one shared event), and each times, from that instant, until its
   store holds every sample of its partition; it reports its samples, drain seconds and CPU seconds.

Figures: per shard, samples stored, drain seconds, CPU seconds (and the part in Python's garbage collector),
samples per second, and how long its NATS loop thread was runnable but waiting for a CPU (``runqueue_wait_s``: on
a shared machine, why ``cpu_share`` < 1); in total, all samples over the slowest shard's drain seconds (the
measurement) and all samples over the largest shard CPU time (an estimate: each shard with a core to itself); the
partition's balance (rendezvous hashing is not exactly even and the bench does not pick worker ids to even it) and
what it costs; the nats-server's CPU during the drain (it still writes its pending buffers out to the sockets).
What this measures is the shards' capacity with the cores to themselves, not a live rate: in production the relays
and the NATS servers run on other machines.
"""

from __future__ import annotations

import contextlib
import gc
import json
import multiprocessing as mp
import os
import threading
import time
import urllib.request
from collections.abc import Iterator
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event as MpEvent
from typing import Any

from planner.shard.bench import _fleet, start_publishers
from planner.shard.bench_procs import NS, nats_server, proc_cpu_s
from planner.shard.partition import partition

__all__ = ["DRAIN_SERVER_CONFIG", "bench_drain"]

#: per-client limits that let a held shard's connection queue the whole run (the defaults are 64 MB and 10 s)
DRAIN_SERVER_CONFIG: dict[str, Any] = {
    "max_pending": 4 * 1024**3,  # bytes queued for one client before the server cuts it off as a slow consumer
    "write_deadline": "600s",  # how long one write to a client may block
    "ping_interval": "10m",  # a held client answers no PING
}

_QUIET_S = 5.0  # a shard that stores nothing new for this long has lost samples: it stops and reports them


def _drain_shard(
    url: str,
    shard_id: str,
    shard_ids: list[str],
    workers: int,
    dp: int,
    expected: int,
    release: MpEvent,
    conn: Connection,
) -> None:
    from planner.shard.process import IngestShard

    shard = IngestShard(shard_id, servers=[url], namespace=NS, user=f"shard-{shard_id}", password="s", ttl_s=3600)
    shard.set_membership(_fleet(workers, dp), shard_ids)
    shard.start()
    if not shard.source.wait_subscribed(30):
        conn.send({"error": f"shard {shard_id} not subscribed"})
        return
    # Hold the NATS client: a callback on its event loop that waits, so the loop reads nothing until released.
    # (The loop is the source's own; the bench reaches it here, the product never does.)
    loop = shard.source._thread.loop
    if loop is None:
        conn.send({"error": f"shard {shard_id}: no event loop"})
        return
    gate, held = threading.Event(), threading.Event()
    loop_tid = 0

    def hold() -> None:
        nonlocal loop_tid
        loop_tid = threading.get_native_id()
        held.set()
        gate.wait()

    loop.call_soon_threadsafe(hold)
    if not held.wait(10):
        conn.send({"error": f"shard {shard_id}: the loop could not be held"})
        return
    received0 = shard.source.received  # before any publisher starts
    conn.send("ready")
    release.wait()
    woke = time.monotonic()
    cpu0 = time.process_time()
    gc_s = _gc_timer()
    wait0 = _runqueue_wait_s(loop_tid)
    received_held = shard.source.received - received0  # 0 unless the hold failed
    gate.set()
    last, quiet = shard.source.received, woke
    while shard.source.received - received0 < expected:  # a cheap counter; the store is read once at the end
        time.sleep(0.002)
        got = shard.source.received
        if got != last:
            last, quiet = got, time.monotonic()
        elif time.monotonic() - quiet > _QUIET_S:
            break
    with shard.source.lock:  # the ingest of the last message is complete once the lock is ours
        done = time.monotonic()
        snap = shard.store.snapshot(done)
    cpu = time.process_time() - cpu0
    gc.callbacks.clear()
    waited = _runqueue_wait_s(loop_tid) - wait0
    conn.send(
        {
            "shard": shard_id,
            "workers": len(shard.owned),
            "expected": expected,
            "received": shard.source.received - received0,
            "received_while_held": received_held,
            "stored": sum(v.samples for v in snap.ranks.values()),
            "gaps": sum(v.gaps for v in snap.ranks.values()),
            "drops": sum(snap.drops.values()),
            "woke_at": woke,
            "done_at": done,
            "cpu_s": cpu,
            "runqueue_wait_s": waited,
            "gc_s": gc_s[0],
            "slow_consumer_drops": shard.source.slow_consumer_drops,
            "reconnects": shard.source.disconnects,
        }
    )
    shard.close()


def _gc_timer() -> list[float]:
    """Seconds spent in Python's cyclic garbage collector from now on (``[total]``, kept up to date)."""
    total, started = [0.0], [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            total[0] += time.perf_counter() - started[0]

    gc.callbacks.append(on_gc)
    return total


def _runqueue_wait_s(native_id: int) -> float:
    """Seconds the thread ``native_id`` of this process has spent runnable but waiting for a CPU
    (``/proc/self/task/<tid>/schedstat``, second field): with ``cpu_s``, it tells a shard that waited for a core
    (a busy machine) from one that waited for data."""
    with open(f"/proc/self/task/{native_id}/schedstat") as f:
        return int(f.read().split()[1]) / 1e9


def _connz(http_port: int) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/connz?auth=true&limit=4096", timeout=5) as resp:
        conns: list[dict[str, Any]] = json.load(resp).get("connections") or []
        return conns


def _wait_filled(http_port: int, expected_msgs: dict[str, int], timeout_s: float) -> dict[str, dict[str, int]]:
    """Wait until the server has handed every shard connection its messages (``out_msgs``) and the bytes it
    still holds for them (``pending_bytes``) stopped changing (the kernel socket buffers are full); returns
    each shard's ``out_msgs`` and ``pending_bytes`` then."""
    deadline = time.monotonic() + timeout_s
    previous: dict[str, dict[str, int]] | None = None
    while True:
        now = {
            c["authorized_user"].removeprefix("shard-"): {
                "out_msgs": int(c.get("out_msgs", 0)),
                "pending_bytes": int(c.get("pending_bytes", 0)),
            }
            for c in _connz(http_port)
            if str(c.get("authorized_user", "")).startswith("shard-")
        }
        filled = all(now.get(sid, {}).get("out_msgs", -1) >= n for sid, n in expected_msgs.items())
        if filled and now == previous:
            return now
        if time.monotonic() > deadline:
            raise RuntimeError(f"the shards' connections did not fill in {timeout_s} s: {now} (want {expected_msgs})")
        previous = now if filled else None
        time.sleep(0.5)


@contextlib.contextmanager
def _terminated_at_exit(procs: list[BaseProcess]) -> Iterator[None]:
    """Whatever happens, no held shard outlives the run."""
    try:
        yield
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(5)


def bench_drain(
    workers: int,
    dp: int,
    shards: int,
    steps: int,
    publisher_procs: int,
    batch_steps: int = 0,
    flush_every: int = 512,
    fill_timeout_s: float = 300.0,
) -> dict[str, Any]:
    """Fill held shards with ``steps`` steps of every rank, release them at once, time the drain."""
    if batch_steps and steps % batch_steps:
        raise ValueError(f"--drain-steps {steps} is not a multiple of --batch-steps {batch_steps}")
    records = _fleet(workers, dp)
    shard_ids = [f"s{i}" for i in range(shards)]
    parts = partition(records, shard_ids)
    samples = {sid: sum(records[w].dp_size for w in parts[sid]) * steps for sid in shard_ids}
    rounds = steps // (batch_steps or 1)
    expected_msgs = {
        sid: rounds * (len(parts[sid]) if batch_steps else sum(records[w].dp_size for w in parts[sid]))
        for sid in shard_ids
    }
    spawn = mp.get_context("spawn")
    release = spawn.Event()
    shard_pipes: list[Connection] = []
    procs: list[BaseProcess] = []
    with (
        nats_server(shard_ids, DRAIN_SERVER_CONFIG, monitor=True) as (server, url, http_port),
        _terminated_at_exit(procs),
    ):
        assert http_port is not None
        for sid in shard_ids:
            parent, child = spawn.Pipe()
            args = (url, sid, shard_ids, workers, dp, samples[sid], release, child)
            proc = spawn.Process(target=_drain_shard, args=args, daemon=True)
            proc.start()
            shard_pipes.append(parent)
            procs.append(proc)
        for pipe in shard_pipes:
            if (msg := pipe.recv()) != "ready":
                raise RuntimeError(f"a shard failed to start: {msg}")
        pub_pipes, pub_procs = start_publishers(
            url, records, publisher_procs, batch_steps, rounds=rounds, flush_every=flush_every
        )
        procs += pub_procs
        for pipe in pub_pipes:
            if pipe.recv() != "ready":
                raise RuntimeError("a publisher failed to start")
        fill_start = time.monotonic()
        for pipe in pub_pipes:
            pipe.send("go")
        pubs = [pipe.recv() for pipe in pub_pipes]
        for pub in pub_procs:
            pub.join(10)
        held = _wait_filled(http_port, expected_msgs, fill_timeout_s)
        fill_s = time.monotonic() - fill_start
        load_at_release = os.getloadavg()[0]
        server_cpu0 = proc_cpu_s(server.pid)
        released = time.monotonic()
        release.set()
        figures = [pipe.recv() for pipe in shard_pipes]
        server_cpu = proc_cpu_s(server.pid) - server_cpu0
        for each in procs:
            each.join(10)
    errors = [f["error"] for f in figures if "error" in f]
    if errors:
        raise RuntimeError("; ".join(errors))
    sent = sum(p["sent"] for p in pubs)
    total = sum(f["stored"] for f in figures)
    drain = {f["shard"]: f["done_at"] - released for f in figures}
    slowest_s = max(drain.values())
    rate = total / slowest_s if slowest_s > 0 else 0.0
    # Balance: the ratio S shards can show is capped by the largest partition (the slowest shard has the most to do).
    max_share = max(samples.values()) / sum(samples.values())
    per_rate = {f["shard"]: f["stored"] / drain[f["shard"]] for f in figures if drain[f["shard"]] > 0}
    even = sum(samples.values()) / shards
    if_even = sum(samples.values()) / max(even / r for r in per_rate.values()) if per_rate else None
    return {
        "bench": "shard-nats-drain",
        "measures": "the shards' ingest capacity with the cores to themselves (publishers done and the server's "
        "routing finished before the timed part); not a live rate",
        "workers": workers,
        "dp": dp,
        "shards": shards,
        "steps_per_rank": steps,
        "batch_steps": batch_steps,
        "payloads_per_message": steps * workers * dp // max(sum(p["messages"] for p in pubs), 1),
        "publisher_procs": len(pubs),
        "sent": sent,
        "messages": sum(p["messages"] for p in pubs),
        "stored": total,
        "lost": sent - total,
        "fill_s": round(fill_s, 3),
        "samples_per_s": round(rate),  # all samples / the slowest shard's drain seconds
        "slowest_drain_s": round(slowest_s, 4),
        # an estimate for a shared machine: all samples / the largest shard CPU time, i.e. each shard at its own
        # measured CPU per sample with a core to itself (cpu_share 1); the wall-clock figure above is the measurement
        "samples_per_s_at_full_cores": round(total / max(f["cpu_s"] for f in figures)) if total else None,
        "balance": {
            "samples_per_shard": [samples[sid] for sid in shard_ids],
            "largest_share": round(max_share, 4),
            # the ratio S shards lose to the uneven partition: slowest shard's work / an even share
            "cost": round(max_share * shards, 4),
            "samples_per_s_if_even": round(if_even) if if_even else None,  # each shard at its own rate
        },
        "per_shard": [
            {
                "shard": f["shard"],
                "workers": f["workers"],
                "expected": f["expected"],
                "stored": f["stored"],
                "gaps": f["gaps"],
                "drops": f["drops"],
                "drain_s": round(drain[f["shard"]], 4),
                "release_lag_ms": round((f["woke_at"] - released) * 1000, 2),
                "cpu_s": round(f["cpu_s"], 4),
                # < 1: the shard did not have a core to itself for the whole drain (a shared machine)
                "cpu_share": round(f["cpu_s"] / drain[f["shard"]], 3) if drain[f["shard"]] > 0 else None,
                "runqueue_wait_s": round(f["runqueue_wait_s"], 4),  # its NATS loop thread runnable, waiting for a CPU
                "gc_s": round(f["gc_s"], 4),  # in Python's cyclic garbage collector (part of cpu_s)
                "received_while_held": f["received_while_held"],
                "samples_per_s": round(f["stored"] / drain[f["shard"]]) if drain[f["shard"]] > 0 else None,
                "samples_per_cpu_s": round(f["stored"] / f["cpu_s"]) if f["cpu_s"] else None,
                "cpu_us_per_sample": round(f["cpu_s"] / f["stored"] * 1e6, 3) if f["stored"] else None,
                "held_by_server_bytes": held.get(f["shard"], {}).get("pending_bytes"),
                "slow_consumer_drops": f["slow_consumer_drops"],
                "reconnects": f["reconnects"],
            }
            for f in figures
        ],
        "nats_server_cpu_s_during_drain": round(server_cpu, 4),
        "publisher_cpu_us_per_sample": round(sum(p["cpu_s"] for p in pubs) / sent * 1e6, 3) if sent else None,
        "cores": len(os.sched_getaffinity(0)),
        "load_avg_1m_at_release": round(load_at_release, 2),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }

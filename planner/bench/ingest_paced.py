"""``fpm-planner bench ingest --endpoints N --hz M --seconds T``: the real subscriber at a paced, realistic rate.

N endpoints (PUB sockets on loopback) publish one FPM step each at M Hz for T seconds, spread evenly over each
period (an unsynchronized fleet, not bursts). ``--send-interval-s S`` emulates the shim's publisher sending in
bursts (:class:`~worker_shim.publisher.FpmPublisher`, ``send_interval_s``, the publisher's default unless given):
each endpoint sends the steps that fell due back to back once per S, the endpoints' bursts spread evenly over S.
They live in ``--publisher-procs`` child processes, each hosting many PUB sockets: on a small machine the
publishers and the subscriber share the cores, so the publishers' own CPU is reported (``publisher_cpu_share``)
and a run whose publishers could not keep the pace says so (``sent_samples_per_s`` below
``offered_samples_per_s``, ``publisher_max_lag_s``): a publisher behind schedule sends as fast as it can and stops
at the end of the T seconds whatever it got through.

This process runs the real :class:`~planner.ingest.subscriber.FpmSubscriber` receive thread into a
:class:`~planner.ingest.store.FleetStore` (one SUB socket per endpoint, as in the service), and on its main
thread a decision tick every ``--tick-interval-s``: snapshot under the subscriber's lock, then
:func:`planner.core.step` over every discovered worker (as the service's runner does). Figures:

- ``samples_per_s_held``: samples stored during the T paced seconds / T.
- ``lost``: samples sent that were not stored by the end of the drain (every sample stored, or 3 s without a
  message); ``gaps``/``lost_samples``: what the store saw as counter gaps (a PUB socket drops at its high-water
  mark when the subscriber falls behind; a loss at the very end of a run has no later sample to show it).
- ``ingest_thread_cpu_share``: the receive thread's CPU time / T (``/proc/self/task/<tid>/stat``), 1.0 = a core;
  ``ingest_cpu_us_per_sample``: that CPU time per sample stored (what a busy, shared machine inflates least;
  at 10 ms scheduler ticks, coarse for short or light runs).
- ``process_cpu_share`` and ``process_cpu_us_per_sample``: the same for the whole subscriber process, every
  thread (the receive thread, the ticks on the main thread, libzmq's I/O threads): the figure "one core" means.
  ``zmq_io_cpu_share``: libzmq's background threads alone.
- ``receive_rounds_per_s`` and ``samples_per_round``: how often the receive thread waited for readiness and
  drained (``--min-poll-interval-s`` bounds it), and what one round gathered. ``--readiness poller`` runs the
  subscriber on ``zmq.Poller`` as before issue 14, for a before/after on the same machine.
- ``idle_receive_cpu_share`` and ``idle_round_cpu_ms``: the receive thread's CPU over 2 s after the run, every
  endpoint connected and silent, and per round: the cost of waiting for readiness alone, which grows with the
  endpoints under ``zmq.Poller`` and not under epoll.
- ``rss_mb`` and ``rss_per_endpoint_kb``: the subscriber process's resident memory at the end, and its growth
  from before the endpoints were connected, per endpoint.
- ``tick_ms_p50/p99``: wall time of one tick (snapshot + step) while ingest runs (nearest rank; with few ticks the
  p99 is the maximum).
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import resource
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

import msgspec
import zmq

from planner.bench.percentile import p50_p99
from planner.core import CoreConfig, CoreState, DeploymentStatus, Observation, RoleConfig, Traffic, step
from planner.discovery import EngineCapacity, Role, WorkerRecord
from planner.ingest.native import ReceivePath
from planner.ingest.readiness import ReadinessKind
from planner.ingest.store import DropReason, FleetStore
from planner.ingest.subscriber import FpmSubscriber
from worker_shim import fpm
from worker_shim.fpm import ForwardPassMetrics, QueuedRequests, ScheduledRequests
from worker_shim.publisher import DEFAULT_SEND_INTERVAL_S

__all__ = [
    "PacedPublishers",
    "measure_paced",
    "process_cpu_s",
    "publisher_figures",
    "raise_fd_limit",
    "rss_mb",
    "start_publishers",
]

_SLICE = 64  # sockets sent to back to back; a period is split into ceil(n / _SLICE) evenly spaced slices
_CLK_TCK = os.sysconf("SC_CLK_TCK")
_IDLE_S = 2.0  # after the run: every endpoint connected, none publishing


_MARK = 0xFEDCBA9876543210  # a counter_id msgpack can only write as 0xcf + 8 bytes, and found once in a payload
_U64 = b"\xcf"


def _sample(worker_id: str, dp_rank: int, counter: int) -> ForwardPassMetrics:
    return ForwardPassMetrics(
        worker_id=worker_id,
        dp_rank=dp_rank,
        counter_id=counter,
        wall_time=0.02,
        scheduled_requests=ScheduledRequests(
            num_prefill_requests=1,
            sum_prefill_tokens=512,
            sum_prefill_kv_tokens=128,
            num_decode_requests=32 + dp_rank % 16,
            sum_decode_kv_tokens=40_000,
            var_decode_kv_tokens=900.0,
        ),
        queued_requests=QueuedRequests(num_prefill_requests=dp_rank % 4, sum_prefill_tokens=500 * (dp_rank % 4)),
    )


def patchable(sample: ForwardPassMetrics) -> tuple[bytes, bytes]:
    """``sample`` encoded once around its counter: ``head + counter.to_bytes(8, "big") + tail`` is the same FPM v1
    payload with that ``counter_id`` (msgpack's uint 64, ``0xcf`` + 8 bytes big-endian, is valid for any value), so
    a publisher patches the counter instead of building and encoding a sample per message."""
    payload = fpm.encode(msgspec.structs.replace(sample, counter_id=_MARK))
    marker = _U64 + _MARK.to_bytes(8, "big")
    at = payload.find(marker)
    if at < 0 or payload.find(marker, at + 1) >= 0:
        raise ValueError("the counter marker is not found exactly once in the encoded sample")
    return payload[: at + 1], payload[at + len(marker) :]


def burst_sizes(hz: float, seconds: float, send_interval_s: float) -> tuple[float, list[int]]:
    """The burst period and how many steps each endpoint sends back to back per burst, as
    :class:`~worker_shim.publisher.FpmPublisher` with ``send_interval_s`` does: every ``max(send_interval_s, 1/hz)``
    seconds, the steps that fell due since the last burst (``round(seconds * hz)`` in all)."""
    total = max(1, round(seconds * hz))
    burst_s = max(send_interval_s, 1.0 / hz)
    bursts = max(1, round(seconds / burst_s))
    due = [min(total, math.floor((r + 1) * burst_s * hz + 1e-9)) for r in range(bursts - 1)] + [total]
    return burst_s, [b - a for a, b in zip([0, *due], due, strict=False)]


def _publish_paced(
    keys: list[tuple[str, int]], hz: float, seconds: float, send_interval_s: float, conn: Connection
) -> None:
    """Child process: one PUB socket per ``(worker_id, dp_rank)``; heartbeats until "go", then one step per
    socket per period for ``seconds`` (with ``send_interval_s`` > 1/hz, each socket's due steps back to back once
    per ``send_interval_s``: :func:`burst_sizes`); reports what it sent, its CPU time and how far it fell behind.

    Each socket's step and heartbeat payloads are encoded once (:func:`patchable`); a message costs three
    ``send`` calls and one concatenation (``send_multipart`` and an encode per message cost ~5x that, and made
    the publishers, not the subscriber, the bottleneck at 4,096 endpoints x 50 Hz). Every message is a valid FPM
    v1 message whose seq frame and ``counter_id`` increase by one per message on its socket."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    ctx.set(zmq.MAX_SOCKETS, ctx.get(zmq.SOCKET_LIMIT))
    socks = []
    for _ in keys:
        sock = ctx.socket(zmq.PUB)
        sock.setsockopt(zmq.SNDHWM, 1000)
        sock.bind("tcp://127.0.0.1:*")
        socks.append(sock)
    conn.send([s.getsockopt_string(zmq.LAST_ENDPOINT) for s in socks])
    steps = [patchable(_sample(wid, rank, 0)) for wid, rank in keys]
    beats = [patchable(fpm.heartbeat(wid, rank, 0)) for wid, rank in keys]
    sends = [sock.send for sock in socks]
    more = zmq.SNDMORE
    counter = 0
    while not conn.poll(0.1):  # heartbeats until the subscriber has heard every socket
        counter += 1
        seq = counter.to_bytes(8, "big")
        for send, (head, tail) in zip(sends, beats, strict=True):
            send(b"", more)
            send(seq, more)
            send(head + seq + tail)
    conn.recv()
    cpu0 = time.process_time()
    period_s, sizes = burst_sizes(hz, seconds, send_interval_s)
    slices = [
        list(zip(sends[i : i + _SLICE], steps[i : i + _SLICE], strict=True)) for i in range(0, len(socks), _SLICE)
    ]
    slice_s = period_s / len(slices)
    sent = 0
    max_lag_s = 0.0
    start = time.monotonic()
    rounds = len(sizes)
    end = start + rounds * period_s
    for r, size in enumerate(sizes):  # a publisher that cannot keep the pace stops at the end all the same
        seqs = [(counter + k).to_bytes(8, "big") for k in range(1, size + 1)]
        counter += size
        for j, members in enumerate(slices):
            now = time.monotonic()
            if now >= end:
                break
            lag = now - (start + r * period_s + j * slice_s)
            if lag < 0:
                time.sleep(-lag)
            elif lag > max_lag_s:
                max_lag_s = lag
            for send, (head, tail) in members:
                for seq in seqs:
                    send(b"", more)
                    send(seq, more)
                    send(head + seq + tail)
            sent += len(members) * size
    elapsed = max(time.monotonic() - start, rounds * period_s)  # the last period counts in full
    conn.send({"sent": sent, "elapsed_s": elapsed, "cpu_s": time.process_time() - cpu0, "max_lag_s": max_lag_s})
    conn.recv()
    for sock in socks:
        sock.close(linger=0)
    ctx.term()


@dataclass
class PacedPublishers:
    """The paced publisher child processes (:func:`start_publishers`): ``endpoints`` maps each ``(worker_id,
    dp_rank)`` to the endpoint its PUB socket bound; they heartbeat until :meth:`go`, then publish paced."""

    parts: list[list[tuple[str, int]]]
    pipes: list[Connection]
    children: list[BaseProcess]
    endpoints: dict[tuple[str, int], str]

    def go(self) -> None:
        for pipe in self.pipes:
            pipe.send("go")

    def reports(self) -> list[dict[str, float]]:
        """Blocks until every child finished its paced seconds: what each sent, its elapsed and CPU seconds."""
        return [pipe.recv() for pipe in self.pipes]

    def close(self) -> None:
        for pipe in self.pipes:
            pipe.send("bye")
        for proc in self.children:
            proc.join(10)


def start_publishers(
    keys: list[tuple[str, int]], hz: float, seconds: float, send_interval_s: float, publisher_procs: int
) -> PacedPublishers:
    """Spawn ``publisher_procs`` children sharing ``keys`` (one PUB socket per key, :func:`_publish_paced`)."""
    procs = min(publisher_procs, len(keys))
    share = math.ceil(len(keys) / procs)
    parts = [keys[i : i + share] for i in range(0, len(keys), share)]
    spawn = mp.get_context("spawn")
    pipes = []
    children: list[BaseProcess] = []
    for part in parts:
        parent, child = spawn.Pipe()
        proc = spawn.Process(target=_publish_paced, args=(part, hz, seconds, send_interval_s, child), daemon=True)
        proc.start()
        pipes.append(parent)
        children.append(proc)
    bound: dict[tuple[str, int], str] = {}
    for part, pipe in zip(parts, pipes, strict=True):
        bound.update(zip(part, pipe.recv(), strict=True))
    return PacedPublishers(parts=parts, pipes=pipes, children=children, endpoints=bound)


def publisher_figures(reports: list[dict[str, float]], endpoints: int, hz: float) -> dict[str, Any]:
    """What the publishers offered and got through (``sent_samples_per_s`` below ``offered_samples_per_s``: they
    could not keep the pace), their worst lag behind schedule and their CPU share."""
    sent = sum(int(r["sent"]) for r in reports)
    elapsed = max(r["elapsed_s"] for r in reports)
    return {
        "offered_samples_per_s": round(endpoints * hz),
        "sent": sent,
        "sent_samples_per_s": round(sent / elapsed) if elapsed > 0 else None,
        "publisher_max_lag_s": round(max(r["max_lag_s"] for r in reports), 3),
        "publisher_cpu_share": round(sum(r["cpu_s"] for r in reports) / elapsed, 3) if elapsed else None,
    }


def _stat_cpu_s(path: str) -> float:
    with open(path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime, stime (fields 14 and 15 of stat)


def _thread_cpu_s(native_id: int) -> float:
    return _stat_cpu_s(f"/proc/self/task/{native_id}/stat")


def process_cpu_s() -> float:
    """Every thread of this process (the receive thread, the ticks, libzmq's I/O threads)."""
    return _stat_cpu_s("/proc/self/stat")


def _zmq_io_cpu_s() -> float:
    """libzmq's background threads of this process (named ``ZMQbg/...``: the I/O threads and the reaper)."""
    total = 0.0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().startswith("ZMQbg"):
                    total += _thread_cpu_s(int(tid))
        except OSError:  # a thread that ended meanwhile
            continue
    return total


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _fleet(endpoints: int, dp: int) -> dict[str, WorkerRecord]:
    """``endpoints / dp`` aggregated workers of ``dp`` ranks, endpoints filled in later."""
    capacity = EngineCapacity(max_num_batched_tokens=8192, max_num_seqs=256, kv_capacity_tokens=500_000)
    return {
        f"w{i}": WorkerRecord(
            worker_id=f"w{i}",
            role=Role.AGG,
            service="agg",
            dp_size=dp,
            fpm_endpoints=tuple(f"tcp://placeholder-{i}:{r}" for r in range(dp)),
            capacity=capacity,
        )
        for i in range(endpoints // dp)
    }


def measure_paced(
    endpoints: int,
    hz: float,
    seconds: float,
    *,
    dp: int = 8,
    publisher_procs: int = 2,
    window: int = 256,
    tick_interval_s: float = 0.5,
    receive_path: ReceivePath = "auto",
    min_poll_interval_s: float = 0.1,
    readiness: ReadinessKind = "auto",
    send_interval_s: float = DEFAULT_SEND_INTERVAL_S,
) -> dict[str, Any]:
    """Run the paced publishers in child processes and the real subscriber + ticks here; returns the figures."""
    if endpoints < 1 or dp < 1 or endpoints % dp or hz <= 0 or seconds <= 0 or publisher_procs < 1:
        raise ValueError("need endpoints a positive multiple of dp, hz > 0, seconds > 0, publisher_procs >= 1")
    if not 0 <= send_interval_s < seconds:
        raise ValueError(f"need 0 <= send_interval_s < seconds, got {send_interval_s}")
    raise_fd_limit()
    template = _fleet(endpoints, dp)
    keys = [(wid, rank) for wid, record in template.items() for rank in range(record.dp_size)]
    publishers = start_publishers(keys, hz, seconds, send_interval_s, publisher_procs)
    bound = publishers.endpoints
    workers = {
        wid: WorkerRecord(
            worker_id=wid,
            role=record.role,
            service=record.service,
            dp_size=record.dp_size,
            fpm_endpoints=tuple(bound[(wid, r)] for r in range(record.dp_size)),
            capacity=record.capacity,
        )
        for wid, record in template.items()
    }
    rss_before = rss_mb()
    store = FleetStore(ttl_s=10.0, window_size=window)
    sub = FpmSubscriber(store, receive_path=receive_path, min_poll_interval_s=min_poll_interval_s, readiness=readiness)
    sub.set_workers(workers)
    sub.start()
    deadline = time.monotonic() + 120
    while True:
        snap = sub.snapshot(time.monotonic())
        if int(snap.totals.fresh.sum()) == len(keys):
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {int(snap.totals.fresh.sum())} of {len(keys)} endpoints heard within 120 s")
        time.sleep(0.2)
    del snap
    time.sleep(0.3)  # the last warm-up heartbeats

    def stored_now() -> int:
        with sub.lock:
            return sum(store.rank_view(wid, rank, 0.0).samples for wid, rank in keys)

    stored0 = stored_now()
    # The receive thread, by the name the subscriber gives it.
    native_id = next((t.native_id for t in threading.enumerate() if t.name == "fpm-subscriber"), None)
    if native_id is None:
        raise RuntimeError("the subscriber thread did not start")
    cpu0, proc0, io0 = _thread_cpu_s(native_id), process_cpu_s(), _zmq_io_cpu_s()
    rounds0 = sub.rounds
    config = CoreConfig(roles={Role.AGG: RoleConfig(min_replicas=1, max_replicas=2 * len(workers))})
    deployments = {"agg": DeploymentStatus(service="agg", desired=len(workers), ready=len(workers))}
    traffic = {Role.AGG: Traffic(request_rate_per_s=400.0, isl_tokens=3000, osl_tokens=300)}
    state = CoreState()
    tick_ms: list[float] = []
    publishers.go()
    start = time.monotonic()
    next_tick = start + tick_interval_s
    while True:
        now = time.monotonic()
        if now >= start + seconds:
            break
        if now < next_tick:
            time.sleep(min(next_tick, start + seconds) - now)
            continue
        next_tick += tick_interval_s
        t0 = time.perf_counter()
        snapshot = sub.snapshot(time.monotonic())
        observation = Observation(workers=workers, fleet=snapshot, deployments=deployments, traffic=traffic)
        state, _ = step(state, observation, time.monotonic(), config)
        tick_ms.append((time.perf_counter() - t0) * 1000)
        del snapshot, observation
    held_span = time.monotonic() - start
    stored_in_span = stored_now() - stored0
    cpu_in_span = _thread_cpu_s(native_id) - cpu0
    proc_in_span = process_cpu_s() - proc0
    io_in_span = _zmq_io_cpu_s() - io0
    rounds_in_span = sub.rounds - rounds0
    reports = publishers.reports()
    # Drain what is still queued (until every sample is stored, or nothing arrived for 3 s over two whole receive
    # rounds: a starved subscriber's round can outlast 3 s, and it counts what it received at the round's end), then
    # account; 120 s at most.
    sent = sum(int(r["sent"]) for r in reports)
    last, quiet_since, quiet_rounds, drain_end = -1, time.monotonic(), sub.rounds, time.monotonic() + 120
    while stored_now() - stored0 < sent and time.monotonic() < drain_end:
        if time.monotonic() - quiet_since >= 3.0 and sub.rounds - quiet_rounds >= 2:
            break
        time.sleep(0.2)
        got = sub.received
        if got != last:
            last, quiet_since, quiet_rounds = got, time.monotonic(), sub.rounds
    stored = stored_now() - stored0
    # Every endpoint connected and silent now (the publishers wait for "bye"): what waiting costs per round.
    idle_cpu0, idle_rounds0, idle_start = _thread_cpu_s(native_id), sub.rounds, time.monotonic()
    time.sleep(_IDLE_S)
    idle_cpu = _thread_cpu_s(native_id) - idle_cpu0
    idle_rounds = sub.rounds - idle_rounds0
    idle_span = time.monotonic() - idle_start
    rss = rss_mb()
    with sub.lock:
        views = [store.rank_view(wid, rank, 0.0) for wid, rank in keys]
        drops = {str(r): n for r, n in store.drops.items() if n and r is not DropReason.STALE}
    publishers.close()
    sub.close()
    return {
        "bench": "ingest",
        "mode": "paced",
        "endpoints": endpoints,
        "workers": len(workers),
        "dp": dp,
        "hz": hz,
        "seconds": seconds,
        "publisher_procs": len(publishers.parts),
        "receive_path": sub.receive_path,
        "send_interval_s": send_interval_s,
        **publisher_figures(reports, endpoints, hz),
        "samples_per_s_held": round(stored_in_span / held_span),
        "stored": stored,
        "lost": sent - stored,
        "gaps": sum(v.gaps for v in views),
        "lost_samples": sum(v.lost_samples for v in views),
        "drops_by_reason": drops,
        "ingest_thread_cpu_share": round(cpu_in_span / held_span, 3),
        "ingest_cpu_us_per_sample": round(cpu_in_span * 1e6 / stored_in_span, 2) if stored_in_span else None,
        "process_cpu_share": round(proc_in_span / held_span, 3),
        "process_cpu_us_per_sample": round(proc_in_span * 1e6 / stored_in_span, 2) if stored_in_span else None,
        "zmq_io_cpu_share": round(io_in_span / held_span, 3),
        "readiness": readiness,
        "min_poll_interval_s": min_poll_interval_s,
        "receive_rounds_per_s": round(rounds_in_span / held_span, 1),
        "samples_per_round": round(stored_in_span / rounds_in_span, 1) if rounds_in_span else None,
        "idle_receive_cpu_share": round(idle_cpu / idle_span, 3),
        "idle_round_cpu_ms": round(idle_cpu * 1000 / idle_rounds, 3) if idle_rounds else None,
        "rss_mb": round(rss, 1),
        "rss_per_endpoint_kb": round((rss - rss_before) * 1024 / endpoints, 1),
        "ticks": len(tick_ms),
        **(p50_p99("tick_ms", tick_ms, 2) if tick_ms else {}),
        "loop_errors": sub.loop_errors,
        "cores": len(os.sched_getaffinity(0)),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "python": sys.version.split()[0],
    }

"""An ingest shard and the leader's summary listener, both on NATS.

:class:`IngestShard` owns the workers that rendezvous hashing gives it (:mod:`planner.shard.partition`) among
the current shard ids, subscribes to exactly their subjects (one ``fpm.<ns>.*.<worker>.*`` wildcard per owned
worker: the shard's partition is a list of per-worker wildcards, so it agrees with the leader's hash by
construction and a rebalance is a few subscribe/unsubscribe calls), feeds its own FleetStore through a
:class:`~planner.transport.nats_source.NatsFpmSource`, and publishes a
:class:`~planner.shard.summary.ShardSummary` on ``fpm-shard.<ns>.<shard_id>`` when asked (every tick).

:class:`SummaryListener` is the leader's side: it subscribes to ``fpm-shard.<ns>.*`` and hands every decoded
summary to a :class:`~planner.shard.merge.SummaryMerger` (under its lock); a payload that is not a summary is
counted and logged, never merged.

Alternatives considered: NATS subject-mapping partitions (``partition(n, wildcard)`` in the server config) need
the server's configuration changed, and every shard resubscribed, whenever the number of shards changes, and
hash the subject with the server's own function, which the leader would then have to mirror; queue groups
balance messages, not workers, so one worker's ranks would land on several shards.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg

from planner.discovery import WorkerRecord
from planner.ingest.store import FleetStore
from planner.shard.merge import SummaryMerger
from planner.shard.partition import partition
from planner.shard.summary import ShardSummary, decode_summary, encode_summary, summarize
from planner.transport.nats_source import NatsFpmSource
from planner.transport.subjects import escape, worker_wildcard
from worker_shim.loop_thread import LoopThread

__all__ = ["IngestShard", "SummaryListener", "summary_subject", "summary_wildcard"]

log = logging.getLogger(__name__)


def summary_subject(namespace: str, shard_id: str) -> str:
    return f"fpm-shard.{escape(namespace)}.{escape(shard_id)}"


def summary_wildcard(namespace: str) -> str:
    return f"fpm-shard.{escape(namespace)}.*"


class IngestShard:
    """One shard: its partition of the workers, its own store fed from NATS, its summaries."""

    def __init__(
        self,
        shard_id: str,
        *,
        servers: Sequence[str],
        namespace: str,
        user: str | None = None,
        password: str | None = None,
        ttl_s: float = 10.0,
        window_size: int = 256,
        wall_clock: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.shard_id = shard_id
        self.namespace = namespace
        self.store = FleetStore(ttl_s=ttl_s, window_size=window_size)
        self.source = NatsFpmSource(
            self.store, servers=servers, namespace=namespace, user=user, password=password, subjects=(), clock=clock
        )
        self.wall_clock = wall_clock
        self.clock = clock
        self.owned: tuple[str, ...] = ()
        self._seq = 0

    def set_membership(self, workers: Mapping[str, WorkerRecord], shard_ids: Sequence[str]) -> None:
        """Follow discovery and the shard set: own this shard's partition, subscribe to exactly its subjects."""
        if self.shard_id not in shard_ids:
            raise ValueError(f"shard {self.shard_id!r} is not among the shards {list(shard_ids)}")
        owned = partition(workers, shard_ids)[self.shard_id]
        self.owned = tuple(owned)
        self.source.set_workers({wid: workers[wid] for wid in owned})
        self.source.set_subjects([worker_wildcard(self.namespace, wid) for wid in owned])

    def summary(self) -> ShardSummary:
        """This shard's state now."""
        self._seq += 1
        snapshot = self.source.snapshot(self.clock())
        return summarize(self.shard_id, self._seq, snapshot, self.wall_clock(), self.source.received)

    def publish_summary(self) -> ShardSummary | None:
        """Take a summary and publish it; None when NATS is not connected (the leader sees the summary age)."""
        summary = self.summary()
        if self.source.publish(summary_subject(self.namespace, self.shard_id), encode_summary(summary)):
            return summary
        return None

    def start(self) -> IngestShard:
        self.source.start()
        return self

    def close(self) -> None:
        self.source.close()

    def __enter__(self) -> IngestShard:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class SummaryListener:
    """The leader's subscription to every shard's summaries, merged by a :class:`SummaryMerger`."""

    def __init__(
        self,
        merger: SummaryMerger,
        *,
        servers: Sequence[str],
        namespace: str,
        user: str | None = None,
        password: str | None = None,
    ) -> None:
        self.merger = merger
        self.lock = threading.Lock()
        self.received = 0
        self.bad_summaries = 0
        self._servers = list(servers)
        self._subject = summary_wildcard(namespace)
        self._user = user
        self._password = password
        self._thread = LoopThread(self._main, name="fpm-shard-summaries")
        self._ready = threading.Event()

    async def _on_msg(self, msg: Msg) -> None:
        try:
            summary = decode_summary(msg.data)
        except ValueError as exc:
            self.bad_summaries += 1
            log.warning("dropped a message on %s: %s", msg.subject, exc)
            return
        with self.lock:
            self.received += 1
            self.merger.update(summary)

    async def _main(self, stopping: asyncio.Event) -> None:
        nc: Client | None = None
        while nc is None and not stopping.is_set():
            try:
                nc = await nats.connect(
                    servers=self._servers,
                    user=self._user,
                    password=self._password,
                    name="fpm-planner-leader",
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=0.25,
                    connect_timeout=2,
                )
            except Exception as exc:
                log.warning("cannot connect to NATS %s: %s", self._servers, exc)
                await asyncio.sleep(0.25)
        if nc is None:
            return
        try:
            await nc.subscribe(self._subject, cb=self._on_msg)
            await nc.flush()
            self._ready.set()
            await stopping.wait()
        finally:
            await nc.close()

    def start(self) -> SummaryListener:
        self._thread.start()
        return self

    def wait_ready(self, timeout_s: float) -> bool:
        return self._ready.wait(timeout_s)

    def close(self) -> None:
        self._thread.close()

    def __enter__(self) -> SummaryListener:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

"""An ingest shard and the leader's summary listener, both on NATS.

:class:`IngestShard` owns the workers that rendezvous hashing gives it (:mod:`planner.shard.partition`) among
the current shard ids, subscribes to exactly their subjects (one ``fpm.<ns>.*.<worker>.*`` wildcard per owned
worker: the shard's partition is a list of per-worker wildcards, so it agrees with the leader's hash by
construction and a rebalance is a few subscribe/unsubscribe calls), feeds its own FleetStore through a
:class:`~planner.transport.nats_source.NatsFpmSource` (the FPM traffic extension of its samples counted per service
by a :class:`~planner.shard.traffic.CumulativeTraffic`), and publishes a
:class:`~planner.shard.summary.ShardSummary` on ``fpm-shard.<ns>.<shard_id>`` when asked (every tick).

:class:`SummaryListener` is the leader's side: it subscribes to ``fpm-shard.<ns>.*`` and hands every decoded
summary to a :class:`~planner.shard.merge.SummaryMerger` (under its lock); a payload that is not a summary is
counted and logged, never merged. The leader publishes its membership (the discovered workers and the live shard
set, :mod:`planner.shard.membership`) on the same connection; a shard's :class:`MembershipFollower` assembles
it, and :meth:`IngestShard.follow` applies it.

Alternatives considered: NATS subject-mapping partitions (``partition(n, wildcard)`` in the server config) need
the server's configuration changed, and every shard resubscribed, whenever the number of shards changes, and
hash the subject with the server's own function, which the leader would then have to mirror; queue groups
balance messages, not workers, so one worker's ranks would land on several shards.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Generic, Self, TypeVar

from nats.aio.client import Client
from nats.aio.msg import Msg

from planner.discovery import WorkerRecord
from planner.ingest.store import FleetStore
from planner.shard.membership import Membership, MembershipAssembler, decode_membership, membership_subject
from planner.shard.merge import SummaryMerger
from planner.shard.partition import partition
from planner.shard.summary import ShardSummary, decode_summary, encode_summary, summarize
from planner.shard.traffic import CumulativeTraffic
from planner.transport.nats_connect import connect_retrying
from planner.transport.nats_source import NatsFpmSource
from planner.transport.subjects import escape, worker_wildcard
from worker_shim.loop_thread import LoopThread

__all__ = ["IngestShard", "MembershipFollower", "SummaryListener", "summary_subject", "summary_wildcard"]

log = logging.getLogger(__name__)

T = TypeVar("T")


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
        # the FPM traffic extension of every stored step sample, counted per service for the summaries
        self.traffic = CumulativeTraffic()
        self.store.traffic = self.traffic
        self.source = NatsFpmSource(
            self.store, servers=servers, namespace=namespace, user=user, password=password, subjects=(), clock=clock
        )
        self.wall_clock = wall_clock
        self.clock = clock
        self.owned: tuple[str, ...] = ()
        self._seq = 0
        self.run_started_at = wall_clock()  # this run's traffic counters start here (the leader differences them)

    def set_membership(self, workers: Mapping[str, WorkerRecord], shard_ids: Sequence[str]) -> None:
        """Follow discovery and the shard set: own this shard's partition, subscribe to exactly its subjects."""
        if self.shard_id not in shard_ids:
            raise ValueError(f"shard {self.shard_id!r} is not among the shards {list(shard_ids)}")
        owned = partition(workers, shard_ids)[self.shard_id]
        self.owned = tuple(owned)
        self.source.set_workers({wid: workers[wid] for wid in owned})
        self.source.set_subjects([worker_wildcard(self.namespace, wid) for wid in owned])

    def follow(self, workers: Mapping[str, WorkerRecord], shard_ids: Sequence[str]) -> None:
        """Follow the leader's membership: this shard's partition when it is in the live shard set, else
        nothing (it is not live yet: its next summary, empty, makes it so, and the next membership counts it)."""
        if self.shard_id in shard_ids:
            self.set_membership(workers, shard_ids)
        else:
            self.set_membership({}, [self.shard_id])

    def summary(self) -> ShardSummary:
        """This shard's state now."""
        self._seq += 1
        snapshot = self.source.snapshot(self.clock())
        return summarize(
            self.shard_id,
            self._seq,
            snapshot,
            self.wall_clock(),
            self.source.received,
            traffic=self.traffic,
            run_started_at=self.run_started_at,
        )

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


class _NatsListener:
    """One NATS connection on a thread of its own, subscribed to one subject (``on_msg`` for each message), that
    can also publish. Reconnects forever; counts connects, disconnects and errors of its loop."""

    def __init__(
        self,
        subject: str,
        *,
        servers: Sequence[str],
        user: str | None,
        password: str | None,
        name: str,
    ) -> None:
        self.lock = threading.Lock()
        self.servers = list(servers)
        self.received = 0
        self.loop_errors = 0
        self.connects = 0
        self.disconnects = 0
        self.publish_errors = 0
        self._subject = subject
        self._user = user
        self._password = password
        self._name = name
        self._nc: Client | None = None
        self._thread = LoopThread(self._main, name=name, on_error=self._loop_error)
        self._ready = threading.Event()

    @property
    def reconnects(self) -> int:
        return max(0, self.connects - 1)

    @property
    def connected(self) -> bool:
        return self._ready.is_set()

    def _loop_error(self, exc: BaseException) -> None:
        self.loop_errors += 1

    async def _on_msg(self, msg: Msg) -> None:
        raise NotImplementedError

    async def _on_disconnect(self) -> None:
        self.disconnects += 1
        self._ready.clear()

    async def _on_reconnect(self) -> None:
        self.connects += 1
        self._ready.set()

    async def _main(self, stopping: asyncio.Event) -> None:
        nc = await connect_retrying(
            stopping,
            servers=self.servers,
            user=self._user,
            password=self._password,
            name=self._name,
            disconnected_cb=self._on_disconnect,
            reconnected_cb=self._on_reconnect,
        )
        if nc is None:
            return
        try:
            await nc.subscribe(self._subject, cb=self._on_msg)
            await nc.flush()
            self._nc = nc
            self.connects += 1
            self._ready.set()
            await stopping.wait()
        finally:
            self._ready.clear()
            self._nc = None
            await nc.close()

    def publish(self, subject: str, payload: bytes) -> bool:
        """Queue ``payload`` on ``subject`` without waiting (from any thread but the listener's own); False when
        not connected. A publish that fails later is counted (``publish_errors``)."""
        loop, nc = self._thread.loop, self._nc
        if loop is None or nc is None or not nc.is_connected or loop.is_closed():
            return False
        future = asyncio.run_coroutine_threadsafe(nc.publish(subject, payload), loop)
        future.add_done_callback(self._published)
        return True

    def _published(self, future: concurrent.futures.Future[None]) -> None:
        if not future.cancelled() and future.exception() is not None:
            self.publish_errors += 1

    def start(self) -> Self:
        self._thread.start()
        return self

    def wait_ready(self, timeout_s: float) -> bool:
        return self._ready.wait(timeout_s)

    def close(self) -> None:
        self._thread.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class _DecodingListener(_NatsListener, Generic[T]):
    """A listener whose every message is decoded by ``decode``: what it gives is counted (``received``) and handed
    to :meth:`_apply` under ``lock``; a message it refuses (ValueError) is counted (``bad_messages``) and logged,
    never applied."""

    def __init__(
        self,
        subject: str,
        decode: Callable[[bytes], T],
        *,
        servers: Sequence[str],
        user: str | None,
        password: str | None,
        name: str,
    ) -> None:
        super().__init__(subject, servers=servers, user=user, password=password, name=name)
        self.bad_messages = 0
        self._decode = decode

    async def _on_msg(self, msg: Msg) -> None:
        try:
            item = self._decode(msg.data)
        except ValueError as exc:
            self.bad_messages += 1
            log.warning("dropped a message on %s: %s", msg.subject, exc)
            return
        with self.lock:
            self.received += 1
            self._apply(item)

    def _apply(self, item: T) -> None:
        """Take one decoded message in (called under ``lock``)."""
        raise NotImplementedError


class SummaryListener(_DecodingListener[ShardSummary]):
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
        super().__init__(
            summary_wildcard(namespace),
            decode_summary,
            servers=servers,
            user=user,
            password=password,
            name="fpm-shard-summaries",
        )
        self.merger = merger

    @property
    def bad_summaries(self) -> int:
        """Messages on the summaries' subjects that were not a summary."""
        return self.bad_messages

    def _apply(self, item: ShardSummary) -> None:
        self.merger.update(item)


class MembershipFollower(_DecodingListener[Membership]):
    """A shard's subscription to the leader's membership: the newest complete one, and an event set when one
    arrives (a message that is not a membership part is counted and logged, never applied)."""

    def __init__(
        self,
        *,
        servers: Sequence[str],
        namespace: str,
        user: str | None = None,
        password: str | None = None,
    ) -> None:
        super().__init__(
            membership_subject(namespace),
            decode_membership,
            servers=servers,
            user=user,
            password=password,
            name="fpm-shard-membership",
        )
        self.assembler = MembershipAssembler()
        self.latest: tuple[dict[str, WorkerRecord], tuple[str, ...]] | None = None
        self.latest_at: float | None = None  # the leader's wall clock when it took the newest membership
        self.arrived = threading.Event()

    @property
    def bad_memberships(self) -> int:
        """Messages on the membership subject that were not a membership part."""
        return self.bad_messages

    def _apply(self, item: Membership) -> None:
        complete = self.assembler.add(item)
        if complete is not None:
            self.latest = complete
            self.latest_at = item.taken_at
            self.arrived.set()

    def take(self) -> tuple[dict[str, WorkerRecord], tuple[str, ...]] | None:
        """The newest complete membership not taken yet (None: nothing new)."""
        with self.lock:
            latest, self.latest = self.latest, None
            self.arrived.clear()
        return latest

"""NATS ingest source: FPM samples from NATS subjects into a :class:`~planner.ingest.store.FleetStore`, the same
way :class:`~planner.ingest.subscriber.FpmSubscriber` feeds it from ZMQ sockets.

A message on ``fpm.<ns>.<service>.<worker_id>.<dp_rank>`` (:mod:`planner.transport.subjects`) carries one FPM
payload, unchanged from the shim's ZMQ frame. The subject takes the place of the ZMQ endpoint: it is mapped to
the endpoint discovery lists for that worker and rank, and the sample is ingested as if it had arrived there. So
attribution and every drop reason are the store's own: a payload whose ``worker_id`` or ``dp_rank`` disagrees
with its subject is ``foreign_endpoint`` (or ``empty_worker_id``, which names the worker
``identity_not_synced``), a subject of no discovered worker is ``unknown_worker``, and so on. The subject's
worker id is trusted because the server enforced the publisher's credentials
(:mod:`planner.transport.nats_config`).

A message on ``fpm.<ns>.<service>.<worker_id>.b`` is the batched form (:mod:`planner.transport.batch`): several
of that worker's payloads, each with the DP rank it was read from; each is ingested exactly as the unbatched
message on that rank's subject would be (the same endpoint, the same drop reasons), all of one batch under one
acquisition of :attr:`lock`. A batch that cannot be read is one ``decode_error``; an unreadable entry in a
readable batch is one ``decode_error`` and the others are kept. Both forms may arrive on one source.

NATS core delivery is at most once: what is lost while a connection is down shows up as a counter gap
(``gaps``/``lost_samples`` of the rank), as a jump in ``counter_id`` always does. (The ZMQ path's disconnect
notice is not used: after a NATS reconnect the same publisher run carrying on is normal, not an oversized
message.)

One thread runs an asyncio loop with the NATS client; it reconnects forever. The first connection is tried until
it is made or the source is closed (:func:`~planner.transport.nats_connect.connect_retrying`), so a source closed
while NATS is down ends its thread. Readers share :attr:`lock` with the ingest, as with the ZMQ subscriber.
Nothing raises out of the receive path (``loop_errors``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import SlowConsumerError

from planner.discovery import WorkerRecord
from planner.ingest.store import DropReason, FleetSnapshot, FleetStore
from planner.ingest.subscriber import LinkStats, LinkTotals
from planner.transport.batch import BATCH_TOKEN, BatchDecodeError, batch_subject, decode_batch
from planner.transport.nats_connect import connect_retrying
from planner.transport.subjects import namespace_wildcard, subject
from worker_shim import fpm
from worker_shim.loop_thread import LoopThread

__all__ = ["NatsFpmSource"]

log = logging.getLogger(__name__)

_UNROUTED = "nats:"  # prefix of the pseudo endpoint of a subject no discovered rank publishes on
_BATCH_SUFFIX = "." + BATCH_TOKEN


class NatsFpmSource:
    """Subscribes to FPM subjects on NATS and feeds a :class:`FleetStore` (the ``transport: nats`` ingest)."""

    def __init__(
        self,
        store: FleetStore,
        *,
        servers: Sequence[str],
        namespace: str,
        user: str | None = None,
        password: str | None = None,
        subjects: Sequence[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        pending_msgs_limit: int = 500_000,
        reconnect_wait_s: float = 0.25,
    ) -> None:
        self.store = store
        self.servers = list(servers)
        self.namespace = namespace
        #: what this source subscribes to: the whole namespace, or one shard's partition
        self.subjects = tuple(subjects) if subjects is not None else (namespace_wildcard(namespace),)
        self.clock = clock
        self.lock = threading.Lock()
        self.received = 0  # payloads (samples), batched or not
        self.batches_received = 0  # NATS messages in the batched form
        self.loop_errors = 0
        self.connects = 0
        self.disconnects = 0
        self.slow_consumer_drops = 0
        self._user = user
        self._password = password
        self._pending_msgs_limit = pending_msgs_limit
        self._reconnect_wait_s = reconnect_wait_s
        self._route: dict[str, str] = {}  # subject -> the discovered endpoint of that worker and rank
        self._batch_route: dict[str, tuple[str, ...]] = {}  # batch subject -> the worker's endpoints by rank
        self._thread = LoopThread(self._main, name="fpm-nats", on_error=self._loop_error)
        self._subscribed = threading.Event()
        self._nc: Client | None = None
        self._subs: dict[str, Subscription] = {}

    # -- discovery -------------------------------------------------------------------------------------------

    def set_workers(self, workers: Mapping[str, WorkerRecord]) -> None:
        """Follow discovery: the store adopts the set, and each discovered rank's subject maps to its endpoint."""
        route = {
            subject(self.namespace, record.service, record.worker_id, rank): endpoint
            for record in workers.values()
            for rank, endpoint in enumerate(record.fpm_endpoints)
        }
        batch_route = {
            batch_subject(self.namespace, record.service, record.worker_id): tuple(record.fpm_endpoints)
            for record in workers.values()
        }
        with self.lock:
            self.store.set_workers(workers)
            self._route = route
            self._batch_route = batch_route

    def set_subjects(self, subjects: Sequence[str], timeout_s: float = 10.0) -> None:
        """Subscribe to ``subjects`` instead (a shard's partition after a rebalance): new ones are subscribed
        before departed ones are dropped. From any thread but the source's own; applied at connect when not
        running."""
        self.subjects = tuple(dict.fromkeys(subjects))
        loop = self._thread.loop
        if loop is not None and self._nc is not None and not loop.is_closed():
            asyncio.run_coroutine_threadsafe(self._sync_subscriptions(), loop).result(timeout_s)

    def publish(self, subj: str, payload: bytes, timeout_s: float = 10.0) -> bool:
        """Publish on this source's connection (a shard's summaries); False when not connected."""
        loop, nc = self._thread.loop, self._nc
        if loop is None or nc is None or not nc.is_connected or loop.is_closed():
            return False
        asyncio.run_coroutine_threadsafe(nc.publish(subj, payload), loop).result(timeout_s)
        return True

    async def _sync_subscriptions(self) -> None:
        nc = self._nc
        if nc is None:
            return
        wanted = self.subjects
        for subj in wanted:
            if subj not in self._subs:
                self._subs[subj] = await nc.subscribe(
                    subj, cb=self._on_msg, pending_msgs_limit=self._pending_msgs_limit
                )
        for subj in [s for s in self._subs if s not in set(wanted)]:
            await self._subs.pop(subj).unsubscribe()
        await nc.flush()

    @property
    def endpoints(self) -> tuple[str, ...]:
        """The subjects subscribed to (the NATS counterpart of the ZMQ subscriber's connected endpoints)."""
        return self.subjects if self._subscribed.is_set() else ()

    @property
    def connected(self) -> bool:
        return self._subscribed.is_set()

    def link_totals(self) -> LinkTotals:
        """The NATS connection's counters in the ZMQ subscriber's terms (one link: the connection to NATS)."""
        return LinkTotals(disconnects=self.disconnects, reconnects=max(0, self.connects - 1))

    def links(self) -> dict[str, LinkStats]:
        """The NATS connection as the one link (keyed by the server URLs), in the ZMQ subscriber's terms."""
        stats = LinkStats(
            endpoint=",".join(self.servers),
            connected=self.connected,
            connections=self.connects,
            disconnects=self.disconnects,
            reconnects=max(0, self.connects - 1),
            connect_retries=0,
            protocol_errors=0,
            socket_replacements=0,
            backoff_s=0.0,
        )
        return {stats.endpoint: stats}

    def troubled_links(self, limit: int = 50) -> list[LinkStats]:
        """The NATS connection, when it is down or ever dropped (the ZMQ subscriber lists endpoints)."""
        if limit < 1 or (self.connected and not self.disconnects):
            return []
        return list(self.links().values())

    # -- receive ---------------------------------------------------------------------------------------------

    def ingest_message(self, subj: str, payload: bytes, received_at: float) -> DropReason | None:
        """Ingest one NATS message as the store would one ZMQ message on the subject's endpoint."""
        endpoint = self._route.get(subj)
        with self.lock:
            self.received += 1
            if endpoint is None:
                endpoint = _UNROUTED + subj
            try:
                sample = fpm.decode(payload)
            except fpm.FpmDecodeError:
                return self.store.drop(DropReason.DECODE_ERROR, endpoint)
            return self.store.ingest(endpoint, sample, received_at, received_at)

    def ingest_batch(self, subj: str, frame: bytes, received_at: float) -> int:
        """Ingest one batched message (:mod:`planner.transport.batch`); returns how many samples were stored.

        Each payload is ingested as the unbatched message on its rank's subject would be; all under one lock."""
        endpoints = self._batch_route.get(subj, ())
        try:
            ranks, payloads, unreadable = decode_batch(frame)
        except BatchDecodeError:
            ranks, payloads, unreadable = [], [], 1
        decode, decode_error = fpm.decode, fpm.FpmDecodeError
        samples: list[fpm.ForwardPassMetrics | None] = []
        for payload in payloads:  # decoded before taking the lock: readers wait only for the ingest
            try:
                samples.append(decode(payload))
            except decode_error:
                samples.append(None)
        n_endpoints = len(endpoints)
        stored = 0
        store = self.store
        with self.lock:
            self.batches_received += 1
            self.received += len(payloads) + unreadable
            for rank, sample in zip(ranks, samples, strict=True):
                if rank < n_endpoints:
                    endpoint = endpoints[rank]
                else:  # as the unbatched message on that rank's subject: attributed to no one
                    endpoint = _UNROUTED + subj[: -len(BATCH_TOKEN)] + str(rank)
                if sample is None:
                    store.drop(DropReason.DECODE_ERROR, endpoint)
                elif store.ingest(endpoint, sample, received_at, received_at) is None:
                    stored += 1
            if unreadable:  # pinned on the subject's worker (any of its endpoints names it)
                where = endpoints[0] if endpoints else _UNROUTED + subj
                store.drop(DropReason.DECODE_ERROR, where, count=unreadable)
        return stored

    async def _on_msg(self, msg: Msg) -> None:
        try:
            subj = msg.subject
            if subj.endswith(_BATCH_SUFFIX):
                self.ingest_batch(subj, msg.data, self.clock())
            else:
                self.ingest_message(subj, msg.data, self.clock())
        except Exception:  # the receive path must survive anything one message does
            self.loop_errors += 1
            log.exception("FPM ingest from NATS failed")

    async def _on_error(self, exc: Exception) -> None:
        if isinstance(exc, SlowConsumerError):
            self.slow_consumer_drops += 1  # the message is gone; its rank's next counter shows the gap
        else:
            log.warning("NATS: %s", exc)

    async def _on_disconnect(self) -> None:
        self.disconnects += 1
        self._subscribed.clear()

    async def _on_reconnect(self) -> None:
        self.connects += 1
        self._subscribed.set()

    async def _main(self, stopping: asyncio.Event) -> None:
        nc = await connect_retrying(
            stopping,
            servers=self.servers,
            user=self._user,
            password=self._password,
            name="fpm-planner-ingest",
            retry_wait_s=self._reconnect_wait_s,
            error_cb=self._on_error,
            disconnected_cb=self._on_disconnect,
            reconnected_cb=self._on_reconnect,
        )
        if nc is None:
            return
        try:
            self._nc = nc
            await self._sync_subscriptions()
            self.connects += 1
            self._subscribed.set()
            await stopping.wait()
        finally:
            self._subscribed.clear()
            self._nc = None
            self._subs.clear()
            await nc.close()

    # -- thread ----------------------------------------------------------------------------------------------

    def start(self) -> NatsFpmSource:
        self._thread.start()
        return self

    def _loop_error(self, exc: BaseException) -> None:
        self.loop_errors += 1

    def wait_subscribed(self, timeout_s: float) -> bool:
        """Block until the subscriptions are in place (or ``timeout_s`` passed); True when they are."""
        return self._subscribed.wait(timeout_s)

    def close(self) -> None:
        self._thread.close()

    def __enter__(self) -> NatsFpmSource:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def snapshot(self, now: float) -> FleetSnapshot:
        with self.lock:
            return self.store.snapshot(now)

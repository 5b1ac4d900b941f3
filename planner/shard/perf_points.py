"""Perf-model training points in sharded mode: each shard forwards a bounded, subsampled stream of its step
samples; the leader feeds them to its perf models as the unsharded service feeds its store's windows.

The perf model (:class:`~perf_model.model.PerfModel`, one per role) learns engine step time from FPM step
samples: it needs, per sample, the rank (warm-up tracking), the counter (restart detection), the step's wall time
and what it scheduled. In sharded mode the samples stay in the shards, so:

- a shard's :class:`PointPicker` takes, at every summary, the newest step samples its store holds that it has not
  passed over yet, at most a token-bucket budget of ``perf_points_per_s / live shards`` per second (the leader's
  fleet-wide rate, sent in the membership; burst: 2 s of it), split evenly over the roles present, and within a
  role over the ranks in a rotating order (so every rank is visited in turn even when the budget is smaller than
  the ranks). The fleet-wide stream is therefore about ``perf_points_per_s`` whatever the number of engines;
- it publishes them as :class:`PerfPoints` (msgpack arrays, ~60 bytes a point) on
  ``fpm-shard.<ns>.perf.v1.<shard>`` (five tokens: never matched by the summaries' ``fpm-shard.<ns>.*``), cut into
  messages of at most ``max_bytes`` (48 KiB), under the server's 64 KiB ``max_payload``;
- the leader's :class:`PerfPointListener` keeps at most ``max_pending`` points between two ticks (the surplus is
  counted, never buffered), and every tick :func:`attribute` keeps only the points of workers in its current
  membership (a rank within the worker's DP size), under the role the leader's discovery gives the worker, and
  hands them to the same :class:`~planner.service.perf_feed.PerfFeed` the unsharded path uses.

Subsampling keeps the model sound: its warm-up filter counts the step samples it is offered per rank, at most the
engine's own count, so a sample it accepts is past the engine's warm-up too; a rank moved between shards may be
offered an older counter once, which the filter takes for a restart (more warm-up, never less).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec

from planner.discovery import Role, WorkerRecord
from planner.ingest.store import FleetStore
from planner.shard.process import _DecodingListener
from planner.transport.subjects import escape
from worker_shim.fpm import ForwardPassMetrics, ScheduledRequests

__all__ = [
    "DEFAULT_PERF_POINTS_PER_S",
    "PERF_POINTS_VERSION",
    "PerfPoint",
    "PerfPointListener",
    "PerfPoints",
    "PointPicker",
    "attribute",
    "decode_perf_points",
    "encode_perf_points",
    "perf_points_subject",
    "perf_points_wildcard",
]

PERF_POINTS_VERSION = 1
# Fleet-wide training points per second the leader takes by default: ~30 KB/s on the wire and a few ms of the
# leader's CPU per second; a role's model (4,096 points at most, refitted every 30 s) is refreshed within a refit.
DEFAULT_PERF_POINTS_PER_S = 512.0
_FIELDS = ScheduledRequests.__struct_fields__


def perf_points_subject(namespace: str, shard_id: str) -> str:
    return f"fpm-shard.{escape(namespace)}.perf.v{PERF_POINTS_VERSION}.{escape(shard_id)}"


def perf_points_wildcard(namespace: str) -> str:
    return f"fpm-shard.{escape(namespace)}.perf.v{PERF_POINTS_VERSION}.*"


class PerfPoint(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One step sample as the perf model reads it (``scheduled``: the ScheduledRequests fields in order)."""

    worker_id: str
    dp_rank: int
    counter_id: int
    wall_time: float
    scheduled: tuple[int | float, ...]

    @classmethod
    def of(cls, sample: ForwardPassMetrics) -> PerfPoint:
        return cls(
            sample.worker_id,
            sample.dp_rank,
            sample.counter_id,
            sample.wall_time,
            msgspec.structs.astuple(sample.scheduled_requests),
        )

    def sample(self) -> ForwardPassMetrics:
        fields: dict[str, Any] = dict(zip(_FIELDS, self.scheduled, strict=True))
        scheduled = ScheduledRequests(**fields)
        return ForwardPassMetrics(
            worker_id=self.worker_id,
            dp_rank=self.dp_rank,
            counter_id=self.counter_id,
            wall_time=self.wall_time,
            scheduled_requests=scheduled,
        )


class PerfPoints(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One message of a shard's training points (messages are independent: no reassembly)."""

    version: int = PERF_POINTS_VERSION
    shard_id: str
    seq: int  # increases with every message of one shard run
    points: tuple[PerfPoint, ...]


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(PerfPoints)


def encode_perf_points(
    shard_id: str, first_seq: int, points: Sequence[PerfPoint], *, max_bytes: int = 48 * 1024
) -> list[bytes]:
    """``points`` as messages of at most about ``max_bytes`` each (numbered from ``first_seq``)."""
    groups: list[list[PerfPoint]] = [[]]
    size = 0
    for point in points:
        n = len(_encoder.encode(point))
        if groups[-1] and size + n > max_bytes:
            groups.append([])
            size = 0
        groups[-1].append(point)
        size += n
    if not groups[-1]:
        return []
    return [
        _encoder.encode(PerfPoints(shard_id=shard_id, seq=first_seq + i, points=tuple(group)))
        for i, group in enumerate(groups)
    ]


def decode_perf_points(payload: bytes) -> PerfPoints:
    """Decode one message; ``ValueError`` naming the problem for anything else (another version included)."""
    try:
        message = _decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ValueError(f"not shard perf points: {exc}") from exc
    if message.version != PERF_POINTS_VERSION:
        raise ValueError(f"unsupported shard perf points version {message.version} (this leader reads 1)")
    for point in message.points:
        if len(point.scheduled) != len(_FIELDS) or point.dp_rank < 0:
            raise ValueError(f"shard perf points of {message.shard_id!r}: a point of {point.worker_id!r} is malformed")
    return message


class PointPicker:
    """A shard's choice of training points: the newest step samples not passed over yet, at most the budget."""

    def __init__(self, *, burst_s: float = 2.0) -> None:
        self.burst_s = burst_s
        self.picked = 0
        self._passed: dict[tuple[str, int], float] = {}  # rank -> receive time of its newest sample passed over
        self._cursor: dict[Role, int] = {}
        self._tokens = 0.0
        self._last_at: float | None = None

    def pick(
        self,
        store: FleetStore,
        lock: threading.Lock | threading.RLock,
        workers: Mapping[str, WorkerRecord],
        *,
        rate_per_s: float,
        shards: int,
        now: float,
    ) -> list[PerfPoint]:
        """The points to send at ``now`` (the store's clock) given the fleet-wide ``rate_per_s`` over ``shards``
        live shards; ``workers``: the shard's own (their roles split the budget)."""
        per_shard = max(0.0, rate_per_s) / max(1, shards)
        elapsed = 0.0 if self._last_at is None else max(0.0, now - self._last_at)
        self._last_at = now
        self._tokens = min(per_shard * self.burst_s, self._tokens + per_shard * elapsed)
        budget = int(self._tokens)
        for key in [k for k in self._passed if k[0] not in workers]:
            del self._passed[key]
        if budget <= 0:
            return []
        out: list[PerfPoint] = []
        with lock:
            pending: dict[Role, list[tuple[tuple[str, int], Sequence[tuple[float, ForwardPassMetrics]]]]] = {}
            for key, window in store.iter_windows():
                record = workers.get(key[0])
                if record is not None and window and window[-1][0] > self._passed.get(key, -math.inf):
                    pending.setdefault(record.role, []).append((key, window))
            roles = sorted(pending)
            for i, role in enumerate(roles):
                quota = budget // len(roles) + (1 if i < budget % len(roles) else 0)
                out.extend(self._pick_role(role, pending[role], quota))
        self._tokens -= len(out)
        self.picked += len(out)
        return out

    def _pick_role(
        self,
        role: Role,
        ranks: list[tuple[tuple[str, int], Sequence[tuple[float, ForwardPassMetrics]]]],
        quota: int,
    ) -> Iterable[PerfPoint]:
        if quota <= 0:
            return []
        start = self._cursor.get(role, 0) % len(ranks)
        share = -(-quota // len(ranks))  # ceil: the quota is used up when the ranks have that many new
        out: list[PerfPoint] = []
        visited = 0
        for key, window in ranks[start:] + ranks[:start]:
            if len(out) >= quota:
                break
            visited += 1
            since = self._passed.get(key, -math.inf)
            newest: list[PerfPoint] = []
            for at, sample in reversed(window):
                if at <= since or len(newest) >= min(share, quota - len(out)):
                    break
                if not sample.is_heartbeat:
                    newest.append(PerfPoint.of(sample))
            out.extend(reversed(newest))  # in publishing order, as the model expects
            self._passed[key] = window[-1][0]
        self._cursor[role] = start + visited
        return out


def attribute(
    points: Iterable[PerfPoint], workers: Mapping[str, WorkerRecord]
) -> tuple[dict[Role, list[ForwardPassMetrics]], int]:
    """The points of workers in ``workers`` (a rank within its DP size) as samples by the worker's role there;
    and how many were not attributable (never fed)."""
    by_role: dict[Role, list[ForwardPassMetrics]] = {}
    refused = 0
    for point in points:
        record = workers.get(point.worker_id)
        if record is None or point.dp_rank >= record.dp_size:
            refused += 1
            continue
        by_role.setdefault(record.role, []).append(point.sample())
    return by_role, refused


class PerfPointListener(_DecodingListener[PerfPoints]):
    """The leader's subscription to every shard's training points, held (at most ``max_pending``) until taken; a
    message that is not one is counted (``bad_messages``) and logged, never taken."""

    def __init__(
        self,
        *,
        servers: Sequence[str],
        namespace: str,
        user: str | None = None,
        password: str | None = None,
        max_pending: int = 8192,
    ) -> None:
        super().__init__(
            perf_points_wildcard(namespace),
            decode_perf_points,
            servers=servers,
            user=user,
            password=password,
            name="fpm-shard-perf",
        )
        self.max_pending = max_pending
        self.points_received = 0
        self.dropped_full = 0  # points received while max_pending were waiting (never buffered)
        self._pending: list[PerfPoint] = []

    def _apply(self, item: PerfPoints) -> None:
        self.points_received += len(item.points)
        room = max(0, self.max_pending - len(self._pending))
        self._pending.extend(item.points[:room])
        self.dropped_full += max(0, len(item.points) - room)

    def take(self) -> list[PerfPoint]:
        """The points received since the last call."""
        with self.lock:
            points, self._pending = self._pending, []
        return points

"""FleetStore: the latest FPM sample and a bounded window per ``(worker_id, dp_rank)``, attributed to the
endpoint it came from. Pure: every method takes the time as an argument; no clock, no I/O, no threads.

Only samples that can be attributed are kept: the worker must be discovered, the sample must arrive on the
endpoint discovery lists for that worker and rank, and its values must be ones an engine can produce.
Everything else is dropped and counted by :class:`DropReason`. Nothing here raises on bad input.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence

import msgspec

from planner.discovery import WorkerRecord
from worker_shim import fpm
from worker_shim.fpm import ForwardPassMetrics

__all__ = ["DropReason", "EndpointSeen", "FleetSnapshot", "FleetStore", "RankState", "RankView"]


class DropReason(enum.StrEnum):
    DECODE_ERROR = "decode_error"  # payload is not an FPM v1 msgpack map
    BAD_FRAME = "bad_frame"  # not [topic, seq u64, payload]
    # ZMQ cut the connection (a message over ZMQ_MAXMSGSIZE) and the publisher carried on: counted once when the
    # next message after the reconnect shows the same publisher run; a publisher restart is not counted here.
    OVERSIZED = "oversized"
    UNKNOWN_WORKER = "unknown_worker"  # worker id not discovered (or deregistered, or lease lapsed)
    EMPTY_WORKER_ID = "empty_worker_id"  # published under "" (identity never synced)
    FOREIGN_ENDPOINT = "foreign_endpoint"  # a discovered id/rank arriving on another worker's (or rank's) endpoint
    STALE = "stale"  # received longer than the TTL before it could be stored
    OUT_OF_ORDER = "out_of_order"  # counter not after the last one of the same publisher run (duplicate/replay)
    INVALID_VALUE = "invalid_value"  # NaN, infinite or negative numbers; dp_rank outside dp_size


class EndpointSeen(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What an endpoint last published under, attributable or not."""

    endpoint: str
    worker_id: str
    dp_rank: int
    last_at: float
    messages: int


_Seen = tuple[str, int, float, int]


class EndpointsView(Mapping[str, EndpointSeen]):
    """Endpoint -> :class:`EndpointSeen`, frozen at snapshot time; records are built only for the endpoints read
    (a fleet has tens of thousands, a tick looks at a few)."""

    __slots__ = ("_raw",)

    def __init__(self, raw: dict[str, _Seen]) -> None:
        self._raw = raw

    def __getitem__(self, endpoint: str) -> EndpointSeen:
        wid, rank, at, n = self._raw[endpoint]
        return EndpointSeen(endpoint=endpoint, worker_id=wid, dp_rank=rank, last_at=at, messages=n)

    def __iter__(self) -> Iterator[str]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)

    def __contains__(self, endpoint: object) -> bool:
        return endpoint in self._raw


class RankState:
    """Mutable per-(worker, rank) state inside the store."""

    __slots__ = (
        "counter",
        "disconnected",
        "endpoint",
        "gaps",
        "heartbeats",
        "last_active",
        "last_active_at",
        "last_seen_at",
        "latest",
        "lost_samples",
        "restarts",
        "samples",
        "window",
    )

    def __init__(self, endpoint: str, window_size: int) -> None:
        self.endpoint = endpoint
        self.latest: ForwardPassMetrics | None = None  # newest message, heartbeats included
        self.last_seen_at = 0.0
        self.last_active: ForwardPassMetrics | None = None  # newest step sample (not a heartbeat)
        self.last_active_at = 0.0
        self.window: deque[tuple[float, ForwardPassMetrics]] = deque(maxlen=window_size)
        self.counter = -1
        self.disconnected = False
        self.samples = 0
        self.heartbeats = 0
        self.restarts = 0
        self.gaps = 0
        self.lost_samples = 0


class RankView(msgspec.Struct, frozen=True, gc=False):
    """Read-only view of one ``(worker_id, dp_rank)`` at snapshot time (no cycles possible: ``gc=False``)."""

    worker_id: str
    dp_rank: int
    endpoint: str
    fresh: bool
    age_s: float | None  # since the last message of any kind; None = never heard
    active_age_s: float | None  # since the last step sample
    latest: ForwardPassMetrics | None
    last_active: ForwardPassMetrics | None
    samples: int
    heartbeats: int
    restarts: int
    gaps: int
    lost_samples: int


class FleetSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the decision core and diagnostics read from the store at one instant."""

    now: float
    ttl_s: float
    ranks: Mapping[tuple[str, int], RankView]
    endpoints: Mapping[str, EndpointSeen]
    drops: Mapping[DropReason, int]
    drops_by_worker: Mapping[str, Mapping[DropReason, int]]


class FleetStore:
    """Latest sample + bounded window per ``(worker_id, dp_rank)`` for discovered workers only."""

    def __init__(self, *, ttl_s: float = 10.0, window_size: int = 256, restart_tolerance: int = 64) -> None:
        if ttl_s <= 0 or window_size < 1 or restart_tolerance < 1:
            raise ValueError("need ttl_s > 0, window_size >= 1, restart_tolerance >= 1")
        self.ttl_s = ttl_s
        self.window_size = window_size
        self.restart_tolerance = restart_tolerance
        self._workers: dict[str, WorkerRecord] = {}
        self._owner: dict[str, tuple[str, int]] = {}  # endpoint -> (worker_id, dp_rank)
        self._ranks: dict[tuple[str, int], RankState] = {}
        # endpoint -> (worker_id, dp_rank, last_at, messages); immutable, so a snapshot's shallow copy is consistent
        self._endpoints: dict[str, _Seen] = {}
        self.drops: dict[DropReason, int] = dict.fromkeys(DropReason, 0)
        # Drops we can still pin on a discovered worker (by its endpoint), for diagnostics.
        self.drops_by_worker: dict[str, dict[DropReason, int]] = {}

    # -- discovery -------------------------------------------------------------------------------------------

    def set_workers(self, workers: Mapping[str, WorkerRecord]) -> None:
        """Adopt the discovered set: new workers get empty state, departed ones are forgotten entirely."""
        self._workers = dict(workers)
        self._owner = {
            endpoint: (wid, rank)
            for wid, record in workers.items()
            for rank, endpoint in enumerate(record.fpm_endpoints)
        }
        for key in [k for k, st in self._ranks.items() if self._owner.get(st.endpoint) != k]:
            del self._ranks[key]
        for endpoint in [e for e in self._endpoints if e not in self._owner]:
            del self._endpoints[endpoint]
        for wid in [w for w in self.drops_by_worker if w not in self._workers]:
            del self.drops_by_worker[wid]

    @property
    def workers(self) -> Mapping[str, WorkerRecord]:
        return self._workers

    def endpoint_owner(self, endpoint: str) -> tuple[str, int] | None:
        return self._owner.get(endpoint)

    # -- ingest ----------------------------------------------------------------------------------------------

    def note_disconnect(self, endpoint: str) -> None:
        """The subscriber's connection to ``endpoint`` was dropped (ZMQ monitor). Whether that was ZMQ refusing
        an oversized message or the publisher going away is settled by the next message's counter."""
        owner = self._owner.get(endpoint)
        state = self._ranks.get(owner) if owner is not None else None
        if state is not None:
            state.disconnected = True

    def drop(self, reason: DropReason, endpoint: str | None = None, count: int = 1) -> DropReason:
        """Count a drop; pinned on the worker that owns ``endpoint`` when there is one."""
        self.drops[reason] += count
        owner = self._owner.get(endpoint) if endpoint is not None else None
        if owner is not None:
            per = self.drops_by_worker.setdefault(owner[0], {})
            per[reason] = per.get(reason, 0) + count
        return reason

    def ingest_frames(self, endpoint: str, parts: Sequence[bytes], received_at: float, now: float) -> DropReason | None:
        """Ingest one raw ZMQ message received on ``endpoint``; returns the drop reason or None when stored."""
        if len(parts) != 3 or len(parts[1]) != 8:
            return self.drop(DropReason.BAD_FRAME, endpoint)
        try:
            sample = fpm.decode(parts[2])
        except fpm.FpmDecodeError:
            return self.drop(DropReason.DECODE_ERROR, endpoint)
        return self.ingest(endpoint, sample, received_at, now)

    def ingest(self, endpoint: str, sample: ForwardPassMetrics, received_at: float, now: float) -> DropReason | None:
        """Ingest one decoded sample received on ``endpoint`` at ``received_at``."""
        owner = self._owner.get(endpoint)
        if owner is not None:
            seen = self._endpoints.get(endpoint)
            self._endpoints[endpoint] = (
                sample.worker_id,
                sample.dp_rank,
                received_at,
                1 if seen is None else seen[3] + 1,
            )
        wid = sample.worker_id
        if not wid:
            return self.drop(DropReason.EMPTY_WORKER_ID, endpoint)
        record = self._workers.get(wid)
        if record is None:
            return self.drop(DropReason.UNKNOWN_WORKER, endpoint)
        if fpm.invalid_fields(sample) or sample.dp_rank >= record.dp_size:
            return self.drop(DropReason.INVALID_VALUE, endpoint)
        key = (wid, sample.dp_rank)
        if owner != key:
            return self.drop(DropReason.FOREIGN_ENDPOINT, endpoint)
        if now - received_at > self.ttl_s:
            return self.drop(DropReason.STALE, endpoint)
        state = self._ranks.get(key)
        if state is None:
            state = self._ranks[key] = RankState(endpoint, self.window_size)
        counter = sample.counter_id
        last = state.counter
        if last >= 0:
            if counter <= last:
                # One ZMQ connection delivers in order, so going backwards means a new publisher run: certain after
                # a disconnect, assumed for a jump back near zero or far back; a small step back is a replay.
                near = counter >= self.restart_tolerance and last - counter <= self.restart_tolerance
                if not state.disconnected and (counter == last or near):
                    return self.drop(DropReason.OUT_OF_ORDER, endpoint)
                state.restarts += 1  # what the old run sent after our last sample is unknowable
            else:
                if state.disconnected:
                    self.drop(DropReason.OVERSIZED, endpoint)
                if counter > last + 1:
                    state.gaps += 1
                    state.lost_samples += counter - last - 1
        state.disconnected = False
        state.counter = counter
        state.latest = sample
        state.last_seen_at = received_at
        if sample.is_heartbeat:
            state.heartbeats += 1
        else:
            state.samples += 1
            state.last_active = sample
            state.last_active_at = received_at
            state.window.append((received_at, sample))
        return None

    # -- read ------------------------------------------------------------------------------------------------

    def window(self, worker_id: str, dp_rank: int) -> tuple[tuple[float, ForwardPassMetrics], ...]:
        state = self._ranks.get((worker_id, dp_rank))
        return () if state is None else tuple(state.window)

    def iter_windows(self) -> Iterable[tuple[tuple[str, int], deque[tuple[float, ForwardPassMetrics]]]]:
        for key, state in self._ranks.items():
            yield key, state.window

    def rank_view(self, worker_id: str, dp_rank: int, now: float) -> RankView:
        record = self._workers.get(worker_id)
        endpoint = record.fpm_endpoints[dp_rank] if record and dp_rank < record.dp_size else ""
        return self._view(worker_id, dp_rank, endpoint, self._ranks.get((worker_id, dp_rank)), now)

    def _view(self, worker_id: str, dp_rank: int, endpoint: str, state: RankState | None, now: float) -> RankView:
        if state is None:
            return RankView(worker_id, dp_rank, endpoint, False, None, None, None, None, 0, 0, 0, 0, 0)
        age = now - state.last_seen_at
        return RankView(
            worker_id,
            dp_rank,
            state.endpoint,
            age <= self.ttl_s,
            age,
            None if state.last_active is None else now - state.last_active_at,
            state.latest,
            state.last_active,
            state.samples,
            state.heartbeats,
            state.restarts,
            state.gaps,
            state.lost_samples,
        )

    def snapshot(self, now: float) -> FleetSnapshot:
        """Every discovered worker's every rank (heard from or not), endpoint observations and drop counters."""
        get, view = self._ranks.get, self._view
        ranks = {
            (wid, rank): view(wid, rank, endpoint, get((wid, rank)), now)
            for wid, record in self._workers.items()
            for rank, endpoint in enumerate(record.fpm_endpoints)
        }
        return FleetSnapshot(
            now=now,
            ttl_s=self.ttl_s,
            ranks=ranks,
            endpoints=EndpointsView(dict(self._endpoints)),
            drops=dict(self.drops),
            drops_by_worker={w: dict(d) for w, d in self.drops_by_worker.items()},
        )

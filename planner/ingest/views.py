"""What the store's readers get: :class:`FleetSnapshot` (every discovered rank, endpoint observations, drop
counters and the :class:`FleetTotals` the decision core reads, frozen at one instant), the per-rank
:class:`RankView` and per-endpoint :class:`EndpointSeen` records, and the lazy mappings that build them only for
the keys read. Pure: no clock, no I/O."""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping, Sequence

import msgspec
import numpy as np
import numpy.typing as npt

from planner.ingest.drops import DropReason
from planner.ingest.slots import SlotTable
from worker_shim.fpm import ForwardPassMetrics

__all__ = [
    "NO_COUNTS",
    "EndpointSeen",
    "EndpointsView",
    "FleetSnapshot",
    "FleetTotals",
    "LoadField",
    "RankColumns",
    "RankView",
    "RanksView",
    "Seen",
    "WindowEntry",
]


class LoadField(enum.IntEnum):
    """Index into the tuples of :attr:`FleetTotals.load`: one count of each rank's newest message (heartbeats
    included)."""

    QUEUED_PREFILL_TOKENS = 0  # queued_requests.sum_prefill_tokens
    SCHEDULED_PREFILL_TOKENS = 1  # scheduled_requests.sum_prefill_tokens
    DECODE_REQUESTS = 2  # scheduled_requests.num_decode_requests
    QUEUED_DECODE_REQUESTS = 3  # queued_requests.num_decode_requests
    DECODE_KV_TOKENS = 4  # scheduled_requests.sum_decode_kv_tokens
    PREFILL_REQUESTS = 5  # scheduled_requests.num_prefill_requests + queued_requests.num_prefill_requests


class EndpointSeen(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What an endpoint last published under, attributable or not."""

    endpoint: str
    worker_id: str
    dp_rank: int
    last_at: float
    messages: int


Seen = tuple[str, int, float, int]  # (worker_id, dp_rank, last_at, messages)


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


class FleetTotals(msgspec.Struct, frozen=True, kw_only=True):
    """What the decision core reads of a snapshot, computed when it was taken (arrays read-only).

    ``fresh[s]``: slot ``s``'s newest message (heartbeats included) is at most ``ttl_s`` old. ``fresh_ranks[i]``:
    how many ranks of worker ``i`` (table order) are fresh. ``load[service][f]``: count ``f``
    (:class:`LoadField`) summed over the newest messages of the fresh ranks of the workers whose
    ``WorkerRecord.service`` is ``service`` — ints when the samples hold ints, as they do off the wire.
    """

    table: SlotTable
    fresh: npt.NDArray[np.bool_]
    fresh_ranks: npt.NDArray[np.int64]
    load: Mapping[str, tuple[float, ...]]


WindowEntry = tuple[float, ForwardPassMetrics]  # (received_at, sample), as held in a window


class RankColumns:
    """The columns a :class:`RankView` is built from: copies in a snapshot, the store's own for a live view."""

    __slots__ = ("active", "counts", "heartbeats", "latest", "samples", "seen_at")

    def __init__(
        self,
        seen_at: Sequence[float] | npt.NDArray[np.float64],
        latest: Sequence[ForwardPassMetrics | None],
        active: Sequence[WindowEntry | None],
        samples: Sequence[int],
        heartbeats: Sequence[int],
        counts: Mapping[int, tuple[int, int, int]],
    ) -> None:
        self.seen_at = seen_at
        self.latest = latest
        self.active = active
        self.samples = samples
        self.heartbeats = heartbeats
        self.counts = counts

    def view(self, table: SlotTable, slot: int, now: float, fresh: bool) -> RankView:
        worker_id, dp_rank = table.slot_worker[slot], table.slot_rank[slot]
        endpoint = table.endpoints[slot]
        latest = self.latest[slot]
        if latest is None:
            return RankView(worker_id, dp_rank, endpoint, False, None, None, None, None, 0, 0, 0, 0, 0)
        active = self.active[slot]
        restarts, gaps, lost = self.counts.get(slot, NO_COUNTS)
        return RankView(
            worker_id,
            dp_rank,
            endpoint,
            fresh,
            now - float(self.seen_at[slot]),
            None if active is None else now - active[0],
            latest,
            None if active is None else active[1],
            self.samples[slot],
            self.heartbeats[slot],
            restarts,
            gaps,
            lost,
        )


NO_COUNTS = (0, 0, 0)  # restarts, gaps, lost samples


class RanksView(Mapping[tuple[str, int], RankView]):
    """``(worker_id, dp_rank)`` -> :class:`RankView` for every discovered rank (heard from or not), frozen at
    snapshot time; iterates in discovery order and builds a view only for the keys read."""

    __slots__ = ("_cols", "_fresh", "_now", "_table")

    def __init__(self, table: SlotTable, cols: RankColumns, fresh: npt.NDArray[np.bool_], now: float) -> None:
        self._table = table
        self._cols = cols
        self._fresh = fresh
        self._now = now

    def __getitem__(self, key: tuple[str, int]) -> RankView:
        slot = self._slot(key)
        if slot is None:
            raise KeyError(key)
        return self._cols.view(self._table, slot, self._now, bool(self._fresh[slot]))

    def _slot(self, key: object) -> int | None:
        if not isinstance(key, tuple) or len(key) != 2:
            return None
        return self._table.slot(*key)

    def __iter__(self) -> Iterator[tuple[str, int]]:
        return self._table.keys()

    def __len__(self) -> int:
        return self._table.size

    def __contains__(self, key: object) -> bool:
        return self._slot(key) is not None


class EndpointsView(Mapping[str, EndpointSeen]):
    """Endpoint -> :class:`EndpointSeen` for the discovered endpoints that published anything, frozen at snapshot
    time; records are built only for the endpoints read (a fleet has tens of thousands, a tick looks at a few)."""

    __slots__ = ("_route", "_seen")

    def __init__(self, route: Mapping[str, tuple[str, int, int]], seen: Sequence[Seen | None]) -> None:
        self._route = route
        self._seen = seen

    def __getitem__(self, endpoint: str) -> EndpointSeen:
        raw = self._seen[self._route[endpoint][2]]
        if raw is None:
            raise KeyError(endpoint)
        wid, rank, at, n = raw
        return EndpointSeen(endpoint=endpoint, worker_id=wid, dp_rank=rank, last_at=at, messages=n)

    def __iter__(self) -> Iterator[str]:
        seen = self._seen
        return (endpoint for endpoint, route in self._route.items() if seen[route[2]] is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __contains__(self, endpoint: object) -> bool:
        route = self._route.get(endpoint) if isinstance(endpoint, str) else None
        return route is not None and self._seen[route[2]] is not None


class FleetSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the decision core and diagnostics read from the store at one instant: ``ranks`` per key
    (every discovered rank, heard from or not), ``totals`` per service and slot (the decision core)."""

    now: float
    ttl_s: float
    ranks: Mapping[tuple[str, int], RankView]
    endpoints: Mapping[str, EndpointSeen]
    drops: Mapping[DropReason, int]
    drops_by_worker: Mapping[str, Mapping[DropReason, int]]
    totals: FleetTotals

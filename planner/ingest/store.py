"""FleetStore: the latest FPM sample and a bounded window per ``(worker_id, dp_rank)``, attributed to the
endpoint it came from. Pure: every method takes the time as an argument; no clock, no I/O, no threads.

Only samples that can be attributed are kept: the worker must be discovered, the sample must arrive on the
endpoint discovery lists for that worker and rank, and its values must be ones an engine can produce.
Everything else is dropped and counted by :class:`DropReason`. Nothing here raises on bad input.

Layout (columnar). :meth:`FleetStore.set_workers` gives every discovered ``(worker_id, dp_rank)`` a *slot*
(:class:`SlotTable`): workers grouped by ``service`` (services in order of first appearance), discovery order
within a service, a worker's ranks consecutive. Per-rank state lives in flat Python lists indexed by slot (a
store into a list is the cheapest write Python has; ingest writes one element per column), among them the
:class:`LoadField` counts of each rank's newest message, so that nobody has to read them back out of tens of
thousands of sample objects scattered in memory. A snapshot costs no per-rank Python work: one vectorized
freshness test, one C-level sum per load count and service (each service is one contiguous slot range:
:class:`FleetTotals`), and a copy of each column its ``ranks`` mapping needs, which builds a :class:`RankView`
only for the keys read.
"""

from __future__ import annotations

import enum
import math
import operator
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import accumulate, chain, compress, groupby, repeat
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec
import numpy as np
import numpy.typing as npt
from msgspec.structs import astuple

from planner.discovery import WorkerRecord
from worker_shim import fpm
from worker_shim.fpm import ForwardPassMetrics

if TYPE_CHECKING:
    from planner.ingest.traffic import TrafficWindows

__all__ = [
    "DropReason",
    "EndpointSeen",
    "FleetSnapshot",
    "FleetStore",
    "FleetTotals",
    "FpmLimits",
    "LoadField",
    "RankView",
    "SlotTable",
]


class DropReason(enum.StrEnum):
    DECODE_ERROR = "decode_error"  # payload is not an FPM v1 msgpack map
    BAD_FRAME = "bad_frame"  # not [topic, seq u64, payload]
    # ZMQ cut the connection for a message over ZMQ_MAXMSGSIZE: a protocol error after the handshake that libzmq
    # does not recover from by itself (counted by the subscriber; never a reset, a restart or a publisher gone).
    OVERSIZED = "oversized"
    UNKNOWN_WORKER = "unknown_worker"  # worker id not discovered (or deregistered, or lease lapsed)
    EMPTY_WORKER_ID = "empty_worker_id"  # published under "" (identity never synced)
    FOREIGN_ENDPOINT = "foreign_endpoint"  # a discovered id/rank arriving on another worker's (or rank's) endpoint
    STALE = "stale"  # received longer than the TTL before it could be stored
    OUT_OF_ORDER = "out_of_order"  # counter not after the last one of the same publisher run (duplicate/replay)
    # NaN, infinite or negative numbers, a count beyond its plausibility limit (FpmLimits); dp_rank outside dp_size
    INVALID_VALUE = "invalid_value"


_U64_MAX = 2**64 - 1


class FpmLimits(msgspec.Struct, frozen=True, kw_only=True):
    """Plausibility limits on the counts of one FPM sample: a sample beyond any of them is dropped as
    ``invalid_value``. Generous (far above what an engine step produces) but finite, so one corrupt or hostile
    sample cannot drive a fleet to its maximum or a prediction into float overflow.

    ``max_counter_jump``: a counter step forward larger than this within one publisher run is not taken as that
    many lost samples; it counts as a restart (what happened in between is unknowable)."""

    max_requests: int = 1_000_000  # any num_*_requests
    max_step_tokens: int = 10_000_000  # scheduled sum_prefill_tokens: tokens computed in one step
    max_kv_tokens: int = 1_000_000_000  # sum_prefill_kv_tokens, sum_decode_kv_tokens
    max_queued_tokens: int = 10_000_000_000  # queued sum_prefill_tokens
    max_variance: float = 1e18  # any var_*
    max_wall_time_s: float = 3600.0
    max_counter_jump: int = 1_000_000

    def __post_init__(self) -> None:
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"FpmLimits.{name} must be a finite number > 0, got {value!r}")

    def bound(self, section: str, name: str) -> float:
        """The limit of field ``name`` of ``scheduled_requests`` or ``queued_requests`` (``section``)."""
        if name.startswith("var_"):
            return self.max_variance
        if name.endswith("_requests"):
            return self.max_requests
        if "kv_tokens" in name:
            return self.max_kv_tokens
        if name == "sum_prefill_tokens":
            return self.max_step_tokens if section == "scheduled_requests" else self.max_queued_tokens
        return self.max_kv_tokens  # a count added later: bounded all the same

    def bounds(self) -> tuple[float, ...]:
        """The limits in the order of ``astuple(scheduled_requests) + astuple(queued_requests)``."""
        return tuple(self.bound("scheduled_requests", n) for n in fpm.ScheduledRequests.__struct_fields__) + tuple(
            self.bound("queued_requests", n) for n in fpm.QueuedRequests.__struct_fields__
        )

    def violations(self, sample: ForwardPassMetrics) -> tuple[str, ...]:
        """Names of the fields of ``sample`` beyond their limit; empty when plausible."""
        bad = [
            f"{section}.{name}"
            for section in ("scheduled_requests", "queued_requests")
            for name in getattr(sample, section).__struct_fields__
            if getattr(getattr(sample, section), name) > self.bound(section, name)
        ]
        if sample.wall_time > self.max_wall_time_s:
            bad.append("wall_time")
        if sample.counter_id > _U64_MAX:
            bad.append("counter_id")
        if sample.run_id > _U64_MAX or sample.run_id < 0:
            bad.append("run_id")
        return tuple(bad)


class LoadField(enum.IntEnum):
    """Index into :attr:`SlotColumns.load`: one count of each rank's newest message (heartbeats included)."""

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


_Seen = tuple[str, int, float, int]  # (worker_id, dp_rank, last_at, messages)


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


class SlotTable(msgspec.Struct, frozen=True, kw_only=True):
    """Where every discovered rank lives: built by :meth:`FleetStore.set_workers`, never changed after (a new
    discovered set gets a new table), so snapshots share it.

    Slot ``s`` holds rank ``slot_rank[s]`` of worker ``slot_worker[s]``, published on ``endpoints[s]``;
    :meth:`slot` finds a rank's slot, and ``route`` maps an endpoint to ``(worker_id, dp_rank, slot)`` of the
    rank it belongs to (the last lister, in discovery order, when two list one). :meth:`keys` lists every
    ``(worker_id, dp_rank)`` in discovery order.

    Workers are numbered in slot order: worker ``i`` is ``records[i]`` (given under ``worker_ids[i]``), its ranks
    are slots ``first[i]`` to ``first[i] + dp_size[i] - 1``. ``services`` maps each ``WorkerRecord.service`` to
    its range of worker numbers ``[start, stop)``: a service's ranks are one contiguous range of slots. The
    per-worker arrays (read-only; ``first_slot`` is ``first``) repeat the records' numbers for vectorized sums.
    ``keyed_by_id``: every worker was given under its own ``worker_id`` (always, unless a caller mislabels).
    """

    slot_worker: Sequence[str]
    slot_rank: Sequence[int]
    endpoints: Sequence[str]
    route: Mapping[str, tuple[str, int, int]]
    order: Sequence[tuple[str, int]] | None  # discovery order of the keys, when it is not slot order
    records: Sequence[WorkerRecord]
    worker_ids: Sequence[str]
    worker_index: Mapping[str, int]
    services: Mapping[str, tuple[int, int]]
    first: Sequence[int]
    first_slot: npt.NDArray[np.int64]
    dp_size: npt.NDArray[np.int64]
    max_num_batched_tokens: npt.NDArray[np.float64]
    max_num_seqs: npt.NDArray[np.float64]
    kv_capacity_tokens: npt.NDArray[np.float64]
    keyed_by_id: bool

    def slot(self, worker_id: str, dp_rank: int) -> int | None:
        """The slot of ``(worker_id, dp_rank)``; None when that is not a discovered rank."""
        index = self.worker_index.get(worker_id)
        if index is None or not isinstance(dp_rank, int) or not 0 <= dp_rank < self.records[index].dp_size:
            return None
        return self.first[index] + dp_rank

    def slot_range(self, start: int, stop: int) -> tuple[int, int]:
        """The slots of workers ``start`` to ``stop - 1``."""
        n = len(self.records)
        size = self.size
        return (self.first[start] if start < n else size), (self.first[stop] if stop < n else size)

    @property
    def size(self) -> int:
        """The number of slots (discovered ranks)."""
        return len(self.slot_rank)

    @property
    def endpoints_unique(self) -> bool:
        return len(self.route) == self.size

    def keys(self) -> Iterator[tuple[str, int]]:
        """Every ``(worker_id, dp_rank)``, in discovery order."""
        return iter(self.order) if self.order is not None else zip(self.slot_worker, self.slot_rank, strict=True)


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


_Entry = tuple[float, ForwardPassMetrics]  # (received_at, sample), as held in a window


class _RankColumns:
    """The columns a :class:`RankView` is built from: copies in a snapshot, the store's own for a live view."""

    __slots__ = ("active", "counts", "heartbeats", "latest", "samples", "seen_at")

    def __init__(
        self,
        seen_at: Sequence[float] | npt.NDArray[np.float64],
        latest: Sequence[ForwardPassMetrics | None],
        active: Sequence[_Entry | None],
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
        restarts, gaps, lost = self.counts.get(slot, _NO_COUNTS)
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


_NO_COUNTS = (0, 0, 0)  # restarts, gaps, lost samples


class RanksView(Mapping[tuple[str, int], RankView]):
    """``(worker_id, dp_rank)`` -> :class:`RankView` for every discovered rank (heard from or not), frozen at
    snapshot time; iterates in discovery order and builds a view only for the keys read."""

    __slots__ = ("_cols", "_fresh", "_now", "_table")

    def __init__(self, table: SlotTable, cols: _RankColumns, fresh: npt.NDArray[np.bool_], now: float) -> None:
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

    def __init__(self, route: Mapping[str, tuple[str, int, int]], seen: Sequence[_Seen | None]) -> None:
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


def _frozen(values: Sequence[float], dtype: type[np.generic]) -> npt.NDArray[Any]:
    a = np.array(values, dtype=dtype)
    a.flags.writeable = False
    return a


_SERVICE = operator.attrgetter("service")
_DP_SIZE = operator.attrgetter("dp_size")
_ENDPOINTS = operator.attrgetter("fpm_endpoints")
_WORKER_ID = operator.attrgetter("worker_id")


def _capacity(records: Sequence[WorkerRecord], name: str) -> npt.NDArray[np.float64]:
    return _frozen(list(map(operator.attrgetter(f"capacity.{name}"), records)), np.float64)


def _layout(workers: Mapping[str, WorkerRecord]) -> SlotTable:
    """The slot layout of ``workers`` (C-level loops: it is rebuilt on every discovery change)."""
    worker_ids = list(workers)
    records = list(workers.values())
    services = list(map(_SERVICE, records))
    runs = [(service, sum(1 for _ in members)) for service, members in groupby(services)]
    order: list[tuple[str, int]] | None = None
    if len(runs) != len(set(services)):  # services interleave: group them, keeping discovery order within each
        order = [(wid, rank) for wid, record in zip(worker_ids, records, strict=True) for rank in range(record.dp_size)]
        position = {service: i for i, service in enumerate(dict.fromkeys(services))}
        moved = sorted(range(len(records)), key=lambda i: position[services[i]])
        worker_ids = [worker_ids[i] for i in moved]
        records = [records[i] for i in moved]
        runs = [(service, sum(1 for _ in members)) for service, members in groupby(map(_SERVICE, records))]
    ranges: dict[str, tuple[int, int]] = {}
    start = 0
    for service, count in runs:
        ranges[service] = (start, start + count)
        start += count
    dp_sizes = list(map(_DP_SIZE, records))
    first = list(accumulate(dp_sizes, initial=0))
    n = first.pop()
    slot_worker = list(chain.from_iterable(map(repeat, worker_ids, dp_sizes)))
    slot_rank = list(chain.from_iterable(map(range, dp_sizes)))
    endpoints = list(chain.from_iterable(map(_ENDPOINTS, records)))
    route = dict(zip(endpoints, zip(slot_worker, slot_rank, range(n), strict=True), strict=True))
    if len(route) < n:  # an endpoint listed twice: the last lister in discovery order owns it
        first_of = dict(zip(worker_ids, first, strict=True))
        route = {}
        for wid, record in workers.items():
            for rank, endpoint in enumerate(record.fpm_endpoints):
                route[endpoint] = (wid, rank, first_of[wid] + rank)
    return SlotTable(
        slot_worker=slot_worker,
        slot_rank=slot_rank,
        endpoints=endpoints,
        route=route,
        order=order,
        records=records,
        worker_ids=worker_ids,
        worker_index=dict(zip(worker_ids, range(len(worker_ids)), strict=True)),
        services=ranges,
        first=first,
        first_slot=_frozen(first, np.int64),
        dp_size=_frozen(dp_sizes, np.int64),
        max_num_batched_tokens=_capacity(records, "max_num_batched_tokens"),
        max_num_seqs=_capacity(records, "max_num_seqs"),
        kv_capacity_tokens=_capacity(records, "kv_capacity_tokens"),
        keyed_by_id=all(map(operator.eq, worker_ids, map(_WORKER_ID, records))),
    )


_EMPTY_TABLE = _layout({})

_T = TypeVar("_T")


class _Moves:
    """Where each slot of a new layout takes its state from: runs of consecutive old slots, or of none (-1)."""

    __slots__ = ("runs",)

    def __init__(self) -> None:
        self.runs: list[list[int]] = []  # [first old slot or -1, length]

    def add(self, old: int, length: int = 1) -> None:
        if not length:
            return
        if self.runs:
            last = self.runs[-1]
            if (old < 0 and last[0] < 0) or (old >= 0 and last[0] >= 0 and last[0] + last[1] == old):
                last[1] += length
                return
        self.runs.append([old, length])

    def prefix(self) -> int:
        """How many leading slots stay where they are."""
        return self.runs[0][1] if self.runs and self.runs[0][0] == 0 else 0

    def take(self, column: list[_T], empty: _T) -> list[_T]:
        """``column`` rearranged in place for the new layout (``empty`` where there is no old slot): only what
        follows the unmoved prefix is copied."""
        keep = self.prefix()
        tail: list[_T] = []
        for old, length in self.runs[1 if keep else 0 :]:
            tail.extend(column[old : old + length] if old >= 0 else repeat(empty, length))
        del column[keep:]
        column.extend(tail)
        return column

    def renumber(self, old_slots: Iterable[int], old_size: int) -> list[int]:
        """The new slot of each of ``old_slots`` (slots of a layout of ``old_size``), -1 where there is none."""
        if self.prefix() >= old_size:
            return list(old_slots)
        new_of = np.full(old_size + 1, -1, dtype=np.int64)  # the extra -1 keeps an empty lookup well-formed
        start = 0
        for old, length in self.runs:
            if old >= 0:
                new_of[old : old + length] = np.arange(start, start + length)
            start += length
        return new_of[np.fromiter(old_slots, dtype=np.int64)].tolist()  # type: ignore[no-any-return]


class FleetStore:
    """Latest sample + bounded window per ``(worker_id, dp_rank)`` for discovered workers only."""

    def __init__(
        self,
        *,
        ttl_s: float = 10.0,
        window_size: int = 256,
        restart_tolerance: int = 64,
        limits: FpmLimits | None = None,
    ) -> None:
        if ttl_s <= 0 or window_size < 1 or restart_tolerance < 1:
            raise ValueError("need ttl_s > 0, window_size >= 1, restart_tolerance >= 1")
        self.ttl_s = ttl_s
        self.window_size = window_size
        self.restart_tolerance = restart_tolerance
        self.limits = limits or FpmLimits()
        self._bounds = self.limits.bounds()
        self._max_wall_time_s = self.limits.max_wall_time_s
        self._max_jump = self.limits.max_counter_jump
        self._workers: dict[str, WorkerRecord] = {}
        self._table = _EMPTY_TABLE
        self._route = self._table.route  # endpoint -> (worker_id, dp_rank, slot)
        # Per-slot columns (see the module docstring); a slot never heard from has counter -1 and no window.
        self._counter: list[int] = []  # counter_id of the newest message stored
        self._run: list[int] = []  # run_id of the newest message stored (0: the publisher sends none)
        self._latest: list[ForwardPassMetrics | None] = []  # newest message, heartbeats included
        self._seen_at: list[float] = []  # when it was received; -inf: never
        self._qp: list[float] = []  # its LoadField counts, one list per field
        self._sp: list[float] = []
        self._dr: list[float] = []
        self._qd: list[float] = []
        self._kv: list[float] = []
        self._preq: list[float] = []
        self._active: list[_Entry | None] = []  # newest step sample (not a heartbeat): its window entry
        self._windows: list[deque[_Entry] | None] = []
        self._samples: list[int] = []
        self._heartbeats: list[int] = []
        self._counts: dict[int, tuple[int, int, int]] = {}  # slot -> (restarts, gaps, lost samples), rare
        # What each slot's endpoint last published under, attributable or not (immutable tuples).
        self._seen: list[_Seen | None] = []
        self._disconnected: set[int] = set()  # heard slots whose connection dropped since their last message
        self._heard: list[int] = []  # slots in the order they were first heard from (iter_windows)
        self.drops: dict[DropReason, int] = dict.fromkeys(DropReason, 0)
        # Drops we can still pin on a discovered worker (by its endpoint), for diagnostics.
        self.drops_by_worker: dict[str, dict[DropReason, int]] = {}
        # Fed the FPM traffic extension of every stored step sample, under its worker's service (issue 13).
        self.traffic: TrafficWindows | None = None

    # -- discovery -------------------------------------------------------------------------------------------

    def set_workers(self, workers: Mapping[str, WorkerRecord]) -> None:
        """Adopt the discovered set: new workers get empty state, departed ones are forgotten entirely.

        A rank keeps its state while it keeps its endpoint; an endpoint keeps what it last published under while
        any worker lists it. Rebuilds the slot layout: O(ranks), with per-rank Python work only for workers whose
        record changed."""
        old = self._table
        table = _layout(workers)
        state, seen = _Moves(), _Moves()  # per-rank state follows (key, endpoint); observations the endpoint
        unchanged = table.endpoints_unique and old.endpoints_unique
        kept, length = 0, 0  # a pending run of old slots of unchanged workers (the same ranks, same endpoints)
        for wid, record, first in zip(table.worker_ids, table.records, table.first, strict=True):
            index = old.worker_index.get(wid)
            if unchanged and index is not None and old.records[index] is record:
                if length and kept + length == old.first[index]:
                    length += record.dp_size
                else:
                    state.add(kept, length)
                    seen.add(kept, length)
                    kept, length = old.first[index], record.dp_size
                continue
            state.add(kept, length)
            seen.add(kept, length)
            length = 0
            for rank, endpoint in enumerate(record.fpm_endpoints):
                if table.route[endpoint][2] != first + rank:  # a later worker lists this endpoint: nothing here
                    state.add(-1)
                    seen.add(-1)
                    continue
                previous = old.slot(wid, rank)
                state.add(previous if previous is not None and old.endpoints[previous] == endpoint else -1)
                owner = old.route.get(endpoint)
                seen.add(-1 if owner is None else owner[2])
        state.add(kept, length)
        seen.add(kept, length)
        self._counter = state.take(self._counter, -1)
        self._run = state.take(self._run, 0)
        self._latest = state.take(self._latest, None)
        self._seen_at = state.take(self._seen_at, float("-inf"))
        self._qp = state.take(self._qp, 0)
        self._sp = state.take(self._sp, 0)
        self._dr = state.take(self._dr, 0)
        self._qd = state.take(self._qd, 0)
        self._kv = state.take(self._kv, 0)
        self._preq = state.take(self._preq, 0)
        self._active = state.take(self._active, None)
        self._windows = state.take(self._windows, None)
        self._samples = state.take(self._samples, 0)
        self._heartbeats = state.take(self._heartbeats, 0)
        self._seen = seen.take(self._seen, None)
        size = old.size
        self._heard = [slot for slot in state.renumber(self._heard, size) if slot >= 0]
        counts = self._counts
        self._counts = {
            slot: counts[old_slot]
            for old_slot, slot in zip(counts, state.renumber(counts, size), strict=True)
            if slot >= 0
        }
        self._disconnected = {slot for slot in state.renumber(self._disconnected, size) if slot >= 0}
        self._workers = dict(workers)
        self._table = table
        self._route = table.route
        for wid in [w for w in self.drops_by_worker if w not in self._workers]:
            del self.drops_by_worker[wid]

    @property
    def workers(self) -> Mapping[str, WorkerRecord]:
        return self._workers

    def endpoint_owner(self, endpoint: str) -> tuple[str, int] | None:
        route = self._route.get(endpoint)
        return None if route is None else (route[0], route[1])

    # -- ingest ----------------------------------------------------------------------------------------------

    def note_disconnect(self, endpoint: str) -> None:
        """The subscriber's connection to ``endpoint`` was dropped (ZMQ monitor): a counter going backwards
        after it is a new publisher run for certain (publishers that send no ``run_id``)."""
        route = self._route.get(endpoint)
        if route is not None and self._counter[route[2]] >= 0:
            self._disconnected.add(route[2])

    def drop(self, reason: DropReason, endpoint: str | None = None, count: int = 1) -> DropReason:
        """Count a drop; pinned on the worker that owns ``endpoint`` when there is one."""
        self.drops[reason] += count
        route = self._route.get(endpoint) if endpoint is not None else None
        if route is not None:
            per = self.drops_by_worker.setdefault(route[0], {})
            per[reason] = per.get(reason, 0) + count
        return reason

    def ingest_frames(self, endpoint: str, parts: Sequence[bytes], received_at: float, now: float) -> DropReason | None:
        """Ingest one raw ZMQ message received on ``endpoint``; returns the drop reason or None when stored."""
        if len(parts) != 3 or len(parts[1]) != 8:
            return self.drop(DropReason.BAD_FRAME, endpoint)
        try:
            sample = fpm.decode(parts[2])
        except Exception:  # FpmDecodeError, or whatever else a hostile payload provokes
            return self.drop(DropReason.DECODE_ERROR, endpoint)
        return self.ingest(endpoint, sample, received_at, now)

    def ingest(self, endpoint: str, sample: ForwardPassMetrics, received_at: float, now: float) -> DropReason | None:
        """Ingest one decoded sample received on ``endpoint`` at ``received_at``."""
        route = self._route.get(endpoint)
        if route is None:
            return self._unattributed(endpoint, sample)
        slot = route[2]
        seen = self._seen[slot]
        self._seen[slot] = (sample.worker_id, sample.dp_rank, received_at, 1 if seen is None else seen[3] + 1)
        if route[0] != sample.worker_id or route[1] != sample.dp_rank:
            return self._unattributed(endpoint, sample)
        # The endpoint's own worker and rank: the id is discovered and the rank within its dp_size.
        if not self._valid(sample):
            return self.drop(DropReason.INVALID_VALUE, endpoint)
        if now - received_at > self.ttl_s:
            return self.drop(DropReason.STALE, endpoint)
        counter = sample.counter_id
        counters = self._counter
        last = counters[slot]
        disconnected = self._disconnected
        run = sample.run_id
        if last >= 0:
            last_run = self._run[slot]
            if run != last_run and run and last_run:
                # A new publisher run (its run_id is drawn at start): a restart, whatever the counters say.
                restarts, gaps, lost = self._counts.get(slot, _NO_COUNTS)
                self._counts[slot] = (restarts + 1, gaps, lost)
            elif counter <= last:
                # One ZMQ connection delivers in order, so going backwards means a new publisher run: certain after
                # a disconnect, assumed for a jump back near zero or far back; a small step back is a replay. Within
                # one known run, any step back is a replay.
                near = counter >= self.restart_tolerance and last - counter <= self.restart_tolerance
                if (run and run == last_run) or (slot not in disconnected and (counter == last or near)):
                    return self.drop(DropReason.OUT_OF_ORDER, endpoint)
                restarts, gaps, lost = self._counts.get(slot, _NO_COUNTS)
                # what the old run sent after our last sample is unknowable
                self._counts[slot] = (restarts + 1, gaps, lost)
            elif counter > last + 1:
                restarts, gaps, lost = self._counts.get(slot, _NO_COUNTS)
                if counter - last > self._max_jump:  # implausible as loss: a run we could not tell apart
                    self._counts[slot] = (restarts + 1, gaps, lost)
                else:
                    self._counts[slot] = (restarts, gaps + 1, lost + counter - last - 1)
            if disconnected:
                disconnected.discard(slot)
        else:  # the first message stored for this rank
            self._windows[slot] = deque(maxlen=self.window_size)
            self._heard.append(slot)
        counters[slot] = counter
        self._run[slot] = run
        self._latest[slot] = sample
        self._seen_at[slot] = received_at
        sched = sample.scheduled_requests
        queued = sample.queued_requests
        self._qp[slot] = queued.sum_prefill_tokens
        self._sp[slot] = sched.sum_prefill_tokens
        self._dr[slot] = sched.num_decode_requests
        self._qd[slot] = queued.num_decode_requests
        self._kv[slot] = sched.sum_decode_kv_tokens
        self._preq[slot] = sched.num_prefill_requests + queued.num_prefill_requests
        if sample.is_heartbeat:
            self._heartbeats[slot] += 1
        else:
            self._samples[slot] += 1
            entry = (received_at, sample)
            self._active[slot] = entry
            self._windows[slot].append(entry)  # type: ignore[union-attr]
            if self.traffic is not None and sample.traffic is not msgspec.UNSET:
                self.traffic.add(self._workers[route[0]].service, sample.traffic, received_at)
        return None

    def _valid(self, sample: ForwardPassMetrics) -> bool:
        """Nothing an engine cannot produce (:func:`worker_shim.fpm.invalid_fields`: negative, NaN or infinite
        numbers) and every count within :attr:`limits`, in one pass of C-level comparisons (this runs for every
        sample): NaN and +inf fail the comparison with the limit, a negative count (-inf too) the minimum."""
        counts = astuple(sample.scheduled_requests) + astuple(sample.queued_requests)
        if not (
            all(map(operator.le, counts, self._bounds))
            and min(counts) >= 0
            and 0.0 <= sample.wall_time <= self._max_wall_time_s
            and 0 <= sample.counter_id <= _U64_MAX
            and 0 <= sample.run_id <= _U64_MAX
            and sample.dp_rank >= 0
        ):
            return False
        return sample.traffic is msgspec.UNSET or not fpm.invalid_fields(sample)  # the extension's histograms

    def _unattributed(self, endpoint: str, sample: ForwardPassMetrics) -> DropReason:
        """The drop for a sample that is not its endpoint's own worker and rank (first match wins)."""
        wid = sample.worker_id
        if not wid:
            return self.drop(DropReason.EMPTY_WORKER_ID, endpoint)
        record = self._workers.get(wid)
        if record is None:
            return self.drop(DropReason.UNKNOWN_WORKER, endpoint)
        if not self._valid(sample) or sample.dp_rank >= record.dp_size:
            return self.drop(DropReason.INVALID_VALUE, endpoint)
        return self.drop(DropReason.FOREIGN_ENDPOINT, endpoint)

    # -- read ------------------------------------------------------------------------------------------------

    def window(self, worker_id: str, dp_rank: int) -> tuple[tuple[float, ForwardPassMetrics], ...]:
        slot = self._table.slot(worker_id, dp_rank)
        window = None if slot is None else self._windows[slot]
        return () if window is None else tuple(window)

    def iter_windows(self) -> Iterable[tuple[tuple[str, int], deque[tuple[float, ForwardPassMetrics]]]]:
        """Every rank heard from, in the order first heard, with its (live) window."""
        table, windows = self._table, self._windows
        for slot in self._heard:
            window = windows[slot]
            if window is not None:
                yield (table.slot_worker[slot], table.slot_rank[slot]), window

    def rank_view(self, worker_id: str, dp_rank: int, now: float) -> RankView:
        """One rank read now (not from a snapshot)."""
        slot = self._table.slot(worker_id, dp_rank)
        if slot is None:  # not a discovered rank (every discovered rank has a slot): no endpoint to name
            return RankView(worker_id, dp_rank, "", False, None, None, None, None, 0, 0, 0, 0, 0)
        cols = _RankColumns(self._seen_at, self._latest, self._active, self._samples, self._heartbeats, self._counts)
        return cols.view(self._table, slot, now, now - self._seen_at[slot] <= self.ttl_s)

    def snapshot(self, now: float) -> FleetSnapshot:
        """Every discovered worker's every rank (heard from or not), endpoint observations, drop counters, and
        the totals the decision core reads. No per-rank Python work: a vectorized freshness test, a C-level sum
        per load count and service, and a copy of each column a :class:`RankView` needs."""
        table = self._table
        seen_at = np.array(self._seen_at, dtype=np.float64)
        fresh = (now - seen_at) <= self.ttl_s
        fresh_ranks = (
            np.add.reduceat(fresh, table.first_slot, dtype=np.int64) if table.records else np.zeros(0, np.int64)
        )
        columns = (self._qp, self._sp, self._dr, self._qd, self._kv, self._preq)
        load: dict[str, tuple[float, ...]] = {}
        for service, workers in table.services.items():
            start, stop = table.slot_range(*workers)
            part = fresh[start:stop]
            if part.all():
                load[service] = tuple(sum(col[start:stop]) for col in columns)
            else:
                mask = part.tolist()
                load[service] = tuple(sum(compress(col[start:stop], mask)) for col in columns)
        for a in (seen_at, fresh, fresh_ranks):
            a.flags.writeable = False
        cols = _RankColumns(
            seen_at, self._latest[:], self._active[:], self._samples[:], self._heartbeats[:], dict(self._counts)
        )
        return FleetSnapshot(
            now=now,
            ttl_s=self.ttl_s,
            ranks=RanksView(table, cols, fresh, now),
            endpoints=EndpointsView(self._route, self._seen[:]),
            drops=dict(self.drops),
            drops_by_worker={w: dict(d) for w, d in self.drops_by_worker.items()},
            totals=FleetTotals(table=table, fresh=fresh, fresh_ranks=fresh_ranks, load=load),
        )

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

This module holds the store itself (the per-rank state and how a sample gets into it); the rest lives beside it and
is re-exported here: :mod:`planner.ingest.drops` (:class:`DropReason`, :class:`FpmLimits`, the plausibility check),
:mod:`planner.ingest.slots` (:class:`SlotTable` and the layout), :mod:`planner.ingest.views` (:class:`FleetSnapshot`
and the records and views it hands out).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from itertools import compress
from typing import TYPE_CHECKING

import msgspec
import numpy as np

from planner.discovery import WorkerRecord
from planner.ingest.drops import DropReason, FpmLimits, plausible
from planner.ingest.slots import EMPTY_TABLE, SlotMoves, SlotTable, layout
from planner.ingest.views import (
    NO_COUNTS,
    EndpointSeen,
    EndpointsView,
    FleetSnapshot,
    FleetTotals,
    LoadField,
    RankColumns,
    RanksView,
    RankView,
    Seen,
    WindowEntry,
)
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
        self._table = EMPTY_TABLE
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
        self._active: list[WindowEntry | None] = []  # newest step sample (not a heartbeat): its window entry
        self._windows: list[deque[WindowEntry] | None] = []
        self._samples: list[int] = []
        self._heartbeats: list[int] = []
        self._counts: dict[int, tuple[int, int, int]] = {}  # slot -> (restarts, gaps, lost samples), rare
        # What each slot's endpoint last published under, attributable or not (immutable tuples).
        self._seen: list[Seen | None] = []
        self._disconnected: set[int] = set()  # heard slots whose connection dropped since their last message
        self._heard: list[int] = []  # slots in the order they were first heard from (iter_windows)
        self.drops: dict[DropReason, int] = dict.fromkeys(DropReason, 0)
        # Drops we can still pin on a discovered worker (by its endpoint), for diagnostics.
        self.drops_by_worker: dict[str, dict[DropReason, int]] = {}
        # Fed the FPM traffic extension of every stored step sample, under its worker's service (issue 13).
        self.traffic: TrafficWindows | None = None

    def set_limits(self, limits: FpmLimits) -> None:
        """Check every sample from now on against ``limits`` (an ingest shard told the planner's)."""
        self.limits = limits
        self._bounds = limits.bounds()
        self._max_wall_time_s = limits.max_wall_time_s
        self._max_jump = limits.max_counter_jump

    # -- discovery -------------------------------------------------------------------------------------------

    def set_workers(self, workers: Mapping[str, WorkerRecord]) -> None:
        """Adopt the discovered set: new workers get empty state, departed ones are forgotten entirely.

        A rank keeps its state while it keeps its endpoint; an endpoint keeps what it last published under while
        any worker lists it. Rebuilds the slot layout: O(ranks), with per-rank Python work only for workers whose
        record changed."""
        old = self._table
        table = layout(workers)
        state, seen = SlotMoves(), SlotMoves()  # per-rank state follows (key, endpoint); observations the endpoint
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
        if not plausible(sample, self._bounds, self._max_wall_time_s):
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
                restarts, gaps, lost = self._counts.get(slot, NO_COUNTS)
                self._counts[slot] = (restarts + 1, gaps, lost)
            elif counter <= last:
                # One ZMQ connection delivers in order, so going backwards means a new publisher run: certain after
                # a disconnect, assumed for a jump back near zero or far back; a small step back is a replay. Within
                # one known run, any step back is a replay.
                near = counter >= self.restart_tolerance and last - counter <= self.restart_tolerance
                if (run and run == last_run) or (slot not in disconnected and (counter == last or near)):
                    return self.drop(DropReason.OUT_OF_ORDER, endpoint)
                restarts, gaps, lost = self._counts.get(slot, NO_COUNTS)
                # what the old run sent after our last sample is unknowable
                self._counts[slot] = (restarts + 1, gaps, lost)
            elif counter > last + 1:
                restarts, gaps, lost = self._counts.get(slot, NO_COUNTS)
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

    def _unattributed(self, endpoint: str, sample: ForwardPassMetrics) -> DropReason:
        """The drop for a sample that is not its endpoint's own worker and rank (first match wins)."""
        wid = sample.worker_id
        if not wid:
            return self.drop(DropReason.EMPTY_WORKER_ID, endpoint)
        record = self._workers.get(wid)
        if record is None:
            return self.drop(DropReason.UNKNOWN_WORKER, endpoint)
        if not plausible(sample, self._bounds, self._max_wall_time_s) or sample.dp_rank >= record.dp_size:
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
        cols = RankColumns(self._seen_at, self._latest, self._active, self._samples, self._heartbeats, self._counts)
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
        cols = RankColumns(
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

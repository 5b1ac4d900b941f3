"""The leader's side of sharded ingest: the shards' latest summaries merged into the
:class:`~planner.ingest.store.FleetSnapshot` the decision core reads, with no raw sample in sight.

Pure: time (the wall clock, as the shards stamp their summaries) is an argument. The leader lays out the
discovered workers as a store would (a :class:`~planner.ingest.store.FleetStore` that is given the workers and
never a sample, so the slot table is the store's own), then per tick:

- a summary older than ``max_summary_age_s`` is ignored: its workers count as not fresh (never a scale-down on
  missing data), and a shard that stopped publishing is visible in :meth:`SummaryMerger.shards`;
- a rank is fresh when a live summary says so. After a rebalance the old owner's last summary keeps a moved
  worker fresh until the old owner's next summary (which no longer holds it); the new owner reports it fresh once
  it has heard one message (a heartbeat at the latest, 1 s by default). So a moved worker is missing for at most
  one summary interval plus one heartbeat interval, well inside the TTL, and while it is missing it counts as
  not fresh: no scale-down on it;
- per-service load is the sum of the live summaries' totals (each shard sums only the workers it owns; while a
  rebalance is in flight, a moved worker may be summed by two shards for one summary interval);
- drop counters are summed over every shard's newest summary, per worker too; the endpoints of workers with
  suspect drops carry what they last published under, so ``identity_not_synced`` is still named.

``ranks`` of the merged snapshot holds every discovered rank with its freshness (diagnostics still list every
worker and rank) and the counters the shards count (samples, heartbeats, counter restarts and gaps, lost samples,
ages: the newest a summary carried for the rank, :data:`~planner.shard.summary.RANK_STATS`, kept per slot as each
summary arrives; ages grow with the time since that summary, so they are upper bounds; a rank no summary carried
yet shows as never heard, zero counts); the samples themselves stay in the shards. The FPM traffic counters the
summaries carry are not merged here: :class:`~planner.shard.traffic.TrafficDiffer` adds their differences to the
decider's traffic windows (where histograms add), read by the same code as on the unsharded path.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np
import numpy.typing as npt

from planner.discovery import WorkerRecord
from planner.ingest.store import (
    DropReason,
    EndpointSeen,
    FleetSnapshot,
    FleetStore,
    FleetTotals,
    LoadField,
    RankView,
    SlotTable,
)
from planner.shard.summary import NEVER_MS, RANK_STATS, ShardSummary

__all__ = ["SummaryMerger"]

_REASONS = {str(reason): reason for reason in DropReason}


class _SummaryRanks(Mapping[tuple[str, int], RankView]):
    """Every discovered rank with its merged freshness (no samples: those stay in the shards)."""

    __slots__ = ("_fresh", "_now", "_stats", "_stats_at", "_table")

    def __init__(
        self,
        table: SlotTable,
        fresh: npt.NDArray[np.bool_],
        stats: npt.NDArray[np.void],
        stats_at: npt.NDArray[np.float64],
        now: float,
    ) -> None:
        self._table = table
        self._fresh = fresh
        self._stats = stats
        self._stats_at = stats_at
        self._now = now

    def __getitem__(self, key: tuple[str, int]) -> RankView:
        slot = self._table.slot(*key) if isinstance(key, tuple) and len(key) == 2 else None
        if slot is None:
            raise KeyError(key)
        endpoint = self._table.endpoints[slot]
        fresh = bool(self._fresh[slot])
        at = float(self._stats_at[slot])
        if at != at:  # no summary carried this rank's counters yet
            return RankView(key[0], key[1], endpoint, fresh, None, None, None, None, 0, 0, 0, 0, 0)
        row = self._stats[slot]
        since_s = max(0.0, self._now - at)

        def age(ms: int) -> float | None:
            return None if ms == NEVER_MS else ms / 1000.0 + since_s

        return RankView(
            key[0],
            key[1],
            endpoint,
            fresh,
            age(int(row["age_ms"])),
            age(int(row["active_age_ms"])),
            None,
            None,
            int(row["samples"]),
            int(row["heartbeats"]),
            int(row["restarts"]),
            int(row["gaps"]),
            int(row["lost"]),
        )

    def __iter__(self) -> Iterator[tuple[str, int]]:
        return self._table.keys()

    def __len__(self) -> int:
        return self._table.size


class SummaryMerger:
    """Holds the newest summary of every shard and merges them into a snapshot on demand."""

    def __init__(self, *, ttl_s: float = 10.0, max_summary_age_s: float = 5.0) -> None:
        if not 0 < max_summary_age_s <= ttl_s:
            raise ValueError("need 0 < max_summary_age_s <= ttl_s (a moved worker's state may lapse only a TTL)")
        self.ttl_s = ttl_s
        self.max_summary_age_s = max_summary_age_s
        self._layout = FleetStore(ttl_s=ttl_s, window_size=1)  # never ingests: the slot table of the workers
        self._table = self._layout.snapshot(0.0).totals.table
        self._summaries: dict[str, ShardSummary] = {}
        # shard -> (its workers and their dp sizes, as last mapped; leader slots; rank positions in its summary)
        self._slots: dict[
            str, tuple[tuple[tuple[str, ...], tuple[int, ...]], npt.NDArray[np.intp], npt.NDArray[np.intp]]
        ] = {}
        self.rejected = 0  # summaries older than the shard's newest one
        # per leader slot: the newest rank counters a summary carried, and that summary's taken_at (NaN: none)
        self._stats = np.zeros(0, dtype=RANK_STATS)
        self._stats_at = np.zeros(0, dtype=np.float64)
        self._reset_stats()

    def _reset_stats(self) -> None:
        self._stats = np.zeros(self._table.size, dtype=RANK_STATS)
        self._stats_at = np.full(self._table.size, np.nan)

    @property
    def layout(self) -> FleetStore:
        """The store that lays the discovered workers out (it never ingests a sample)."""
        return self._layout

    def summaries(self) -> dict[str, ShardSummary]:
        """Every shard heard from -> its newest summary."""
        return dict(self._summaries)

    def set_workers(self, workers: Mapping[str, WorkerRecord]) -> None:
        self._layout.set_workers(workers)
        self._table = self._layout.snapshot(0.0).totals.table
        self._slots.clear()
        self._reset_stats()  # the slots moved: counters come back with the next summaries

    def update(self, summary: ShardSummary) -> bool:
        """Keep ``summary`` if it is its shard's newest (by ``taken_at``, which survives a shard restart)."""
        current = self._summaries.get(summary.shard_id)
        if current is not None and (summary.taken_at, summary.seq) <= (current.taken_at, current.seq):
            self.rejected += 1
            return False
        self._summaries[summary.shard_id] = summary
        self._keep_stats(summary)
        return True

    def _keep_stats(self, summary: ShardSummary) -> None:
        positions, stats = summary.rank_positions()
        if not len(positions):
            return
        slots, where = self._map(summary)
        slot_of = np.full(len(summary.fresh), -1, dtype=np.intp)
        slot_of[where] = slots
        mine = slot_of[positions]
        known = mine >= 0
        self._stats[mine[known]] = stats[known]
        self._stats_at[mine[known]] = summary.taken_at

    def forget(self, shard_id: str) -> None:
        """A shard left for good (its counters leave the sums)."""
        self._summaries.pop(shard_id, None)
        self._slots.pop(shard_id, None)

    def shards(self, now: float) -> dict[str, float]:
        """Every shard heard from -> the age of its newest summary."""
        return {shard: now - s.taken_at for shard, s in self._summaries.items()}

    def _map(self, summary: ShardSummary) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
        """(leader slots, summary rank positions) of the summary's ranks that are discovered ranks here."""
        key = (summary.workers, summary.dp_size)
        cached = self._slots.get(summary.shard_id)
        if cached is not None and cached[0] == key:  # the same partition as last tick: the same mapping
            return cached[1], cached[2]
        table = self._table
        index = table.worker_index
        dp_here = table.dp_size
        firsts = table.first_slot
        src_start = 0
        slots: list[npt.NDArray[np.intp]] = []
        where: list[npt.NDArray[np.intp]] = []
        for wid, dp in zip(summary.workers, summary.dp_size, strict=True):
            i = index.get(wid)
            if i is not None and int(dp_here[i]) == dp:
                slots.append(np.arange(firsts[i], firsts[i] + dp, dtype=np.intp))
                where.append(np.arange(src_start, src_start + dp, dtype=np.intp))
            src_start += dp
        out = (np.concatenate(slots), np.concatenate(where)) if slots else (np.zeros(0, np.intp), np.zeros(0, np.intp))
        self._slots[summary.shard_id] = (key, *out)
        return out

    def snapshot(self, now: float, *, local_now: float | None = None) -> FleetSnapshot:
        """The merged snapshot at ``now`` (wall clock seconds, as the shards stamp their summaries).
        ``local_now``: the same instant on the reader's own clock (the service's monotonic clock): the snapshot
        is stamped with it and the endpoints' ``last_at`` are shifted onto it."""
        shift = 0.0 if local_now is None else local_now - now
        table = self._table
        fresh = np.zeros(table.size, dtype=np.bool_)
        load = {service: [0.0] * len(LoadField) for service in table.services}
        drops = dict.fromkeys(DropReason, 0)
        by_worker: dict[str, dict[DropReason, int]] = {}
        endpoints: dict[str, EndpointSeen] = {}
        for summary in self._summaries.values():
            for name, n in summary.drops.items():
                reason = _REASONS.get(name)
                if reason is not None:
                    drops[reason] += n
            for wid, per in summary.drops_by_worker.items():
                if wid in table.worker_index:
                    mine = by_worker.setdefault(wid, {})
                    for name, n in per.items():
                        reason = _REASONS.get(name)
                        if reason is not None:
                            mine[reason] = mine.get(reason, 0) + n
            if now - summary.taken_at > self.max_summary_age_s:
                continue  # stale summary: its ranks stay not fresh
            slots, where = self._map(summary)
            if len(slots):
                fresh[slots] |= np.frombuffer(summary.fresh, dtype=np.uint8)[where].astype(np.bool_)
            for service, values in summary.load.items():
                acc = load.get(service)
                if acc is not None:
                    for f, v in enumerate(values[: len(LoadField)]):
                        acc[f] += v
            for endpoint, seen in summary.seen.items():
                endpoints[endpoint] = EndpointSeen(
                    endpoint=endpoint,
                    worker_id=seen.worker_id,
                    dp_rank=seen.dp_rank,
                    last_at=summary.taken_at - seen.age_s + shift,
                    messages=seen.messages,
                )
        fresh.flags.writeable = False
        fresh_ranks = (
            np.add.reduceat(fresh, table.first_slot, dtype=np.int64) if table.records else np.zeros(0, np.int64)
        )
        fresh_ranks.flags.writeable = False
        return FleetSnapshot(
            now=now + shift,
            ttl_s=self.ttl_s,
            ranks=_SummaryRanks(table, fresh, self._stats, self._stats_at, now),
            endpoints=endpoints,
            drops=drops,
            drops_by_worker=by_worker,
            totals=FleetTotals(
                table=table,
                fresh=fresh,
                fresh_ranks=fresh_ranks,
                load={service: tuple(values) for service, values in load.items()},
            ),
        )

"""The slot layout of the discovered ranks: :class:`SlotTable` (which ``(worker_id, dp_rank)`` lives in which slot
of the store's per-rank columns, and which endpoint it publishes on), :func:`layout` that builds one from the
discovered workers, and :class:`SlotMoves` that rearranges the columns of an old layout into a new one. Pure."""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import accumulate, chain, groupby, repeat
from typing import Any, TypeVar

import msgspec
import numpy as np
import numpy.typing as npt

from planner.discovery import WorkerRecord

__all__ = ["EMPTY_TABLE", "SlotMoves", "SlotTable", "layout"]


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


def layout(workers: Mapping[str, WorkerRecord]) -> SlotTable:
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


EMPTY_TABLE = layout({})

_T = TypeVar("_T")


class SlotMoves:
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

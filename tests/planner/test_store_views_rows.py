"""Store rows the mutation run of the modules split out of ``planner/ingest/store.py`` showed missing: a sample at
each plausibility limit is stored (one past is dropped), an invalid traffic extension is dropped, which field
``FpmLimits.violations`` names for a run id, the dtypes of a slot table's arrays, ``SlotTable.slot_range`` at the
end, and the lookups of a snapshot's ``ranks`` and ``endpoints`` mappings."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from planner.discovery import EngineCapacity, Role, WorkerRecord, default_endpoints
from planner.ingest.store import DropReason, FleetStore, FpmLimits
from worker_shim.fpm import ForwardPassMetrics, LogHistogram, ScheduledRequests, StepTraffic
from worker_shim.metrics import TrafficAccumulator

U64_MAX = 2**64 - 1
W1 = WorkerRecord(
    worker_id="w1",
    role=Role.DECODE,
    service="decode",
    dp_size=2,
    fpm_endpoints=default_endpoints("10.0.2.1", 2),
    capacity=EngineCapacity(max_num_batched_tokens=4096, max_num_seqs=128, kv_capacity_tokens=100_000),
)
W2 = WorkerRecord(
    worker_id="w2", role=Role.PREFILL, service="prefill", dp_size=1, fpm_endpoints=default_endpoints("10.0.2.2", 1)
)
E10, E11 = W1.fpm_endpoints
E20 = W2.fpm_endpoints[0]


def sample(worker_id: str = "w1", dp_rank: int = 0, **fields: Any) -> ForwardPassMetrics:
    values: dict[str, Any] = {
        "counter_id": 0,
        "wall_time": 0.01,
        "scheduled_requests": ScheduledRequests(num_decode_requests=1),
        **fields,
    }
    return ForwardPassMetrics(worker_id=worker_id, dp_rank=dp_rank, **values)


def make_store() -> FleetStore:
    store = FleetStore(ttl_s=5.0, window_size=4)
    store.set_workers({"w1": W1, "w2": W2})
    return store


def arrivals(*tokens: int) -> StepTraffic:
    acc = TrafficAccumulator()
    for n in tokens:
        acc.arrival(n)
    return acc.take()


@pytest.mark.parametrize(
    ("fields", "dropped"),
    [
        ({"wall_time": 3600.0}, False),
        ({"wall_time": 3600.5}, True),
        ({"run_id": U64_MAX}, False),
        ({"run_id": U64_MAX + 1}, True),
        ({"counter_id": U64_MAX}, False),
        ({"counter_id": U64_MAX + 1}, True),
        ({"traffic": arrivals(100, 200)}, False),
        # two values counted, one in the buckets: no producer sends that
        ({"traffic": StepTraffic(arrivals=LogHistogram(count=2, sum=300.0, buckets={40: 1}))}, True),
    ],
    ids=[
        "a step of exactly max_wall_time_s is stored",
        "a longer step is dropped",
        "the largest u64 run id is stored",
        "a run id past u64 is dropped",
        "the largest u64 counter is stored",
        "a counter past u64 is dropped",
        "a valid traffic extension is stored",
        "a traffic extension whose buckets do not add up is dropped",
    ],
)
def test_a_sample_at_a_plausibility_edge(fields: dict[str, Any], dropped: bool) -> None:
    store = make_store()
    got = store.ingest(E10, sample(**fields), 1.0, 1.0)
    assert got is (DropReason.INVALID_VALUE if dropped else None)
    assert store.rank_view("w1", 0, 1.0).samples == (0 if dropped else 1)
    assert store.drops[DropReason.INVALID_VALUE] == (1 if dropped else 0)


@pytest.mark.parametrize(
    ("run_id", "named"),
    [(U64_MAX, ()), (U64_MAX + 1, ("run_id",)), (-1, ("run_id",)), (0, ())],
    ids=["the largest u64 is fine", "past u64 is named", "negative is named", "0 (no run id) is fine"],
)
def test_violations_name_a_run_id_outside_u64(run_id: int, named: tuple[str, ...]) -> None:
    assert FpmLimits().violations(sample(run_id=run_id)) == named


def test_slot_table_arrays_have_their_declared_dtypes() -> None:
    emptied = make_store()
    emptied.set_workers({})  # every worker gone: a table laid out now, not the one built at import
    tables = [make_store(), FleetStore(ttl_s=1.0), emptied]
    for table in (store.snapshot(0.0).totals.table for store in tables):
        assert table.first_slot.dtype == np.int64 and table.dp_size.dtype == np.int64
        for capacity in (table.max_num_batched_tokens, table.max_num_seqs, table.kv_capacity_tokens):
            assert capacity.dtype == np.float64
    table = make_store().snapshot(0.0).totals.table
    assert table.first_slot.tolist() == [0, 2] and table.max_num_seqs.tolist() == [128.0, 256.0]


def test_slot_range_reaches_the_end_of_the_table() -> None:
    table = make_store().snapshot(0.0).totals.table
    assert table.services == {"decode": (0, 1), "prefill": (1, 2)}
    assert table.slot_range(0, 1) == (0, 2)
    assert table.slot_range(1, 2) == (2, 3)
    assert table.slot_range(0, 2) == (0, 3)
    assert table.slot_range(2, 2) == (3, 3)  # no workers past the last: an empty range at the end


def test_snapshot_ranks_lookups() -> None:
    store = make_store()
    store.ingest(E11, sample("w1", 1), 1.0, 1.0)
    ranks = store.snapshot(1.0).ranks
    assert ("w1", 1) in ranks and ("w1", 0) in ranks and ("w2", 0) in ranks  # heard from or not
    for absent in (("w1", 2), ("w3", 0), "w1", ("w1", 0, 0), ["w1", 0]):
        assert absent not in ranks
    assert ranks[("w1", 1)].samples == 1 and ranks[("w1", 0)].samples == 0
    with pytest.raises(KeyError) as missing:
        ranks[("w1", 2)]
    assert missing.value.args == (("w1", 2),)


def test_snapshot_endpoints_lookups() -> None:
    store = make_store()
    store.ingest(E20, sample("", 0), 2.0, 2.0)  # published under no id: still what the endpoint said
    endpoints = store.snapshot(3.0).endpoints
    seen = endpoints[E20]
    assert (seen.endpoint, seen.worker_id, seen.dp_rank, seen.last_at, seen.messages) == (E20, "", 0, 2.0, 1)
    assert E20 in endpoints and E10 not in endpoints
    assert ["not", "hashable"] not in endpoints and 5 not in endpoints
    with pytest.raises(KeyError) as missing:
        endpoints[E10]  # listed, silent
    assert missing.value.args == (E10,)

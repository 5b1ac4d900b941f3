"""FleetStore rows the mutation run showed missing: freshness and the stale drop at exactly ``ttl_s``, the restart
rule for counters far behind / near zero / just behind (no disconnect), per-worker counts of batched drops, and the
per-service load totals of a snapshot."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import numpy as np
import pytest

from planner.discovery import Role, WorkerRecord, default_endpoints
from planner.ingest.store import DropReason, FleetStore, FpmLimits, LoadField
from worker_shim import fpm
from worker_shim.fpm import ForwardPassMetrics, QueuedRequests, ScheduledRequests

TTL_S = 5.0
W1 = WorkerRecord(
    worker_id="w1", role=Role.DECODE, service="decode", dp_size=2, fpm_endpoints=default_endpoints("10.0.1.1", 2)
)
W2 = WorkerRecord(
    worker_id="w2", role=Role.DECODE, service="decode", dp_size=1, fpm_endpoints=default_endpoints("10.0.1.2", 1)
)
W3 = WorkerRecord(
    worker_id="w3", role=Role.PREFILL, service="prefill", dp_size=1, fpm_endpoints=default_endpoints("10.0.1.3", 1)
)
E10, E11 = W1.fpm_endpoints
E20 = W2.fpm_endpoints[0]
E30 = W3.fpm_endpoints[0]


def step(worker_id: str, dp_rank: int, counter: int, **sched: int) -> ForwardPassMetrics:
    return ForwardPassMetrics(
        worker_id=worker_id,
        dp_rank=dp_rank,
        counter_id=counter,
        wall_time=0.01,
        scheduled_requests=ScheduledRequests(**sched) if sched else ScheduledRequests(num_decode_requests=1),
    )


def make_store(restart_tolerance: int = 64) -> FleetStore:
    store = FleetStore(ttl_s=TTL_S, window_size=4, restart_tolerance=restart_tolerance)
    store.set_workers({"w1": W1, "w2": W2, "w3": W3})
    return store


@pytest.mark.parametrize(
    ("age_s", "fresh"),
    [(TTL_S, True), (TTL_S - 0.25, True), (TTL_S + 0.25, False)],
    ids=["exactly ttl_s old is fresh", "inside the ttl is fresh", "past the ttl is not"],
)
def test_freshness_at_the_ttl_edge(age_s: float, fresh: bool) -> None:
    store = make_store()
    store.ingest(E10, step("w1", 0, 0, num_decode_requests=3), 100.0, 100.0)
    now = 100.0 + age_s
    snap = store.snapshot(now)
    assert snap.ranks[("w1", 0)].fresh is fresh
    assert store.rank_view("w1", 0, now).fresh is fresh
    assert snap.totals.fresh.tolist() == [fresh, False, False, False]
    assert snap.totals.fresh_ranks.tolist() == [1 if fresh else 0, 0, 0]
    assert snap.totals.load["decode"][LoadField.DECODE_REQUESTS] == (3 if fresh else 0)


@pytest.mark.parametrize(
    ("delay_s", "dropped"),
    [(TTL_S, False), (TTL_S + 0.25, True)],
    ids=["received exactly ttl_s ago is stored", "received longer ago is dropped as stale"],
)
def test_the_stale_drop_at_the_ttl_edge(delay_s: float, dropped: bool) -> None:
    store = make_store()
    out = store.ingest(E10, step("w1", 0, 0), 100.0, 100.0 + delay_s)
    assert out is (DropReason.STALE if dropped else None)
    assert store.drops[DropReason.STALE] == (1 if dropped else 0)
    assert store.drops_by_worker.get("w1", {}).get(DropReason.STALE, 0) == (1 if dropped else 0)
    assert store.rank_view("w1", 0, 100.0 + delay_s).samples == (0 if dropped else 1)


@dataclass
class CounterRow:
    name: str
    counters: tuple[int, ...]
    drops: tuple[DropReason | None, ...]
    restarts: int
    gaps: int = 0
    lost: int = 0


COUNTER_ROWS = [
    CounterRow(
        "a counter far behind the last one is a restart, even without a disconnect",
        (1000, 500),
        (None, None),
        1,
    ),
    CounterRow("a counter back near zero is a restart", (100, 3), (None, None), 1),
    CounterRow(
        "a counter exactly restart_tolerance behind (and >= it) is a replay",
        (200, 136),
        (None, DropReason.OUT_OF_ORDER),
        0,
    ),
    CounterRow(
        "a counter one more than restart_tolerance behind is a restart",
        (200, 135),
        (None, None),
        1,
    ),
    CounterRow(
        "a counter just behind, above the tolerance, is a replay",
        (200, 199),
        (None, DropReason.OUT_OF_ORDER),
        0,
    ),
    CounterRow(
        "a counter just below restart_tolerance is a restart even one step back",
        (64, 63),
        (None, None),
        1,
    ),
    CounterRow("the same counter twice is a duplicate", (7, 7), (None, DropReason.OUT_OF_ORDER), 0),
    CounterRow("the same counter 0 twice is a duplicate", (0, 0), (None, DropReason.OUT_OF_ORDER), 0),
    CounterRow("the next counter is neither a gap nor a restart", (7, 8), (None, None), 0),
    CounterRow("a skipped counter is one gap of one lost sample", (7, 9), (None, None), 0, 1, 1),
    CounterRow(
        "a restart then a gap in the new run",
        (500, 0, 4),
        (None, None, None),
        1,
        1,
        3,
    ),
]


@pytest.mark.parametrize("row", COUNTER_ROWS, ids=[r.name for r in COUNTER_ROWS])
def test_counter_rules(row: CounterRow) -> None:
    store = make_store(restart_tolerance=64)
    drops = tuple(store.ingest(E10, step("w1", 0, c), 1.0 + i, 1.0 + i) for i, c in enumerate(row.counters))
    assert drops == row.drops
    view = store.rank_view("w1", 0, 1.0 + len(row.counters))
    assert (view.restarts, view.gaps, view.lost_samples) == (row.restarts, row.gaps, row.lost)
    assert view.samples == sum(1 for d in row.drops if d is None)
    stored = [c for c, d in zip(row.counters, row.drops, strict=True) if d is None]
    assert view.latest is not None and view.latest.counter_id == stored[-1]
    assert store.drops[DropReason.OUT_OF_ORDER] == row.drops.count(DropReason.OUT_OF_ORDER)
    pinned = store.drops_by_worker.get("w1", {}).get(DropReason.OUT_OF_ORDER, 0)
    assert pinned == row.drops.count(DropReason.OUT_OF_ORDER)  # a replay is pinned on the endpoint's worker


def test_batched_drops_count_each_message_for_the_fleet_and_the_worker() -> None:
    store = make_store()
    assert store.drop(DropReason.BAD_FRAME, E11, count=3) is DropReason.BAD_FRAME
    store.drop(DropReason.BAD_FRAME, E10, count=2)
    store.drop(DropReason.DECODE_ERROR, E20)
    store.drop(DropReason.BAD_FRAME, "tcp://10.9.9.9:20380", count=4)  # nobody's endpoint: fleet-wide only
    assert store.drops[DropReason.BAD_FRAME] == 9
    assert store.drops[DropReason.DECODE_ERROR] == 1
    assert store.drops_by_worker == {"w1": {DropReason.BAD_FRAME: 5}, "w2": {DropReason.DECODE_ERROR: 1}}
    snap = store.snapshot(1.0)
    assert snap.drops[DropReason.BAD_FRAME] == 9
    assert snap.drops_by_worker["w1"] == {DropReason.BAD_FRAME: 5}


def test_raw_frames_count_their_drops_per_worker() -> None:
    store = make_store()
    assert store.ingest_frames(E10, [b"", b"\x00" * 8], 1.0, 1.0) is DropReason.BAD_FRAME
    assert store.ingest_frames(E10, [b"", b"\x00" * 7, b"x"], 1.0, 1.0) is DropReason.BAD_FRAME
    assert store.ingest_frames(E10, [b"", b"\x00" * 8, b"junk"], 1.0, 1.0) is DropReason.DECODE_ERROR
    assert store.ingest_frames(E10, list(fpm.frames(step("w1", 0, 5))), 1.0, 1.0) is None
    assert store.drops_by_worker["w1"] == {DropReason.BAD_FRAME: 2, DropReason.DECODE_ERROR: 1}
    assert store.rank_view("w1", 0, 1.0).samples == 1


def test_snapshot_load_sums_the_newest_message_of_fresh_ranks_per_service() -> None:
    store = make_store()
    sample = ForwardPassMetrics(
        worker_id="w1",
        dp_rank=0,
        counter_id=0,
        wall_time=0.02,
        scheduled_requests=ScheduledRequests(
            num_prefill_requests=1, sum_prefill_tokens=300, num_decode_requests=5, sum_decode_kv_tokens=7000
        ),
        queued_requests=QueuedRequests(num_prefill_requests=2, sum_prefill_tokens=900, num_decode_requests=4),
    )
    store.ingest(E10, sample, 100.0, 100.0)
    store.ingest(E11, step("w1", 1, 0, num_decode_requests=10, sum_decode_kv_tokens=1), 100.0, 100.0)
    store.ingest(E11, step("w1", 1, 1, num_decode_requests=2, sum_decode_kv_tokens=20), 101.0, 101.0)  # newest counts
    store.ingest(E20, step("w2", 0, 0, num_decode_requests=100), 90.0, 90.0)  # stale at 102
    store.ingest(E30, step("w3", 0, 0, sum_prefill_tokens=64, num_prefill_requests=1), 101.0, 101.0)
    load = store.snapshot(102.0).totals.load
    assert load["decode"] == (900, 300, 7, 4, 7020, 3)
    assert load["prefill"] == (0, 64, 0, 0, 0, 1)
    assert [f.name for f in LoadField] == [
        "QUEUED_PREFILL_TOKENS",
        "SCHEDULED_PREFILL_TOKENS",
        "DECODE_REQUESTS",
        "QUEUED_DECODE_REQUESTS",
        "DECODE_KV_TOKENS",
        "PREFILL_REQUESTS",
    ]


def test_a_heartbeat_keeps_the_rank_fresh_and_zeroes_its_load() -> None:
    store = make_store()
    store.ingest(E20, step("w2", 0, 0, num_decode_requests=9), 100.0, 100.0)
    store.ingest(E20, fpm.heartbeat("w2", 0, 1), 104.0, 104.0)
    snap = store.snapshot(108.0)
    view = snap.ranks[("w2", 0)]
    assert view.fresh and (view.samples, view.heartbeats) == (1, 1)
    assert view.last_active is not None and view.last_active.counter_id == 0
    assert view.active_age_s == 8.0 and view.age_s == 4.0
    assert snap.totals.load["decode"][LoadField.DECODE_REQUESTS] == 0


def test_rank_view_of_a_heard_rank_reads_every_column() -> None:
    store = make_store()
    store.ingest(E11, step("w1", 1, 3, num_decode_requests=4), 100.0, 100.0)
    store.ingest(E11, step("w1", 1, 6, num_decode_requests=5), 101.0, 101.0)  # a gap of two
    store.ingest(E11, fpm.heartbeat("w1", 1, 7), 102.0, 102.0)
    view = store.rank_view("w1", 1, 104.0)
    assert (view.worker_id, view.dp_rank, view.endpoint, view.fresh) == ("w1", 1, E11, True)
    assert (view.age_s, view.active_age_s) == (2.0, 3.0)
    assert view.latest is not None and view.latest.counter_id == 7 and view.latest.is_heartbeat
    assert view.last_active is not None and view.last_active.scheduled_requests.num_decode_requests == 5
    assert (view.samples, view.heartbeats, view.restarts, view.gaps, view.lost_samples) == (2, 1, 0, 1, 2)
    assert store.rank_view("w1", 1, 102.0 + TTL_S + 0.5).fresh is False
    assert store.snapshot(104.0).ranks[("w1", 1)] == view


@pytest.mark.parametrize(
    ("worker_id", "dp_rank", "endpoint"),
    [("w1", 0, E10), ("w1", 2, ""), ("w1", -1, ""), ("nobody", 0, "")],
    ids=["a discovered rank never heard from", "a rank past dp_size", "a negative rank", "an unknown worker"],
)
def test_rank_view_of_a_rank_without_samples_is_empty(worker_id: str, dp_rank: int, endpoint: str) -> None:
    store = make_store()
    store.ingest(E11, step("w1", 1, 0), 100.0, 100.0)
    view = store.rank_view(worker_id, dp_rank, 100.0)
    assert (view.worker_id, view.dp_rank, view.endpoint, view.fresh) == (worker_id, dp_rank, endpoint, False)
    assert (view.age_s, view.active_age_s, view.latest, view.last_active) == (None, None, None, None)
    assert (view.samples, view.heartbeats, view.restarts, view.gaps, view.lost_samples) == (0, 0, 0, 0, 0)


def test_endpoint_owner_and_the_endpoints_a_snapshot_saw() -> None:
    store = make_store()
    assert (store.endpoint_owner(E11), store.endpoint_owner(E30)) == (("w1", 1), ("w3", 0))
    assert store.endpoint_owner("tcp://10.9.9.9:20380") is None
    store.ingest(E20, step("", 0, 0), 1.0, 1.0)  # published, unattributable
    store.ingest(E30, step("w3", 0, 0), 2.0, 2.0)
    store.ingest("tcp://10.9.9.9:20380", step("w1", 0, 0), 2.0, 2.0)  # nobody's endpoint: not remembered
    endpoints = store.snapshot(3.0).endpoints
    assert len(endpoints) == 2 and list(endpoints) == [E20, E30]
    assert E20 in endpoints and E30 in endpoints
    assert E10 not in endpoints and "tcp://10.9.9.9:20380" not in endpoints
    assert (endpoints[E20].worker_id, endpoints[E20].last_at, endpoints[E20].messages) == ("", 1.0, 1)
    with pytest.raises(KeyError):
        endpoints[E10]


def test_a_disconnect_before_any_message_or_on_an_unknown_endpoint_changes_nothing() -> None:
    store = make_store()
    store.note_disconnect(E10)  # never heard from: the first message is just the first
    store.note_disconnect("tcp://10.9.9.9:20380")
    assert store.ingest(E10, step("w1", 0, 500), 1.0, 1.0) is None
    assert store.ingest(E10, step("w1", 0, 499), 2.0, 2.0) is DropReason.OUT_OF_ORDER  # no disconnect pending
    store.note_disconnect(E10)
    assert store.ingest(E10, step("w1", 0, 499), 3.0, 3.0) is None  # after one: a new run
    view = store.rank_view("w1", 0, 3.0)
    assert (view.restarts, view.samples) == (1, 2)


def test_set_workers_moves_state_with_its_key_and_endpoint_like_a_plain_model() -> None:
    """Random rediscovery (workers added, dropped, reordered, moved to another service or endpoint, now and then two
    listing one endpoint) between samples, against plain dict models: a rank keeps its samples and counter while it
    keeps its endpoint; an endpoint keeps what it last published under while any worker lists it; the snapshot's
    per-service load sums the newest sample of each fresh rank; drops stay pinned on listed workers only."""
    rng = random.Random(5)
    store = FleetStore(ttl_s=TTL_S, window_size=4)
    ranks: dict[tuple[str, int, str], tuple[int, int, int]] = {}  # (wid, rank, endpoint) -> (counter, samples, load)
    seen: dict[str, tuple[str, int, int]] = {}  # endpoint -> (worker_id, dp_rank, messages)
    drops: dict[str, int] = {}
    workers: dict[str, WorkerRecord] = {}
    hosts = [f"10.1.0.{i}" for i in range(40)]
    counter = 0
    for round_no in range(240):
        if round_no % 5 == 0:
            new: dict[str, WorkerRecord] = {}
            for wid in rng.sample([f"w{i}" for i in range(10)], rng.randint(1, 8)):
                old = workers.get(wid)
                if old is not None and rng.random() < 0.7:
                    new[wid] = old  # unchanged (the same object)
                    continue
                dp = rng.randint(1, 3)
                new[wid] = WorkerRecord(
                    worker_id=wid,
                    role=Role.DECODE,
                    service=rng.choice(["a", "b", "c"]),
                    dp_size=dp,
                    fpm_endpoints=default_endpoints(rng.choice(hosts), dp),
                )
            workers = new
            store.set_workers(workers)
            owner = {e: (w, r) for w, rec in workers.items() for r, e in enumerate(rec.fpm_endpoints)}  # last wins
            ranks = {k: v for k, v in ranks.items() if owner.get(k[2]) == (k[0], k[1])}
            seen = {e: v for e, v in seen.items() if e in owner}
            drops = {w: n for w, n in drops.items() if w in workers}
        wid = rng.choice(list(workers))
        rec = workers[wid]
        rank = rng.randrange(rec.dp_size)
        endpoint = rec.fpm_endpoints[rank]
        counter += 1
        load = rng.randint(0, 50)
        as_id = "nobody" if rng.random() < 0.1 else wid
        out = store.ingest(endpoint, step(as_id, rank, counter, num_decode_requests=load), 100.0, 100.0)
        messages = seen[endpoint][2] if endpoint in seen else 0
        seen[endpoint] = (as_id, rank, messages + 1)
        if as_id == "nobody":
            assert out is DropReason.UNKNOWN_WORKER
        elif owner[endpoint] == (wid, rank):
            assert out is None
            _, samples, _ = ranks.get((wid, rank, endpoint), (0, 0, 0))
            ranks[(wid, rank, endpoint)] = (counter, samples + 1, load)
        else:
            assert out is DropReason.FOREIGN_ENDPOINT
        if out is not None:
            drops[owner[endpoint][0]] = drops.get(owner[endpoint][0], 0) + 1
        snap = store.snapshot(101.0)
        for w, record in workers.items():
            for r, e in enumerate(record.fpm_endpoints):
                view = store.rank_view(w, r, 101.0)
                held = ranks.get((w, r, e)) if owner[e] == (w, r) else None
                assert view.samples == (held[1] if held else 0), (round_no, w, r)
                assert (view.latest.counter_id if view.latest else None) == (held[0] if held else None)
        assert {e: (s.worker_id, s.dp_rank, s.messages) for e, s in snap.endpoints.items()} == seen
        expected_load: dict[str, int] = {}
        for (w, _r, _e), (_, _, ld) in ranks.items():
            expected_load[workers[w].service] = expected_load.get(workers[w].service, 0) + ld
        for service in {rec2.service for rec2 in workers.values()}:
            assert snap.totals.load[service][LoadField.DECODE_REQUESTS] == expected_load.get(service, 0)
        assert {w: sum(per.values()) for w, per in store.drops_by_worker.items()} == drops


def test_plausibility_limits_per_field_and_at_their_edges() -> None:
    limits = FpmLimits(max_requests=10, max_step_tokens=100, max_kv_tokens=1000, max_queued_tokens=50, max_variance=5.0)
    assert limits.bounds() == (10, 100, 5.0, 1000, 10, 1000, 5.0, 10, 50, 5.0, 10)
    at_edge = ForwardPassMetrics(
        worker_id="w",
        dp_rank=0,
        counter_id=2**64 - 1,
        wall_time=3600.0,
        scheduled_requests=ScheduledRequests(num_prefill_requests=10, sum_prefill_tokens=100, var_prefill_length=5.0),
        queued_requests=QueuedRequests(sum_prefill_tokens=50),
    )
    assert limits.violations(at_edge) == ()
    past = ForwardPassMetrics(
        worker_id="w",
        dp_rank=0,
        counter_id=2**64,
        wall_time=3600.5,
        scheduled_requests=ScheduledRequests(sum_prefill_tokens=101, sum_decode_kv_tokens=1001),
        queued_requests=QueuedRequests(sum_prefill_tokens=51, num_decode_requests=11),
    )
    assert limits.violations(past) == (
        "scheduled_requests.sum_prefill_tokens",
        "scheduled_requests.sum_decode_kv_tokens",
        "queued_requests.sum_prefill_tokens",
        "queued_requests.num_decode_requests",
        "wall_time",
        "counter_id",
    )
    assert FpmLimits(max_requests=1).max_requests == 1
    for bad in (0, -1, math.inf, math.nan):
        with pytest.raises(ValueError, match=r"FpmLimits\.max_variance must be a finite number > 0"):
            FpmLimits(max_variance=bad)


@pytest.mark.parametrize(("tolerance", "ok"), [(1, True), (0, False)])
def test_a_restart_tolerance_of_one_is_the_smallest(tolerance: int, ok: bool) -> None:
    if ok:
        assert FleetStore(ttl_s=1.0, restart_tolerance=tolerance).restart_tolerance == 1
    else:
        with pytest.raises(ValueError, match="restart_tolerance >= 1"):
            FleetStore(ttl_s=1.0, restart_tolerance=tolerance)


def test_snapshot_arrays_are_read_only() -> None:
    store = make_store()
    store.ingest(E10, step("w1", 0, 0), 1.0, 1.0)
    totals = store.snapshot(1.0).totals
    for array in (totals.fresh, totals.fresh_ranks, totals.table.dp_size):
        with pytest.raises(ValueError, match="read-only"):
            array[0] = 0
    empty = FleetStore(ttl_s=1.0).snapshot(0.0).totals
    assert empty.fresh_ranks.dtype == np.int64 and empty.fresh_ranks.size == 0

"""FleetStore snapshots, pure: a snapshot is frozen at the instant it was taken, its per-service totals are the
sums of its rank views, and a new discovered set moves state with the ranks it belongs to. Time is passed in."""

from __future__ import annotations

import random

import pytest

from planner.discovery import Role, WorkerRecord, default_endpoints
from planner.ingest.store import FleetSnapshot, FleetStore, LoadField, RankView
from worker_shim import fpm
from worker_shim.fpm import ForwardPassMetrics, QueuedRequests, ScheduledRequests


def worker(worker_id: str, service: str, dp: int, host: str | None = None) -> WorkerRecord:
    role = Role.PREFILL if service.startswith("prefill") else Role.DECODE
    return WorkerRecord(
        worker_id=worker_id,
        role=role,
        service=service,
        dp_size=dp,
        fpm_endpoints=default_endpoints(host or f"host-{worker_id}", dp),
    )


def sample(worker_id: str, rank: int, counter: int, *, load: int = 1) -> ForwardPassMetrics:
    return ForwardPassMetrics(
        worker_id=worker_id,
        dp_rank=rank,
        counter_id=counter,
        wall_time=0.01,
        scheduled_requests=ScheduledRequests(
            num_prefill_requests=load % 3,
            sum_prefill_tokens=100 * load,
            num_decode_requests=load,
            sum_decode_kv_tokens=1000 * load,
        ),
        queued_requests=QueuedRequests(
            num_prefill_requests=load % 2, sum_prefill_tokens=7 * load, num_decode_requests=load % 5
        ),
    )


def views(snapshot: FleetSnapshot) -> dict[tuple[str, int], RankView]:
    return {key: snapshot.ranks[key] for key in snapshot.ranks}


def test_a_snapshot_does_not_change_when_samples_arrive_after_it() -> None:
    store = FleetStore(ttl_s=5.0, window_size=4)
    a, b = worker("a", "decode", 2), worker("b", "prefill", 1)
    store.set_workers({"a": a, "b": b})
    store.ingest(a.fpm_endpoints[0], sample("a", 0, 10, load=3), 100.0, 100.0)
    store.ingest(b.fpm_endpoints[0], sample("", 0, 1), 100.0, 100.0)  # b's endpoint publishes under ""
    snap = store.snapshot(101.0)
    before = views(snap)
    endpoints_before = {e: snap.endpoints[e] for e in snap.endpoints}
    totals_before = dict(snap.totals.load)
    fresh_before = snap.totals.fresh.tolist()

    store.ingest(a.fpm_endpoints[0], sample("a", 0, 15, load=9), 101.0, 101.0)  # a gap of 4
    store.ingest(a.fpm_endpoints[0], sample("a", 0, 0, load=5), 101.5, 101.5)  # a restart
    store.ingest(a.fpm_endpoints[0], fpm.heartbeat("a", 0, 1), 101.6, 101.6)
    store.ingest(a.fpm_endpoints[1], sample("a", 1, 1, load=2), 101.7, 101.7)  # never heard before the snapshot
    store.ingest(b.fpm_endpoints[0], sample("b", 0, 2, load=4), 101.8, 101.8)  # b's identity synced
    store.set_workers({"b": b})  # and a departs

    assert views(snap) == before
    assert before[("a", 0)].latest == sample("a", 0, 10, load=3) and before[("a", 0)].samples == 1
    assert (before[("a", 0)].restarts, before[("a", 0)].gaps, before[("a", 1)].age_s) == (0, 0, None)
    assert {e: snap.endpoints[e] for e in snap.endpoints} == endpoints_before
    assert snap.endpoints[b.fpm_endpoints[0]].worker_id == ""
    assert dict(snap.totals.load) == totals_before
    assert snap.totals.fresh.tolist() == fresh_before
    # the store itself moved on
    later = store.snapshot(102.0)
    assert ("a", 0) not in later.ranks and later.ranks[("b", 0)].samples == 1


def test_totals_are_the_sums_of_the_rank_views() -> None:
    """A random fleet (services interleaved in discovery order, ranks fresh, stale, heartbeating or never heard):
    the per-service totals and per-worker fresh counts equal sums over the rank views, brute force."""
    rng = random.Random(4)
    services = ["prefill", "decode", "decode-b"]
    workers = {f"w{i}": worker(f"w{i}", rng.choice(services), rng.randint(1, 4), host=f"10.0.0.{i}") for i in range(40)}
    store = FleetStore(ttl_s=10.0, window_size=4)
    store.set_workers(workers)
    counter = 0
    for wid, record in workers.items():
        for rank, endpoint in enumerate(record.fpm_endpoints):
            counter += 1
            at = rng.choice([None, 99.0, 95.0, 90.0, 89.9, 70.0])  # TTL 10 s at now=100: fresh down to 90.0
            if at is None:
                continue
            if rng.random() < 0.2:
                store.ingest(endpoint, fpm.heartbeat(wid, rank, counter), at, at)
            else:
                store.ingest(endpoint, sample(wid, rank, counter, load=rng.randint(0, 500)), at, at)
    snap = store.snapshot(100.0)
    rank_views = list(snap.ranks.values())
    assert {v.fresh for v in rank_views} == {True, False}

    for service in services:
        fresh = [v.latest for v in rank_views if v.fresh and workers[v.worker_id].service == service]
        expected = (
            sum(s.queued_requests.sum_prefill_tokens for s in fresh if s),
            sum(s.scheduled_requests.sum_prefill_tokens for s in fresh if s),
            sum(s.scheduled_requests.num_decode_requests for s in fresh if s),
            sum(s.queued_requests.num_decode_requests for s in fresh if s),
            sum(s.scheduled_requests.sum_decode_kv_tokens for s in fresh if s),
            sum(s.scheduled_requests.num_prefill_requests + s.queued_requests.num_prefill_requests for s in fresh if s),
        )
        assert snap.totals.load[service] == expected
        assert all(type(x) is int for x in snap.totals.load[service])
    table = snap.totals.table
    for index, wid in enumerate(table.worker_ids):
        assert snap.totals.fresh_ranks[index] == sum(v.fresh for v in rank_views if v.worker_id == wid)
    assert snap.totals.load[services[0]][LoadField.DECODE_REQUESTS] > 0


def test_ranks_iterate_in_discovery_order_and_answer_only_for_discovered_ranks() -> None:
    store = FleetStore()
    workers = {"d1": worker("d1", "decode", 2), "p1": worker("p1", "prefill", 1), "d2": worker("d2", "decode", 1)}
    store.set_workers(workers)  # services interleave: d1, p1, d2
    snap = store.snapshot(0.0)
    assert list(snap.ranks) == [("d1", 0), ("d1", 1), ("p1", 0), ("d2", 0)]
    assert len(snap.ranks) == 4 and [v.worker_id for v in snap.ranks.values()] == ["d1", "d1", "p1", "d2"]
    for key in [("d1", 2), ("d1", -1), ("nobody", 0), "d1", ("d1",), ("d1", 0, 0)]:
        assert key not in snap.ranks
        assert snap.ranks.get(key) is None  # type: ignore[call-overload]
    with pytest.raises(KeyError):
        snap.ranks[("p1", 1)]
    view = snap.ranks[("d1", 1)]
    assert (view.endpoint, view.fresh, view.age_s, view.samples) == (workers["d1"].fpm_endpoints[1], False, None, 0)


def test_a_new_discovered_set_moves_state_with_its_ranks() -> None:
    """Adding a worker ahead of others in the slot order, moving a rank to a new endpoint, removing workers and
    giving an endpoint to another worker: a rank keeps its state and window while it keeps its endpoint, an
    endpoint keeps what it last published under, and iter_windows keeps the order ranks were first heard in."""
    store = FleetStore(ttl_s=10.0, window_size=8)
    d1, d2, p1 = worker("d1", "decode", 2), worker("d2", "decode", 1), worker("p1", "prefill", 1)
    store.set_workers({"d1": d1, "d2": d2, "p1": p1})
    store.ingest(p1.fpm_endpoints[0], sample("p1", 0, 1, load=5), 1.0, 1.0)
    store.ingest(d2.fpm_endpoints[0], sample("d2", 0, 100, load=2), 1.0, 1.0)
    store.ingest(d1.fpm_endpoints[1], sample("d1", 1, 5, load=3), 2.0, 2.0)
    store.ingest(d1.fpm_endpoints[1], sample("d1", 1, 9, load=4), 3.0, 3.0)  # a gap of 3
    store.ingest(d1.fpm_endpoints[0], sample("", 0, 1), 3.0, 3.0)  # d1 rank 0's endpoint: unsynced
    store.note_disconnect(d2.fpm_endpoints[0])
    before = views(store.snapshot(4.0))

    d0 = worker("d0", "decode", 3)
    p2 = WorkerRecord(  # takes over d1's rank-0 endpoint
        worker_id="p2", role=Role.PREFILL, service="prefill", dp_size=1, fpm_endpoints=(d1.fpm_endpoints[0],)
    )
    d1_moved = WorkerRecord(  # rank 1 now publishes elsewhere
        worker_id="d1", role=Role.DECODE, service="decode", dp_size=2, fpm_endpoints=(d1.fpm_endpoints[0], "tcp://x:1")
    )
    store.set_workers({"d0": d0, "d2": d2, "d1": d1_moved, "p1": p1})  # d0 takes the first slots
    after = views(store.snapshot(4.0))
    for key in [("d2", 0), ("d1", 0), ("p1", 0)]:
        assert after[key] == before[key]
    assert after[("d1", 1)].age_s is None and after[("d1", 1)].endpoint == "tcp://x:1"  # a new rank: new state
    assert after[("d0", 2)].age_s is None
    assert [key for key, _ in store.iter_windows()] == [("p1", 0), ("d2", 0)]  # as first heard
    assert store.window("d1", 1) == ()
    # The disconnect was kept: a small step back after it is a new run, not a replay.
    assert store.ingest(d2.fpm_endpoints[0], sample("d2", 0, 90), 5.0, 5.0) is None
    assert store.rank_view("d2", 0, 5.0).restarts == 1

    store.set_workers({"d0": d0, "p2": p2, "p1": p1})  # d1 and d2 depart; p2 now lists d1's old endpoint
    snap = store.snapshot(5.0)
    assert snap.ranks[("p2", 0)].age_s is None  # a rank's state does not follow its endpoint to another worker
    assert snap.endpoints[p2.fpm_endpoints[0]].worker_id == ""  # what the endpoint published under does
    assert [key for key, _ in store.iter_windows()] == [("p1", 0)]
    assert snap.totals.load["prefill"][LoadField.SCHEDULED_PREFILL_TOKENS] == 500


def test_a_snapshot_of_an_empty_store() -> None:
    snap = FleetStore().snapshot(1.0)
    assert len(snap.ranks) == 0 and list(snap.endpoints) == [] and dict(snap.totals.load) == {}
    assert snap.totals.fresh_ranks.tolist() == []

"""FleetStore, pure: what is kept, what is dropped and why, restarts, gaps, freshness. Time is passed in."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import msgpack
import pytest

from planner.discovery import WorkerRecord, default_endpoints
from planner.ingest.store import DropReason, FleetStore
from worker_shim import fpm
from worker_shim.fpm import ForwardPassMetrics, ScheduledRequests

W1 = WorkerRecord(
    worker_id="w1", role="decode", service="decode", dp_size=2, fpm_endpoints=default_endpoints("10.0.0.1", 2)
)
W2 = WorkerRecord(
    worker_id="w2", role="prefill", service="prefill", dp_size=1, fpm_endpoints=default_endpoints("10.0.0.2", 1)
)
E10, E11 = W1.fpm_endpoints
E20 = W2.fpm_endpoints[0]


def step(worker_id: str, dp_rank: int, counter: int, wall_time: float = 0.01) -> ForwardPassMetrics:
    return ForwardPassMetrics(
        worker_id=worker_id,
        dp_rank=dp_rank,
        counter_id=counter,
        wall_time=wall_time,
        scheduled_requests=ScheduledRequests(num_decode_requests=3, sum_decode_kv_tokens=300),
    )


@pytest.fixture()
def store() -> FleetStore:
    s = FleetStore(ttl_s=5.0, window_size=4)
    s.set_workers({"w1": W1, "w2": W2})
    return s


@dataclass
class Row:
    name: str
    endpoint: str
    sample: ForwardPassMetrics
    expected: DropReason | None
    received_at: float = 100.0
    now: float = 100.0
    before: list[tuple[str, ForwardPassMetrics]] = field(default_factory=list)


ROWS = [
    Row("a registered worker's sample on its own endpoint is kept", E10, step("w1", 0, 0), None),
    Row("each rank on its own endpoint is kept", E11, step("w1", 1, 0), None),
    Row("an id nobody registered is dropped as unknown", E10, step("stranger", 0, 0), DropReason.UNKNOWN_WORKER),
    Row("the empty id (identity never synced) is dropped", E10, step("", 0, 0), DropReason.EMPTY_WORKER_ID),
    Row("a known id on another worker's endpoint is dropped", E20, step("w1", 0, 0), DropReason.FOREIGN_ENDPOINT),
    Row(
        "a rank arriving on its sibling rank's endpoint is dropped", E10, step("w1", 1, 0), DropReason.FOREIGN_ENDPOINT
    ),
    Row("a rank beyond dp_size is invalid", E10, step("w1", 2, 0), DropReason.INVALID_VALUE),
    Row("a NaN step time is invalid", E10, step("w1", 0, 0, wall_time=math.nan), DropReason.INVALID_VALUE),
    Row(
        "a negative count is invalid",
        E10,
        ForwardPassMetrics(
            worker_id="w1",
            dp_rank=0,
            counter_id=0,
            wall_time=0.01,
            scheduled_requests=ScheduledRequests(sum_prefill_tokens=-5),
        ),
        DropReason.INVALID_VALUE,
    ),
    Row(
        "a sample held past the TTL before storing is stale",
        E10,
        step("w1", 0, 0),
        DropReason.STALE,
        received_at=90.0,
        now=100.0,
    ),
    Row(
        "a repeated counter is out of order",
        E10,
        step("w1", 0, 500),
        DropReason.OUT_OF_ORDER,
        before=[(E10, step("w1", 0, 500))],
    ),
    Row(
        "a counter slightly behind the last is out of order",
        E10,
        step("w1", 0, 490),
        DropReason.OUT_OF_ORDER,
        before=[(E10, step("w1", 0, 500))],
    ),
    Row(
        "a counter back near zero is a publisher restart, kept",
        E10,
        step("w1", 0, 3),
        None,
        before=[(E10, step("w1", 0, 500))],
    ),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_ingest(store: FleetStore, row: Row) -> None:
    for endpoint, earlier in row.before:
        assert store.ingest(endpoint, earlier, row.received_at, row.now) is None
    before = dict(store.drops)
    assert store.ingest(row.endpoint, row.sample, row.received_at, row.now) == row.expected
    delta = {r: store.drops[r] - before[r] for r in DropReason if store.drops[r] != before[r]}
    assert delta == ({} if row.expected is None else {row.expected: 1})


def test_raw_frames_that_are_not_fpm_are_dropped_by_reason(store: FleetStore) -> None:
    good = list(fpm.frames(step("w1", 0, 0)))
    assert store.ingest_frames(E10, good, 1.0, 1.0) is None
    assert store.ingest_frames(E10, good[:2], 1.0, 1.0) is DropReason.BAD_FRAME
    assert store.ingest_frames(E10, [b"", b"\x00" * 3, good[2]], 1.0, 1.0) is DropReason.BAD_FRAME
    assert store.ingest_frames(E10, [b"", good[1], b"\xc1garbage"], 1.0, 1.0) is DropReason.DECODE_ERROR
    nan = msgpack.packb({"worker_id": "w1", "dp_rank": 0, "counter_id": 1, "wall_time": float("nan")})
    assert store.ingest_frames(E10, [b"", good[1], nan], 1.0, 1.0) is DropReason.INVALID_VALUE
    assert store.drops[DropReason.BAD_FRAME] == 2
    assert store.drops_by_worker["w1"] == {
        DropReason.BAD_FRAME: 2,
        DropReason.DECODE_ERROR: 1,
        DropReason.INVALID_VALUE: 1,
    }


def test_a_publisher_restart_is_counted_not_taken_for_lost_samples(store: FleetStore) -> None:
    for counter in range(1000, 1010):
        store.ingest(E10, step("w1", 0, counter), 1.0, 1.0)
    store.ingest(E10, step("w1", 0, 0), 2.0, 2.0)
    store.ingest(E10, step("w1", 0, 1), 2.0, 2.0)
    view = store.rank_view("w1", 0, 2.0)
    assert (view.restarts, view.gaps, view.lost_samples) == (1, 0, 0)
    assert view.samples == 12


def test_gaps_count_the_samples_lost_between(store: FleetStore) -> None:
    for counter in (0, 1, 5, 6, 10):
        store.ingest(E10, step("w1", 0, counter), 1.0, 1.0)
    view = store.rank_view("w1", 0, 1.0)
    assert (view.gaps, view.lost_samples, view.restarts) == (2, 6, 0)


def test_a_disconnect_followed_by_the_same_run_is_a_gap_never_oversized(store: FleetStore) -> None:
    """A plain reset is not ``oversized`` (only the subscriber, seeing libzmq give up, counts that)."""
    store.ingest(E10, step("w1", 0, 10), 1.0, 1.0)
    store.note_disconnect(E10)
    store.ingest(E10, step("w1", 0, 12), 2.0, 2.0)  # same publisher run carried on after the reconnect
    store.note_disconnect(E10)
    store.ingest(E10, step("w1", 0, 0), 3.0, 3.0)  # a restart explains this disconnect
    assert store.drops[DropReason.OVERSIZED] == 0
    view = store.rank_view("w1", 0, 3.0)
    assert (view.restarts, view.gaps, view.lost_samples) == (1, 1, 1)


def test_the_window_is_bounded_and_holds_only_step_samples(store: FleetStore) -> None:
    for counter in range(10):
        store.ingest(E10, step("w1", 0, counter), float(counter), float(counter))
    store.ingest(E10, fpm.heartbeat("w1", 0, 10), 10.0, 10.0)
    window = store.window("w1", 0)
    assert [s.counter_id for _, s in window] == [6, 7, 8, 9]
    view = store.rank_view("w1", 0, 10.0)
    assert view.latest is not None and view.latest.is_heartbeat
    assert view.last_active is not None and view.last_active.counter_id == 9
    assert (view.samples, view.heartbeats) == (10, 1)


def test_freshness_follows_the_ttl_and_heartbeats_keep_a_rank_fresh(store: FleetStore) -> None:
    store.ingest(E10, step("w1", 0, 0), 100.0, 100.0)
    store.ingest(E10, fpm.heartbeat("w1", 0, 1), 108.0, 108.0)
    snap = store.snapshot(now=110.0)
    rank0, rank1 = snap.ranks[("w1", 0)], snap.ranks[("w1", 1)]
    assert rank0.fresh and rank0.age_s == pytest.approx(2.0) and rank0.active_age_s == pytest.approx(10.0)
    assert not rank1.fresh and rank1.age_s is None  # never heard from, still listed
    assert not store.snapshot(now=113.5).ranks[("w1", 0)].fresh
    assert set(snap.ranks) == {("w1", 0), ("w1", 1), ("w2", 0)}


def test_endpoints_remember_the_id_they_publish_under(store: FleetStore) -> None:
    store.ingest(E20, step("", 0, 0), 5.0, 5.0)
    seen = store.snapshot(5.0).endpoints[E20]
    assert (seen.worker_id, seen.dp_rank, seen.messages) == ("", 0, 1)
    store.ingest(E20, step("w2", 0, 1), 6.0, 6.0)
    assert store.snapshot(6.0).endpoints[E20].worker_id == "w2"


def test_a_departed_worker_is_forgotten_and_its_samples_then_dropped(store: FleetStore) -> None:
    store.ingest(E20, step("w2", 0, 0), 1.0, 1.0)
    store.set_workers({"w1": W1})
    assert store.ingest(E20, step("w2", 0, 1), 2.0, 2.0) is DropReason.UNKNOWN_WORKER
    snap = store.snapshot(2.0)
    assert ("w2", 0) not in snap.ranks and E20 not in snap.endpoints and "w2" not in snap.drops_by_worker
    assert store.window("w2", 0) == ()


def test_memory_is_bounded_by_the_window_not_by_run_length() -> None:
    store = FleetStore(ttl_s=5.0, window_size=8)
    store.set_workers({"w1": W1})
    for counter in range(20_000):
        store.ingest(E10, step("w1", 0, counter), 1.0, 1.0)
        store.ingest(E10, step("nobody", 0, counter), 1.0, 1.0)
    assert len(store.window("w1", 0)) == 8
    assert len(list(store.iter_windows())) == 1
    assert store.drops[DropReason.UNKNOWN_WORKER] == 20_000


def test_rejects_nonsense_configuration() -> None:
    with pytest.raises(ValueError, match="ttl_s"):
        FleetStore(ttl_s=0)


def test_after_a_disconnect_any_step_back_is_a_restart_not_a_replay(store: FleetStore) -> None:
    store.ingest(E10, step("w1", 0, 150), 1.0, 1.0)
    store.note_disconnect(E10)
    # The new run's first messages were lost to the reconnect: it arrives at 100, "just behind" the old 150.
    assert store.ingest(E10, step("w1", 0, 100), 2.0, 2.0) is None
    view = store.rank_view("w1", 0, 2.0)
    assert (view.restarts, view.gaps) == (1, 0)
    assert store.drops[DropReason.OVERSIZED] == 0

"""What sharded ingest carries besides the summaries' totals, pure parts: the per-rank counters the diagnostics
show (in the summaries), the perf-model training points (picked, encoded, attributed, learned from) and the
planner's FPM limits (in the membership). The NATS path is in ``tests/service/test_service_sharded_feeds.py``."""

from __future__ import annotations

import re
import threading

import msgspec
import pytest

from perf_model.model import PerfModel
from planner.discovery import Role, WorkerRecord
from planner.ingest.drops import DropReason, FpmLimits
from planner.ingest.store import FleetStore
from planner.service.config import PerfModelSettings
from planner.service.perf_feed import PerfFeed
from planner.shard import feeds_bench
from planner.shard.membership import MembershipAssembler, decode_membership, membership_parts
from planner.shard.merge import SummaryMerger
from planner.shard.partition import partition
from planner.shard.perf_points import (
    PerfPoint,
    PointPicker,
    attribute,
    decode_perf_points,
    encode_perf_points,
)
from planner.shard.summary import decode_summary, encode_summary, summarize
from tests.planner.test_shard_merge import T0, fleet, sample
from worker_shim.fpm import ForwardPassMetrics, ScheduledRequests


def _feed_counted(stores: dict[str, FleetStore], workers: dict[str, WorkerRecord]) -> None:
    """Every rank publishes a few steps and a heartbeat; w1's rank 2 skips a counter (a gap), w2's rank 0
    restarts (its counter goes back), w3's rank 3 is never heard."""
    for i, (wid, record) in enumerate(workers.items()):
        for rank, endpoint in enumerate(record.fpm_endpoints):
            if (wid, rank) == ("w3", 3):
                continue
            counters = [1, 2, 3 + i]
            if (wid, rank) == ("w1", 2):
                counters = [1, 2, 5, 6]
            if (wid, rank) == ("w2", 0):
                counters = [100, 101, 1, 2]
            for n, counter in enumerate(counters):
                at = n * 0.5
                for store in stores.values():
                    store.ingest(endpoint, sample(wid, rank, counter, 10 + rank), at, at)
            beat = ForwardPassMetrics(worker_id=wid, dp_rank=rank, counter_id=counters[-1] + 1, wall_time=0.0)
            for store in stores.values():
                store.ingest(endpoint, beat, 2.5, 2.5)


def test_the_merged_ranks_show_the_counters_each_shard_counted() -> None:
    workers = fleet(8)
    owners = partition(workers, ["a", "b"])
    stores = {s: FleetStore() for s in owners}
    for s, owned in owners.items():
        stores[s].set_workers({w: workers[w] for w in owned})
    _feed_counted(stores, workers)
    merger = SummaryMerger()
    merger.set_workers(workers)
    for s, store in stores.items():
        merger.update(decode_summary(encode_summary(summarize(s, 1, store.snapshot(3.0), T0, 0))))
    merged = merger.snapshot(T0 + 0.25).ranks  # a quarter second after the summaries
    checked = 0
    for s, owned in owners.items():
        for wid in owned:
            for rank in range(workers[wid].dp_size):
                want = stores[s].rank_view(wid, rank, 3.0)
                got = merged[(wid, rank)]
                counts = (got.samples, got.heartbeats, got.restarts, got.gaps, got.lost_samples)
                assert counts == (want.samples, want.heartbeats, want.restarts, want.gaps, want.lost_samples)
                if want.age_s is None:
                    assert got.age_s is None and got.active_age_s is None
                else:
                    assert got.age_s == pytest.approx(want.age_s + 0.25, abs=1e-3)
                    assert got.active_age_s == pytest.approx((want.active_age_s or 0.0) + 0.25, abs=1e-3)
                checked += 1
    assert checked == 32
    assert merged[("w1", 2)].lost_samples == 2 and merged[("w2", 0)].restarts == 1
    assert merged[("w0", 0)].samples == 3 and merged[("w0", 0)].heartbeats == 1


def test_a_shard_with_more_ranks_than_a_summary_carries_covers_them_all_in_turn() -> None:
    workers = fleet(5, dp=2)  # ten ranks, three a summary: every rank within four summaries
    store = FleetStore()
    store.set_workers(workers)
    _feed_counted({"a": store}, workers)
    merger = SummaryMerger()
    merger.set_workers(workers)
    covered: list[int] = []
    for seq in range(1, 5):
        summary = decode_summary(
            encode_summary(summarize("a", seq, store.snapshot(3.0), T0, 0, rank_stats_per_summary=3))
        )
        assert len(summary.rank_stats) == 3 * 24
        merger.update(summary)
        ranks = merger.snapshot(T0).ranks
        covered.append(sum(1 for key in ranks if ranks[key].samples > 0))
    assert covered == [3, 6, 9, 10]


def test_a_summary_whose_rank_counters_do_not_fit_its_ranks_is_refused() -> None:
    workers = fleet(2, dp=2)
    store = FleetStore()
    store.set_workers(workers)
    summary = summarize("a", 1, store.snapshot(0.0), T0, 0)
    bad = msgspec.structs.replace(summary, rank_stats=summary.rank_stats + b"\0" * 24)
    with pytest.raises(ValueError, match="rank_stats do not fit its 4 ranks"):
        decode_summary(encode_summary(bad))


def _steps(store: FleetStore, workers: dict[str, WorkerRecord], steps: int, t0: float) -> None:
    """Every rank steps ``steps`` times (a decode load varying over a 64x range), 10 ms apart from ``t0``."""
    for n in range(steps):
        for i, (wid, record) in enumerate(workers.items()):
            for rank, endpoint in enumerate(record.fpm_endpoints):
                counter = int(t0 * 100) + n + 1
                load = 1 + (counter * 7 + i + rank) % 64
                scheduled = (
                    ScheduledRequests(num_prefill_requests=1, sum_prefill_tokens=64 * load)
                    if record.role is Role.PREFILL
                    else ScheduledRequests(num_decode_requests=load, sum_decode_kv_tokens=1000 * load)
                )
                s = ForwardPassMetrics(
                    worker_id=wid,
                    dp_rank=rank,
                    counter_id=counter,
                    wall_time=0.005 + 0.0002 * load,
                    scheduled_requests=scheduled,
                )
                at = t0 + n * 0.01
                store.ingest(endpoint, s, at, at)


def test_a_shard_sends_at_most_its_share_of_the_rate_split_over_roles_and_visits_every_rank() -> None:
    workers = fleet(40, dp=4)  # 160 ranks, 40 of them prefill: far more ranks than one second's budget
    store = FleetStore(window_size=64)
    store.set_workers(workers)
    picker = PointPicker()
    lock = threading.Lock()
    seen: set[tuple[str, int]] = set()
    sent: list[int] = []
    for second in range(12):
        _steps(store, workers, 20, float(second))
        points = picker.pick(store, lock, workers, rate_per_s=200.0, shards=4, now=float(second))
        sent.append(len(points))
        roles = [workers[p.worker_id].role for p in points]
        if points:
            assert abs(roles.count(Role.PREFILL) - roles.count(Role.DECODE)) <= 1  # the budget split over roles
        seen.update((p.worker_id, p.dp_rank) for p in points)
        by_rank: dict[tuple[str, int], list[int]] = {}
        for p in points:
            by_rank.setdefault((p.worker_id, p.dp_rank), []).append(p.counter_id)
        assert [c for c in by_rank.values() if c != sorted(c)] == []  # publishing order within a rank
    assert sent == [0] + [50] * 11  # 200/s over 4 shards: 50 a second, whatever the fleet's size
    assert len(seen) == 160  # every rank in turn
    now = 12.0
    while picker.pick(store, lock, workers, rate_per_s=200.0, shards=4, now=now):  # the ranks not visited yet
        now += 1.0
        assert now < 30
    assert picker.pick(store, lock, workers, rate_per_s=200.0, shards=4, now=now + 10) == []  # nothing new
    _steps(store, workers, 20, 100.0)
    burst = picker.pick(store, lock, workers, rate_per_s=200.0, shards=4, now=now + 10.5)
    assert len(burst) == 100  # a burst of at most 2 s of the share


def test_points_round_trip_in_messages_under_the_payload_cap_and_only_members_are_attributed() -> None:
    workers = fleet(4, dp=2)
    points = [
        PerfPoint.of(
            ForwardPassMetrics(
                worker_id=f"w{i % 4}",
                dp_rank=i % 2,
                counter_id=i,
                wall_time=0.01 + i * 1e-6,
                scheduled_requests=ScheduledRequests(num_decode_requests=i % 50 + 1, sum_decode_kv_tokens=i * 1000),
            )
        )
        for i in range(3000)
    ]
    points.append(PerfPoint("ghost", 0, 1, 0.01, points[0].scheduled))  # not a member
    points.append(PerfPoint("w1", 2, 1, 0.01, points[0].scheduled))  # a rank beyond w1's DP size
    payloads = encode_perf_points("a", 1, points)
    assert len(payloads) > 1 and max(map(len, payloads)) < 48 * 1024 + 256 < 64 * 1024
    decoded = [p for payload in payloads for p in decode_perf_points(payload).points]
    assert decoded == points
    by_role, refused = attribute(decoded, workers)
    assert refused == 2
    assert sum(map(len, by_role.values())) == 3000
    for role, samples in by_role.items():
        assert samples and [s for s in samples if workers[s.worker_id].role is not role] == []
    first = by_role[workers["w1"].role][0]
    assert type(first.scheduled_requests.num_decode_requests) is int and not first.is_heartbeat
    with pytest.raises(ValueError, match="unsupported shard perf points version 2"):
        decode_perf_points(msgspec.msgpack.encode({"version": 2, "shard_id": "a", "seq": 1, "points": []}))
    with pytest.raises(ValueError, match="is malformed"):
        decode_perf_points(msgspec.msgpack.encode({"shard_id": "a", "seq": 1, "points": [["w0", 0, 1, 0.1, [1]]]}))


def test_the_leaders_perf_models_become_live_ready_on_the_points_a_shard_forwards() -> None:
    workers = fleet(8, dp=2)
    store = FleetStore(window_size=256)
    store.set_workers(workers)
    picker = PointPicker()
    perf = PerfFeed(PerfModelSettings())
    lock = threading.Lock()
    for second in range(80):  # virtual seconds: the models refit every 30 s
        _steps(store, workers, 50, float(second))
        points = picker.pick(store, lock, workers, rate_per_s=64.0, shards=2, now=float(second))
        by_role, refused = attribute(
            [p for payload in encode_perf_points("a", second, points) for p in decode_perf_points(payload).points],
            workers,
        )
        assert refused == 0
        perf.observe(by_role, float(second))
    roles = perf.brief()["roles"]
    for role in (Role.PREFILL, Role.DECODE):
        model = perf.models[role]
        assert isinstance(model, PerfModel)
        assert roles[role.value]["live_ready"], roles[role.value]["not_ready_because"]
        assert roles[role.value]["offered"] <= 80 * 32 // 2 + 1  # at most the shard's share of the rate


def test_the_membership_carries_the_planners_limits_and_the_points_rate_to_the_shards() -> None:
    limits = FpmLimits(max_requests=5)
    parts = membership_parts(
        leader="l",
        seq=1,
        taken_at=T0,
        shards=["a"],
        workers=fleet(300),
        max_part_bytes=4096,
        limits=limits,
        perf_points_per_s=128.0,
    )
    assert len(parts) > 1
    assembler = MembershipAssembler()
    for payload in parts:
        assembler.add(decode_membership(payload))
    assert assembler.limits == limits and assembler.perf_points_per_s == 128.0
    store = FleetStore()
    workers = fleet(1)
    store.set_workers(workers)
    endpoint = workers["w0"].fpm_endpoints[0]
    assert store.ingest(endpoint, sample("w0", 0, 1, 6), 0.0, 0.0) is None
    store.set_limits(assembler.limits)
    assert store.ingest(endpoint, sample("w0", 0, 2, 6), 0.1, 0.1) is DropReason.INVALID_VALUE
    bad = msgspec.msgpack.encode(
        {"leader": "l", "seq": 1, "taken_at": T0, "shards": ["a"], "limits": {"max_requests": 0}}
    )
    with pytest.raises(ValueError, match="max_requests must be a finite number > 0"):
        decode_membership(bad)


def test_the_feeds_bench_prints_the_summary_size_and_the_points_figures(capsys: pytest.CaptureFixture[str]) -> None:
    assert feeds_bench.main(["--workers", "8", "--dp", "2", "--rate", "64", "--shards", "2", "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    sizes = re.search(r"summary of 16 ranks: (\d+) bytes without rank counters, (\d+) with \(16 ranks a summary\)", out)
    assert sizes is not None, out
    assert int(sizes.group(2)) - int(sizes.group(1)) >= 16 * 24
    assert re.search(r"leader CPU to merge one summary \(counters kept per slot\): \d+ us", out), out
    points = re.search(
        r"perf points: 64/s over 2 shards: (\d+) a second from this shard, (\d+) bytes in 1 message", out
    )
    assert points is not None and int(points.group(1)) == 32 and int(points.group(2)) > 0, out

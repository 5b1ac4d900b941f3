"""Sharded ingest, pure parts: rendezvous partitions, shard summaries, and the leader's merge, checked against
one unsharded FleetStore fed the same samples (the decision core must decide the same on either)."""

from __future__ import annotations

from collections import Counter

import msgspec
import pytest

from planner.core import CoreConfig, CoreState, DeploymentStatus, Observation, RoleConfig, step
from planner.core.decision import WorkerStatus
from planner.discovery import Role, WorkerRecord
from planner.ingest.store import DropReason, FleetStore
from planner.shard.merge import SummaryMerger
from planner.shard.partition import owner, partition
from planner.shard.summary import SUMMARY_VERSION, decode_summary, encode_summary, summarize
from worker_shim.fpm import ForwardPassMetrics, QueuedRequests, ScheduledRequests

T0 = 1_700_000_000.0  # wall clock, as the shards stamp summaries


def fleet(n: int, dp: int = 4) -> dict[str, WorkerRecord]:
    out = {}
    for i in range(n):
        role = Role.PREFILL if i % 4 == 0 else Role.DECODE
        out[f"w{i}"] = WorkerRecord(
            worker_id=f"w{i}",
            role=role,
            service=role.value,
            dp_size=dp,
            fpm_endpoints=tuple(f"tcp://10.0.{i}.1:{20380 + r}" for r in range(dp)),
        )
    return out


def sample(wid: str, rank: int, counter: int, load: int) -> ForwardPassMetrics:
    return ForwardPassMetrics(
        worker_id=wid,
        dp_rank=rank,
        counter_id=counter,
        wall_time=0.02,
        scheduled_requests=ScheduledRequests(num_decode_requests=load, sum_decode_kv_tokens=100 * load),
        queued_requests=QueuedRequests(num_prefill_requests=load % 3, sum_prefill_tokens=50 * load),
    )


def feed(stores: dict[str, FleetStore], route: dict[str, str], workers: dict[str, WorkerRecord], at: float) -> None:
    """Every rank of every worker publishes; worker w3's rank 1 is silent and w5 publishes under ''."""
    for i, (wid, record) in enumerate(workers.items()):
        for rank, endpoint in enumerate(record.fpm_endpoints):
            if wid == "w3" and rank == 1:
                continue
            s = sample("" if wid == "w5" else wid, rank, 1, 10 + i + rank)
            for name, store in stores.items():
                if route.get(wid, name) == name:
                    store.ingest(endpoint, s, at, at)


def test_rendezvous_moves_only_the_workers_of_the_shard_that_came_or_went() -> None:
    ids = [f"pod-{i}" for i in range(2000)]
    two = {w: owner(w, ["a", "b"]) for w in ids}
    three = {w: owner(w, ["b", "c", "a"]) for w in ids}  # order of shard ids does not matter
    moved = [w for w in ids if two[w] != three[w]]
    assert 500 < len(moved) < 850  # about a third
    assert all(three[w] == "c" for w in moved)  # a newcomer takes workers, nobody else swaps
    assert {w: owner(w, ["a", "b"]) for w in ids} == two  # stable
    counts = Counter(two.values())
    assert abs(counts["a"] - counts["b"]) < 200
    parts = partition(ids, ["a", "b"])
    assert sorted(parts["a"] + parts["b"]) == sorted(ids)
    with pytest.raises(ValueError):
        owner("x", [])


def test_merged_summaries_give_the_decision_core_what_one_store_gives_it() -> None:
    workers = fleet(24)
    whole = FleetStore(ttl_s=10.0)
    whole.set_workers(workers)
    shard_ids = ["s0", "s1", "s2"]
    parts = partition(workers, shard_ids)
    route = {wid: shard for shard, ids in parts.items() for wid in ids}
    shards = {s: FleetStore(ttl_s=10.0) for s in shard_ids}
    for s, store in shards.items():
        store.set_workers({wid: workers[wid] for wid in parts[s]})
    feed({"whole": whole}, {}, workers, T0)
    feed(shards, route, workers, T0)
    merger = SummaryMerger(ttl_s=10.0, max_summary_age_s=5.0)
    merger.set_workers(workers)
    for seq, (s, store) in enumerate(shards.items()):
        wire = encode_summary(summarize(s, seq, store.snapshot(T0 + 1), T0 + 1, received=0))
        assert merger.update(decode_summary(wire))
    merged = merger.snapshot(T0 + 2)
    direct = whole.snapshot(T0 + 2)
    assert merged.totals.fresh.tolist() == direct.totals.fresh.tolist()
    assert merged.totals.fresh_ranks.tolist() == direct.totals.fresh_ranks.tolist()
    assert merged.totals.load == direct.totals.load
    assert merged.drops[DropReason.EMPTY_WORKER_ID] == direct.drops[DropReason.EMPTY_WORKER_ID] == 4
    assert merged.drops_by_worker == direct.drops_by_worker
    assert len(merged.ranks) == len(direct.ranks) and merged.ranks[("w3", 1)].fresh is False

    roles = {role: RoleConfig(min_replicas=1, max_replicas=100) for role in Role}
    config = CoreConfig(roles=roles)
    deployments = {
        "prefill": DeploymentStatus(service="prefill", desired=6, ready=6),
        "decode": DeploymentStatus(service="decode", desired=18, ready=18),
    }
    decide = [
        step(CoreState(), Observation(workers=workers, fleet=snap, deployments=deployments), T0 + 2, config)[1]
        for snap in (direct, merged)
    ]
    strip = [
        [msgspec.structs.replace(d, stages=(), summary="") for d in decisions] for decisions in decide
    ]  # same numbers and reasons; the wording of a summary may name workers in another order
    assert strip[0] == strip[1]
    unsynced = [
        p.worker_id for d in decide[1] for p in d.coverage.problems if p.status is WorkerStatus.IDENTITY_NOT_SYNCED
    ]
    assert unsynced == ["w5"]


def test_a_stale_summary_counts_its_workers_not_fresh_and_an_older_one_is_refused() -> None:
    workers = fleet(8)
    store = FleetStore(ttl_s=10.0)
    store.set_workers(workers)
    feed({"s0": store}, {}, workers, T0)
    merger = SummaryMerger(ttl_s=10.0, max_summary_age_s=3.0)
    merger.set_workers(workers)
    assert merger.update(summarize("s0", 2, store.snapshot(T0), T0, received=0))
    assert not merger.update(summarize("s0", 1, store.snapshot(T0), T0 - 1, received=0))
    assert merger.rejected == 1
    assert merger.snapshot(T0 + 1).totals.fresh_ranks.sum() == 8 * 4 - 1 - 4  # w3 rank 1, w5 (unsynced)
    late = merger.snapshot(T0 + 3.5)
    assert late.totals.fresh.sum() == 0 and late.totals.load["decode"] == (0.0,) * 6
    assert late.drops[DropReason.EMPTY_WORKER_ID] == 4  # counters stay


def test_a_rebalance_keeps_a_moved_worker_fresh_until_its_old_owner_lets_go_and_its_new_owner_has_heard() -> None:
    workers = fleet(16)
    before = partition(workers, ["a", "b"])
    after = partition(workers, ["a", "b", "c"])
    moved = [w for w in after["c"] if w not in ("w3", "w5")]
    assert moved
    stores = {s: FleetStore(ttl_s=10.0) for s in ("a", "b", "c")}
    for s in ("a", "b"):
        stores[s].set_workers({w: workers[w] for w in before[s]})
    route = {w: s for s, ids in before.items() for w in ids}
    feed(stores, route, workers, T0)
    merger = SummaryMerger(ttl_s=10.0, max_summary_age_s=5.0)
    merger.set_workers(workers)
    for s in ("a", "b"):
        merger.update(summarize(s, 1, stores[s].snapshot(T0 + 0.5), T0 + 0.5, received=0))

    def fresh_ranks(at: float) -> dict[str, int]:
        snap = merger.snapshot(at)
        return {w: int(snap.totals.fresh_ranks[snap.totals.table.worker_index[w]]) for w in moved}

    assert set(fresh_ranks(T0 + 1).values()) == {4}
    # Shard c joins: a and b drop the moved workers, c owns them but has heard nothing yet.
    for s in ("a", "b", "c"):
        stores[s].set_workers({w: workers[w] for w in after[s]})
    merger.update(summarize("c", 1, stores["c"].snapshot(T0 + 1), T0 + 1, received=0))
    assert set(fresh_ranks(T0 + 1.1).values()) == {4}  # the old owners' last summaries still hold them
    for s in ("a", "b"):
        merger.update(summarize(s, 2, stores[s].snapshot(T0 + 1.5), T0 + 1.5, received=0))
    assert set(fresh_ranks(T0 + 1.6).values()) == {0}  # gap: not fresh (no scale-down on it), never wrong
    feed(stores, {w: s for s, ids in after.items() for w in ids}, workers, T0 + 2)  # c hears their heartbeats
    merger.update(summarize("c", 2, stores["c"].snapshot(T0 + 2.2), T0 + 2.2, received=0))
    assert set(fresh_ranks(T0 + 2.3).values()) == {4}  # back within a heartbeat + a summary interval < TTL


def test_a_summary_that_is_not_one_is_refused_with_a_clear_error() -> None:
    with pytest.raises(ValueError, match="not a shard summary"):
        decode_summary(b"\x01\x02")
    workers = fleet(2)
    store = FleetStore()
    store.set_workers(workers)
    good = summarize("s", 1, store.snapshot(T0), T0, received=0)
    with pytest.raises(ValueError, match="disagree"):
        decode_summary(encode_summary(msgspec.structs.replace(good, fresh=b"\x01")))
    with pytest.raises(ValueError, match="version"):
        decode_summary(encode_summary(msgspec.structs.replace(good, version=SUMMARY_VERSION + 1)))

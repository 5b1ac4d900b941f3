"""Reconcile, worker by worker: each row sets up one worker's FPM and names the classification it must get."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import msgspec
import pytest

from planner.core import CoreConfig, DeploymentStatus, Reason, RoleConfig, WorkerStatus
from planner.core.reconcile import reconcile, reconcile_services
from planner.core.step import group_services
from planner.discovery import Role
from planner.ingest.store import FleetSnapshot
from tests.core.fleetkit import Fleet, Load
from worker_shim.fpm import ForwardPassMetrics

NOW = 100.0


def fresh(fleet: Fleet) -> None:
    fleet.publish("w", NOW - 1, Load(decode=3))


def stale(fleet: Fleet) -> None:
    fleet.publish("w", NOW - 30, Load(decode=3))  # TTL is 10 s


def one_rank(fleet: Fleet) -> None:
    fleet.publish("w", NOW - 1, Load(decode=3), ranks=(0,))


def unsynced(fleet: Fleet) -> None:
    fleet.publish("w", NOW - 1, Load(decode=3), as_id="")


def unsynced_long_ago(fleet: Fleet) -> None:
    fleet.publish("w", NOW - 60, Load(decode=3), as_id="")


def synced_after_restore(fleet: Fleet) -> None:
    fleet.publish("w", NOW - 5, Load(decode=3), as_id="")
    fleet.publish("w", NOW - 1, Load(decode=3))


def unsynced_after_fresh(fleet: Fleet) -> None:
    fleet.publish("w", NOW - 5, Load(decode=3))  # both ranks still fresh ...
    fleet.publish("w", NOW - 1, Load(decode=3), as_id="")  # ... but their endpoints now publish under ""


def wrong_rank(fleet: Fleet) -> None:
    record = fleet.workers["w"]
    sample = ForwardPassMetrics(worker_id="w", dp_rank=0, counter_id=99, wall_time=0.01)
    fleet.store.ingest(record.fpm_endpoints[1], sample, NOW - 1, NOW)  # rank 0's id on rank 1's endpoint
    fleet.publish("w", NOW - 1, Load(decode=3), ranks=(0,))


def foreign(fleet: Fleet) -> None:
    fleet.publish("w", NOW - 1, Load(decode=3), as_id="someone-else")


@dataclass
class Row:
    name: str
    setup: Callable[[Fleet], None]
    status: WorkerStatus
    missing: tuple[int, ...] = ()
    published_as: tuple[str, ...] = ()
    not_ready: bool = False


ROWS = [
    Row("fresh samples on both ranks make a healthy worker", fresh, WorkerStatus.HEALTHY),
    Row("samples older than the TTL make a silent worker", stale, WorkerStatus.SILENT, (0, 1)),
    Row("a worker never heard from is silent", lambda f: None, WorkerStatus.SILENT, (0, 1)),
    Row("fresh samples on one rank of two make a partial worker", one_rank, WorkerStatus.PARTIAL, (1,)),
    Row(
        "an endpoint publishing under '' is identity_not_synced",
        unsynced,
        WorkerStatus.IDENTITY_NOT_SYNCED,
        (0, 1),
        ("",),
    ),
    Row(
        "an endpoint publishing under a foreign id is identity_not_synced",
        foreign,
        WorkerStatus.IDENTITY_NOT_SYNCED,
        (0, 1),
        ("someone-else",),
    ),
    Row(
        "endpoints that turned to '' while every rank is still fresh make identity_not_synced",
        unsynced_after_fresh,
        WorkerStatus.IDENTITY_NOT_SYNCED,
        (),
        ("",),
    ),
    Row(
        "an endpoint publishing another rank of the same id is identity_not_synced",
        wrong_rank,
        WorkerStatus.IDENTITY_NOT_SYNCED,
        (1,),
        ("w#rank0",),
    ),
    Row(
        "'' heard only long ago leaves a silent worker, not an unsynced one",
        unsynced_long_ago,
        WorkerStatus.SILENT,
        (0, 1),
    ),
    Row("after the id syncs the worker is healthy again", synced_after_restore, WorkerStatus.HEALTHY),
    Row(
        "a worker the deployment reports not ready is not_ready, not silent",
        lambda f: None,
        WorkerStatus.NOT_READY,
        not_ready=True,
    ),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_classification(row: Row) -> None:
    fleet = Fleet()
    fleet.add("w", Role.DECODE, dp=2)
    fleet.add("ok", Role.DECODE, dp=2)
    fleet.publish("ok", NOW - 1, Load(decode=1))
    row.setup(fleet)
    deployment = DeploymentStatus(
        service="decode", desired=2, ready=2, not_ready_workers=("w",) if row.not_ready else ()
    )
    coverage = reconcile(
        Role.DECODE, "decode", list(fleet.workers.values()), fleet.store.snapshot(NOW), deployment
    ).coverage
    problems = {p.worker_id: p for p in coverage.problems}
    assert "ok" not in problems
    if row.status == WorkerStatus.HEALTHY:
        assert problems == {} and coverage.healthy == 2 and coverage.complete
        return
    problem = problems["w"]
    assert (problem.status, problem.missing_ranks, problem.published_as) == (row.status, row.missing, row.published_as)
    assert problem.detail
    if row.not_ready:
        assert coverage.not_ready == 1 and coverage.ranks_expected == 2  # its ranks are not expected
    else:
        assert not coverage.complete


def test_load_sums_fresh_ranks_only_and_counts_the_rest_idle() -> None:
    fleet = Fleet()
    fleet.add("a", Role.AGG, dp=2)
    fleet.add("b", Role.AGG, dp=2)
    fleet.publish("a", NOW - 1, Load(queued_prefill=100, prefill=50, decode=4, kv=400, queued_decode=1))
    fleet.publish("b", NOW - 30, Load(queued_prefill=9999, decode=9999))  # stale: not counted
    rec = reconcile(Role.AGG, "agg", list(fleet.workers.values()), fleet.store.snapshot(NOW), None)
    assert (
        rec.load.queued_prefill_tokens,
        rec.load.scheduled_prefill_tokens,
        rec.load.decode_requests,
        rec.load.queued_decode_requests,
        rec.load.decode_kv_tokens,
    ) == (200, 100, 8, 2, 800)
    assert (rec.engines_expected, rec.engines_reporting, rec.engines_silent) == (4, 2, 2)
    assert rec.coverage.gaps == (Reason.DEPLOYMENT_STATUS_MISSING, Reason.WORKERS_SILENT)


def test_a_worker_discovery_knows_but_the_store_was_never_told_about_is_silent() -> None:
    fleet = Fleet()
    fleet.add("known", Role.DECODE)
    fleet.publish("known", NOW - 1, Load(decode=1))
    snapshot: FleetSnapshot = fleet.store.snapshot(NOW)
    late = fleet.add("late", Role.DECODE, dp=2)  # discovered after the snapshot was taken
    coverage = reconcile(
        Role.DECODE,
        "decode",
        [fleet.workers["known"], late],
        snapshot,
        DeploymentStatus(service="decode", desired=2, ready=2),
    ).coverage
    assert [(p.worker_id, p.status, p.missing_ranks) for p in coverage.problems] == [
        ("late", WorkerStatus.SILENT, (0, 1))
    ]
    assert coverage.gaps == (Reason.WORKERS_SILENT,)


def test_load_and_coverage_are_brute_force_sums_over_the_rank_views_on_either_path() -> None:
    """A random fleet of three services with fresh, stale, heartbeating, never-heard and unsynced ranks and some
    workers not ready: reconcile's load, rank counts and per-worker verdicts equal sums over the snapshot's rank
    views. The same workers given as copies (not the store's own records) take the rank-by-rank path and get the
    same answer."""
    rng = random.Random(11)
    fleet = Fleet()
    for i in range(30):
        role = rng.choice([Role.PREFILL, Role.DECODE])
        fleet.add(f"w{i:02d}", role, rng.choice([role.value, f"{role.value}-b"]), dp=rng.randint(1, 4))
    for wid, record in fleet.workers.items():
        for rank in range(record.dp_size):
            age = rng.choice([None, 1.0, 9.0, 10.0, 10.5, 40.0])  # TTL 10 s
            if age is not None:
                idle = rng.random() < 0.2
                load = (
                    Load()
                    if idle
                    else Load(prefill=rng.randint(0, 900), decode=rng.randint(0, 90), kv=rng.randint(0, 9000))
                )
                fleet.publish(wid, NOW - age, load, ranks=(rank,), as_id="" if rng.random() < 0.05 else None)
    snapshot = fleet.store.snapshot(NOW)
    views = list(snapshot.ranks.values())
    own = dict(fleet.workers)
    copies = {wid: msgspec.structs.replace(record) for wid, record in own.items()}
    config = CoreConfig(roles={role: RoleConfig() for role in Role})
    not_ready = {
        service: tuple(rng.sample(sorted(w.worker_id for w in ws), 1))
        for service, (_, ws) in group_services(own, config).items()
    }
    deployments = {
        s: DeploymentStatus(service=s, desired=9, ready=7, not_ready_workers=nr) for s, nr in not_ready.items()
    }

    results = []
    for workers in (own, copies):
        groups = group_services(workers, config)
        results.append(reconcile_services(groups, snapshot, deployments))
        for service, (_, members) in groups.items():
            rec = results[-1][service]
            ids = {w.worker_id for w in members}
            fresh = [v.latest for v in views if v.fresh and v.worker_id in ids and v.latest is not None]
            assert (
                rec.load.queued_prefill_tokens,
                rec.load.scheduled_prefill_tokens,
                rec.load.decode_requests,
                rec.load.queued_decode_requests,
                rec.load.decode_kv_tokens,
                rec.prefill_requests,
            ) == (
                sum(s.queued_requests.sum_prefill_tokens for s in fresh),
                sum(s.scheduled_requests.sum_prefill_tokens for s in fresh),
                sum(s.scheduled_requests.num_decode_requests for s in fresh),
                sum(s.queued_requests.num_decode_requests for s in fresh),
                sum(s.scheduled_requests.sum_decode_kv_tokens for s in fresh),
                sum(s.scheduled_requests.num_prefill_requests + s.queued_requests.num_prefill_requests for s in fresh),
            )
            ready = [w for w in members if w.worker_id not in not_ready[service]]
            missing = {
                w.worker_id: tuple(v.dp_rank for v in views if v.worker_id == w.worker_id and not v.fresh)
                for w in ready
            }
            assert rec.engines_expected == sum(w.dp_size for w in ready)
            assert rec.engines_reporting == sum(w.dp_size - len(missing[w.worker_id]) for w in ready)
            verdicts = {p.worker_id: (p.status, p.missing_ranks) for p in rec.coverage.problems}
            for w in ready:
                gone = missing[w.worker_id]
                if verdicts.get(w.worker_id, (None,))[0] == WorkerStatus.IDENTITY_NOT_SYNCED:
                    continue
                expected = (
                    None
                    if not gone
                    else (WorkerStatus.SILENT if len(gone) == w.dp_size else WorkerStatus.PARTIAL, gone)
                )
                assert verdicts.get(w.worker_id) == expected, w.worker_id
            assert rec.coverage.healthy == sum(1 for w in ready if w.worker_id not in verdicts)
    assert results[0] == results[1]
    assert {p.status for r in results[0].values() for p in r.coverage.problems} == set(WorkerStatus) - {
        WorkerStatus.HEALTHY
    }

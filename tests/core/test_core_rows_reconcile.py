"""Reconcile rows the mutation run showed missing, each run on both paths (the snapshot's per-service totals, and
rank by rank for records that are not the store's own): coverage against the deployment's ready count with silent
pods still starting, the unsynced-identity horizon edge, which gaps appear without silent workers, and the
per-engine capacities averaged over the right set of engines."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import msgspec
import pytest

from planner.core import DeploymentStatus, Reason
from planner.core.reconcile import Reconciled, reconcile
from planner.discovery import EngineCapacity, Role
from tests.core.fleetkit import Fleet, Load

NOW = 100.0  # fleetkit's store: TTL 10 s
PATHS = ["snapshot totals", "rank by rank"]


def run(fleet: Fleet, path: str, service: str = "decode", role: Role = Role.DECODE) -> Reconciled:
    workers = [w for w in fleet.workers.values() if w.service == service]
    if path == "rank by rank":
        workers = [msgspec.structs.replace(w) for w in workers]  # equal records, not the store's own objects
    return reconcile(role, service, workers, fleet.store.snapshot(NOW), fleet.deployments.get(service))


def workers(n: int, fresh: int) -> Fleet:
    """``n`` decode workers, the first ``fresh`` of them publishing now."""
    fleet = Fleet()
    fleet.add_many(n, Role.DECODE)
    for i in range(fresh):
        fleet.publish(f"decode-{i}", NOW - 1, Load(decode=2, kv=100))
    return fleet


@dataclass
class CoverageRow:
    name: str
    setup: Callable[[], Fleet]
    complete: bool
    gaps: tuple[Reason, ...]
    healthy: int
    silent: int


def starting_beyond_ready() -> Fleet:
    fleet = workers(3, fresh=2)
    fleet.deploy("decode", desired=3, ready=2)
    return fleet


def silent_among_ready() -> Fleet:
    fleet = workers(3, fresh=2)
    fleet.deploy("decode", desired=3, ready=3)
    return fleet


def ready_but_undiscovered() -> Fleet:
    fleet = workers(2, fresh=2)
    fleet.deploy("decode", desired=3, ready=3)
    return fleet


def nothing_discovered() -> Fleet:
    fleet = Fleet()
    fleet.deploy("decode", desired=2, ready=2)
    return fleet


def no_status() -> Fleet:
    return workers(2, fresh=2)


def no_status_one_silent() -> Fleet:
    return workers(2, fresh=1)


def not_ready_and_silent() -> Fleet:
    fleet = workers(3, fresh=2)
    fleet.deploy("decode", desired=3, ready=2, not_ready=("decode-2",))
    return fleet


def ready_count_past_the_ready_workers() -> Fleet:
    fleet = workers(3, fresh=2)
    fleet.deploy("decode", desired=3, ready=3, not_ready=("decode-2",))
    return fleet


def more_healthy_than_ready() -> Fleet:
    fleet = workers(3, fresh=3)
    fleet.deploy("decode", desired=3, ready=1)
    return fleet


COVERAGE_ROWS = [
    CoverageRow(
        "a silent pod still starting beyond the ready count does not block a scale-down",
        starting_beyond_ready,
        True,
        (),
        2,
        1,
    ),
    CoverageRow(
        "a silent worker among the ready ones blocks it", silent_among_ready, False, (Reason.WORKERS_SILENT,), 2, 1
    ),
    CoverageRow(
        "ready replicas nobody discovered: only that gap, no workers_silent without a silent worker",
        ready_but_undiscovered,
        False,
        (Reason.READY_REPLICAS_UNDISCOVERED,),
        2,
        0,
    ),
    CoverageRow(
        "ready replicas and no worker discovered at all",
        nothing_discovered,
        False,
        (Reason.READY_REPLICAS_UNDISCOVERED, Reason.NO_WORKERS_DISCOVERED),
        0,
        0,
    ),
    CoverageRow(
        "no deployment status: that gap alone when every discovered worker is healthy",
        no_status,
        False,
        (Reason.DEPLOYMENT_STATUS_MISSING,),
        2,
        0,
    ),
    CoverageRow(
        "no deployment status and a silent worker: both gaps",
        no_status_one_silent,
        False,
        (Reason.DEPLOYMENT_STATUS_MISSING, Reason.WORKERS_SILENT),
        1,
        1,
    ),
    CoverageRow(
        "a silent worker the deployment reports not ready does not block a scale-down",
        not_ready_and_silent,
        True,
        (),
        2,
        0,
    ),
    CoverageRow(
        "3 ready reported, 3 discovered of which 1 not ready: a ready replica is not discovered",
        ready_count_past_the_ready_workers,
        False,
        (Reason.READY_REPLICAS_UNDISCOVERED,),
        2,
        0,
    ),
    CoverageRow("more healthy workers than ready replicas is complete", more_healthy_than_ready, True, (), 3, 0),
]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("row", COVERAGE_ROWS, ids=[r.name for r in COVERAGE_ROWS])
def test_coverage(row: CoverageRow, path: str) -> None:
    coverage = run(row.setup(), path).coverage
    assert (coverage.complete, coverage.gaps, coverage.healthy, coverage.silent) == (
        row.complete,
        row.gaps,
        row.healthy,
        row.silent,
    )


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    ("age_s", "unsynced"),
    [(10.0, True), (9.5, True), (10.5, False)],
    ids=["published under '' exactly one TTL ago", "inside the TTL", "just past the TTL"],
)
def test_the_unsynced_identity_horizon_is_the_ttl_inclusive(age_s: float, unsynced: bool, path: str) -> None:
    fleet = workers(2, fresh=1)
    fleet.deploy("decode", desired=2, ready=2)
    fleet.publish("decode-1", NOW - age_s, Load(decode=1), as_id="")
    coverage = run(fleet, path).coverage
    assert coverage.identity_not_synced == (1 if unsynced else 0)
    # an unsynced worker is not also counted silent
    assert coverage.gaps == ((Reason.IDENTITY_NOT_SYNCED,) if unsynced else (Reason.WORKERS_SILENT,))
    assert coverage.silent == (0 if unsynced else 1)


def mixed_capacity_fleet() -> Fleet:
    """decode-0: 2 ranks of 8192 tokens / 256 seqs / 100k KV; decode-1: 1 rank of 2048 / 64 / unknown KV;
    decode-2: 1 rank of 1024 / 32 / 40k KV; decode-3 (not ready): 1 rank of 10 / 10 / 10."""
    fleet = Fleet()
    fleet.add(
        "decode-0",
        Role.DECODE,
        dp=2,
        capacity=EngineCapacity(max_num_batched_tokens=8192, max_num_seqs=256, kv_capacity_tokens=100_000),
    )
    fleet.add(
        "decode-1",
        Role.DECODE,
        capacity=EngineCapacity(max_num_batched_tokens=2048, max_num_seqs=64, kv_capacity_tokens=0),
    )
    fleet.add(
        "decode-2",
        Role.DECODE,
        capacity=EngineCapacity(max_num_batched_tokens=1024, max_num_seqs=32, kv_capacity_tokens=40_000),
    )
    fleet.add(
        "decode-3",
        Role.DECODE,
        capacity=EngineCapacity(max_num_batched_tokens=10, max_num_seqs=10, kv_capacity_tokens=10),
    )
    fleet.deploy("decode", desired=4, ready=3, not_ready=("decode-3",))
    return fleet


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("fresh", [True, False], ids=["all fresh", "all silent"])
def test_capacities_are_means_per_expected_engine(path: str, fresh: bool) -> None:
    """Token budget and batch size: means over the ranks of ready workers (4 engines). KV capacity: the mean over
    the engines whose capacity is known only (3 engines), never diluted by unknown (0) ones."""
    fleet = mixed_capacity_fleet()
    if fresh:
        fleet.publish_all(NOW - 1, Load(decode=4))
    rec = run(fleet, path)
    assert rec.engines_expected == 4
    assert rec.engines_reporting == (4 if fresh else 0)
    assert rec.engines_silent == (0 if fresh else 4)
    assert rec.max_num_batched_tokens == (2 * 8192 + 2048 + 1024) / 4
    assert rec.max_num_seqs == (2 * 256 + 64 + 32) / 4
    assert rec.kv_capacity_tokens == (2 * 100_000 + 40_000) / 3


@pytest.mark.parametrize("path", PATHS)
def test_no_engine_expected_means_no_capacity(path: str) -> None:
    fleet = Fleet()
    fleet.add("decode-0", Role.DECODE)
    fleet.deploy("decode", desired=1, ready=0, not_ready=("decode-0",))
    rec = run(fleet, path)
    assert (rec.engines_expected, rec.max_num_batched_tokens, rec.max_num_seqs, rec.kv_capacity_tokens) == (
        0,
        0.0,
        0.0,
        0.0,
    )
    assert rec.dp_per_replica == 1
    assert rec.coverage.not_ready == 1


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    ("dp_sizes", "expected"),
    [((2, 2, 1), 2), ((1, 1, 2), 1), ((1, 2), 2), ((4,), 4)],
    ids=["most common wins", "most common wins (smaller)", "a tie goes to the larger", "one worker"],
)
def test_dp_per_replica_is_the_most_common_dp_size(dp_sizes: tuple[int, ...], expected: int, path: str) -> None:
    fleet = Fleet()
    for i, dp in enumerate(dp_sizes):
        fleet.add(f"decode-{i}", Role.DECODE, dp=dp)
    fleet.deploy("decode", desired=len(dp_sizes))
    assert run(fleet, path).dp_per_replica == expected


@pytest.mark.parametrize("path", PATHS)
def test_partial_worker_counts_its_fresh_ranks_and_names_the_gap(path: str) -> None:
    fleet = Fleet()
    fleet.add("decode-0", Role.DECODE, dp=4)
    fleet.deploy("decode", desired=1)
    fleet.publish("decode-0", NOW - 1, Load(decode=1, queued_prefill=5), ranks=(0, 2))
    rec = run(fleet, path)
    assert (rec.engines_expected, rec.engines_reporting, rec.engines_silent) == (4, 2, 2)
    assert rec.coverage.gaps == (Reason.RANKS_MISSING,)  # partial, not silent: no workers_silent
    assert [(p.worker_id, p.missing_ranks) for p in rec.coverage.problems] == [("decode-0", (1, 3))]
    assert (rec.load.decode_requests, rec.load.queued_prefill_tokens, rec.prefill_requests) == (2, 10, 2)


@pytest.mark.parametrize("path", PATHS)
def test_a_deployment_status_is_reported_back(path: str) -> None:
    fleet = workers(2, fresh=2)
    fleet.deployments["decode"] = DeploymentStatus(service="decode", desired=5, ready=2)
    coverage = run(fleet, path).coverage
    assert (coverage.deployment_desired, coverage.deployment_ready, coverage.discovered) == (5, 2, 2)


@pytest.mark.parametrize("path", PATHS)
def test_problem_details_name_what_is_missing(path: str) -> None:
    fleet = Fleet()
    fleet.add("decode-0", Role.DECODE, dp=4)  # partial
    fleet.add("decode-1", Role.DECODE)  # silent
    fleet.add("decode-2", Role.DECODE)  # not ready
    fleet.add("decode-3", Role.DECODE, dp=2)  # unsynced on both ranks, under two ids
    fleet.deploy("decode", desired=4, ready=3, not_ready=("decode-2",))
    fleet.publish("decode-0", NOW - 1, Load(decode=1), ranks=(0, 2))
    fleet.publish("decode-3", NOW - 1, Load(decode=1), ranks=(0,), as_id="")
    fleet.publish("decode-3", NOW - 1, Load(decode=1), ranks=(1,), as_id="other")
    coverage = run(fleet, path).coverage
    assert (coverage.partial, coverage.silent, coverage.not_ready, coverage.identity_not_synced) == (1, 1, 1, 1)
    assert [(p.worker_id, p.status.value, p.detail) for p in coverage.problems] == [
        ("decode-0", "partial", "no fresh FPM from rank(s) 1, 3 of 4"),
        ("decode-1", "silent", "no fresh FPM from any rank"),
        ("decode-2", "not_ready", "the deployment reports it not ready"),
        (
            "decode-3",
            "identity_not_synced",
            "its endpoint publishes under '', 'other', not 'decode-3': identity not synced",
        ),
    ]
    assert coverage.gaps == (Reason.IDENTITY_NOT_SYNCED, Reason.RANKS_MISSING, Reason.WORKERS_SILENT)


def test_workers_discovery_no_longer_lists_add_no_load() -> None:
    """The store still holds decode-1 (set_workers not called since), but discovery now lists decode-0 only: its
    load and coverage are decode-0's alone."""
    fleet = Fleet()
    fleet.add_many(2, Role.DECODE)
    fleet.deploy("decode", desired=1)
    fleet.publish("decode-0", NOW - 1, Load(decode=3, kv=300))
    fleet.publish("decode-1", NOW - 1, Load(decode=5, kv=500))
    listed = [msgspec.structs.replace(fleet.workers["decode-0"])]
    rec = reconcile(Role.DECODE, "decode", listed, fleet.store.snapshot(NOW), fleet.deployments["decode"])
    assert (rec.load.decode_requests, rec.load.decode_kv_tokens) == (3, 300)
    assert (rec.coverage.discovered, rec.coverage.healthy, rec.engines_expected) == (1, 1, 1)


@pytest.mark.parametrize("path", PATHS)
def test_a_one_token_kv_capacity_is_a_known_capacity(path: str) -> None:
    fleet = Fleet()
    fleet.add("decode-0", Role.DECODE, capacity=EngineCapacity(kv_capacity_tokens=1))
    fleet.deploy("decode", desired=1)
    assert run(fleet, path).kv_capacity_tokens == 1.0  # silent: classified one by one
    fleet.publish("decode-0", NOW - 1, Load(decode=1))
    assert run(fleet, path).kv_capacity_tokens == 1.0  # fresh: summed as arrays on the snapshot path


def test_no_worker_at_all_means_one_engine_per_replica() -> None:
    fleet = nothing_discovered()
    rec = reconcile(Role.DECODE, "decode", [], fleet.store.snapshot(NOW), fleet.deployments["decode"])
    assert (rec.dp_per_replica, rec.engines_expected, rec.coverage.discovered) == (1, 0, 0)


def test_a_suspect_worker_of_the_next_service_is_none_of_this_ones_business() -> None:
    """prefill's workers come first in the store, decode's next; decode-0 had a stray sample on its endpoint (a
    suspect). Reconciling prefill classifies prefill's workers only."""
    fleet = Fleet()
    fleet.add_many(2, Role.PREFILL)
    fleet.add_many(2, Role.DECODE)
    fleet.deploy("prefill", desired=2)
    fleet.publish_all(NOW - 1, Load(queued_prefill=100), role=Role.PREFILL)
    fleet.stray(fleet.workers["decode-0"].fpm_endpoints[0], "intruder", NOW - 1)
    prefill = [w for w in fleet.workers.values() if w.service == "prefill"]
    rec = reconcile(Role.PREFILL, "prefill", prefill, fleet.store.snapshot(NOW), fleet.deployments["prefill"])
    assert (rec.coverage.healthy, rec.coverage.problems, rec.coverage.complete) == (2, (), True)
    assert rec.load.queued_prefill_tokens == 100

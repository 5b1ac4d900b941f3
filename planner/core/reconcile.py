"""Reconcile: classify every discovered worker of a service, sum the load its fresh ranks report, and say
whether coverage is complete enough for a scale-down. Pure.

Classification, first match wins:

- ``not_ready``: the deployment lists the worker as not ready;
- ``identity_not_synced``: one of its endpoints last published, within the TTL, under ``""`` or another id
  (or another rank) — a snapshot-restored engine whose id was never pushed in;
- ``healthy``: fresh FPM on every rank;
- ``partial``: fresh FPM on some ranks (``missing_ranks`` names the others);
- ``silent``: no fresh FPM on any rank.

Coverage is complete when the deployment status is known, no worker is ``identity_not_synced`` or
``partial``, and at least as many workers are healthy as the deployment reports ready (every ready replica is
covered; silent workers beyond that are the ones still starting).

Cost: a service whose workers are the ones the store was given (the usual case) reads its load from the
snapshot's per-service totals and its freshness from per-worker counts (``FleetSnapshot.totals``); only workers that
are not fully fresh, not ready, or had suspect drops are classified one by one, the others are summed as arrays.
Workers the store was not given as they are here (discovery moved on since ``set_workers``) go rank by rank
through ``FleetSnapshot.ranks``, with the same rules.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence

import msgspec
import numpy as np

from planner.core.decision import Coverage, Reason, WorkerCoverage, WorkerStatus
from planner.core.observation import DeploymentStatus, RoleLoad
from planner.discovery import Role, WorkerRecord
from planner.ingest.store import DropReason, FleetSnapshot, LoadField, SlotTable

__all__ = ["Reconciled", "reconcile", "reconcile_services"]


class Reconciled(msgspec.Struct, frozen=True, kw_only=True):
    """Reconcile's output for one service: the coverage record, the measured load, and engine capacities."""

    coverage: Coverage
    load: RoleLoad
    engines_expected: int  # ranks of workers that are not ``not_ready``
    engines_reporting: int  # ranks with fresh FPM
    engines_silent: int  # expected ranks without fresh FPM (counted idle)
    dp_per_replica: int  # the most common dp_size among the workers (1 without workers)
    max_num_batched_tokens: float  # mean per engine over the expected engines (0: no workers)
    max_num_seqs: float
    kv_capacity_tokens: float  # mean per engine over expected engines with a known capacity (0: unknown)
    prefill_requests: float  # scheduled + queued prefill requests over fresh ranks


_SUSPECT_DROPS = (
    DropReason.EMPTY_WORKER_ID,
    DropReason.UNKNOWN_WORKER,
    DropReason.FOREIGN_ENDPOINT,
    DropReason.INVALID_VALUE,
)


def _own_range(service: str, workers: Sequence[WorkerRecord], table: SlotTable) -> tuple[int, int] | None:
    """The table's workers ``[start, stop)`` when ``workers`` are exactly the table's records of ``service`` (the
    same objects, in order): then the snapshot's totals for ``service`` are theirs. None otherwise."""
    start, stop = table.services.get(service, (0, 0))
    if len(workers) != stop - start or not table.keyed_by_id:
        return None
    return (start, stop) if all(map(operator.is_, workers, table.records[start:stop])) else None


_NO_LOAD = (0,) * len(LoadField)


def _loads_by_rank(
    groups: Mapping[str, tuple[Role, Sequence[WorkerRecord]]], fleet: FleetSnapshot
) -> dict[str, tuple[float, ...]]:
    """Load per service, rank by rank: the latest sample of every fresh rank the snapshot holds for an id, to the
    service of the (last) group listing that id. For workers the store was not given as they are here."""
    service_of: dict[str, str] = {}
    for service, (_, workers) in groups.items():
        for record in workers:
            service_of[record.worker_id] = service
    sums = {service: [0] * len(LoadField) for service in groups}
    ranks = fleet.ranks
    for key in ranks:
        owner = service_of.get(key[0])
        if owner is None:
            continue
        view = ranks[key]
        sample = view.latest
        if not view.fresh or sample is None:
            continue
        sched, queued = sample.scheduled_requests, sample.queued_requests
        acc = sums[owner]
        acc[LoadField.QUEUED_PREFILL_TOKENS] += queued.sum_prefill_tokens
        acc[LoadField.SCHEDULED_PREFILL_TOKENS] += sched.sum_prefill_tokens
        acc[LoadField.DECODE_REQUESTS] += sched.num_decode_requests
        acc[LoadField.QUEUED_DECODE_REQUESTS] += queued.num_decode_requests
        acc[LoadField.DECODE_KV_TOKENS] += sched.sum_decode_kv_tokens
        acc[LoadField.PREFILL_REQUESTS] += sched.num_prefill_requests + queued.num_prefill_requests
    return {service: tuple(acc) for service, acc in sums.items()}


def reconcile_services(
    groups: Mapping[str, tuple[Role, Sequence[WorkerRecord]]],
    fleet: FleetSnapshot,
    deployments: Mapping[str, DeploymentStatus],
) -> dict[str, Reconciled]:
    """Reconcile every service in ``groups`` (service -> (role, workers)); see the module docstring for the cost.

    Endpoints are checked only for workers whose endpoints had samples dropped as empty, unknown, foreign or
    invalid (the store counts those per worker), so ``identity_not_synced`` costs nothing in a healthy fleet.
    """
    table = fleet.totals.table
    ranges = {service: _own_range(service, workers, table) for service, (_, workers) in groups.items()}
    if all(rng is not None for rng in ranges.values()):
        # Each service's workers are the store's for that service name, and no other: its totals are theirs.
        loads = {service: fleet.totals.load.get(service, _NO_LOAD) for service in groups}
    else:
        loads = _loads_by_rank(groups, fleet)
    suspects = {wid for wid, per in fleet.drops_by_worker.items() if any(per.get(reason) for reason in _SUSPECT_DROPS)}
    return {
        service: _classify(
            role, service, workers, fleet, deployments.get(service), loads[service], suspects, ranges[service]
        )
        for service, (role, workers) in groups.items()
    }


def reconcile(
    role: Role,
    service: str,
    workers: Sequence[WorkerRecord],
    fleet: FleetSnapshot,
    deployment: DeploymentStatus | None,
) -> Reconciled:
    """Reconcile one service (see :func:`reconcile_services`, which does every service at once)."""
    deployments = {service: deployment} if deployment is not None else {}
    return reconcile_services({service: (role, workers)}, fleet, deployments)[service]


class _Tally:
    """Coverage counts of one service while classifying (mutable scratch)."""

    __slots__ = (
        "healthy",
        "kvcap_engines",
        "kvcap_sum",
        "mnbt_sum",
        "not_ready",
        "partial",
        "problems",
        "ranks_expected",
        "ranks_fresh",
        "seqs_sum",
        "silent",
        "unsynced",
    )

    def __init__(self) -> None:
        self.healthy = self.partial = self.silent = self.unsynced = self.not_ready = 0
        self.ranks_expected = self.ranks_fresh = self.kvcap_engines = 0
        self.mnbt_sum = self.seqs_sum = self.kvcap_sum = 0.0
        self.problems: list[WorkerCoverage] = []


def _missing(fleet: FleetSnapshot, worker_id: str) -> tuple[list[int], int]:
    """The ranks of ``worker_id`` the snapshot holds without fresh FPM (in rank order), and how many it holds."""
    table = fleet.totals.table
    index = table.worker_index.get(worker_id)
    if index is None:
        return [], 0
    first, held = int(table.first_slot[index]), int(table.dp_size[index])
    fresh = fleet.totals.fresh[first : first + held].tolist()
    return [rank for rank, ok in enumerate(fresh) if not ok], held


def _classify_one(
    record: WorkerRecord,
    tally: _Tally,
    fleet: FleetSnapshot,
    not_ready_ids: frozenset[str],
    suspects: set[str],
) -> None:
    """Classify one worker the snapshot may or may not hold as given (first match wins, module docstring)."""
    wid = record.worker_id
    dp = record.dp_size
    if wid in not_ready_ids:
        tally.not_ready += 1
        tally.problems.append(
            WorkerCoverage(worker_id=wid, status=WorkerStatus.NOT_READY, detail="the deployment reports it not ready")
        )
        return
    tally.ranks_expected += dp
    cap = record.capacity
    tally.mnbt_sum += cap.max_num_batched_tokens * dp
    tally.seqs_sum += cap.max_num_seqs * dp
    if cap.kv_capacity_tokens > 0:
        tally.kvcap_sum += cap.kv_capacity_tokens * dp
        tally.kvcap_engines += dp
    missing_list, held = _missing(fleet, wid)
    if held < dp:
        # Not (or not fully) in the store's snapshot: discovery moved on since set_workers.
        missing_list = sorted({*missing_list, *range(held, dp)})
    missing = tuple(sorted(missing_list)) if missing_list else ()
    tally.ranks_fresh += dp - len(missing)
    foreign: list[str] = []
    if wid in suspects:
        endpoints = fleet.endpoints
        horizon = fleet.now - fleet.ttl_s
        for rank, endpoint in enumerate(record.fpm_endpoints):
            seen = endpoints.get(endpoint)
            if seen is not None and (seen.worker_id != wid or seen.dp_rank != rank) and seen.last_at >= horizon:
                foreign.append(seen.worker_id if seen.worker_id != wid else f"{wid}#rank{seen.dp_rank}")
    if foreign:
        tally.unsynced += 1
        published = tuple(sorted(set(foreign)))
        shown = ", ".join(repr(x) for x in published)
        tally.problems.append(
            WorkerCoverage(
                worker_id=wid,
                status=WorkerStatus.IDENTITY_NOT_SYNCED,
                missing_ranks=missing,
                published_as=published,
                detail=f"its endpoint publishes under {shown}, not {wid!r}: identity not synced",
            )
        )
    elif not missing:
        tally.healthy += 1
    elif len(missing) < dp:
        tally.partial += 1
        tally.problems.append(
            WorkerCoverage(
                worker_id=wid,
                status=WorkerStatus.PARTIAL,
                missing_ranks=missing,
                detail=f"no fresh FPM from rank(s) {', '.join(map(str, missing))} of {dp}",
            )
        )
    else:
        tally.silent += 1
        tally.problems.append(
            WorkerCoverage(
                worker_id=wid,
                status=WorkerStatus.SILENT,
                missing_ranks=missing,
                detail="no fresh FPM from any rank",
            )
        )


def _classify(
    role: Role,
    service: str,
    workers: Sequence[WorkerRecord],
    fleet: FleetSnapshot,
    deployment: DeploymentStatus | None,
    load: tuple[float, ...],
    suspects: set[str],
    own_range: tuple[int, int] | None,
) -> Reconciled:
    not_ready_ids = frozenset(deployment.not_ready_workers) if deployment is not None else frozenset()
    tally = _Tally()
    dp_counts: dict[int, int] = {}
    if own_range is None:
        for record in workers:
            dp_counts[record.dp_size] = dp_counts.get(record.dp_size, 0) + 1
            _classify_one(record, tally, fleet, not_ready_ids, suspects)
    else:
        # The snapshot's own workers: those fully fresh, ready and not suspect are healthy and summed as arrays;
        # only the others are classified one by one.
        table = fleet.totals.table
        start, stop = own_range
        dp = table.dp_size[start:stop]
        values, counts = np.unique(dp, return_counts=True)
        dp_counts = dict(zip(values.tolist(), counts.tolist(), strict=True))
        odd = set((np.flatnonzero(fleet.totals.fresh_ranks[start:stop] < dp) + start).tolist())
        for wid in (*not_ready_ids, *suspects):
            index = table.worker_index.get(wid)
            if index is not None and start <= index < stop:
                odd.add(index)
        fine = np.ones(stop - start, dtype=np.bool_)
        fine[np.array(sorted(odd), dtype=np.intp) - start] = False
        ranks = dp[fine]
        kvcap = table.kv_capacity_tokens[start:stop][fine]
        tally.healthy = len(ranks)
        tally.ranks_expected = tally.ranks_fresh = int(ranks.sum())
        tally.mnbt_sum = float((table.max_num_batched_tokens[start:stop][fine] * ranks).sum())
        tally.seqs_sum = float((table.max_num_seqs[start:stop][fine] * ranks).sum())
        tally.kvcap_sum = float((kvcap * ranks)[kvcap > 0].sum())
        tally.kvcap_engines = int(ranks[kvcap > 0].sum())
        for index in sorted(odd):
            _classify_one(table.records[index], tally, fleet, not_ready_ids, suspects)
    healthy, partial, silent, unsynced, not_ready = (
        tally.healthy,
        tally.partial,
        tally.silent,
        tally.unsynced,
        tally.not_ready,
    )
    ranks_expected, ranks_fresh, problems = tally.ranks_expected, tally.ranks_fresh, tally.problems

    discovered = len(workers)
    gaps: list[Reason] = []
    if unsynced:
        gaps.append(Reason.IDENTITY_NOT_SYNCED)
    if partial:
        gaps.append(Reason.RANKS_MISSING)
    if deployment is None:
        gaps.append(Reason.DEPLOYMENT_STATUS_MISSING)
        required = discovered - not_ready
    else:
        required = deployment.ready
    if healthy < required:
        if silent:
            gaps.append(Reason.WORKERS_SILENT)
        if discovered - not_ready < required:
            gaps.append(Reason.READY_REPLICAS_UNDISCOVERED)
            if discovered == 0:
                gaps.append(Reason.NO_WORKERS_DISCOVERED)
    problems.sort(key=lambda p: p.worker_id)
    coverage = Coverage(
        role=role,
        service=service,
        discovered=discovered,
        healthy=healthy,
        partial=partial,
        silent=silent,
        identity_not_synced=unsynced,
        not_ready=not_ready,
        ranks_expected=ranks_expected,
        ranks_fresh=ranks_fresh,
        deployment_desired=None if deployment is None else deployment.desired,
        deployment_ready=None if deployment is None else deployment.ready,
        complete=not gaps,
        gaps=tuple(gaps),
        problems=tuple(problems),
        unknown_worker_drops=fleet.drops.get(DropReason.UNKNOWN_WORKER, 0),
        empty_worker_id_drops=fleet.drops.get(DropReason.EMPTY_WORKER_ID, 0),
    )
    dp_per_replica = max(dp_counts, key=lambda d: (dp_counts[d], d)) if dp_counts else 1
    return Reconciled(
        coverage=coverage,
        load=RoleLoad(
            queued_prefill_tokens=load[LoadField.QUEUED_PREFILL_TOKENS],
            scheduled_prefill_tokens=load[LoadField.SCHEDULED_PREFILL_TOKENS],
            decode_requests=load[LoadField.DECODE_REQUESTS],
            queued_decode_requests=load[LoadField.QUEUED_DECODE_REQUESTS],
            decode_kv_tokens=load[LoadField.DECODE_KV_TOKENS],
        ),
        engines_expected=ranks_expected,
        engines_reporting=ranks_fresh,
        engines_silent=max(ranks_expected - ranks_fresh, 0),
        dp_per_replica=dp_per_replica,
        max_num_batched_tokens=tally.mnbt_sum / ranks_expected if ranks_expected else 0.0,
        max_num_seqs=tally.seqs_sum / ranks_expected if ranks_expected else 0.0,
        kv_capacity_tokens=tally.kvcap_sum / tally.kvcap_engines if tally.kvcap_engines else 0.0,
        prefill_requests=load[LoadField.PREFILL_REQUESTS],
    )

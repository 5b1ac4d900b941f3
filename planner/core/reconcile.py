"""Reconcile: classify every discovered worker of a service, sum the load its fresh ranks report, and say
whether coverage is complete enough for a scale-down. Pure; one pass over the service's ranks.

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
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from planner.core.decision import Coverage, Reason, WorkerCoverage, WorkerStatus
from planner.core.observation import DeploymentStatus, RoleLoad
from planner.discovery import Role, WorkerRecord
from planner.ingest.store import DropReason, FleetSnapshot

__all__ = ["Reconciled", "reconcile"]


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


def reconcile(
    role: Role,
    service: str,
    workers: Sequence[WorkerRecord],
    fleet: FleetSnapshot,
    deployment: DeploymentStatus | None,
) -> Reconciled:
    """Classify ``workers`` (all of ``service``) against ``fleet`` and ``deployment``."""
    ranks = fleet.ranks
    endpoints = fleet.endpoints
    horizon = fleet.now - fleet.ttl_s
    not_ready_ids = frozenset(deployment.not_ready_workers) if deployment is not None else frozenset()

    healthy = partial = silent = unsynced = not_ready = 0
    ranks_expected = ranks_fresh = 0
    qp = sp = dr = qd = kv = preq = 0.0
    mnbt_sum = seqs_sum = kvcap_sum = 0.0
    kvcap_engines = 0
    problems: list[WorkerCoverage] = []
    dp_counts: dict[int, int] = {}

    for record in workers:
        wid = record.worker_id
        dp = record.dp_size
        dp_counts[dp] = dp_counts.get(dp, 0) + 1
        if wid in not_ready_ids:
            not_ready += 1
            problems.append(
                WorkerCoverage(
                    worker_id=wid, status=WorkerStatus.NOT_READY, detail="the deployment reports it not ready"
                )
            )
            continue
        ranks_expected += dp
        cap = record.capacity
        mnbt_sum += cap.max_num_batched_tokens * dp
        seqs_sum += cap.max_num_seqs * dp
        if cap.kv_capacity_tokens > 0:
            kvcap_sum += cap.kv_capacity_tokens * dp
            kvcap_engines += dp
        fresh_here = 0
        missing: list[int] | None = None
        foreign: list[str] | None = None
        for rank, endpoint in enumerate(record.fpm_endpoints):
            seen = endpoints.get(endpoint)
            if (
                seen is not None
                and (seen.worker_id != wid or seen.dp_rank != rank)
                and seen.last_at >= horizon
            ):
                if foreign is None:
                    foreign = []
                foreign.append(seen.worker_id if seen.worker_id != wid else f"{wid}#rank{seen.dp_rank}")
            view = ranks.get((wid, rank))
            if view is None or not view.fresh or view.latest is None:
                if missing is None:
                    missing = []
                missing.append(rank)
                continue
            fresh_here += 1
            sample = view.latest
            sched = sample.scheduled_requests
            queued = sample.queued_requests
            qp += queued.sum_prefill_tokens
            sp += sched.sum_prefill_tokens
            dr += sched.num_decode_requests
            qd += queued.num_decode_requests
            kv += sched.sum_decode_kv_tokens
            preq += sched.num_prefill_requests + queued.num_prefill_requests
        ranks_fresh += fresh_here
        if foreign is not None:
            unsynced += 1
            shown = ", ".join(repr(x) for x in sorted(set(foreign)))
            problems.append(
                WorkerCoverage(
                    worker_id=wid,
                    status=WorkerStatus.IDENTITY_NOT_SYNCED,
                    missing_ranks=tuple(missing or ()),
                    published_as=tuple(sorted(set(foreign))),
                    detail=f"its endpoint publishes under {shown}, not {wid!r}: identity not synced",
                )
            )
        elif missing is None:
            healthy += 1
        elif fresh_here:
            partial += 1
            problems.append(
                WorkerCoverage(
                    worker_id=wid,
                    status=WorkerStatus.PARTIAL,
                    missing_ranks=tuple(missing),
                    detail=f"no fresh FPM from rank(s) {', '.join(map(str, missing))} of {dp}",
                )
            )
        else:
            silent += 1
            problems.append(
                WorkerCoverage(
                    worker_id=wid,
                    status=WorkerStatus.SILENT,
                    missing_ranks=tuple(missing),
                    detail="no fresh FPM from any rank",
                )
            )

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
            queued_prefill_tokens=qp,
            scheduled_prefill_tokens=sp,
            decode_requests=dr,
            queued_decode_requests=qd,
            decode_kv_tokens=kv,
        ),
        engines_expected=ranks_expected,
        engines_reporting=ranks_fresh,
        engines_silent=ranks_expected - ranks_fresh,
        dp_per_replica=dp_per_replica,
        max_num_batched_tokens=mnbt_sum / ranks_expected if ranks_expected else 0.0,
        max_num_seqs=seqs_sum / ranks_expected if ranks_expected else 0.0,
        kv_capacity_tokens=kvcap_sum / kvcap_engines if kvcap_engines else 0.0,
        prefill_requests=preq,
    )

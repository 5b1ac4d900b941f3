"""What one ingest shard tells the leader every tick: a :class:`ShardSummary` of its FleetStore snapshot.

Its size grows with the shard's workers and ranks (one byte of freshness per rank), never with the sample rate:
per-service load totals (:class:`~planner.ingest.store.LoadField` sums over the fresh ranks), per-worker
classification inputs (fresh ranks, the freshness of each rank), drop counters (fleet-wide and per worker), and,
for the workers whose endpoints had suspect drops only, what each of their endpoints last published under (so
the leader can still name ``identity_not_synced``). Encoded as msgpack by msgspec; the leader refuses a summary
it cannot decode.

Version 2 adds the FPM traffic (:mod:`planner.shard.traffic`): ``run_started_at`` (the shard run's start on its
wall clock) and ``traffic``, per service the cumulative counters of the traffic extension since that start
(counts, sums and fixed log-bucket histograms, which add; never percentiles). Its size grows with the buckets
seen, at most 641 per histogram, never with the sample rate. The leader reads versions 1 and 2: a version 1
summary has no traffic (that shard's samples count for none), everything else in it is read as before. A
version 1 leader refuses version 2 summaries, so upgrade the service before the shards.
"""

from __future__ import annotations

import msgspec

from planner.ingest.store import DropReason, FleetSnapshot
from planner.shard.traffic import CumulativeTraffic, ServiceTraffic, check_traffic

__all__ = [
    "READS_VERSIONS",
    "SUMMARY_VERSION",
    "SeenRecord",
    "ShardSummary",
    "decode_summary",
    "encode_summary",
    "summarize",
]

SUMMARY_VERSION = 2
READS_VERSIONS = (1, 2)  # what this leader decodes (1: no traffic)

# Drops that make the leader look at a worker's endpoints (as reconcile does with the store's own counters).
_SUSPECT = (
    DropReason.EMPTY_WORKER_ID,
    DropReason.UNKNOWN_WORKER,
    DropReason.FOREIGN_ENDPOINT,
    DropReason.INVALID_VALUE,
)


class SeenRecord(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """What an endpoint last published under, ``age_s`` before the summary was taken."""

    worker_id: str
    dp_rank: int
    age_s: float
    messages: int


class ShardSummary(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One shard's state at ``taken_at`` (the shard's wall clock, seconds since the epoch)."""

    version: int = SUMMARY_VERSION
    shard_id: str
    seq: int  # increases with every summary of one shard run
    taken_at: float
    ttl_s: float
    workers: tuple[str, ...]  # the workers the shard owns, in its store's slot order
    dp_size: tuple[int, ...]  # per worker
    fresh: bytes  # one byte per rank, workers' ranks consecutive: 1 = fresh at taken_at
    load: dict[str, tuple[float, ...]]  # service -> LoadField sums over its fresh ranks
    drops: dict[str, int]  # DropReason -> count since the shard started
    drops_by_worker: dict[str, dict[str, int]]
    seen: dict[str, SeenRecord]  # endpoint -> what it last published under (suspect workers only)
    received: int  # messages the shard received
    # version 2: the FPM traffic extension's counters since the run started (planner.shard.traffic)
    run_started_at: float | None = None  # the shard run's start (wall clock); None: no traffic (version 1)
    traffic: dict[str, ServiceTraffic] = msgspec.field(default_factory=dict)


def summarize(
    shard_id: str,
    seq: int,
    snapshot: FleetSnapshot,
    taken_at: float,
    received: int,
    *,
    traffic: CumulativeTraffic | None = None,
    run_started_at: float | None = None,
) -> ShardSummary:
    """The summary of a shard's store snapshot (taken at the store's ``snapshot.now``; ``taken_at`` is the same
    instant on the wall clock, which the leader compares across processes). ``traffic``: the shard's counters
    (the store's traffic hook), sent with ``run_started_at`` (both or neither)."""
    if (traffic is None) != (run_started_at is None):
        raise ValueError("summarize: traffic and run_started_at go together")
    totals = snapshot.totals
    table = totals.table
    suspects = [wid for wid, per in snapshot.drops_by_worker.items() if any(per.get(reason) for reason in _SUSPECT)]
    seen: dict[str, SeenRecord] = {}
    endpoints = snapshot.endpoints
    for wid in suspects:
        index = table.worker_index.get(wid)
        if index is None:
            continue
        for endpoint in table.records[index].fpm_endpoints:
            record = endpoints.get(endpoint)
            if record is not None:
                seen[endpoint] = SeenRecord(
                    record.worker_id, record.dp_rank, snapshot.now - record.last_at, record.messages
                )
    return ShardSummary(
        shard_id=shard_id,
        seq=seq,
        taken_at=taken_at,
        ttl_s=snapshot.ttl_s,
        workers=tuple(table.worker_ids),
        dp_size=tuple(table.dp_size.tolist()),
        fresh=totals.fresh.astype("u1").tobytes(),
        load={service: tuple(values) for service, values in totals.load.items()},
        drops={str(reason): n for reason, n in snapshot.drops.items() if n},
        drops_by_worker={
            wid: {str(r): n for r, n in per.items() if n} for wid, per in snapshot.drops_by_worker.items()
        },
        seen=seen,
        received=received,
        run_started_at=run_started_at,
        traffic={} if traffic is None else traffic.totals(snapshot.now),
    )


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(ShardSummary)


def encode_summary(summary: ShardSummary) -> bytes:
    return _encoder.encode(summary)


def decode_summary(payload: bytes) -> ShardSummary:
    """Decode a summary; ``ValueError`` naming the problem for anything else (a newer version included)."""
    try:
        summary = _decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ValueError(f"not a shard summary: {exc}") from exc
    if summary.version not in READS_VERSIONS:
        raise ValueError(
            f"unsupported shard summary version {summary.version} (this leader reads {list(READS_VERSIONS)})"
        )
    ranks = sum(summary.dp_size)
    if len(summary.dp_size) != len(summary.workers) or len(summary.fresh) != ranks:
        raise ValueError(f"shard summary {summary.shard_id!r}: workers, dp_size and fresh disagree in length")
    try:
        check_traffic(summary.traffic)
    except ValueError as exc:
        raise ValueError(f"shard summary {summary.shard_id!r}: {exc}") from exc
    return summary

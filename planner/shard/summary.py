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

Rank counters (optional fields of version 2, which a leader that does not know them ignores): what the
diagnostics show per rank and only the shard counts (samples, heartbeats, counter restarts and gaps, lost
samples, the age of the newest message and of the newest step sample), packed as 24 bytes a rank
(:data:`RANK_STATS`) for at most :data:`RANK_STATS_PER_SUMMARY` ranks per summary: every rank of a shard up to
that many, else a window that moves on by that many ranks with every summary (``rank_stats_start``, in the
summary's rank order, wrapping), so a summary carries at most 6 KiB of counters however many ranks the shard owns;
with more ranks than that, each rank's counters are refreshed every ``ranks / 256`` summaries.
"""

from __future__ import annotations

import msgspec
import numpy as np
import numpy.typing as npt

from planner.ingest.store import DropReason, FleetSnapshot
from planner.shard.traffic import CumulativeTraffic, ServiceTraffic, check_traffic

__all__ = [
    "NEVER_MS",
    "RANK_STATS",
    "RANK_STATS_PER_SUMMARY",
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

# One rank's counters as the diagnostics show them (little-endian; counts saturate, ages in ms).
RANK_STATS = np.dtype(
    [
        ("samples", "<u4"),
        ("heartbeats", "<u4"),
        ("restarts", "<u2"),
        ("gaps", "<u2"),
        ("lost", "<u4"),
        ("age_ms", "<u4"),
        ("active_age_ms", "<u4"),
    ]
)
RANK_STATS_PER_SUMMARY = 256  # ranks whose counters one summary carries (6 KiB)
NEVER_MS = 2**32 - 1  # an age of a rank never heard from (or beyond ~49 days)


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
    # the counters (RANK_STATS, packed) of the ranks at positions rank_stats_start, +1, ... (wrapping)
    rank_stats_start: int = 0
    rank_stats: bytes = b""

    def rank_positions(self) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.void]]:
        """(the rank positions in this summary's order, their counters) of what ``rank_stats`` holds."""
        stats = np.frombuffer(self.rank_stats, dtype=RANK_STATS)
        ranks = len(self.fresh)
        if not len(stats):
            return np.zeros(0, np.intp), stats
        return (self.rank_stats_start + np.arange(len(stats), dtype=np.intp)) % ranks, stats


def _clip(value: int, dtype: str) -> int:
    return min(max(0, value), int(np.iinfo(dtype).max))


def _age_ms(age_s: float | None) -> int:
    return NEVER_MS if age_s is None else min(NEVER_MS - 1, max(0, round(age_s * 1000.0)))


def rank_stats(snapshot: FleetSnapshot, seq: int, per_summary: int = RANK_STATS_PER_SUMMARY) -> tuple[int, bytes]:
    """(start position, packed counters) of the ranks summary ``seq`` carries (see the module docstring)."""
    table = snapshot.totals.table
    ranks = table.size
    if ranks == 0 or per_summary < 1:
        return 0, b""
    count = min(per_summary, ranks)
    start = ((seq - 1) * count) % ranks if ranks > count else 0
    out = np.zeros(count, dtype=RANK_STATS)
    for i in range(count):
        slot = (start + i) % ranks
        view = snapshot.ranks.get((table.slot_worker[slot], table.slot_rank[slot]))
        if view is None:
            out[i]["age_ms"] = out[i]["active_age_ms"] = NEVER_MS
            continue
        out[i] = (
            _clip(view.samples, "<u4"),
            _clip(view.heartbeats, "<u4"),
            _clip(view.restarts, "<u2"),
            _clip(view.gaps, "<u2"),
            _clip(view.lost_samples, "<u4"),
            _age_ms(view.age_s),
            _age_ms(view.active_age_s),
        )
    return start, out.tobytes()


def summarize(
    shard_id: str,
    seq: int,
    snapshot: FleetSnapshot,
    taken_at: float,
    received: int,
    *,
    traffic: CumulativeTraffic | None = None,
    run_started_at: float | None = None,
    rank_stats_per_summary: int = RANK_STATS_PER_SUMMARY,
) -> ShardSummary:
    """The summary of a shard's store snapshot (taken at the store's ``snapshot.now``; ``taken_at`` is the same
    instant on the wall clock, which the leader compares across processes). ``traffic``: the shard's counters
    (the store's traffic hook), sent with ``run_started_at`` (both or neither). The rank counters of up to
    ``rank_stats_per_summary`` ranks go with it (0: none)."""
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
    stats_start, stats = rank_stats(snapshot, seq, rank_stats_per_summary)
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
        rank_stats_start=stats_start,
        rank_stats=stats,
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
    n_stats, odd = divmod(len(summary.rank_stats), RANK_STATS.itemsize)
    if odd or n_stats > ranks or not 0 <= summary.rank_stats_start < max(1, ranks):
        raise ValueError(f"shard summary {summary.shard_id!r}: rank_stats do not fit its {ranks} ranks")
    try:
        check_traffic(summary.traffic)
    except ValueError as exc:
        raise ValueError(f"shard summary {summary.shard_id!r}: {exc}") from exc
    return summary

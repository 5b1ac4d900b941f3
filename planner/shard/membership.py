"""What the leader tells the ingest shards every tick: the discovered workers and the live shard set.

The leader runs discovery (Kubernetes pods, registrations, a static file); the shards follow it rather than a
file of their own. Every tick the leader publishes a :class:`Membership` on
``fpm-shard.<ns>.membership.v1`` (:func:`membership_subject`; four tokens, so it never matches the summaries'
``fpm-shard.<ns>.*``): the live shard set (the shards whose summaries are fresh) and the workers, each as much
as a shard needs to route and attribute its samples (id, role, service, FPM endpoints: the endpoints are the
keys the leader's diagnostics read a summary's ``seen`` records by; the capacities stay with the leader).

Compact and bounded: msgpack arrays, and a worker set larger than ``max_part_bytes`` is cut into parts
(``part`` of ``parts``, same ``seq``) so no message passes the server's ``max_payload``. A shard applies a
membership only once it holds every part of one ``seq`` (:class:`MembershipAssembler`), and never one older
than what it applied (by ``(taken_at, seq)``). ``version`` is checked: a shard refuses a membership it cannot
read, with a clear error, and keeps its partition.

Two optional fields carry the leader's settings a shard must follow (a version 1 reader without them ignores
them; a membership without them reads as "not set"): ``limits``, the planner's ``ingest.limits``
(:class:`~planner.ingest.drops.FpmLimits`, which the shard's store then checks every sample against, so a sample
the planner would drop as ``invalid_value`` is dropped by the shard too), and ``perf_points_per_s``, the
fleet-wide rate of perf-model training points the leader takes (:mod:`planner.shard.perf_points`; 0: none).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import msgspec

from planner.discovery import Role, WorkerRecord
from planner.ingest.drops import FpmLimits
from planner.shard.summary import ShardSummary
from planner.transport.subjects import escape

__all__ = [
    "MEMBERSHIP_VERSION",
    "MemberWorker",
    "Membership",
    "MembershipAssembler",
    "decode_membership",
    "encode_membership",
    "membership_due",
    "membership_parts",
    "membership_subject",
]

MEMBERSHIP_VERSION = 1


def membership_subject(namespace: str) -> str:
    return f"fpm-shard.{escape(namespace)}.membership.v{MEMBERSHIP_VERSION}"


class MemberWorker(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One discovered worker as a shard needs it (``dp_size`` is the number of endpoints)."""

    worker_id: str
    role: str
    service: str
    fpm_endpoints: tuple[str, ...]

    def record(self) -> WorkerRecord:
        return WorkerRecord(
            worker_id=self.worker_id,
            role=Role(self.role),
            service=self.service,
            dp_size=len(self.fpm_endpoints),
            fpm_endpoints=self.fpm_endpoints,
        )


class Membership(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One part of the leader's membership at ``taken_at`` (the leader's wall clock, seconds since the epoch)."""

    version: int = MEMBERSHIP_VERSION
    leader: str  # who published it (diagnostics, logs)
    seq: int  # increases with every membership of one leader run
    taken_at: float
    shards: tuple[str, ...]  # the live shard set, sorted
    part: int = 0
    parts: int = 1
    workers: tuple[MemberWorker, ...] = ()  # this part's workers
    limits: FpmLimits | None = None  # the planner's ingest.limits (None: the leader sent none: keep the shard's)
    perf_points_per_s: float = 0.0  # fleet-wide perf-model training points the leader takes per second


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Membership)


def encode_membership(membership: Membership) -> bytes:
    return _encoder.encode(membership)


def decode_membership(payload: bytes) -> Membership:
    """Decode one part; ``ValueError`` naming the problem for anything else (a newer version included)."""
    try:
        membership = _decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ValueError(f"not a shard membership: {exc}") from exc
    if membership.version != MEMBERSHIP_VERSION:
        raise ValueError(
            f"unsupported shard membership version {membership.version} (this shard reads {MEMBERSHIP_VERSION})"
        )
    if not 0 <= membership.part < membership.parts:
        raise ValueError(f"shard membership part {membership.part} of {membership.parts}")
    if not (math.isfinite(membership.perf_points_per_s) and membership.perf_points_per_s >= 0):
        raise ValueError(f"shard membership perf_points_per_s {membership.perf_points_per_s} is not a rate >= 0")
    return membership


def membership_parts(
    *,
    leader: str,
    seq: int,
    taken_at: float,
    shards: Sequence[str],
    workers: Mapping[str, WorkerRecord],
    max_part_bytes: int = 48 * 1024,
    limits: FpmLimits | None = None,
    perf_points_per_s: float = 0.0,
) -> list[bytes]:
    """The encoded parts of one membership, each at most about ``max_part_bytes`` (one worker never splits);
    ``limits`` and ``perf_points_per_s`` go in every part."""
    members = [MemberWorker(r.worker_id, r.role.value, r.service, tuple(r.fpm_endpoints)) for r in workers.values()]
    groups: list[list[MemberWorker]] = [[]]
    size = 0
    for member in members:
        n = len(_encoder.encode(member))
        if groups[-1] and size + n > max_part_bytes:
            groups.append([])
            size = 0
        groups[-1].append(member)
        size += n
    live = tuple(sorted(shards))
    return [
        encode_membership(
            Membership(
                leader=leader,
                seq=seq,
                taken_at=taken_at,
                shards=live,
                part=i,
                parts=len(groups),
                workers=tuple(group),
                limits=limits,
                perf_points_per_s=perf_points_per_s,
            )
        )
        for i, group in enumerate(groups)
    ]


def membership_due(
    *,
    now: float,
    published_at: float | None,
    repeat_s: float,
    workers_changed: bool,
    shards: Sequence[str],
    published_shards: Sequence[str],
    owned: Mapping[str, frozenset[str]],
    summaries: Mapping[str, ShardSummary],
) -> str | None:
    """Why the leader must publish its membership at ``now`` (wall clock), or None: the shards follow the last one.

    Due when nothing was published yet, the workers or the live shard set changed, ``repeat_s`` passed since the
    last one, or a live shard's summary taken after the last publish does not hold the workers the partition
    gives it (``owned``: a shard restarted, or it missed a part: NATS delivery is at most once)."""
    if published_at is None:
        return "first"
    if workers_changed:
        return "workers_changed"
    if tuple(shards) != tuple(published_shards):
        return "shards_changed"
    if now - published_at >= repeat_s:
        return "repeat"
    for shard in shards:
        summary = summaries.get(shard)
        if summary is not None and summary.taken_at > published_at:
            if frozenset(summary.workers) != owned.get(shard, frozenset()):
                return "shard_behind"
    return None


class MembershipAssembler:
    """A shard's side: collects the parts of the memberships newer than the last applied one (at most
    ``max_pending`` at once, the oldest given up first) and yields one once it is complete."""

    def __init__(self, max_pending: int = 4) -> None:
        self.applied: tuple[float, int] | None = None  # (taken_at, seq) of the last complete membership
        # the leader's settings in the last complete membership (limits None: it sent none)
        self.limits: FpmLimits | None = None
        self.perf_points_per_s = 0.0
        self.max_pending = max_pending
        self._pending: dict[tuple[float, int, str], dict[int, Membership]] = {}
        self.refused = 0

    def add(self, part: Membership) -> tuple[dict[str, WorkerRecord], tuple[str, ...]] | None:
        """Take one part; (workers, shard set) when it completes a membership newer than the last applied."""
        order = (part.taken_at, part.seq)
        if self.applied is not None and order <= self.applied:
            self.refused += 1
            return None
        key = (part.taken_at, part.seq, part.leader)
        parts = self._pending.setdefault(key, {})
        parts[part.part] = part
        while len(self._pending) > self.max_pending:
            del self._pending[min(self._pending)]
        if len(parts) < part.parts:
            return None
        self.applied = order
        self.limits = part.limits
        self.perf_points_per_s = part.perf_points_per_s
        self._pending = {k: v for k, v in self._pending.items() if (k[0], k[1]) > order}
        workers: dict[str, WorkerRecord] = {}
        for i in range(part.parts):
            for member in parts[i].workers:
                try:
                    workers[member.worker_id] = member.record()
                except ValueError:  # a record discovery itself would have refused: not ours to route
                    self.refused += 1
        return workers, part.shards

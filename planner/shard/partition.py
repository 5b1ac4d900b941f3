"""Which shard owns which worker: rendezvous (highest random weight) hashing of the worker id over shard ids.

Stable: a worker's owner depends only on its id and the set of shard ids, not on their order or on the other
workers. When a shard joins it takes over only the workers whose highest weight is now its own (about 1/N of
them); when one leaves only its own workers move, each to the shard with its next-highest weight. No other
worker changes owner, so rebalancing restarts the state of the moved workers only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from hashlib import blake2b

__all__ = ["owner", "partition"]


def _weight(shard_id: str, worker_id: str) -> bytes:
    return blake2b(f"{shard_id}\x00{worker_id}".encode(), digest_size=8).digest()


def owner(worker_id: str, shard_ids: Sequence[str]) -> str:
    """The shard that owns ``worker_id`` among ``shard_ids`` (non-empty)."""
    if not shard_ids:
        raise ValueError("no shards to own a worker")
    return max(shard_ids, key=lambda shard: (_weight(shard, worker_id), shard))


def partition(worker_ids: Iterable[str], shard_ids: Sequence[str]) -> dict[str, list[str]]:
    """Every shard's workers (in the order given); every shard is a key, perhaps with no workers."""
    out: dict[str, list[str]] = {shard: [] for shard in shard_ids}
    for wid in worker_ids:
        out[owner(wid, shard_ids)].append(wid)
    return out

"""Known workers: who may publish FPM, on which endpoints, with which engine capacities.

Sources yield :class:`WorkerRecord` s keyed by worker id. Two sources live here: a static YAML file and an
in-memory registry with leases (the registration API's backing store). Both are pure with respect to time:
``now`` is passed in.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import msgspec
import yaml

from planner.errors import DiscoveryError, LeaseError

__all__ = [
    "DEFAULT_FPM_PORT_BASE",
    "Discovery",
    "EngineCapacity",
    "LeaseRegistry",
    "Role",
    "StaticFileDiscovery",
    "WorkerRecord",
    "default_endpoints",
    "parse_worker",
]

DEFAULT_FPM_PORT_BASE = 20380


class Role(enum.StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"
    AGG = "agg"


class EngineCapacity(msgspec.Struct, frozen=True, kw_only=True):
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    max_model_len: int = 8192
    kv_capacity_tokens: int = 0  # 0 = unknown


class WorkerRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One discovered worker (one vLLM server, possibly with several data-parallel ranks)."""

    worker_id: str
    role: Role
    service: str
    dp_size: int = 1
    fpm_endpoints: tuple[str, ...] = ()  # one per DP rank, index = dp_rank
    capacity: EngineCapacity = EngineCapacity()

    def __post_init__(self) -> None:
        if not self.worker_id:
            raise ValueError("worker_id must not be empty")
        if self.dp_size < 1:
            raise ValueError(f"worker {self.worker_id}: dp_size must be >= 1, got {self.dp_size}")
        if len(self.fpm_endpoints) != self.dp_size:
            raise ValueError(
                f"worker {self.worker_id}: {len(self.fpm_endpoints)} fpm_endpoints for dp_size {self.dp_size}"
                " (one per rank)"
            )
        if len(set(self.fpm_endpoints)) != len(self.fpm_endpoints):
            raise ValueError(f"worker {self.worker_id}: fpm_endpoints repeat an endpoint")
        for name in EngineCapacity.__struct_fields__:
            if getattr(self.capacity, name) < 0:
                raise ValueError(f"worker {self.worker_id}: capacity.{name} must be >= 0")


def default_endpoints(host: str, dp_size: int, base_port: int = DEFAULT_FPM_PORT_BASE) -> tuple[str, ...]:
    """The endpoints a worker's shim binds by default: ``tcp://host:{base_port + rank}``."""
    return tuple(f"tcp://{host}:{base_port + rank}" for rank in range(dp_size))


_worker_decoder = msgspec.json.Decoder(WorkerRecord)


def parse_worker(data: Mapping[str, Any]) -> WorkerRecord:
    """Validate one worker from plain data (YAML, JSON); a missing ``fpm_endpoints`` with a ``host`` gets the
    default ports. Raises :class:`DiscoveryError` naming the problem."""
    raw = dict(data)
    if "fpm_endpoints" not in raw and "host" in raw:
        raw["fpm_endpoints"] = list(
            default_endpoints(
                str(raw["host"]), int(raw.get("dp_size", 1)), int(raw.get("fpm_port_base", DEFAULT_FPM_PORT_BASE))
            )
        )
    raw.pop("host", None)
    raw.pop("fpm_port_base", None)
    try:
        return msgspec.convert(raw, WorkerRecord)
    except (msgspec.ValidationError, ValueError) as exc:
        raise DiscoveryError(f"invalid worker {raw.get('worker_id', '?')!r}: {exc}") from exc


class Discovery(Protocol):
    """A source of known workers."""

    def workers(self, now: float) -> Mapping[str, WorkerRecord]:
        """The workers known at ``now``, by worker id."""
        ...


class StaticFileDiscovery:
    """Workers listed in a YAML file: ``workers: [{worker_id, role, service, dp_size, fpm_endpoints | host,
    capacity: {...}}]``. The file is re-read when its modification time changes; a file that stops parsing keeps
    the last good list and reports the error in :attr:`last_error`."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.last_error: str | None = None
        self._mtime_ns: int | None = None
        self._workers: dict[str, WorkerRecord] = self.load(self.path)
        self._mtime_ns = self.path.stat().st_mtime_ns

    @staticmethod
    def load(path: Path) -> dict[str, WorkerRecord]:
        try:
            doc = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise DiscoveryError(f"cannot read workers file {path}: {exc}") from exc
        if doc is None:
            return {}
        if not isinstance(doc, dict) or not isinstance(doc.get("workers", []), list):
            raise DiscoveryError(f"{path}: expected a mapping with a 'workers' list")
        workers: dict[str, WorkerRecord] = {}
        for i, item in enumerate(doc.get("workers") or []):
            if not isinstance(item, dict):
                raise DiscoveryError(f"{path}: workers[{i}] is not a mapping")
            record = parse_worker(item)
            if record.worker_id in workers:
                raise DiscoveryError(f"{path}: worker_id {record.worker_id!r} listed twice")
            workers[record.worker_id] = record
        return workers

    def workers(self, now: float) -> Mapping[str, WorkerRecord]:
        try:
            mtime = self.path.stat().st_mtime_ns
            if mtime != self._mtime_ns:
                self._workers = self.load(self.path)
                self._mtime_ns = mtime
            self.last_error = None
        except (OSError, DiscoveryError) as exc:
            self.last_error = str(exc)
        return self._workers


class _Lease(msgspec.Struct, kw_only=True):
    record: WorkerRecord
    ttl_s: float
    expires_at: float


class LeaseRegistry:
    """Workers that registered themselves, each with a lease renewed by registering again.

    A worker whose lease lapses drops out at the next :meth:`workers` call (and is counted in :attr:`expired`).
    """

    def __init__(self, *, default_ttl_s: float = 30.0, max_ttl_s: float = 3600.0) -> None:
        if default_ttl_s <= 0 or max_ttl_s < default_ttl_s:
            raise ValueError("need 0 < default_ttl_s <= max_ttl_s")
        self.default_ttl_s = default_ttl_s
        self.max_ttl_s = max_ttl_s
        self._leases: dict[str, _Lease] = {}
        self.expired: int = 0

    def register(self, record: WorkerRecord, now: float, ttl_s: float | None = None) -> float:
        """Register or re-register (renew) ``record``; returns when its lease expires."""
        ttl = self.default_ttl_s if ttl_s is None else ttl_s
        if not 0 < ttl <= self.max_ttl_s:
            raise LeaseError(f"ttl_s must be in (0, {self.max_ttl_s}], got {ttl}")
        self._expire(now)
        owner = self._endpoint_owner(record)
        if owner is not None:
            raise LeaseError(f"worker {record.worker_id!r}: endpoint already registered by {owner!r}")
        lease = _Lease(record=record, ttl_s=ttl, expires_at=now + ttl)
        self._leases[record.worker_id] = lease
        return lease.expires_at

    def renew(self, worker_id: str, now: float) -> float:
        self._expire(now)
        lease = self._leases.get(worker_id)
        if lease is None:
            raise LeaseError(f"worker {worker_id!r} is not registered (or its lease lapsed)")
        lease.expires_at = now + lease.ttl_s
        return lease.expires_at

    def deregister(self, worker_id: str) -> bool:
        """Remove ``worker_id``; False when it was not registered."""
        return self._leases.pop(worker_id, None) is not None

    def expires_at(self, worker_id: str) -> float | None:
        lease = self._leases.get(worker_id)
        return None if lease is None else lease.expires_at

    def workers(self, now: float) -> Mapping[str, WorkerRecord]:
        self._expire(now)
        return {wid: lease.record for wid, lease in self._leases.items()}

    def _endpoint_owner(self, record: WorkerRecord) -> str | None:
        mine = set(record.fpm_endpoints)
        for wid, lease in self._leases.items():
            if wid != record.worker_id and mine.intersection(lease.record.fpm_endpoints):
                return wid
        return None

    def _expire(self, now: float) -> None:
        gone = [wid for wid, lease in self._leases.items() if lease.expires_at <= now]
        for wid in gone:
            del self._leases[wid]
        self.expired += len(gone)

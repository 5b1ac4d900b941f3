"""Who the planner listens to: registrations (leases), the static workers file and further discovery sources.

:class:`WorkerRegistry` merges the sources (static first: a registration cannot shadow it; then the other
sources, e.g. pod discovery; then the leases), checks a registration against every endpoint another worker
holds, and tells its ``on_change`` callback (the subscriber) whenever the merged set changes.

It is handed a monotonic ``clock`` and a ``to_wall`` conversion by the runner; it never imports the runner.
Times it shows (``expires_at_s``) are wall-clock Unix seconds.
"""

from __future__ import annotations

import ipaddress
import logging
import re
from collections.abc import Callable, Mapping, Sequence

import msgspec

from planner.discovery import Discovery, EngineCapacity, LeaseRegistry, Role, StaticFileDiscovery, WorkerRecord
from planner.errors import ConfigError, DiscoveryError, LeaseError
from planner.service.config import DiscoveryConfig
from planner.service.schemas import WorkersResponse, WorkerView

__all__ = ["EndpointConflictError", "Registration", "WorkerRegistry", "WorkerSource", "check_endpoint"]

log = logging.getLogger(__name__)

_TCP = re.compile(r"^tcp://(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):(?P<port>[0-9]{1,5})$")
_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)


def check_endpoint(endpoint: str) -> str | None:
    """Why ``endpoint`` is not a connectable ``tcp://host:port`` (None: it is). Refused: other transports
    (``ipc://``, ``inproc://``: nothing outside this host or process), wildcard or unspecified hosts (``*``,
    ``0.0.0.0``, ``::``), interface names, port 0 and ports past 65535."""
    match = _TCP.match(endpoint)
    if match is None:
        return "expected tcp://host:port (a host name or IP address and a port; no other transport)"
    host, port = match.group("host"), int(match.group("port"))
    if not 1 <= port <= 65535:
        return f"port {port} is not connectable (1-65535)"
    bare = host[1:-1] if host.startswith("[") else host
    try:
        address = ipaddress.ip_address(bare)
    except ValueError:
        if host.startswith("[") or not _HOSTNAME.match(host) or host.replace(".", "").isdigit():
            return f"host {host!r} is neither an IP address nor a DNS name"
        return None
    if address.is_unspecified or address.is_multicast:
        return f"host {host!r} is a wildcard or multicast address, not one a subscriber can connect to"
    if isinstance(address, ipaddress.IPv6Address) and not host.startswith("["):
        return f"an IPv6 host is written in brackets: tcp://[{bare}]:{port}"
    return None


class EndpointConflictError(LeaseError):
    """A registration naming an FPM endpoint another registered worker already holds."""


class WorkerSource(msgspec.Struct, frozen=True, kw_only=True):
    """Where a worker came from and, for a lease, when it lapses (wall clock)."""

    source: str  # "registration" | "static" | "kubernetes" | a source's class name
    expires_at_s: float | None


class Registration(msgspec.Struct, frozen=True, kw_only=True):
    worker_id: str
    expires_at_s: float


class WorkerRegistry:
    """Registrations, the static file and the discovery sources, merged into one set of workers."""

    def __init__(
        self,
        config: DiscoveryConfig,
        *,
        sources: Sequence[Discovery],
        clock: Callable[[], float],
        to_wall: Callable[[float], float],
        on_change: Callable[[Mapping[str, WorkerRecord]], None],
    ) -> None:
        self.config = config
        self.sources = tuple(sources)
        self._clock = clock
        self._to_wall = to_wall
        self._on_change = on_change
        self.leases = LeaseRegistry(default_ttl_s=config.default_ttl_s, max_ttl_s=config.max_ttl_s)
        self.static: StaticFileDiscovery | None = None
        if config.static_file is not None:
            try:
                self.static = StaticFileDiscovery(config.static_file)
            except DiscoveryError as exc:
                raise ConfigError(f"discovery.static_file: {exc}") from exc
        self._workers: dict[str, WorkerRecord] = {}
        self._sources: dict[str, str] = {}

    @property
    def workers(self) -> Mapping[str, WorkerRecord]:
        return self._workers

    def register(
        self,
        worker_id: str,
        *,
        role: Role,
        service: str,
        dp_size: int,
        fpm_endpoints: tuple[str, ...],
        capacity: EngineCapacity,
        ttl_s: float | None,
    ) -> Registration:
        """Register or renew a worker's lease. Raises LeaseError (bad record, bad TTL, endpoint taken)."""
        if not self.config.registration:
            raise LeaseError("the registration API is disabled (discovery.registration: false)")
        if self.static is not None and worker_id in self.static.workers(self._clock()):
            raise LeaseError(f"worker {worker_id!r} is listed in the static workers file; it cannot register")
        for endpoint in fpm_endpoints:
            problem = check_endpoint(endpoint)
            if problem is not None:
                raise LeaseError(f"worker {worker_id!r}: fpm endpoint {endpoint!r} is refused: {problem}")
        try:
            record = WorkerRecord(
                worker_id=worker_id,
                role=role,
                service=service,
                dp_size=dp_size,
                fpm_endpoints=fpm_endpoints,
                capacity=capacity,
            )
        except ValueError as exc:
            raise LeaseError(str(exc)) from exc
        now = self._clock()
        current = dict(self.leases.workers(now))
        for source in self.sources:  # pod discovery: a token holder cannot take over a pod's endpoint
            try:
                current.update(source.workers(now))
            except DiscoveryError:
                current.update({w: r for w, r in self._workers.items() if self._sources.get(w) == source_label(source)})
        if self.static is not None:
            current.update(self.static.workers(now))
        for other_id, other in current.items():
            taken = set(other.fpm_endpoints).intersection(fpm_endpoints)
            if other_id != worker_id and taken:
                raise EndpointConflictError(
                    f"worker {worker_id!r}: endpoint {sorted(taken)[0]} is already registered by {other_id!r}"
                )
        expires = self.leases.register(record, now, ttl_s)
        self.refresh(now)
        return Registration(worker_id=worker_id, expires_at_s=self._to_wall(expires))

    def deregister(self, worker_id: str) -> bool:
        gone = self.leases.deregister(worker_id)
        if gone:
            self.refresh(self._clock())
        return gone

    def refresh(self, now: float) -> Mapping[str, WorkerRecord]:
        """Merge the sources (static first: a registration cannot shadow it) and let ``on_change`` follow."""
        workers: dict[str, WorkerRecord] = {}
        sources: dict[str, str] = {}
        if self.static is not None:
            for wid, record in self.static.workers(now).items():
                workers[wid] = record
                sources[wid] = "static"
        for source in self.sources:
            label = source_label(source)
            try:
                found = source.workers(now)
            except DiscoveryError as exc:
                log.warning("discovery source %s failed: %s", label, exc)
                continue
            for wid, record in found.items():
                if wid not in workers:
                    workers[wid] = record
                    sources[wid] = label
        for wid, record in self.leases.workers(now).items():
            if wid not in workers:
                workers[wid] = record
                sources[wid] = "registration"
        if workers != self._workers:
            self._workers = workers
            self._on_change(workers)
        self._sources = sources
        return workers

    def worker_source(self, worker_id: str) -> WorkerSource:
        expires = self.leases.expires_at(worker_id)
        return WorkerSource(
            source=self._sources.get(worker_id, "registration"),
            expires_at_s=None if expires is None else self._to_wall(expires),
        )

    def worker_views(self) -> WorkersResponse:
        views = []
        for wid, record in sorted(self._workers.items()):
            source = self.worker_source(wid)
            views.append(
                WorkerView(
                    worker_id=wid,
                    role=record.role.value,
                    service=record.service,
                    dp_size=record.dp_size,
                    fpm_endpoints=record.fpm_endpoints,
                    capacity=record.capacity,
                    source=source.source,
                    expires_at_s=source.expires_at_s,
                )
            )
        return WorkersResponse(workers=tuple(views))

    def not_ready(self, now: float) -> set[str]:
        """Discovered workers a source with readiness (pods) reports not ready."""
        out: set[str] = set()
        for source in self.sources:
            readiness = getattr(source, "readiness", None)
            if readiness is None:
                continue
            out.update(wid for wid, ready in readiness(now).items() if not ready and wid in self._workers)
        return out


def source_label(source: Discovery) -> str:
    name = type(source).__name__
    return {"PodDiscovery": "kubernetes"}.get(name, name)

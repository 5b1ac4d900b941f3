"""Leader election over a ``coordination.k8s.io/v1`` Lease, after client-go's leaderelection package.

Several planner replicas run; one holds the Lease and acts, the others serve the API and diagnostics only.

* **Acquire**: a Lease that does not exist is created; one held by someone else can be taken only once it has
  not changed for ``lease_duration_s`` *as observed locally* (each replica times the record it last saw with
  its own monotonic clock, so clock skew between nodes does not matter); an empty holder can be taken at once.
  Every write carries the resourceVersion read, so two candidates cannot both win (the loser gets 409).
* **Renew**: the leader rewrites ``renewTime`` every ``retry_period_s``.
* **Lose on partition**: :attr:`LeaseElector.is_leader` is True only while the last successful renewal is less
  than ``renew_deadline_s`` old, checked against the clock at each read — a leader that cannot reach the API
  server stops acting by itself, before any other replica may take the Lease (``renew_deadline_s <
  lease_duration_s``).
* **Step down**: :meth:`LeaseElector.release` stops acting first, then clears the holder so a follower takes
  over on its next try instead of waiting out the lease.
* **Health**: with a health check (:meth:`LeaseElector.set_health_check`, the runner's "a tick decided
  recently"), a round while it fails neither renews nor acquires: a leader steps down (released, as above),
  so a replica whose ticks stopped deciding never keeps the Lease alive from its electing thread.

``on_started_leading`` / ``on_stopped_leading`` are called (from the electing thread) on each transition.
``clock`` (monotonic seconds) and ``wall_clock`` (epoch seconds, for the Lease's timestamps) are parameters so
tests can drive time.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

import msgspec
from kubernetes import client as k8s

from planner.k8s.errors import CLIENT_ERRORS, http_status, map_api_error

__all__ = ["LeaderElectionConfig", "LeaseElector", "LeaseRecord"]

log = logging.getLogger(__name__)


class LeaderElectionConfig(msgspec.Struct, frozen=True, kw_only=True):
    namespace: str
    identity: str  # unique per replica, e.g. the pod name
    lease_name: str = "fpm-planner-leader"
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0
    request_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if not self.namespace or not self.identity or not self.lease_name:
            raise ValueError("namespace, identity and lease_name must not be empty")
        if not 0 < self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError(
                "need 0 < retry_period_s < renew_deadline_s < lease_duration_s, got "
                f"{self.retry_period_s}, {self.renew_deadline_s}, {self.lease_duration_s}"
            )
        if self.request_timeout_s <= 0:
            raise ValueError("request_timeout_s must be > 0")


class LeaseRecord(msgspec.Struct, frozen=True, kw_only=True):
    """The fields of a Lease spec that matter for election."""

    holder: str
    lease_duration_s: int
    renew_time: str
    transitions: int


def _record(lease: k8s.V1Lease) -> LeaseRecord:
    spec = lease.spec
    if spec is None:
        return LeaseRecord(holder="", lease_duration_s=0, renew_time="", transitions=0)
    return LeaseRecord(
        holder=spec.holder_identity or "",
        lease_duration_s=int(spec.lease_duration_seconds or 0),
        renew_time=spec.renew_time.isoformat() if spec.renew_time is not None else "",
        transitions=int(spec.lease_transitions or 0),
    )


class LeaseElector:
    """See the module docstring. :meth:`try_acquire_or_renew` is one blocking round; :meth:`start` runs rounds
    every ``retry_period_s`` in a thread."""

    def __init__(
        self,
        api_client: k8s.ApiClient,
        config: LeaderElectionConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        on_started_leading: Callable[[], None] | None = None,
        on_stopped_leading: Callable[[], None] | None = None,
    ) -> None:
        self.config = config
        self._api = k8s.CoordinationV1Api(api_client)
        self._clock = clock
        self._wall = wall_clock
        self._on_started = on_started_leading
        self._on_stopped = on_stopped_leading
        self._lock = threading.RLock()
        self._leading = False  # last round's verdict (is_leader also checks the renew deadline)
        self._last_renew: float | None = None  # monotonic time of the last successful acquire/renew
        self._observed: LeaseRecord | None = None
        self._observed_at: float = 0.0
        self.transitions = 0  # times this replica became leader
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._health: Callable[[], bool] | None = None
        self.unhealthy = False  # the last round found the health check failing

    # ------------------------------------------------------------------------------------------- state
    @property
    def identity(self) -> str:
        return self.config.identity

    @property
    def is_leader(self) -> bool:
        """True only while this replica holds the Lease and renewed it less than ``renew_deadline_s`` ago."""
        with self._lock:
            return (
                self._leading
                and self._last_renew is not None
                and self._clock() - self._last_renew < self.config.renew_deadline_s
            )

    @property
    def observed_holder(self) -> str:
        with self._lock:
            return self._observed.holder if self._observed is not None else ""

    def _set_leading(self, leading: bool) -> None:
        with self._lock:
            changed = leading != self._leading
            self._leading = leading
            if leading and changed:
                self.transitions += 1
        if changed:
            log.info(
                "%s: %s leadership of lease %s",
                self.identity,
                "acquired" if leading else "lost",
                self.config.lease_name,
            )
            callback = self._on_started if leading else self._on_stopped
            if callback is not None:
                callback()

    def _micro_time(self) -> datetime:
        return datetime.fromtimestamp(self._wall(), tz=UTC)

    def set_health_check(self, healthy: Callable[[], bool]) -> None:
        """Renew and acquire only while ``healthy()`` is true (an exception counts as false)."""
        self._health = healthy

    def _healthy(self) -> bool:
        if self._health is None:
            return True
        try:
            return bool(self._health())
        except Exception:  # a failing check is a failed check
            log.exception("leader election health check failed")
            return False

    # ------------------------------------------------------------------------------------------- one round
    def try_acquire_or_renew(self) -> bool:
        """One election round (blocking I/O). Returns whether this replica leads after it."""
        if not self._healthy():
            if not self.unhealthy:
                log.warning(
                    "%s: health check failing (ticks stopped deciding): not renewing lease %s%s",
                    self.identity,
                    self.config.lease_name,
                    "; stepping down" if self._leading else "",
                )
            if self._leading:
                self.release()
            self.unhealthy = True  # after stepping down: whoever reads it sees the Lease released
            self.last_error = "health check failing: ticks stopped deciding"
            return False
        self.unhealthy = False
        ok = self._round()
        with self._lock:
            deadline_passed = (
                self._last_renew is None or self._clock() - self._last_renew >= self.config.renew_deadline_s
            )
            lost = self._observed is not None and self._observed.holder not in ("", self.config.identity)
        if ok:
            self._set_leading(True)
        elif lost or deadline_passed:
            # Someone else holds the Lease (even if our renew deadline has not passed: never act next to them),
            # or we could not renew in time.
            with self._lock:
                if lost:
                    self._last_renew = None
            self._set_leading(False)
        return self.is_leader

    def _round(self) -> bool:
        cfg = self.config
        now = self._clock()
        try:
            lease = self._api.read_namespaced_lease(
                cfg.lease_name, cfg.namespace, _request_timeout=cfg.request_timeout_s
            )
        except CLIENT_ERRORS as exc:
            if http_status(exc) != 404:
                self.last_error = str(map_api_error(exc, verb="get", resource="leases", name=cfg.lease_name))
                return False
            return self._create(now)
        record = _record(lease)
        with self._lock:
            if record != self._observed:
                self._observed, self._observed_at = record, now
            observed_at = self._observed_at
            leading = self._leading
        held_by_other = record.holder not in ("", cfg.identity)
        if held_by_other and observed_at + record.lease_duration_s > now:
            if leading:
                self.last_error = f"lease {cfg.lease_name} is held by {record.holder}"
            return False
        spec = lease.spec or k8s.V1LeaseSpec()
        stamp = self._micro_time()
        if record.holder != cfg.identity:
            spec.acquire_time = stamp
            spec.lease_transitions = record.transitions + 1 if record.holder else record.transitions
        spec.holder_identity = cfg.identity
        spec.lease_duration_seconds = math.ceil(cfg.lease_duration_s)
        spec.renew_time = stamp
        lease.spec = spec
        try:
            updated = self._api.replace_namespaced_lease(
                cfg.lease_name, cfg.namespace, lease, _request_timeout=cfg.request_timeout_s
            )
        except CLIENT_ERRORS as exc:
            self.last_error = str(map_api_error(exc, verb="update", resource="leases", name=cfg.lease_name))
            return False
        self._succeeded(updated, now)
        return True

    def _create(self, now: float) -> bool:
        cfg = self.config
        stamp = self._micro_time()
        lease = k8s.V1Lease(
            api_version="coordination.k8s.io/v1",
            kind="Lease",
            metadata=k8s.V1ObjectMeta(name=cfg.lease_name, namespace=cfg.namespace),
            spec=k8s.V1LeaseSpec(
                holder_identity=cfg.identity,
                lease_duration_seconds=math.ceil(cfg.lease_duration_s),
                acquire_time=stamp,
                renew_time=stamp,
                lease_transitions=0,
            ),
        )
        try:
            created = self._api.create_namespaced_lease(cfg.namespace, lease, _request_timeout=cfg.request_timeout_s)
        except CLIENT_ERRORS as exc:
            self.last_error = str(map_api_error(exc, verb="create", resource="leases", name=cfg.lease_name))
            return False
        self._succeeded(created, now)
        return True

    def _succeeded(self, lease: k8s.V1Lease, now: float) -> None:
        with self._lock:
            self._observed, self._observed_at = _record(lease), now
            self._last_renew = now
        self.last_error = None

    # ------------------------------------------------------------------------------------------- step down
    def release(self) -> bool:
        """Step down: stop acting at once, then clear the holder so another replica can take over without
        waiting out the lease. Returns whether the Lease was released (False when it was not ours or the API
        server could not be reached; it then lapses by itself)."""
        cfg = self.config
        with self._lock:
            was_leading = self._leading
            self._last_renew = None
        self._set_leading(False)
        if not was_leading:
            return False
        try:
            lease = self._api.read_namespaced_lease(
                cfg.lease_name, cfg.namespace, _request_timeout=cfg.request_timeout_s
            )
            if lease.spec is None or lease.spec.holder_identity != cfg.identity:
                return False
            lease.spec.holder_identity = None
            lease.spec.lease_duration_seconds = 1
            lease.spec.renew_time = self._micro_time()
            self._api.replace_namespaced_lease(
                cfg.lease_name, cfg.namespace, lease, _request_timeout=cfg.request_timeout_s
            )
        except CLIENT_ERRORS as exc:
            self.last_error = str(map_api_error(exc, verb="update", resource="leases", name=cfg.lease_name))
            return False
        return True

    # ------------------------------------------------------------------------------------------- loop
    def run(self) -> None:
        """Election rounds every ``retry_period_s`` until :meth:`stop`. Blocking: run it in a thread."""
        while not self._stop.is_set():
            try:
                self.try_acquire_or_renew()
            except Exception:  # a bug must not end the loop silently with is_leader stuck
                log.exception("leader election round failed")
                self._set_leading(False)
            self._stop.wait(self.config.retry_period_s)

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self.run, name="lease-elector", daemon=True)
        self._thread.start()

    def stop(self, *, release: bool = True, timeout_s: float = 5.0) -> None:
        """End the loop; with ``release`` step down cleanly (see :meth:`release`)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        if release:
            self.release()
        else:
            self._set_leading(False)

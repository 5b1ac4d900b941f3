"""Operator controls around the tick: durable state and its audit, pause, fallback, Events and conditions,
and the decision log. The runner composes :class:`Operations` and calls it; it never imports the runner.

Durable state (planner.service.state_store): bounds set at run time, pauses and registrations are written on
every change with the credential's name, and read back at start and every ``state.sync_interval_s`` (so the
other replicas, and the next leader after a failover, see them): :meth:`Operations.sync` returns the stored
state when it changed since it was last seen.

Pause (``POST /v1/pause``): a paused service (or ``*``: every service) is still decided and recorded, but no
scale request is sent (:meth:`Operations.gate`). A Condition ``Paused`` and an Event ``Paused`` / ``Resumed``.

Fallback (``operations.fallback``): when a service has been blind — no attributable FPM from any rank while
workers or ready replicas exist — for ``after_s``, its role's ``replicas`` is applied once per blind spell,
with an Event; never below what is running unless ``allow_below_running``.

Events and conditions (leader only; followers would repeat them): a scale applied (``SuccessfulRescale``) or
failed (``FailedRescale``), a blind hold, identity not synced, capped at max with a predicted SLA miss; the
HPA-like conditions of each service after every tick (written only when they change).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from typing import Any, Protocol

import msgspec

from planner.actuators.base import ScaleRequest
from planner.core import CoreConfig, Decision, Reason
from planner.discovery import Role
from planner.errors import ConfigError
from planner.k8s.events import EventReason, EventType, ScaleStatus
from planner.service.decision_log import DecisionLog
from planner.service.history import OutcomeEntry
from planner.service.metrics import PlannerMetrics, capped_at_max_with_predicted_miss
from planner.service.state_store import AuditRecord, FileBackend, MemoryBackend, RuntimeState, StateStore

__all__ = [
    "ALL_SERVICES",
    "PAUSED",
    "FallbackConfig",
    "Operations",
    "OperationsConfig",
    "PauseInfo",
    "StateConfig",
    "StatusSink",
    "build_store",
    "is_blind",
    "role_targets",
]

log = logging.getLogger(__name__)

ALL_SERVICES = "*"
PAUSED = "paused"  # outcome kind: not sent because the service is paused
_NOT_FAILURES = frozenset({"applied", "unchanged", "advisory", "not_leader", "deferred", PAUSED})


class StateConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Where the durable state lives: ``configmap`` (a name, in the Kubernetes section's namespace) or
    ``file`` (a path); neither: in memory (lost on restart)."""

    file: str = ""
    configmap: str = ""
    audit_limit: int = 500
    sync_interval_s: float = 5.0

    def __post_init__(self) -> None:
        if self.file and self.configmap:
            raise ValueError("state: give one of file and configmap, not both")
        if self.audit_limit < 1:
            raise ValueError(f"state.audit_limit must be >= 1, got {self.audit_limit}")
        if self.sync_interval_s <= 0:
            raise ValueError(f"state.sync_interval_s must be > 0, got {self.sync_interval_s}")


class FallbackConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    replicas: dict[str, int] = {}  # role -> replicas to apply when blind for after_s
    after_s: float = 120.0
    allow_below_running: bool = False

    def __post_init__(self) -> None:
        for role, n in self.replicas.items():
            if role not in ("agg", "prefill", "decode"):
                raise ValueError(f"fallback.replicas: unknown role {role!r} (expected agg, decode or prefill)")
            if n < 0:
                raise ValueError(f"fallback.replicas.{role} must be >= 0, got {n}")
        if self.after_s <= 0:
            raise ValueError(f"fallback.after_s must be > 0, got {self.after_s}")


class OperationsConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    state: StateConfig = StateConfig()
    fallback: FallbackConfig = FallbackConfig()
    events: bool = True  # Events and conditions on the scaled objects (Kubernetes actuator only)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None) -> OperationsConfig:
        try:
            return msgspec.convert(dict(data or {}), cls)
        except (msgspec.ValidationError, ValueError) as exc:
            raise ConfigError(f"operations: {exc}") from exc


class PauseInfo(msgspec.Struct, frozen=True, kw_only=True):
    service: str  # the service, or "*"
    by: str
    at_s: float
    reason: str = ""


class StatusSink(Protocol):
    """Where Events and conditions go (planner.k8s.status_sink.KubeStatusSink)."""

    def event(self, service: str, type_: EventType, reason: EventReason, note: str, now_s: float) -> bool: ...

    def conditions(self, service: str, status: ScaleStatus, now_s: float) -> None: ...


def build_store(
    config: StateConfig, wall_clock: Callable[[], float], kubernetes: Mapping[str, Any] | None = None
) -> StateStore:
    """The store ``config`` names: a ConfigMap (needs the ``kubernetes`` section: namespace and client), a
    file, or memory."""
    if config.configmap:
        if kubernetes is None:
            raise ConfigError("operations.state.configmap needs a kubernetes section (namespace, client)")
        from planner.k8s.client import KubeClientConfig, make_api_client
        from planner.service.state_store import ConfigMapBackend

        try:
            client = msgspec.convert(dict(kubernetes.get("client") or {}), KubeClientConfig)
            namespace = str(kubernetes["namespace"])
        except (KeyError, msgspec.ValidationError, ValueError) as exc:
            raise ConfigError(f"kubernetes: {exc}") from exc
        backend: Any = ConfigMapBackend(make_api_client(client), namespace, config.configmap)
    elif config.file:
        backend = FileBackend(config.file)
    else:
        backend = MemoryBackend()
    return StateStore(backend, wall_clock, audit_limit=config.audit_limit)


def role_targets(core: CoreConfig) -> dict[str, dict[str, Any]]:
    """SLA targets and bounds of every configured role (what ``GET /v1/targets`` shows)."""
    out: dict[str, dict[str, Any]] = {}
    for role in Role:
        rc = core.role(role)
        out[role.value] = {
            "mode": rc.mode.value,
            "sla_ttft_ms": rc.sla.ttft_ms,
            "sla_itl_ms": rc.sla.itl_ms,
            "min_replicas": rc.bounds.min_replicas,
            "max_replicas": rc.bounds.max_replicas,
        }
    return out


def is_blind(d: Decision) -> bool:
    """No attributable FPM from any rank while workers or ready replicas exist."""
    cov = d.coverage
    return cov.ranks_fresh == 0 and (cov.discovered > 0 or (cov.deployment_ready or 0) > 0)


def _reasons(d: Decision) -> tuple[str, ...]:
    return tuple(r.value for r in d.reasons)


class Operations:
    """See the module docstring."""

    def __init__(
        self,
        config: OperationsConfig,
        *,
        store: StateStore,
        metrics: PlannerMetrics,
        sink: StatusSink | None,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
    ) -> None:
        self.config = config
        self.store = store
        self.metrics = metrics
        self.sink = sink if config.events else None
        self._clock = clock
        self._wall_clock = wall_clock
        self.decision_log = DecisionLog()
        self._seen_generation: int | None = None
        self._next_sync_at = 0.0
        self._registered: dict[str, Any] = {}  # worker id -> the value last persisted
        self._blind_since: dict[str, float] = {}  # service -> monotonic time its blind spell began
        self._fallback_applied: dict[str, int] = {}  # service -> replicas applied in the current blind spell
        self._failing: dict[str, str] = {}  # service -> the last failed outcome's message
        self._paused_gauges: set[str] = set()
        self._restored: set[tuple[str, str]] = set()  # (worker id, value) taken over from the stored state

    # -- durable state -------------------------------------------------------------------------------------

    def sync(self, *, force: bool = False) -> RuntimeState | None:
        """The stored state when it changed since last seen (read at most every ``sync_interval_s``)."""
        now = self._clock()
        if not force and now < self._next_sync_at:
            return None
        self._next_sync_at = now + self.config.state.sync_interval_s
        state = self.store.load()
        self._registered = dict(state.registrations)
        self._observe_paused(state)
        if state.generation == self._seen_generation:
            return None
        self._seen_generation = state.generation
        return state

    def _observe_paused(self, state: RuntimeState) -> None:
        for service in self._paused_gauges - set(state.pause):
            self.metrics.set_paused(service, False)
        for service in state.pause:
            self.metrics.set_paused(service, True)
        self._paused_gauges = set(state.pause)

    def _changed(self, record: AuditRecord | None) -> AuditRecord | None:
        if record is not None:
            self._seen_generation = self.store.state.generation
        return record

    @staticmethod
    def bounds_patch(state: RuntimeState) -> dict[str, Any]:
        """The stored bounds as a ``PATCH /v1/bounds`` body (empty when none were set at run time)."""
        patch: dict[str, Any] = {}
        roles = {k: v for k, v in state.bounds.items() if k != ALL_SERVICES}
        if roles:
            patch["roles"] = roles
        if ALL_SERVICES in state.bounds:
            patch["max_total_gpus"] = state.bounds[ALL_SERVICES].get("max_total_gpus")
        return patch

    def record_bounds(self, patch: Mapping[str, Any], bounds_after: Mapping[str, Any], *, who: str) -> None:
        """Persist the bounds a ``PATCH /v1/bounds`` set (``bounds_after``: the BoundsResponse as builtins)."""
        for role in (patch.get("roles") or {}).keys():
            after = bounds_after["roles"][str(role)]
            value = {"min_replicas": after["min_replicas"], "max_replicas": after["max_replicas"]}
            self._changed(self.store.set("bounds", str(role), value, who=who, action="set bounds"))
        if "max_total_gpus" in patch:
            value = {"max_total_gpus": bounds_after.get("max_total_gpus")}
            self._changed(self.store.set("bounds", ALL_SERVICES, value, who=who, action="set bounds"))

    def restorable(self, registrations: Mapping[str, Any], known: Container[str]) -> list[tuple[str, Any]]:
        """Stored registrations this replica should take over: not known here, and each (id, value) at most once
        per process, so a lease that lapsed here is not resurrected by every later sync (a worker that vanished
        without deregistering stays in the state until it is deregistered or registers again)."""
        out = []
        for worker_id, value in registrations.items():
            key = (worker_id, json.dumps(value, sort_keys=True))
            if worker_id in known or key in self._restored:
                continue
            self._restored.add(key)
            out.append((worker_id, value))
        return out

    def record_registration(self, worker_id: str, value: Mapping[str, Any] | None, *, who: str) -> None:
        """Persist a registration (``value``: what restores it) or, with None, its removal. A renewal with the
        same value writes nothing (and reads nothing)."""
        current = self._registered.get(worker_id)
        if value is not None and current == value:
            return
        if value is None and current is None and worker_id not in self.store.state.registrations:
            return
        action = "deregister" if value is None else "register"
        self._changed(self.store.set("registrations", worker_id, value, who=who, action=action))
        if value is None:
            self._registered.pop(worker_id, None)
        else:
            self._registered[worker_id] = dict(value)

    # -- pause ---------------------------------------------------------------------------------------------

    def paused(self, service: str) -> PauseInfo | None:
        pauses = self.store.state.pause
        for key in (service, ALL_SERVICES):
            if key in pauses:
                v = pauses[key]
                return PauseInfo(service=key, by=str(v.get("by", "")), at_s=float(v.get("at_s", 0.0)),
                                 reason=str(v.get("reason", "")))  # fmt: skip
        return None

    def pauses(self) -> list[PauseInfo]:
        return [p for p in (self.paused(s) for s in sorted(self.store.state.pause)) if p is not None]

    def pause(self, service: str, *, who: str, reason: str = "", services: Iterable[str] = ()) -> AuditRecord | None:
        """Pause ``service`` (``*``: all). ``services``: the known services (for the Events of ``*``)."""
        value = {"by": who, "at_s": self._wall_clock(), "reason": reason}
        if service in self.store.state.pause:
            return None
        record = self._changed(self.store.set("pause", service, value, who=who, action="pause"))
        self._observe_paused(self.store.state)
        note = f"scaling paused by {who}" + (f": {reason}" if reason else "")
        self._events(service, services, EventType.NORMAL, EventReason.PAUSED, note)
        return record

    def resume(self, service: str, *, who: str, services: Iterable[str] = ()) -> AuditRecord | None:
        record = self._changed(self.store.set("pause", service, None, who=who, action="resume"))
        self._observe_paused(self.store.state)
        if record is not None:
            self._events(service, services, EventType.NORMAL, EventReason.RESUMED, f"scaling resumed by {who}")
        return record

    def _events(self, service: str, services: Iterable[str], t: EventType, reason: EventReason, note: str) -> None:
        if self.sink is None:
            return
        now = self._wall_clock()
        for s in sorted(services) if service == ALL_SERVICES else [service]:
            self.sink.event(s, t, reason, note, now)

    def gate(self, service: str) -> str | None:
        """Why a scale request for ``service`` is not sent (None: send it)."""
        info = self.paused(service)
        if info is None:
            return None
        scope = "every service" if info.service == ALL_SERVICES else "this service"
        return f"paused by {info.by} ({scope}): recorded, not applied"

    # -- fallback ------------------------------------------------------------------------------------------

    def fallback(self, decisions: Iterable[Decision], now: float) -> list[tuple[ScaleRequest, str]]:
        """Fallback scale requests (request, role) for services blind for ``fallback.after_s``; each spell once."""
        cfg = self.config.fallback
        out: list[tuple[ScaleRequest, str]] = []
        for d in decisions:
            if not is_blind(d):
                self._blind_since.pop(d.service, None)
                self._fallback_applied.pop(d.service, None)
                continue
            since = self._blind_since.setdefault(d.service, now)
            wanted = cfg.replicas.get(d.role.value)
            if wanted is None or d.service in self._fallback_applied or now - since < cfg.after_s:
                continue
            running = d.current_replicas
            target = wanted if cfg.allow_below_running else max(wanted, running)
            self._fallback_applied[d.service] = target
            kept = "" if target == wanted else f" (never below the {running} running)"
            note = f"blind for {now - since:.0f} s: fallback_replicas={wanted} -> {target}{kept}"
            log.warning("%s: %s", d.service, note)
            if self.sink is not None:
                self.sink.event(d.service, EventType.WARNING, EventReason.FALLBACK, note, self._wall_clock())
            if target != running:
                out.append((ScaleRequest(service=d.service, replicas=target, reason="fallback"), d.role.value))
        return out

    # -- after a tick --------------------------------------------------------------------------------------

    def after_tick(
        self,
        decisions: Sequence[Decision],
        outcomes: Sequence[OutcomeEntry],
        *,
        leader: bool,
        advisory: bool,
    ) -> None:
        """Log the new decisions; as the leader, Events and conditions; the tick gauges."""
        wall = self._wall_clock()
        self.decision_log.observe(decisions, leader=leader, advisory=advisory)
        for o in outcomes:
            if o.kind in _NOT_FAILURES:
                self._failing.pop(o.service, None)
            else:
                self._failing[o.service] = f"{o.kind}: {o.message}"
        if leader and self.sink is not None:
            by_service = {d.service: d for d in decisions}
            for o in outcomes:
                self._outcome_event(o, by_service.get(o.service), wall)
            for d in decisions:
                self._decision_events(d, wall)
                self.sink.conditions(d.service, self.status_of(d), wall)
        self.metrics.observe_tick(leader=leader, completed_at_s=wall)

    def _outcome_event(self, o: OutcomeEntry, d: Decision | None, wall: float) -> None:
        assert self.sink is not None
        if o.kind == "applied":
            why = " > ".join(_reasons(d)) if d is not None else "fallback"
            self.sink.event(o.service, EventType.NORMAL, EventReason.SUCCESSFUL_RESCALE,
                            f"New size: {o.requested}; reason: {why}", wall)  # fmt: skip
        elif o.kind not in _NOT_FAILURES:
            self.sink.event(o.service, EventType.WARNING, EventReason.FAILED_RESCALE,
                            f"failed to scale to {o.requested}: {o.kind}: {o.message}", wall)  # fmt: skip

    def _decision_events(self, d: Decision, wall: float) -> None:
        assert self.sink is not None
        cov = d.coverage
        if is_blind(d):
            note = (f"no attributable FPM ({cov.ranks_fresh}/{cov.ranks_expected} ranks fresh, {cov.discovered} "
                    f"workers discovered): holding at {d.final_replicas}")  # fmt: skip
            self.sink.event(d.service, EventType.WARNING, EventReason.BLIND_HOLD, note, wall)
        if Reason.IDENTITY_NOT_SYNCED in d.reasons:
            self.sink.event(d.service, EventType.WARNING, EventReason.IDENTITY_NOT_SYNCED, d.summary, wall)
        if capped_at_max_with_predicted_miss(_reasons(d), recommended=d.recommended_replicas, final=d.final_replicas):
            ttft, itl = d.inputs.predicted_ttft_ms, d.inputs.predicted_itl_ms
            predicted = ", ".join(
                f"{name} {value:.0f} ms" for name, value in (("TTFT", ttft), ("ITL", itl)) if value is not None
            )
            note = (f"capped at max_replicas={d.final_replicas} while the SLA needs {d.recommended_replicas}"
                    + (f" (predicted at {d.final_replicas}: {predicted})" if predicted else ""))  # fmt: skip
            self.sink.event(d.service, EventType.WARNING, EventReason.CAPPED_AT_MAX, note, wall)

    def status_of(self, d: Decision) -> ScaleStatus:
        reasons = _reasons(d)
        pause = self.paused(d.service)
        holds = [r for r in (Reason.IDENTITY_NOT_SYNCED, Reason.RANKS_MISSING, Reason.WORKERS_SILENT) if r in d.reasons]
        return ScaleStatus(
            actuator_ok=d.service not in self._failing,
            actuator_message=self._failing.get(d.service, ""),
            blind=is_blind(d),
            hold_reason=holds[0].value if holds else "",
            capped_at_max="clamped_to_max" in reasons,
            capped_at_min="clamped_to_min" in reasons,
            predicted_miss=capped_at_max_with_predicted_miss(
                reasons, recommended=d.recommended_replicas, final=d.final_replicas
            ),
            paused=pause is not None,
            paused_by=pause.by if pause is not None else "",
            fallback_active=d.service in self._fallback_applied,
            fallback_replicas=self._fallback_applied.get(d.service),
            desired_replicas=d.final_replicas,
        )

"""The diagnostics read model: everything an operator needs to see why the planner does what it does.

:class:`DiagnosticsView` is built once by the runner and handed the parts it reads (the subscriber, the
registry, the decider, the actuation record, the perf feed, the history), the clocks and a leader flag, and a
function returning the tick loop's figures (:class:`TickFigures`). It never imports the runner. The document
it returns is described in docs/service.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from planner.discovery import Role
from planner.ingest.traffic import traffic_to_builtins
from planner.service.actuation import Actuation
from planner.service.deciding import Decider
from planner.service.history import DecisionEntry, History
from planner.service.perf_feed import PerfFeed
from planner.service.registry import WorkerRegistry
from planner.transport.settings import IngestSource

__all__ = ["DiagnosticsView", "TickFigures"]


class TickFigures(msgspec.Struct, frozen=True, kw_only=True):
    """The tick loop's state as the runner sees it (times already wall clock)."""

    ticks: int
    last_tick_at_s: float | None
    last_tick_error: str | None
    tick_interval_s: float
    last_tick_duration_ms: float | None
    last_tick_hold: dict[str, Any] | None = None  # the last tick that held without deciding: reason, detail, at_s
    tick_holds: dict[str, int] = {}  # ticks held without deciding, by reason (TickHold)
    ticking: bool = True  # a tick decided recently (what the leader elector's health check reads)


class DiagnosticsView:
    def __init__(
        self,
        *,
        subscriber: IngestSource,
        registry: WorkerRegistry,
        decider: Decider,
        actuation: Actuation,
        perf: PerfFeed,
        history: History,
        actuator_configured: bool,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
        is_leader: Callable[[], bool],
        tick_figures: Callable[[], TickFigures],
    ) -> None:
        self.subscriber = subscriber
        self.registry = registry
        self.decider = decider
        self.actuation = actuation
        self.perf = perf
        self.history = history
        self.actuator_configured = actuator_configured
        self._clock = clock
        self._wall_clock = wall_clock
        self._is_leader = is_leader
        self._tick_figures = tick_figures

    def document(self) -> dict[str, Any]:
        """The diagnostics document (``GET /v1/diagnostics``)."""
        now = self._clock()
        snapshot = self.subscriber.snapshot(now)
        workers: list[dict[str, Any]] = []
        not_ready = self.registry.not_ready(now)
        for wid, record in sorted(self.registry.workers.items()):
            source = self.registry.worker_source(wid)
            ranks = []
            for rank in range(record.dp_size):
                view = snapshot.ranks.get((wid, rank))
                endpoint = record.fpm_endpoints[rank]
                seen = snapshot.endpoints.get(endpoint)
                ranks.append(
                    {
                        "dp_rank": rank,
                        "endpoint": endpoint,
                        "fresh": bool(view and view.fresh),
                        "last_sample_age_s": None if view is None else view.age_s,
                        "last_active_age_s": None if view is None else view.active_age_s,
                        "samples": 0 if view is None else view.samples,
                        "heartbeats": 0 if view is None else view.heartbeats,
                        "counter_restarts": 0 if view is None else view.restarts,
                        "counter_gaps": 0 if view is None else view.gaps,
                        "lost_samples": 0 if view is None else view.lost_samples,
                        "endpoint_publishes_as": None if seen is None else seen.worker_id,
                        "endpoint_publishes_rank": None if seen is None else seen.dp_rank,
                        "load": _load(view.last_active if view is not None else None),
                    }
                )
            drops = snapshot.drops_by_worker.get(wid, {})
            workers.append(
                {
                    "worker_id": wid,
                    "role": record.role.value,
                    "service": record.service,
                    "dp_size": record.dp_size,
                    "source": source.source,
                    "lease_expires_at_s": source.expires_at_s,
                    "capacity": msgspec.to_builtins(record.capacity),
                    "ranks": ranks,
                    "drops": {str(k): v for k, v in drops.items() if v},
                    **self._classification(wid, ranks, not_ready),
                }
            )
        services = self._service_counts(workers)
        leader = self._is_leader()
        ticks = self._tick_figures()
        return {
            "now_s": self._wall_clock(),
            "leader": leader,
            "leadership": "leader" if leader else "follower",
            "ticks": ticks.ticks,
            "last_tick_at_s": ticks.last_tick_at_s,
            "last_tick_error": ticks.last_tick_error,
            "tick_interval_s": ticks.tick_interval_s,
            "last_tick_duration_ms": ticks.last_tick_duration_ms,
            "last_tick_hold": ticks.last_tick_hold,
            "tick_holds": ticks.tick_holds,
            "ticking": ticks.ticking,
            "ingest": {
                "ttl_s": snapshot.ttl_s,
                "received": self.subscriber.received,
                "loop_errors": self.subscriber.loop_errors,
                "endpoints_connected": len(self.subscriber.endpoints),
                "links": msgspec.to_builtins(self.subscriber.link_totals()),
                "links_troubled": msgspec.to_builtins(self.subscriber.troubled_links()),
                "leases_expired": self.registry.leases.expired,
                "static_file_error": None if self.registry.static is None else self.registry.static.last_error,
            },
            "workers": workers,
            "services": services,
            "roles": _role_counts(services),
            "drops": {str(k): v for k, v in snapshot.drops.items()},
            "actuator": self.actuation.brief(self.actuator_configured),
            "latest_decisions": [_entry_brief(e) for e in self.history.latest()],
            "perf_model": self.perf.brief(),
            # What the FPM traffic extension showed per service at the last tick (issue 13; see planner.ingest.traffic)
            "traffic": {
                service: traffic_to_builtins(t) for service, t in sorted(self.decider.last_fpm_traffic.items())
            },
        }

    def _classification(self, worker_id: str, ranks: list[dict[str, Any]], not_ready: set[str]) -> dict[str, Any]:
        """The worker's classification and its cause, now (read off the live snapshot with the core's
        rules), and as the core's Coverage had it at the last tick (``at_last_tick``; None: not covered)."""
        record = self.registry.workers.get(worker_id)
        decision = self.decider.last_decisions.get(record.service) if record is not None else None
        at_last_tick: dict[str, Any] | None = None
        if decision is not None:
            at_last_tick = {"classification": "healthy", "cause": "fresh FPM on every rank"}
            for problem in decision.coverage.problems:
                if problem.worker_id == worker_id:
                    at_last_tick = {"classification": problem.status.value, "cause": problem.detail}
        missing = [r["dp_rank"] for r in ranks if not r["fresh"]]
        foreign = [r for r in ranks if r["endpoint_publishes_as"] not in (None, worker_id)]
        if worker_id in not_ready:
            classification, cause = "not_ready", "the deployment reports it not ready"
        elif foreign:
            shown = ", ".join(repr(r["endpoint_publishes_as"]) for r in foreign)
            classification = "identity_not_synced"
            cause = f"its endpoint publishes under {shown}, not {worker_id!r}: identity not synced"
        elif not missing:
            classification, cause = "healthy", "fresh FPM on every rank"
        elif len(missing) == len(ranks):
            heard = any(r["last_sample_age_s"] is not None for r in ranks)
            classification = "silent"
            cause = "no fresh FPM from any rank" if heard else "no FPM received yet"
        else:
            classification = "partial"
            cause = f"no fresh FPM from rank(s) {', '.join(map(str, missing))} of {len(ranks)}"
        return {
            "classification": classification,
            "cause": cause,
            "missing_ranks": missing,
            "published_as": sorted({str(r["endpoint_publishes_as"]) for r in foreign}),
            "at_last_tick": at_last_tick,
        }

    def _service_counts(self, workers: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Discovered vs FPM-covered vs deployment counts per service, now; with the core's Coverage verdict
        at the last tick (complete enough for a scale-down, and the gaps when not)."""
        last_decisions = self.decider.last_decisions
        status_now = self.actuation.status
        names = sorted({w["service"] for w in workers} | set(last_decisions))
        out = []
        for service in names:
            decision = last_decisions.get(service)
            mine = [w for w in workers if w["service"] == service]
            status = None if status_now is None else status_now.get(service)
            by_class = {
                c: sum(1 for w in mine if w["classification"] == c)
                for c in ("healthy", "partial", "silent", "identity_not_synced", "not_ready")
            }
            role = mine[0]["role"] if mine else (decision.role.value if decision is not None else "")
            out.append(
                {
                    "service": service,
                    "role": role,
                    "discovered": len(mine),
                    "fpm_covered": by_class["healthy"],
                    "partial": by_class["partial"],
                    "silent": by_class["silent"],
                    "identity_not_synced": by_class["identity_not_synced"],
                    "ranks_expected": sum(len(w["ranks"]) for w in mine),
                    "ranks_fresh": sum(1 for w in mine for r in w["ranks"] if r["fresh"]),
                    "deployment_desired": None if status is None else status.desired,
                    "deployment_ready": None if status is None else status.ready,
                    "coverage_at_last_tick": None
                    if decision is None
                    else {
                        "complete": decision.coverage.complete,
                        "gaps": [g.value for g in decision.coverage.gaps],
                        "discovered": decision.coverage.discovered,
                        "fpm_covered": decision.coverage.healthy,
                    },
                }
            )
        return out


def _role_counts(services: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for role in Role:
        mine = [s for s in services if s["role"] == role.value]
        desired = [s["deployment_desired"] for s in mine if s["deployment_desired"] is not None]
        ready = [s["deployment_ready"] for s in mine if s["deployment_ready"] is not None]
        out[role.value] = {
            "services": [s["service"] for s in mine],
            "discovered": sum(s["discovered"] for s in mine),
            "fpm_covered": sum(s["fpm_covered"] for s in mine),
            "deployment_desired": sum(desired) if desired else None,
            "deployment_ready": sum(ready) if ready else None,
        }
    return out


def _load(sample: Any) -> dict[str, float] | None:
    if sample is None:
        return None
    sched = sample.scheduled_requests
    queued = sample.queued_requests
    return {
        "wall_time_ms": sample.wall_time * 1000.0,
        "prefill_tokens": float(sched.sum_prefill_tokens),
        "decode_requests": float(sched.num_decode_requests),
        "decode_kv_tokens": float(sched.sum_decode_kv_tokens),
        "queued_prefill_tokens": float(queued.sum_prefill_tokens),
        "queued_requests": float(queued.num_prefill_requests + queued.num_decode_requests),
    }


def _entry_brief(entry: DecisionEntry) -> dict[str, Any]:
    return {
        "id": entry.id,
        "role": entry.role,
        "service": entry.service,
        "action": entry.action,
        "decided_at_s": entry.decided_at_s,
        "current": entry.current,
        "recommended": entry.recommended,
        "final": entry.final,
        "reasons": list(entry.reasons),
        "summary": entry.summary,
    }

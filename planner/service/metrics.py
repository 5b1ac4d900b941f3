"""Prometheus series of the planner, in a registry of their own (one per runner, so tests can run several).

The names are a contract with the Grafana dashboard (deploy/): change them together.

=====================================================  ======================================================
``fpm_planner_replicas{role,kind}``                    gauge; kind = current | recommended | final
``fpm_planner_decision_reasons_total{role,reason}``    counter; one per reason per decision
``fpm_planner_estimated_ttft_ms{role}``                gauge; the core's TTFT estimate at the final count
``fpm_planner_estimated_itl_ms{role}``                 gauge; the core's ITL estimate at the final count
``fpm_planner_fpm_drops_total{reason}``                counter; FPM samples dropped by the store, by reason
``fpm_planner_tick_duration_seconds``                  histogram; one decision tick, I/O included
``fpm_planner_actuator_outcomes_total{outcome}``       counter; scale attempts by outcome
=====================================================  ======================================================
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["CONTENT_TYPE_LATEST", "PlannerMetrics"]


class PlannerMetrics:
    """The planner's Prometheus series."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.replicas = Gauge(
            "fpm_planner_replicas",
            "Replicas per role: current, recommended and final (after clamps)",
            ["role", "kind"],
            registry=self.registry,
        )
        self.decision_reasons = Counter(
            "fpm_planner_decision_reasons",
            "Reasons given by decisions, per role",
            ["role", "reason"],
            registry=self.registry,
        )
        self.estimated_ttft_ms = Gauge(
            "fpm_planner_estimated_ttft_ms",
            "Estimated TTFT at the final replica count (ms)",
            ["role"],
            registry=self.registry,
        )
        self.estimated_itl_ms = Gauge(
            "fpm_planner_estimated_itl_ms",
            "Estimated ITL at the final replica count (ms)",
            ["role"],
            registry=self.registry,
        )
        self.fpm_drops = Counter(
            "fpm_planner_fpm_drops",
            "FPM samples dropped, by reason",
            ["reason"],
            registry=self.registry,
        )
        self.tick_duration_seconds = Histogram(
            "fpm_planner_tick_duration_seconds",
            "Duration of one planner tick (s)",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=self.registry,
        )
        self.actuator_outcomes = Counter(
            "fpm_planner_actuator_outcomes",
            "Scale attempts by outcome",
            ["outcome"],
            registry=self.registry,
        )
        self._drops_seen: dict[str, int] = {}

    def observe_drops(self, drops: Mapping[str, int]) -> None:
        """Advance the drop counters to the store's cumulative ``drops`` (reason -> count)."""
        for reason, total in drops.items():
            key = str(reason)
            seen = self._drops_seen.get(key, 0)
            counter = self.fpm_drops.labels(reason=key)  # creates the series at 0 so it is always exported
            if total > seen:
                counter.inc(total - seen)
            self._drops_seen[key] = max(seen, total)

    def observe_decision(
        self,
        role: str,
        *,
        current: int,
        recommended: int,
        final: int,
        reasons: tuple[str, ...],
        ttft_ms: float | None,
        itl_ms: float | None,
    ) -> None:
        self.replicas.labels(role=role, kind="current").set(current)
        self.replicas.labels(role=role, kind="recommended").set(recommended)
        self.replicas.labels(role=role, kind="final").set(final)
        for reason in reasons:
            self.decision_reasons.labels(role=role, reason=str(reason)).inc()
        if ttft_ms is not None:
            self.estimated_ttft_ms.labels(role=role).set(ttft_ms)
        if itl_ms is not None:
            self.estimated_itl_ms.labels(role=role).set(itl_ms)

    def observe_outcome(self, outcome: str) -> None:
        self.actuator_outcomes.labels(outcome=str(outcome)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)

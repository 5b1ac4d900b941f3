"""Prometheus series of the planner, in a registry of their own (one per runner, so tests can run several).

The names are a contract with the Grafana dashboard (deploy/): change them together.

=====================================================  ======================================================
``fpm_planner_replicas{role,service,kind}``            gauge; kind = current | recommended | final
``fpm_planner_decision_reasons_total{role,service,reason}`` counter; one per reason per decision
``fpm_planner_estimated_ttft_ms{role,service}``        gauge; the core's TTFT estimate at the final count
``fpm_planner_estimated_itl_ms{role,service}``         gauge; the core's ITL estimate at the final count
``fpm_planner_fpm_drops_total{reason}``                counter; FPM samples dropped by the store, by reason
``fpm_planner_fpm_link_events_total{event}``           counter; FPM connection events, all endpoints: event =
                                                       disconnect | reconnect | connect_retry | protocol_error
``fpm_planner_fpm_endpoints_backing_off``              gauge; endpoints whose socket waits out a reconnect backoff
``fpm_planner_tick_duration_seconds``                  histogram; one decision tick, I/O included
``fpm_planner_actuator_outcomes_total{service,outcome}`` counter; scale attempts by outcome
``fpm_planner_workers{role,service,classification}``   gauge; discovered workers by coverage classification
                                                       (healthy | partial | silent | identity_not_synced |
                                                       not_ready)
``fpm_planner_coverage_complete{role,service}``        gauge; 1 when every ready replica and rank is covered
``fpm_planner_capped_at_max_predicted_miss{role,service}`` gauge; 1 when the final count is held at max_replicas
                                                       while the SLA needs more (the SLA is predicted missed)
``fpm_planner_leader``                                 gauge; 1 while this replica is the leader
``fpm_planner_last_successful_tick_timestamp_seconds`` gauge; Unix time of the last tick that completed
``fpm_planner_paused{service}``                        gauge; 1 while scaling is paused (``*``: all services)
``fpm_planner_observed_request_rate_per_s{service}``   gauge; arrivals/s from the FPM traffic extension (window)
``fpm_planner_observed_ttft_ms{service,quantile}``     gauge; observed TTFT, quantile 0.5 | 0.9 | 0.99 (FPM)
``fpm_planner_observed_itl_ms{service,quantile}``      gauge; observed per-request mean ITL quantiles (FPM)
``fpm_planner_observed_isl_tokens{service,quantile}``  gauge; prompt tokens of arrivals, quantiles (FPM)
``fpm_planner_observed_osl_tokens{service,quantile}``  gauge; output tokens of completions, quantiles (FPM)
``fpm_planner_observed_attainment_frac{service,target}`` gauge; share at or under the SLA (target ttft | itl)
=====================================================  ======================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from planner.core.decision import Coverage
from planner.core.observation import Traffic

if TYPE_CHECKING:
    from planner.ingest.subscriber import LinkTotals

__all__ = ["CONTENT_TYPE_LATEST", "PlannerMetrics", "capped_at_max_with_predicted_miss"]

_SLA_SHORT = frozenset({"sla_needs_more", "sla_unreachable"})


def capped_at_max_with_predicted_miss(reasons: tuple[str, ...], *, recommended: int, final: int) -> bool:
    """Held at ``max_replicas`` while the SLA recommendation wanted more: the SLA is predicted to be missed."""
    return "clamped_to_max" in reasons and recommended > final and not _SLA_SHORT.isdisjoint(reasons)


_QUANTILE = {"p50": "0.5", "p90": "0.9", "p99": "0.99"}


class PlannerMetrics:
    """The planner's Prometheus series."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.replicas = Gauge(
            "fpm_planner_replicas",
            "Replicas per role: current, recommended and final (after clamps)",
            ["role", "service", "kind"],
            registry=self.registry,
        )
        self.decision_reasons = Counter(
            "fpm_planner_decision_reasons",
            "Reasons given by decisions, per role",
            ["role", "service", "reason"],
            registry=self.registry,
        )
        self.estimated_ttft_ms = Gauge(
            "fpm_planner_estimated_ttft_ms",
            "Estimated TTFT at the final replica count (ms)",
            ["role", "service"],
            registry=self.registry,
        )
        self.estimated_itl_ms = Gauge(
            "fpm_planner_estimated_itl_ms",
            "Estimated ITL at the final replica count (ms)",
            ["role", "service"],
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
            ["service", "outcome"],
            registry=self.registry,
        )
        self.workers = Gauge(
            "fpm_planner_workers",
            "Discovered workers by coverage classification",
            ["role", "service", "classification"],
            registry=self.registry,
        )
        self.coverage_complete = Gauge(
            "fpm_planner_coverage_complete",
            "1 when every ready replica and rank is covered by fresh, attributable FPM",
            ["role", "service"],
            registry=self.registry,
        )
        self.capped_at_max_predicted_miss = Gauge(
            "fpm_planner_capped_at_max_predicted_miss",
            "1 when the final count is held at max_replicas while the SLA needs more replicas",
            ["role", "service"],
            registry=self.registry,
        )
        self.leader = Gauge("fpm_planner_leader", "1 while this replica is the leader", registry=self.registry)
        # Observed from the FPM traffic extension over the traffic window (summary-style quantile label).
        self.observed_request_rate = Gauge(
            "fpm_planner_observed_request_rate_per_s", "Arrivals per second (FPM)", ["service"], registry=self.registry
        )
        self.observed_ttft_ms = Gauge(
            "fpm_planner_observed_ttft_ms",
            "Observed TTFT quantiles (FPM, ms)",
            ["service", "quantile"],
            registry=self.registry,
        )
        self.observed_itl_ms = Gauge(
            "fpm_planner_observed_itl_ms",
            "Observed per-request mean ITL quantiles (FPM, ms)",
            ["service", "quantile"],
            registry=self.registry,
        )
        self.observed_isl_tokens = Gauge(
            "fpm_planner_observed_isl_tokens",
            "Prompt length quantiles of arrivals (FPM)",
            ["service", "quantile"],
            registry=self.registry,
        )
        self.observed_osl_tokens = Gauge(
            "fpm_planner_observed_osl_tokens",
            "Output length quantiles of completions (FPM)",
            ["service", "quantile"],
            registry=self.registry,
        )
        self.observed_attainment = Gauge(
            "fpm_planner_observed_attainment_frac",
            "Fraction of requests at or under the SLA target (FPM; target ttft or itl)",
            ["service", "target"],
            registry=self.registry,
        )
        self.last_successful_tick = Gauge(
            "fpm_planner_last_successful_tick_timestamp_seconds",
            "Unix time of the last tick that completed",
            registry=self.registry,
        )
        self.paused = Gauge(
            "fpm_planner_paused", "1 while scaling is paused ('*': every service)", ["service"], registry=self.registry
        )
        self._drops_seen: dict[str, int] = {}
        self.fpm_link_events = Counter(
            "fpm_planner_fpm_link_events",
            "FPM connection events over all endpoints (disconnect, reconnect, connect_retry, protocol_error)",
            ["event"],
            registry=self.registry,
        )
        self.fpm_endpoints_backing_off = Gauge(
            "fpm_planner_fpm_endpoints_backing_off",
            "FPM endpoints whose socket waits out a reconnect backoff",
            registry=self.registry,
        )
        self._link_events_seen: dict[str, int] = {}

    def observe_drops(self, drops: Mapping[str, int]) -> None:
        """Advance the drop counters to the store's cumulative ``drops`` (reason -> count)."""
        for reason, total in drops.items():
            key = str(reason)
            seen = self._drops_seen.get(key, 0)
            counter = self.fpm_drops.labels(reason=key)  # creates the series at 0 so it is always exported
            if total > seen:
                counter.inc(total - seen)
            self._drops_seen[key] = max(seen, total)

    def observe_links(self, totals: LinkTotals) -> None:
        """Advance the connection-event counters to the subscriber's cumulative ``link_totals()``."""
        for event, total in (
            ("disconnect", totals.disconnects),
            ("reconnect", totals.reconnects),
            ("connect_retry", totals.connect_retries),
            ("protocol_error", totals.protocol_errors),
        ):
            seen = self._link_events_seen.get(event, 0)
            counter = self.fpm_link_events.labels(event=event)  # creates the series at 0 so it is always exported
            if total > seen:
                counter.inc(total - seen)
            self._link_events_seen[event] = max(seen, total)
        self.fpm_endpoints_backing_off.set(totals.backing_off)

    def observe_decision(
        self,
        role: str,
        *,
        service: str = "",
        coverage: Coverage | None = None,
        current: int,
        recommended: int,
        final: int,
        reasons: tuple[str, ...],
        ttft_ms: float | None,
        itl_ms: float | None,
    ) -> None:
        self.replicas.labels(role=role, service=service, kind="current").set(current)
        self.replicas.labels(role=role, service=service, kind="recommended").set(recommended)
        self.replicas.labels(role=role, service=service, kind="final").set(final)
        for reason in reasons:
            self.decision_reasons.labels(role=role, service=service, reason=str(reason)).inc()
        if ttft_ms is not None:
            self.estimated_ttft_ms.labels(role=role, service=service).set(ttft_ms)
        if itl_ms is not None:
            self.estimated_itl_ms.labels(role=role, service=service).set(itl_ms)
        capped = capped_at_max_with_predicted_miss(reasons, recommended=recommended, final=final)
        self.capped_at_max_predicted_miss.labels(role=role, service=service).set(1 if capped else 0)
        if coverage is not None:
            counts = {
                "healthy": coverage.healthy,
                "partial": coverage.partial,
                "silent": coverage.silent,
                "identity_not_synced": coverage.identity_not_synced,
                "not_ready": coverage.not_ready,
            }
            for classification, count in counts.items():
                self.workers.labels(role=role, service=service, classification=classification).set(count)
            self.coverage_complete.labels(role=role, service=service).set(1 if coverage.complete else 0)

    def observe_traffic(self, service: str, traffic: Traffic) -> None:
        """What the FPM traffic extension shows for ``service`` over its window (issue 13); unknown figures
        are left as they were."""
        if traffic.request_rate_per_s is not None:
            self.observed_request_rate.labels(service=service).set(traffic.request_rate_per_s)
        for gauge, prefix in (
            (self.observed_ttft_ms, "ttft_ms"),
            (self.observed_itl_ms, "itl_ms"),
            (self.observed_isl_tokens, "isl_tokens"),
            (self.observed_osl_tokens, "osl_tokens"),
        ):
            for q in ("p50", "p90", "p99"):
                value = getattr(traffic, f"{prefix}_{q}")
                if value is not None:
                    gauge.labels(service=service, quantile=_QUANTILE[q]).set(value)
        for target, value in (("ttft", traffic.ttft_attainment_frac), ("itl", traffic.itl_attainment_frac)):
            if value is not None:
                self.observed_attainment.labels(service=service, target=target).set(value)

    def observe_outcome(self, outcome: str, service: str = "") -> None:
        self.actuator_outcomes.labels(service=service, outcome=str(outcome)).inc()

    def observe_tick(self, *, leader: bool, completed_at_s: float) -> None:
        """After a tick that completed: leadership and the time it completed (Unix seconds)."""
        self.leader.set(1 if leader else 0)
        self.last_successful_tick.set(completed_at_s)

    def set_paused(self, service: str, paused: bool) -> None:
        self.paused.labels(service=service).set(1 if paused else 0)

    def render(self) -> bytes:
        return generate_latest(self.registry)

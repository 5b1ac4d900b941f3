"""Per-request outcomes of one replay and their summary: SLA attainment, latency percentiles, GPU-hours,
scale actions and flaps.

SLA: a request meets it when its TTFT <= ``ttft_ms`` and its mean inter-token latency (over its decode) <=
``itl_ms``. Requests that no policy can serve within the SLA are *infeasible* (their prefill alone, on an idle
engine, exceeds ``ttft_ms``, or they exceed ``max_model_len``); they are counted and excluded from attainment.
A feasible request that never finished (dropped, or still running when the replay ended) is a miss.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import msgspec
import numpy as np

from planner.errors import ConfigError
from planner.sim.fleet import ScaleEvent

__all__ = ["FLAP_WINDOW_S", "Outcomes", "PolicySummary", "SlaConfig", "TimelinePoint", "count_flaps", "summarize"]

FLAP_WINDOW_S = 300.0


class SlaConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Targets per request and the attainment goal (fraction of feasible requests meeting both)."""

    ttft_ms: float = 2000.0
    itl_ms: float = 50.0
    attainment_target: float = 0.99

    def __post_init__(self) -> None:
        if not (self.ttft_ms > 0 and self.itl_ms > 0 and 0 < self.attainment_target <= 1):
            raise ConfigError("SLA needs ttft_ms > 0, itl_ms > 0 and 0 < attainment_target <= 1")


class TimelinePoint(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    at_s: float
    replicas: int  # holding GPUs (starting, ready, draining)
    ready: int
    arrivals_per_s: float
    ttft_p99_ms: float | None
    itl_p99_ms: float | None


class Outcomes:
    """Per-request arrays indexed by request id (NaN until the request finishes)."""

    def __init__(self, n: int, feasible: np.ndarray) -> None:
        self.ttft_s = np.full(n, np.nan)
        self.itl_s = np.full(n, np.nan)
        self.finish_s = np.full(n, np.nan)
        self.feasible = feasible
        self.preemptions = 0

    def met(self, sla: SlaConfig) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            return (self.ttft_s * 1000.0 <= sla.ttft_ms) & (self.itl_s * 1000.0 <= sla.itl_ms)


class PolicySummary(msgspec.Struct, frozen=True, kw_only=True):
    sla_attainment: float
    gpu_hours: float
    gpu_hours_vs_oracle: float | None
    scale_actions: int
    flaps: int
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    requests: int
    feasible_requests: int
    unfinished_requests: int
    max_replicas: int
    mean_replicas: float
    preemptions: int
    replay_wall_s: float
    notes: tuple[str, ...] = ()


def _pct(values: np.ndarray, q: float) -> float | None:
    finite = values[np.isfinite(values)]
    return None if finite.size == 0 else float(np.percentile(finite, q)) * 1000.0


def count_flaps(events: Iterable[ScaleEvent], window_s: float = FLAP_WINDOW_S) -> int:
    """Direction reversals within ``window_s`` of the previous action of the same role."""
    flaps = 0
    last: dict[str, tuple[float, int]] = {}
    for ev in sorted(events, key=lambda e: e.at_s):
        direction = 1 if ev.to_replicas > ev.from_replicas else -1
        prev = last.get(ev.role)
        if prev is not None and prev[1] != direction and ev.at_s - prev[0] <= window_s:
            flaps += 1
        last[ev.role] = (ev.at_s, direction)
    return flaps


def summarize(
    outcomes: Outcomes,
    sla: SlaConfig,
    *,
    gpu_hours: float,
    events: Sequence[ScaleEvent],
    timeline: Sequence[TimelinePoint],
    replay_wall_s: float,
    oracle_gpu_hours: float | None = None,
    scale_actions: int | None = None,
    notes: tuple[str, ...] = (),
) -> PolicySummary:
    feasible = outcomes.feasible
    met = outcomes.met(sla) & feasible
    n_feasible = int(feasible.sum())
    replicas = [p.replicas for p in timeline]
    return PolicySummary(
        sla_attainment=float(met.sum()) / n_feasible if n_feasible else 1.0,
        gpu_hours=gpu_hours,
        gpu_hours_vs_oracle=(gpu_hours / oracle_gpu_hours if oracle_gpu_hours and oracle_gpu_hours > 0 else None),
        scale_actions=len(events) if scale_actions is None else scale_actions,
        flaps=count_flaps(events),
        ttft_p50_ms=_pct(outcomes.ttft_s, 50),
        ttft_p99_ms=_pct(outcomes.ttft_s, 99),
        itl_p50_ms=_pct(outcomes.itl_s, 50),
        itl_p99_ms=_pct(outcomes.itl_s, 99),
        requests=int(feasible.shape[0]),
        feasible_requests=n_feasible,
        unfinished_requests=int((~np.isfinite(outcomes.finish_s) & feasible).sum()),
        max_replicas=max(replicas, default=0),
        mean_replicas=float(np.mean(replicas)) if replicas else 0.0,
        preemptions=outcomes.preemptions,
        replay_wall_s=replay_wall_s,
        notes=notes,
    )

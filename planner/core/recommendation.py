"""What the recommend stage returns (SLA and threshold modes alike), and the search's replica bound."""

from __future__ import annotations

import msgspec

from planner.core.decision import Mode, Reason

__all__ = ["MAX_SEARCH_REPLICAS", "Recommendation"]

# Bisection never searches past this many replicas (and says sla_unreachable when even that is not enough).
MAX_SEARCH_REPLICAS = 100_000


class Recommendation(msgspec.Struct, frozen=True, kw_only=True):
    replicas: int
    reason: Reason
    mode: Mode
    detail: str = ""
    predicted_ttft_ms: float | None = None
    predicted_itl_ms: float | None = None
    # SLA mode, on a scale-up: the fewest replicas the arrivals alone need (no backlog); None when not computed.
    arrivals_replicas: int | None = None
    # SLA mode: the model's ITL floor (one sequence decoding alone) when the closed loop's ITL tightening was taken
    # over the limit above it (planner.core.latency_floor); None otherwise.
    itl_floor_ms: float | None = None

"""The percentile the benchmarks report: nearest rank over the sorted figures (no interpolation)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

__all__ = ["nearest_rank", "p50_p99"]


def nearest_rank(values: Sequence[float], q: float) -> float:
    """The value at rank ``round(q * (n - 1))`` of the sorted ``values``; ``q`` in [0, 1], ``values`` non-empty."""
    if not values:
        raise ValueError("no values to take a percentile of")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {q}")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def p50_p99(name: str, values: Sequence[float], digits: int) -> dict[str, float]:
    """``{name}_p50`` (the median) and ``{name}_p99`` (nearest rank) of ``values``, rounded to ``digits``."""
    return {
        f"{name}_p50": round(statistics.median(values), digits),
        f"{name}_p99": round(nearest_rank(values, 0.99), digits),
    }

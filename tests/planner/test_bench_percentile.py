"""The benchmarks' percentile: nearest rank, no interpolation."""

from __future__ import annotations

import pytest

from planner.bench.percentile import nearest_rank, p50_p99


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([5.0, 1.0, 3.0], 0.5, 3.0),
        ([5.0, 1.0, 3.0], 0.0, 1.0),
        ([5.0, 1.0, 3.0], 1.0, 5.0),
        ([float(i) for i in range(101)], 0.99, 99.0),
        ([7.0], 0.99, 7.0),
    ],
)
def test_nearest_rank_of_the_sorted_values(values: list[float], q: float, expected: float) -> None:
    assert nearest_rank(values, q) == expected


@pytest.mark.parametrize(("values", "q", "message"), [([], 0.5, "no values"), ([1.0], 1.5, "q must be in")])
def test_nonsense_is_refused(values: list[float], q: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        nearest_rank(values, q)


def test_p50_p99_names_the_median_and_the_nearest_rank_p99() -> None:
    values = [float(i) / 3 for i in range(101)]
    assert p50_p99("tick_ms", values, 3) == {"tick_ms_p50": 16.667, "tick_ms_p99": 33.0}
    assert p50_p99("x", [1.0, 2.0], 1) == {"x_p50": 1.5, "x_p99": 2.0}  # the median interpolates, p99 does not

"""Perf-model features and settings row by row: the exact feature columns per role (and hinges), hinge names, and
every PerfModelConfig check at its edge with its own message."""

from __future__ import annotations

from typing import Any

import pytest

from perf_model.features import COLUMNS, feature_row, hinge_name
from perf_model.model import PerfModelConfig
from planner.discovery import Role
from planner.errors import ConfigError

LOAD = (100.0, 40.0, 8.0, 3000.0)  # prefill tokens, prefill KV tokens, decode requests, decode KV tokens


@pytest.mark.parametrize(
    ("role", "row"),
    [
        (Role.PREFILL, [1.0, 100.0, 100.0 * (40.0 + 50.0)]),
        (Role.DECODE, [1.0, 8.0, 3000.0]),
        (Role.AGG, [1.0, 100.0, 100.0 * (40.0 + 50.0), 8.0, 3000.0]),
    ],
)
def test_feature_rows(role: Role, row: list[float]) -> None:
    assert feature_row(role, LOAD) == row
    assert len(row) == len(COLUMNS[role])


def test_hinges_add_one_column_each_clipped_at_zero() -> None:
    hinges = ((0, 60.0), (2, 10.0), (3, 1000.0))
    assert feature_row(Role.DECODE, LOAD, hinges) == [1.0, 8.0, 3000.0, 40.0, 0.0, 2000.0]
    assert [hinge_name(h) for h in hinges] == ["prefill>60", "decode>10", "decode_kv>1000"]
    assert hinge_name((1, 0.5)) == "prefill_kv>0.5"


@pytest.mark.parametrize(
    ("field", "accepted", "refused", "message"),
    [
        ("max_samples", 1, 0, "max_samples must be >= 1"),
        ("per_bin", 1, 0, "per_bin must be >= 1"),
        ("warmup_steps", 0, -1, "warmup_steps must be >= 0"),
        ("outlier_factor", 1.001, 1.0, "outlier_factor must be > 1"),
        ("min_samples", 2, 1, "min_samples must be >= 2"),
        ("min_load_bins", 1, 0, "min_load_bins must be >= 1"),
        ("refit_interval_s", 0.0, -0.001, "refit_interval_s must be >= 0"),
        ("band_quantile", 0.5, 1.0, r"band_quantile must be in \[0.5, 1\)"),
        ("band_quantile", 0.999, 0.499, r"band_quantile must be in \[0.5, 1\)"),
        ("bootstrap_band_frac", 0.0, 10.0, r"bootstrap_band_frac must be in \[0, 10\)"),
        ("bootstrap_band_frac", 9.99, -0.001, r"bootstrap_band_frac must be in \[0, 10\)"),
        ("trim_mads", 0.001, 0.0, "trim_mads must be > 0"),
        ("ttft_overhead_ms", 0.0, -0.001, "ttft_overhead_ms must be >= 0"),
    ],
)
def test_perf_model_config_edges(field: str, accepted: Any, refused: Any, message: str) -> None:
    assert getattr(PerfModelConfig(**{field: accepted}), field) == accepted
    with pytest.raises(ConfigError, match=f"^perf model config: {message}$"):
        PerfModelConfig(**{field: refused})

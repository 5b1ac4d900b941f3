"""Trace readers and rate scaling."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from planner.errors import ConfigError
from planner.sim.traces import compress_time, load_trace, scale_rate, synthetic_trace


def azure(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "t.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + body)
    return path


def test_azure_csv_is_read_in_seconds_from_the_first_request(tmp_path: Path) -> None:
    trace = load_trace(azure(tmp_path, "2023-11-16 18:17:04.5000000,100,5\n2023-11-16 18:17:03.9799600,4808,10\n"))
    assert trace.arrival_s.tolist() == pytest.approx([0.0, 0.52004])
    assert trace.isl.tolist() == [4808, 100]
    assert trace.osl.tolist() == [10, 5]
    assert trace.hash_ids == (None, None)


def test_azure_bad_row_names_the_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"t\.csv:3"):
        load_trace(azure(tmp_path, "2023-11-16 18:17:04.5,100,5\n2023-11-16 18:17:05,abc,5\n"))


def test_azure_missing_column_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:17:04,1\n")
    with pytest.raises(ConfigError, match="GeneratedTokens"):
        load_trace(path)


def test_mooncake_jsonl_keeps_hash_ids_and_converts_ms(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 1000, "output_length": 6, "hash_ids": [0, 1]}\n\n'
        '{"timestamp": 1500, "input_length": 10, "output_length": 2, "hash_ids": []}\n'
    )
    trace = load_trace(path)
    assert trace.arrival_s.tolist() == [0.0, 1.5]
    assert trace.hash_ids == ((0, 1), None)


def test_mooncake_bad_line_and_unknown_format_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1}\n{"timestamp": "x"}\n')
    with pytest.raises(ConfigError, match=r"m\.jsonl:2"):
        load_trace(path)
    with pytest.raises(ConfigError, match="unknown trace format"):
        load_trace(tmp_path / "x.parquet")


def test_scale_rate_multiplies_requests_keeps_duration_and_separates_prefix_ids() -> None:
    base = synthetic_trace(rate_per_s=[(100.0, 5.0)], isl=100, osl=10, seed=1)
    base = type(base)(
        name="b", arrival_s=base.arrival_s, isl=base.isl, osl=base.osl, hash_ids=tuple((i,) for i in range(len(base)))
    )
    scaled = scale_rate(base, 3.0, seed=2, shift_s=10.0)
    assert len(scaled) == 3 * len(base)
    assert scaled.duration_s <= base.duration_s * 1.02 + 1.0
    assert np.all(np.diff(scaled.arrival_s) >= 0)
    flat = [h[0] for h in scaled.hash_ids if h]
    assert len(set(flat)) == len(flat)  # copies do not share cache blocks
    half = scale_rate(base, 2.5, seed=2)
    assert 2.3 * len(base) < len(half) < 2.7 * len(base)


def test_scale_rate_without_shift_lines_bursts_up() -> None:
    base = synthetic_trace(rate_per_s=[(60.0, 2.0)], isl=100, osl=10, seed=3)
    aligned = scale_rate(base, 4.0, shift_s=0.0)
    assert np.array_equal(aligned.arrival_s, np.repeat(base.arrival_s, 4))


def test_compress_time_and_bad_factors() -> None:
    base = synthetic_trace(rate_per_s=[(10.0, 1.0)], isl=1, osl=1, seed=0)
    assert compress_time(base, 2.0).arrival_s.tolist() == pytest.approx((base.arrival_s / 2).tolist())
    with pytest.raises(ConfigError):
        scale_rate(base, 0.0)
    with pytest.raises(ConfigError):
        compress_time(base, -1.0)

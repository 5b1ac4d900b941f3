from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.cli import main


def test_bench_prints_one_json_line_of_figures(h200_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "bench",
        "perf-model",
        "--json",
        "--profile",
        str(h200_dir),
        "--train-samples",
        "800",
        "--test-samples",
        "300",
        "--seed",
        "1",
    ]
    assert main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    figures = json.loads(lines[0])
    for name in ("step_time_mape", "ttft_profile_err", "itl_profile_err", "step_timer_call_us"):
        assert figures[name] >= 0
    assert set(figures["roles"]) == {"prefill", "decode", "agg"}
    assert all(role["source"] == "live" for role in figures["roles"].values())
    assert figures["within_targets"] is True


def test_bench_names_a_missing_profile(tmp_path: Path) -> None:
    from perf_model.errors import ProfileError

    with pytest.raises(ProfileError, match="does not exist"):
        main(["bench", "perf-model", "--json", "--profile", str(tmp_path / "none")])

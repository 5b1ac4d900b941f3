"""``fpm-planner bench tick`` runs end to end and prints the figures it promises (no timing is asserted)."""

from __future__ import annotations

import json

import pytest

from planner.cli import main


def test_bench_tick_prints_one_json_line_with_its_figures(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "tick", "--json", "--workers", "16", "--dp", "2", "--ticks", "3", "--warmup", "1"]) == 0
    doc = json.loads(capsys.readouterr().out.strip())
    assert doc["engines"] == 32 and doc["ticks"] == 3
    for key in ("tick_ms_p50", "tick_ms_p99", "tick_cpu_ms_p50", "snapshot_ms_p50", "tick_with_snapshot_ms_p99"):
        assert doc[key] >= 0


def test_bench_tick_refuses_nonsense_arguments() -> None:
    with pytest.raises(SystemExit) as exited:
        main(["bench", "tick", "--workers", "0"])
    assert exited.value.code == "need --workers >= 1, --dp >= 1, --ticks >= 1, --warmup >= 0, --interval-s > 0"

"""The paced ingest benchmark runs the real subscriber thread against paced publishers in child processes and
accounts for every sample (figures are printed by the bench, never asserted here)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from planner.bench.ingest_paced import measure_paced
from planner.cli import main


def test_every_paced_sample_is_stored_and_the_figures_are_all_there() -> None:
    figures = measure_paced(16, 20.0, 1.0, dp=8, publisher_procs=2, window=8, tick_interval_s=0.25)
    assert figures["mode"] == "paced" and figures["publisher_procs"] == 2 and figures["workers"] == 2
    # one step per endpoint per period (fewer only when the publishers fall behind on a busy machine)
    assert 0 < figures["sent"] <= 16 * 20
    assert figures["stored"] == figures["sent"] and figures["lost"] == 0
    assert figures["gaps"] == 0 and figures["drops_by_reason"] == {} and figures["loop_errors"] == 0
    assert figures["ticks"] >= 1 and figures["tick_ms_p99"] >= figures["tick_ms_p50"] > 0
    assert figures["ingest_thread_cpu_share"] >= 0 and figures["rss_mb"] > 0


def test_paced_mode_refuses_an_endpoint_count_that_is_not_whole_workers(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "ingest", "--endpoints", "12", "--dp", "8", "--seconds", "1"]) == 2
    assert "multiple of dp" in capsys.readouterr().err


def test_the_saturation_mode_stays_the_default_and_says_so() -> None:
    # In a child process: the saturation mode pins its process to one core.
    cmd = [sys.executable, "-m", "planner.cli", "bench", "ingest", "--publishers", "2", "--samples", "50"]
    out = subprocess.run([*cmd, "--window", "4"], capture_output=True, text=True, check=True, timeout=120).stdout
    figures = json.loads(out)
    assert figures["mode"] == "saturation" and figures["publishers"] == 2 and figures["samples_stored"] == 100

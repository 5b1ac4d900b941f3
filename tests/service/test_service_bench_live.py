"""``fpm-planner bench service`` through the real service (uvicorn, its ZMQ subscriber, store and tick loop): with
``--hz`` the registered endpoints are live paced publishers and every sample sent is stored by the service; without
it the fleet stays silent as before (figures are printed by the bench, never asserted here)."""

from __future__ import annotations

import json

import pytest

from planner.cli import main


def test_a_live_fleet_through_the_real_service_loses_nothing_and_reports_its_figures(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["bench", "service", "--workers", "8", "--dp-size", "2", "--hz", "20", "--seconds", "2", "--json"]
    assert main(argv) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["workers"] == 8 and figures["ranks"] == 16 and figures["endpoints_connected"] == 16
    assert figures["offered_samples_per_s"] == 16 * 20 and 0 < figures["sent"] <= 16 * 20 * 2
    assert figures["stored"] == figures["sent"] and figures["lost"] == 0  # stored by the service's own store
    assert figures["gaps"] == 0 and figures["lost_samples"] == 0 and figures["loop_errors"] == 0
    assert figures["samples_per_s_held"] > 0 and figures["sent_samples_per_s"] > 0
    assert figures["process_cpu_share"] >= 0 and figures["process_cpu_us_per_sample"] >= 0 and figures["rss_mb"] > 0
    assert figures["ticks_live"] >= 1 and figures["tick_ms_p99"] >= figures["tick_ms_p50"] > 0


def test_without_hz_the_fleet_stays_silent_and_the_figures_are_as_before(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "service", "--workers", "4", "--dp-size", "2", "--ticks", "2", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["ranks"] == 8 and figures["endpoints_connected"] == 8
    assert figures["tick_ms_p99"] >= figures["tick_ms_p50"] > 0 and figures["diagnostics_bytes"] > 0
    assert "sent" not in figures and "samples_per_s_held" not in figures


def test_a_live_run_refuses_a_send_interval_not_shorter_than_its_seconds(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "service", "--hz", "10", "--seconds", "1", "--send-interval-s", "1"]
    assert main(argv) == 2
    assert "--send-interval-s" in capsys.readouterr().err

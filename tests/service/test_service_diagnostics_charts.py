"""The diagnostics page's charts in headless Chromium, from a live ``fpm-planner demo`` held at a max of one
replica under a heavy trace: labelled time and value axes, the current / ready / recommended / final series,
bounds, the SLA target lines with observed latency, perf-model readiness, a banner for "capped at max while the
SLA is missed", decision rows linking to their explain, and a legend naming every line. Screenshots are kept in
the test's tmp dir (printed)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import httpx
import pytest

from tests.service.support import free_port, wait_for

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def chromium(url: str, *extra: str) -> str:
    assert CHROMIUM is not None, "chromium is not installed (make setup installs it)"
    with tempfile.TemporaryDirectory() as profile:
        result = subprocess.run(
            [
                CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
                "--virtual-time-budget=7000", "--window-size=1300,2600", *extra, url,
            ],
            capture_output=True, text=True, timeout=180, check=False,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def test_the_charts_show_axes_series_sla_lines_and_the_capped_banner_from_the_live_demo(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "planner.cli", "demo", "--port", str(port), "--speed", "8", "--max-replicas", "1",
         "--rate-scale", "10"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: any("/diagnostics" in line for line in lines) or proc.poll() is not None, timeout_s=60.0)
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        with httpx.Client(base_url=base, timeout=10.0) as http:
            # live data first: held at max while the load needs more, and the observed TTFT above its target
            wait_for(
                lambda: any(
                    "clamped_to_max" in d["reasons"] and d["recommended"] > d["final"]
                    for d in http.get("/v1/decisions/latest").json()["decisions"]
                ),
                timeout_s=90.0,
            )
            target = http.get("/v1/targets").json()["roles"]["agg"]["sla_ttft_ms"]
            wait_for(
                lambda: (
                    (http.get("/v1/diagnostics").json()["traffic"].get("demo-agg") or {}).get("ttft_ms_p90", 0) > target
                ),
                timeout_s=90.0,
            )
        dom = chromium(f"{base}/diagnostics", "--dump-dom")
        shot = tmp_path / "diagnostics.png"
        chromium(f"{base}/diagnostics", f"--screenshot={shot}")
        print(f"screenshot: {shot}")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
        reader.join(5)

    assert shot.exists() and shot.stat().st_size > 20_000
    box = re.search(r'<div class="chart-box" data-service="demo-agg">(.*?)</div>\s*</div>', dom, re.S)
    assert box is not None, "no chart for the demo's service"
    charts = box.group(1)
    # axes with labels: time ticks (HH:MM:SS) on x, numbers on y, and the axis titles
    assert len(re.findall(r'class="axis x-tick"[^>]*>\d{1,2}:\d{2}:\d{2}<', charts)) >= 8  # two charts, 5 ticks each
    assert len(re.findall(r'class="axis y-tick"[^>]*>\d+(\.\d+)?<', charts)) >= 4
    assert ">time (local)<" in charts and ">replicas<" in charts and ">latency (ms)<" in charts
    # the four replica series, the bounds, the SLA lines and the observed latency
    for cls in ("current", "ready", "recommended", "final", "obs_ttft"):
        assert re.search(rf'<polyline class="series {cls}"', charts), cls
    assert re.search(r'class="ref max-bound"', charts) and re.search(r'class="ref min-bound"', charts)
    assert re.search(r'class="ref sla-line sla-ttft"[^>]*>\s*<title>SLA target TTFT: 500</title>', charts)
    assert re.search(r'class="ref sla-line sla-itl"', charts)
    assert re.search(r'data-perf-ready="false">perf model: not ready — ', charts)
    assert "bounds 1..1" in charts
    # the banner
    banner = re.search(r'<div id="capped" role="alert" style="display: block;">([^<]*)</div>', dom)
    assert banner is not None and "demo-agg: capped at max_replicas=1 while it needs" in banner.group(1)
    assert "SLA miss observed (TTFT p90" in banner.group(1)
    # a real legend: a swatch and a name per line, no colour codes as text
    legend = re.search(r'<div class="legend" id="chart-legend">(.*?)</div>', dom, re.S)
    assert legend is not None
    for name in ("current (deployment desired)", "ready", "recommended", "final", "min / max replicas",
                 "SLA target TTFT", "observed TTFT p90", "predicted ITL"):  # fmt: skip
        assert name in legend.group(1), name
    assert not re.search(r">[^<]*#[0-9a-f]{6}", legend.group(1))
    # decision rows link to their explain
    link = re.search(r'<a href="(/v1/decisions/(\d+)/explain)" class="explain">\2</a>', dom)
    assert link is not None

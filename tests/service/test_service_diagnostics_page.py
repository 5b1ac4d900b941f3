"""The diagnostics page in headless Chromium (Debian's ``chromium``): live data from a real service renders."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import threading

import pytest

from tests.service.support import AUTH, free_port, make_config, registration, serve, wait_for
from worker_shim.fpm import QueuedRequests, ScheduledRequests
from worker_shim.publisher import FpmPublisher

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def dump_dom(url: str) -> str:
    """The page's DOM after its scripts ran for a few (virtual) seconds."""
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (make setup installs it)")
    with tempfile.TemporaryDirectory() as profile:
        result = subprocess.run(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                f"--user-data-dir={profile}",
                "--virtual-time-budget=5000",
                "--dump-dom",
                url,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def test_the_page_renders_the_live_fleet_and_decisions() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    with (
        serve(make_config()) as served,
        FpmPublisher(worker_id="w-live", endpoint=endpoint, heartbeat_interval_s=0.05) as publisher,
    ):
        served.http.put("/v1/workers/w-live", json=registration([endpoint]), headers=AUTH).raise_for_status()
        served.http.put(
            "/v1/workers/w-quiet", json=registration([f"tcp://127.0.0.1:{free_port()}"]), headers=AUTH
        ).raise_for_status()
        stop = threading.Event()

        def publish() -> None:  # a busy engine: queued prefill work on every step
            while not stop.wait(0.02):
                publisher.publish(
                    0.02,
                    ScheduledRequests(num_decode_requests=8, sum_decode_kv_tokens=8000),
                    QueuedRequests(num_prefill_requests=3, sum_prefill_tokens=4321),
                )

        feeder = threading.Thread(target=publish, daemon=True)
        feeder.start()
        try:
            wait_for(
                lambda: any(
                    w["classification"] == "healthy" for w in served.http.get("/v1/diagnostics").json()["workers"]
                )
            )
            wait_for(lambda: served.http.get("/v1/decisions/latest").json()["decisions"])
            dom = dump_dom(f"{served.base_url}/diagnostics")
        finally:
            stop.set()
            feeder.join(5)

    banner = re.search(r'<div id="banner">([^<]*)</div>', dom)
    assert banner is not None and banner.group(1).startswith("leader (acts)"), banner
    # the fleet table: one row per rank, status colours by classification
    assert re.search(r'<tr data-worker-id="w-live">.*?<span class="status healthy">healthy</span>', dom)
    assert re.search(r'<tr data-worker-id="w-quiet">.*?<span class="status silent">silent</span>', dom)
    assert "4321" in dom  # the live queued prefill tokens of w-live
    # why the planner does what it does, in words, and the recent decisions
    why = re.search(r'<div id="why" class="why">(.*?)</div>', dom, re.S)
    assert why is not None and "decode" in why.group(1) and "reasons:" in why.group(1)
    assert len(re.findall(r'<tr data-decision-id="\d+">', dom)) >= 1
    assert "<polyline" in dom  # replicas and load over time

"""``fpm-planner demo`` as a user runs it: a subprocess on a free port; decisions appear over HTTP; Ctrl-C
(SIGINT) stops it cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import httpx

from tests.service.support import free_port, wait_for


def test_demo_serves_decisions_and_stops_cleanly_on_ctrl_c() -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "planner.cli", "demo", "--port", str(port), "--speed", "6"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        url = f"http://127.0.0.1:{port}/diagnostics"
        wait_for(lambda: any(url in line for line in lines) or proc.poll() is not None, timeout_s=60.0)
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10.0) as http:
            assert "fpm-planner diagnostics" in http.get("/diagnostics").text
            # the simulated engines registered themselves through the API and publish FPM
            wait_for(lambda: http.get("/v1/workers").json()["workers"], timeout_s=60.0)
            wait_for(
                lambda: any(
                    r["samples"] > 0 for w in http.get("/v1/diagnostics").json()["workers"] for r in w["ranks"]
                ),
                timeout_s=60.0,
            )
            decisions = wait_for(
                lambda: [d for d in http.get("/v1/decisions").json()["decisions"] if d["service"] == "demo-agg"],
                timeout_s=60.0,
            )
            assert decisions[0]["reasons"]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            rc = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        reader.join(5)
    stderr = proc.stderr.read() if proc.stderr else ""
    assert rc == 0, stderr
    assert any("fpm-planner demo: stopped" in line for line in lines)
    assert "Traceback" not in stderr

"""``fpm-planner serve`` as a process: a bad configuration exits 2 naming the field; SIGTERM shuts it down
cleanly (exit 0) after it served."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from tests.service.support import free_port, wait_for


def test_a_bad_config_exits_2_naming_the_field(tmp_path: Path) -> None:
    path = tmp_path / "planner.yaml"
    path.write_text("tick_interval_s: 0\n")
    result = subprocess.run(
        [sys.executable, "-m", "planner.cli", "serve", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == f"fpm-planner serve: {path}: tick_interval_s: expected float > 0.0"


def test_an_unreadable_curve_key_file_exits_2_naming_the_setting(tmp_path: Path) -> None:
    path = tmp_path / "planner.yaml"
    missing = tmp_path / "server.key"
    path.write_text(f"ingest:\n  curve_server_public_key_file: {missing}\n")
    result = subprocess.run(
        [sys.executable, "-m", "planner.cli", "serve", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith(
        "fpm-planner serve: ingest.curve_server_public_key_file / curve_client_secret_key_file:"
    )
    assert str(missing) in result.stderr


def test_sigterm_stops_the_service_cleanly(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "FPM_PLANNER_TICK_INTERVAL_S": "0.2", "FPM_PLANNER_TOKEN": "t" * 32}
    proc = subprocess.Popen(
        [sys.executable, "-m", "planner.cli", "serve", "--port", str(port), "--log-level", "info"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:

        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"serve exited early: {proc.stderr.read() if proc.stderr else ''}")
            try:
                return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2.0).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, timeout_s=60.0)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    stderr = proc.stderr.read() if proc.stderr else ""
    assert rc == 0, stderr
    assert "Application shutdown complete" in stderr
    assert "Traceback" not in stderr

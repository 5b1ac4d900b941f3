"""``fpm-planner demo`` prints its operator token (or takes ``--token``), so a mutating endpoint can be tried on
it; its ``/docs`` works without a network (Swagger UI served from local files)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from tests.service.support import free_port, wait_for


@contextmanager
def demo(*args: str) -> Iterator[tuple[httpx.Client, list[str]]]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "FPM_PLANNER_TOKEN"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "planner.cli", "demo", "--port", str(port), "--speed", "6", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**env, "PYTHONUNBUFFERED": "1"},
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        wait_for(lambda: any("operator token" in line for line in lines) or proc.poll() is not None, timeout_s=60.0)
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10.0) as http:
            yield http, lines
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        reader.join(5)


def test_the_demo_prints_a_token_that_can_pause_and_serves_docs_offline() -> None:
    with demo() as (http, lines):
        (line,) = [line for line in lines if "operator token:" in line]
        token = re.search(r"operator token: (\S+)", line).group(1)  # type: ignore[union-attr]
        assert len(token.encode()) >= 32
        paused = http.post("/v1/pause", json={"reason": "trying"}, headers={"Authorization": f"Bearer {token}"})
        assert paused.status_code == 200 and paused.json()["paused"][0]["by"] == "default"
        records = http.get("/v1/audit").json()["records"]
        assert ("default", "pause") in {(r["who"], r["action"]) for r in records}
        assert token not in http.get("/v1/audit", params={"limit": 10_000}).text
        docs = http.get("/docs").text
        assert "cdn" not in docs.lower()
        script = re.search(r'src="([^"]*swagger-ui-bundle\.js)"', docs)
        assert script is not None and script.group(1).startswith("/")
        asset = http.get(script.group(1))
        assert asset.status_code == 200 and len(asset.content) > 100_000
        redoc = re.search(r'src="([^"]*redoc[^"]*\.js)"', http.get("/redoc").text)
        assert redoc is not None and http.get(redoc.group(1)).status_code == 200


def test_a_given_token_is_used_and_never_printed() -> None:
    token = "demo-operator-token-0123456789abcdef"
    with demo("--token", token) as (http, lines):
        assert not any(token in line for line in lines)
        assert any("the one given" in line for line in lines)
        assert http.post("/v1/pause", json={}, headers={"Authorization": f"Bearer {token}"}).status_code == 200
        assert http.post("/v1/resume", json={}, headers={"Authorization": "Bearer wrong"}).status_code == 401

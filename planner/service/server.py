"""uvicorn, stopped cleanly by SIGTERM or Ctrl-C (SIGINT): the first signal starts a graceful shutdown (the
app's lifespan stops the runner: the current tick finishes, the subscriber closes) and the process then exits
0; a second Ctrl-C forces the exit. Unlike ``uvicorn.Server.serve``, the signal is not raised again after the
shutdown, so a clean stop is a clean exit."""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
import time
from collections.abc import Generator, Iterator
from types import FrameType
from typing import Any

import uvicorn

__all__ = ["GracefulServer", "serve_in_thread"]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class GracefulServer(uvicorn.Server):
    """A uvicorn server whose signal handling ends in a normal return from :meth:`serve`."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self._on_signal) for sig in _SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        self.should_exit = True


@contextlib.contextmanager
def serve_in_thread(app: Any, *, log_level: str = "warning") -> Iterator[int]:
    """Serve ``app`` on a free loopback port from a daemon thread (benchmarks); yields the port once the server
    has started, and stops it on exit."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port: int = listener.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level=log_level))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("the benchmark's uvicorn server did not start")
            time.sleep(0.01)
        yield port
    finally:
        server.should_exit = True
        thread.join(60.0)
        listener.close()

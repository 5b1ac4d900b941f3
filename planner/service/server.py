"""uvicorn, stopped cleanly by SIGTERM or Ctrl-C (SIGINT): the first signal starts a graceful shutdown (the
app's lifespan stops the runner: the current tick finishes, the subscriber closes) and the process then exits
0; a second Ctrl-C forces the exit. Unlike ``uvicorn.Server.serve``, the signal is not raised again after the
shutdown, so a clean stop is a clean exit."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Generator
from types import FrameType

import uvicorn

__all__ = ["GracefulServer"]

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

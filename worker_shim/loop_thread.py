"""An asyncio loop of its own on a daemon thread, for the NATS pieces that live beside synchronous code (the relay
next to the engine, the planner's NATS ingest source, a shard's summary listener).

``LoopThread(main, name=...)`` runs ``main(stopping)`` until it returns; :meth:`LoopThread.close` sets
``stopping`` from any thread and joins. :attr:`LoopThread.loop` lets the owner submit coroutines
(``asyncio.run_coroutine_threadsafe``) while it runs. An exception out of ``main`` is logged and handed to
``on_error``; it never escapes the thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any

__all__ = ["LoopThread"]

log = logging.getLogger(__name__)


class LoopThread:
    """Runs ``main(stopping)`` on a new event loop in a daemon thread named ``name``."""

    def __init__(
        self,
        main: Callable[[asyncio.Event], Coroutine[Any, Any, None]],
        *,
        name: str,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        self._main = main
        self.name = name
        self._on_error = on_error
        self.loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the thread (once; again after :meth:`close`)."""
        if self._thread is None:
            self.loop = asyncio.new_event_loop()
            self._stopping = asyncio.Event()
            self._thread = threading.Thread(target=self._run, args=(self.loop, self._stopping), name=self.name)
            self._thread.daemon = True
            self._thread.start()

    def _run(self, loop: asyncio.AbstractEventLoop, stopping: asyncio.Event) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._main(stopping))
        except Exception as exc:
            log.exception("%s stopped", self.name)
            if self._on_error is not None:
                self._on_error(exc)
        finally:
            loop.close()

    def close(self, timeout_s: float = 10.0) -> None:
        """Set ``stopping`` and wait up to ``timeout_s`` for ``main`` to return."""
        loop, thread, stopping = self.loop, self._thread, self._stopping
        if loop is not None and thread is not None and stopping is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                loop.call_soon_threadsafe(stopping.set)
            thread.join(timeout_s)
        self._thread = None
        self.loop = None

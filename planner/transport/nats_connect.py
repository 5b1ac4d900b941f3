"""The first connection to NATS, retried until it is made or the owner stops: what the relay, the shards' and the
leader's listeners need before they subscribe or publish (once connected, nats-py reconnects by itself, forever).

:func:`connect_retrying` tries every ``retry_wait_s`` (the same wait the client then uses between reconnects) and
gives up only when ``stopping`` is set (None then). With unlimited attempts nats-py's own ``connect`` retries a
server that is not up inside the call (each failure goes to ``error_cb``) and never returns: it is raced against
``stopping`` here, so an owner closed while NATS is down stops at once. An error ``connect`` raises is logged and
tried again after ``retry_wait_s``. Used by :mod:`worker_shim.relay`, :mod:`planner.shard.process` and
:mod:`planner.transport.nats_source`; it imports nothing of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence

from nats.aio.client import Client

__all__ = ["connect_retrying"]

log = logging.getLogger(__name__)


async def connect_retrying(
    stopping: asyncio.Event,
    *,
    servers: Sequence[str],
    user: str | None,
    password: str | None,
    name: str,
    retry_wait_s: float = 0.25,
    connect_timeout_s: int = 2,
    error_cb: Callable[[Exception], Awaitable[None]] | None = None,
    disconnected_cb: Callable[[], Awaitable[None]] | None = None,
    reconnected_cb: Callable[[], Awaitable[None]] | None = None,
) -> Client | None:
    """A client connected to ``servers`` (reconnecting forever after a drop), or None when ``stopping`` was set
    before a connection was made. A server that is not up yet is tried again every ``retry_wait_s``."""
    while not stopping.is_set():
        nc = Client()
        connecting = asyncio.ensure_future(
            nc.connect(
                servers=list(servers),
                user=user,
                password=password,
                name=name,
                allow_reconnect=True,
                max_reconnect_attempts=-1,
                reconnect_time_wait=retry_wait_s,  # type: ignore[arg-type]  # typed int, used as seconds (float)
                connect_timeout=connect_timeout_s,
                error_cb=error_cb,
                disconnected_cb=disconnected_cb,
                reconnected_cb=reconnected_cb,
            )
        )
        stopped = asyncio.ensure_future(stopping.wait())
        try:
            await asyncio.wait((connecting, stopped), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            if not connecting.done():  # stopped (or cancelled) while the server is still not up
                connecting.cancel()
                with contextlib.suppress(BaseException):
                    await connecting
                with contextlib.suppress(Exception):
                    await nc.close()
        if connecting.cancelled():
            return None
        exc = connecting.exception()
        if exc is None:
            return nc
        log.warning("cannot connect to NATS %s: %s", list(servers), exc)
        with contextlib.suppress(Exception):
            await nc.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), retry_wait_s)
    return None

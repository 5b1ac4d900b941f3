"""A child that dies with the process that started it (the relay under ``fpm-worker``).

Outside Kubernetes nothing reaps a SIGKILLed ``fpm-worker``'s children: its relay would run on, orphaned. The
supervisor names itself in ``$FPM_RELAY_PARENT_PID``; the child then calls :func:`die_with_parent` first thing:

- on Linux it asks the kernel for ``sig`` (SIGTERM: the relay stops as on any SIGTERM) when its parent dies
  (``prctl(PR_SET_PDEATHSIG)``; the "parent" is the parent's *thread* that started the child: the supervisor's,
  which lives as long as it supervises);
- it then checks that the parent is still the one named: a parent killed before the request was made has already
  handed the child to another (``getppid`` changed), and the child should not start at all.

:func:`watch_parent` is the portable fallback (and the belt to those braces): it polls ``getppid`` and sets an
event when the parent changes. Done here with ``ctypes`` (four lines) rather than a ``prctl`` package.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import os
import signal
import sys
from collections.abc import Mapping

__all__ = ["ENV_PARENT_PID", "die_with_parent", "parent_pid_from_env", "watch_parent"]

ENV_PARENT_PID = "FPM_RELAY_PARENT_PID"
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def parent_pid_from_env(env: Mapping[str, str]) -> int | None:
    """The pid ``$FPM_RELAY_PARENT_PID`` names, or None (unset: started by hand or as a sidecar). Raises
    ValueError for a value that is not a positive pid."""
    raw = env.get(ENV_PARENT_PID, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"${ENV_PARENT_PID} must be a positive pid, got {raw!r}")
    return int(raw)


def die_with_parent(parent_pid: int, sig: signal.Signals = signal.SIGTERM) -> bool:
    """Have the kernel send ``sig`` to this process when its parent dies (Linux; elsewhere only the check).
    False when the parent is already not ``parent_pid`` (it died first): the caller should exit."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"prctl(PR_SET_PDEATHSIG): {os.strerror(errno)}")
    return os.getppid() == parent_pid


async def watch_parent(parent_pid: int, stopping: asyncio.Event, interval_s: float = 1.0) -> None:
    """Set ``stopping`` once this process's parent is no longer ``parent_pid``; returns when ``stopping`` is set."""
    while not stopping.is_set():
        if os.getppid() != parent_pid:
            stopping.set()
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), interval_s)

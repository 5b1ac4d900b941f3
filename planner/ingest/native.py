"""Batch receive of FPM messages: the C drain when it is built and bound, pyzmq's ``recv_multipart`` otherwise.

Both return the same thing for a socket: the payload frame of every well-formed message ``[topic, seq u64,
payload]`` in arrival order, and how many malformed messages were read past. The C drain (``_zmqdrain.c``) does it
in one Python call per batch and reads the more-flag from each message instead of a ``getsockopt(RCVMORE)`` per
frame: about a third of pyzmq's cost per message. It uses the libzmq that pyzmq loaded, found in
``/proc/self/maps``; when that fails (another OS, a libzmq linked statically into pyzmq, a libzmq other than 4.x)
the pyzmq path is used and :data:`RECEIVE_PATH` says so, with :data:`NATIVE_UNAVAILABLE` giving the reason.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Literal

import zmq
import zmq.backend

__all__ = ["NATIVE_UNAVAILABLE", "RECEIVE_PATH", "Drain", "ReceivePath", "drain_pyzmq", "native_drain"]

#: A subscriber's choice: the C drain, pyzmq's, or the C drain where it is available (``"auto"``).
ReceivePath = Literal["auto", "native", "pyzmq"]

#: ``drain(socket, max_messages) -> (payloads, bad_frames)``; raises ``zmq.ZMQError`` for errors other than EAGAIN.
Drain = Callable[["zmq.Socket[bytes]", int], tuple[list[bytes], int]]


def drain_pyzmq(sock: zmq.Socket[bytes], max_messages: int) -> tuple[list[bytes], int]:
    """The portable drain: ``recv_multipart`` until the socket is dry or ``max_messages`` were read."""
    payloads: list[bytes] = []
    bad = 0
    recv = sock.recv_multipart
    try:
        for _ in range(max_messages):
            parts = recv(zmq.NOBLOCK)
            if len(parts) == 3 and len(parts[1]) == 8:
                payloads.append(parts[2])
            else:
                bad += 1
    except zmq.Again:
        pass
    return payloads, bad


def _loaded_libzmq() -> str | None:
    """Path of the libzmq shared object this process has mapped (pyzmq's), if any."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:  # address perms offset dev inode [path]
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and os.path.basename(fields[5].rstrip("\n")).startswith("libzmq"):
                    return fields[5].rstrip("\n")
    except OSError:
        return None
    return None


def _bind_native() -> tuple[Drain | None, str]:
    try:
        from planner.ingest import _zmqdrain
    except ImportError as exc:
        return None, f"the C extension planner.ingest._zmqdrain is not built ({exc})"
    # pyzmq's backend loads libzmq on import; make sure it did before looking for it.
    _ = zmq.backend.zmq_version_info()
    path = _loaded_libzmq()
    if path is None:
        return None, "no libzmq shared object is mapped in this process (pyzmq may link it statically)"
    try:
        version = _zmqdrain.bind(path)
    except OSError as exc:
        return None, str(exc)
    if tuple(version) != zmq.zmq_version_info():
        return None, f"libzmq at {path} is {version}, pyzmq reports {zmq.zmq_version_info()}"
    raw = _zmqdrain.drain

    def drain_native(sock: zmq.Socket[bytes], max_messages: int) -> tuple[list[bytes], int]:
        payloads, bad, errno = raw(sock.underlying, max_messages)
        if errno:
            if payloads or bad:  # deliver what was read; the error shows again on the next call
                return payloads, bad
            raise zmq.ZMQError(errno)
        return payloads, bad

    return drain_native, ""


_native, NATIVE_UNAVAILABLE = _bind_native()
#: The drain in use by default: ``"native"`` or ``"pyzmq"``.
RECEIVE_PATH: Literal["native", "pyzmq"] = "native" if _native is not None else "pyzmq"


def native_drain() -> Drain | None:
    """The C drain, or None when it is not available (:data:`NATIVE_UNAVAILABLE` says why)."""
    return _native

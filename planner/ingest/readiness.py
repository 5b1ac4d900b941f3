"""Which of many ZMQ sockets have something to read, at a cost that grows with the ready sockets, not all of them.

``zmq_poll`` (pyzmq's ``Poller``) asks every socket for ``ZMQ_EVENTS`` on every call, a syscall each: with a SUB
socket and its monitor per endpoint that is 8,192 items at 4,096 endpoints, ~20 ms of CPU per call measured on
this class of machine. :class:`EpollReadiness` registers each socket's ``ZMQ_FD`` once in a Linux epoll set
instead, and a wait returns only the signalled sockets.

``ZMQ_FD`` signals that the socket has commands to process (a pipe became readable, a connection came or went),
not that a message is there. The contract (libzmq's ``zmq_getsockopt(ZMQ_FD)``): after a signal, read until
EAGAIN; reading processes the commands and re-arms the signal. A socket left holding messages (a batch cut at its
cap) is not signalled again for them: the caller carries it to the next round itself. Where epoll does not exist
(not Linux), :class:`PollerReadiness` gives the same interface over ``zmq.Poller``.
"""

from __future__ import annotations

import select
from typing import Generic, Literal, TypeVar

import zmq

__all__ = ["EpollReadiness", "PollerReadiness", "Readiness", "ReadinessKind", "make_readiness"]

T = TypeVar("T")

#: ``"epoll"``, ``"poller"`` (``zmq.Poller``, what the subscriber used before issue 14) or ``"auto"`` (epoll where
#: the OS has it).
ReadinessKind = Literal["auto", "epoll", "poller"]


class EpollReadiness(Generic[T]):
    """Sockets by their ``ZMQ_FD`` in an epoll set; :meth:`wait` costs O(signalled sockets)."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._items: dict[int, T] = {}
        self._fds: dict[zmq.Socket[bytes], int] = {}

    def add(self, sock: zmq.Socket[bytes], item: T) -> None:
        fd = sock.fileno()  # ZMQ_FD
        self._epoll.register(fd, select.EPOLLIN)
        self._items[fd] = item
        self._fds[sock] = fd

    def remove(self, sock: zmq.Socket[bytes]) -> None:
        """Forget ``sock`` (before it is closed: a closed socket's descriptor number is reused)."""
        fd = self._fds.pop(sock, None)
        if fd is not None:
            del self._items[fd]
            self._epoll.unregister(fd)

    def wait(self, timeout_s: float) -> list[T]:
        """The items of the sockets signalled within ``timeout_s`` (0: do not wait)."""
        items = self._items
        events = self._epoll.poll(timeout_s, max(1, len(items)))
        return [items[fd] for fd, _ in events if fd in items]

    def close(self) -> None:
        self._epoll.close()


class PollerReadiness(Generic[T]):
    """The same over ``zmq.Poller`` (O(all sockets) per wait), where epoll is not available."""

    def __init__(self) -> None:
        self._poller = zmq.Poller()
        self._items: dict[zmq.Socket[bytes], T] = {}

    def add(self, sock: zmq.Socket[bytes], item: T) -> None:
        self._poller.register(sock, zmq.POLLIN)
        self._items[sock] = item

    def remove(self, sock: zmq.Socket[bytes]) -> None:
        if self._items.pop(sock, None) is not None:
            self._poller.unregister(sock)

    def wait(self, timeout_s: float) -> list[T]:
        items = self._items
        return [items[sock] for sock, _ in self._poller.poll(round(timeout_s * 1000)) if sock in items]

    def close(self) -> None:
        self._items.clear()


Readiness = EpollReadiness[T] | PollerReadiness[T]


def make_readiness(kind: ReadinessKind = "auto") -> Readiness[T]:
    """Epoll where the OS has it (``"auto"``), ``zmq.Poller`` otherwise or when asked."""
    if kind == "poller" or (kind == "auto" and not hasattr(select, "epoll")):
        return PollerReadiness()
    return EpollReadiness()

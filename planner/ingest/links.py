"""Per-endpoint connection bookkeeping of :class:`~planner.ingest.subscriber.FpmSubscriber`: the reconnect
policy, each endpoint's mutable link state and the counters it exports (:class:`LinkStats`, :class:`LinkTotals`).
The receive thread alone mutates a :class:`Link`; readers take :meth:`Link.stats` copies."""

from __future__ import annotations

import random

import msgspec
import zmq

__all__ = ["TOTALED", "Link", "LinkStats", "LinkTotals", "ReconnectPolicy"]


class ReconnectPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """Reconnect timing. libzmq retries a connect that fails (refused, unreachable) after ``base_s``, doubling
    up to ``max_s``, with its own jitter; the subscriber waits ``min(max_s, base_s * 2**k) * U(1 - jitter, 1)``
    before reopening an endpoint that dropped ``k + 1`` connections in a row without a decodable message (and
    ``base_s`` when libzmq gave up on it after a protocol error)."""

    base_s: float = 0.1
    max_s: float = 5.0  # below the store's 10 s TTL: a worker back up is heard again before it counts as silent
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if not 0.001 <= self.base_s <= self.max_s or not 0.0 <= self.jitter < 1.0:
            raise ValueError("need 0.001 <= base_s <= max_s and 0 <= jitter < 1")

    def delay_s(self, failures: int, rng: random.Random) -> float:
        """The hold-off after ``failures`` consecutive failed connections (>= 0), jittered."""
        raw = self.max_s if failures >= 64 else min(self.max_s, self.base_s * 2.0**failures)
        return raw * (1.0 - self.jitter * rng.random())


class LinkStats(msgspec.Struct, frozen=True, kw_only=True):
    """One endpoint's connection counters (cumulative since the endpoint was first followed)."""

    endpoint: str
    connected: bool  # a ZMTP handshake completed and the connection has not dropped since
    connections: int  # ZMTP handshakes completed (the first connection included)
    disconnects: int  # connections dropped (reset, publisher gone, protocol error)
    reconnects: int  # connections re-established after a drop
    connect_retries: int  # connect attempts libzmq retried (refused, unreachable)
    protocol_errors: int  # drops libzmq would not recover from by itself (socket replaced)
    socket_replacements: int  # SUB sockets closed and reopened by the subscriber
    backoff_s: float  # the hold-off the endpoint is in now (0.0: none)


class LinkTotals(msgspec.Struct, frozen=True, kw_only=True):
    """Connection counters summed over every endpoint ever followed (cumulative: never lower than before), and
    how many endpoints wait out a backoff now."""

    disconnects: int = 0
    reconnects: int = 0
    connect_retries: int = 0
    protocol_errors: int = 0
    socket_replacements: int = 0
    backing_off: int = 0


TOTALED = ("disconnects", "reconnects", "connect_retries", "protocol_errors", "replacements")


class Link:
    """Mutable per-endpoint state of the receive thread."""

    __slots__ = (
        "backoff_s",
        "connect_retries",
        "connected",
        "connections",
        "disconnects",
        "due",
        "endpoint",
        "failures",
        "healthy",
        "monitor",
        "protocol_errors",
        "reconnects",
        "replacements",
        "settled",
        "sock",
        "verdict",
    )

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.sock: zmq.Socket[bytes] | None = None
        self.monitor: zmq.Socket[bytes] | None = None
        self.connected = False
        self.healthy = True  # a decodable message arrived since the last drop (or nothing dropped yet)
        self.settled = True  # libzmq showed it is handling the last drop (a retry or a new handshake)
        self.due: float | None = None  # when to act: a verdict on the last drop, or reopen the socket
        self.verdict = False  # at ``due``: a silent libzmq means a message over ZMQ_MAXMSGSIZE (``oversized``)
        self.failures = 0  # drops in a row without a decodable message
        self.backoff_s = 0.0
        self.connections = 0
        self.disconnects = 0
        self.reconnects = 0
        self.connect_retries = 0
        self.protocol_errors = 0
        self.replacements = 0

    def stats(self) -> LinkStats:
        return LinkStats(
            endpoint=self.endpoint,
            connected=self.connected,
            connections=self.connections,
            disconnects=self.disconnects,
            reconnects=self.reconnects,
            connect_retries=self.connect_retries,
            protocol_errors=self.protocol_errors,
            socket_replacements=self.replacements,
            backoff_s=self.backoff_s,
        )

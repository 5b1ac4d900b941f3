"""FPM subscriber: the I/O shell in front of :class:`~planner.ingest.store.FleetStore`.

One ZMQ SUB socket per discovered endpoint (so every message is attributed to the endpoint it came from), all
served by one thread, in rounds at most every ``min_poll_interval_s``; which sockets are ready comes from their
``ZMQ_FD`` in an epoll set (:mod:`planner.ingest.readiness`), so a round costs what the ready sockets cost.
Each socket caps inbound messages with ZMQ_MAXMSGSIZE and is watched by a monitor socket.
Ready sockets are drained in batches, by the C drain of :mod:`planner.ingest.native` where it is built
(``receive_path``); the store is updated under a lock that readers (:meth:`FpmSubscriber.snapshot`) share.
Nothing raises out of the receive loop: a message that does not decode, whatever the error, is one
``decode_error``; any other failure is counted in :attr:`FpmSubscriber.loop_errors` and the loop goes on.

Connections (see ``docs/wire_and_ingest.md``). A SUB socket is never disconnected and reconnected in place: that
leaves libzmq reading a terminated pipe mid-message and aborts the process (``Assertion failed: !_more``). Either
libzmq reconnects the socket by itself (``ZMQ_RECONNECT_IVL`` doubling up to ``ZMQ_RECONNECT_IVL_MAX``, with
jitter: a reset, a restart, a publisher that is down), or the socket is closed and a fresh one opened after an
exponential backoff with jitter: when libzmq will not reconnect (a protocol error after the handshake, i.e. a
message over ZMQ_MAXMSGSIZE: counted ``oversized``), and when an endpoint keeps dropping connections without
delivering one decodable message (a non-ZMQ peer, a flapping proxy), so such an endpoint costs one attempt per
backoff period instead of one every ``reconnect_ivl``. Every endpoint's counts are in :meth:`FpmSubscriber.links`.

With ``curve`` (:class:`~worker_shim.curve.CurveClientKeys`) every socket is a CURVE client of the publishers'
server key: encrypted, and only publishers holding that key complete a handshake.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Literal

import zmq
from zmq.utils.monitor import parse_monitor_message

from planner.discovery import WorkerRecord
from planner.ingest.links import TOTALED, Link, LinkStats, LinkTotals, ReconnectPolicy
from planner.ingest.native import NATIVE_UNAVAILABLE, Drain, ReceivePath, drain_pyzmq, native_drain
from planner.ingest.readiness import Readiness, ReadinessKind, make_readiness
from planner.ingest.store import DropReason, FleetSnapshot, FleetStore
from worker_shim import fpm
from worker_shim.curve import CurveClientKeys

__all__ = ["FpmSubscriber", "LinkStats", "LinkTotals", "ReconnectPolicy"]

log = logging.getLogger(__name__)

_BATCH = 256  # messages drained from one socket before moving to the next ready one
_EVENTS = zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_HANDSHAKE_SUCCEEDED

_Ready = Readiness[tuple[zmq.Socket[bytes], Link, bool]]


def _close_link(link: Link, ready: _Ready) -> None:
    """Close the link's SUB socket and its monitor (never a disconnect on a socket that stays open)."""
    sock, monitor = link.sock, link.monitor
    link.sock = link.monitor = None
    link.connected = False
    if sock is not None:
        ready.remove(sock)
        sock.disable_monitor()
        sock.close()
    if monitor is not None:
        ready.remove(monitor)
        monitor.close()


def _release(links: dict[str, Link], ready: _Ready, ctx: zmq.Context[zmq.Socket[bytes]], own_ctx: bool) -> None:
    """Every socket closed, then the context (when the subscriber made it) terminated: by ``close()``, or when the
    subscriber is collected without it. Holds none of the subscriber, only what it owns."""
    for link in links.values():
        _close_link(link, ready)
    links.clear()
    ready.close()
    if own_ctx:
        ctx.term()


class FpmSubscriber:
    """Connects to the FPM endpoints of the discovered workers and feeds a :class:`FleetStore`."""

    def __init__(
        self,
        store: FleetStore,
        *,
        max_msg_bytes: int = 64 * 1024,
        rcvhwm: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        receive_path: ReceivePath = "auto",
        reconnect: ReconnectPolicy | None = None,
        seed: int | None = None,
        curve: CurveClientKeys | None = None,
        min_poll_interval_s: float = 0.1,
        readiness: ReadinessKind = "auto",
    ) -> None:
        if not 0.0 <= min_poll_interval_s <= 1.0:
            raise ValueError("min_poll_interval_s must be within [0, 1]")
        self.store = store
        native = native_drain()
        if receive_path == "native" and native is None:
            raise RuntimeError(f"the native FPM receive path is unavailable: {NATIVE_UNAVAILABLE}")
        self._drain_socket: Drain = native if native is not None and receive_path != "pyzmq" else drain_pyzmq
        #: ``"native"`` (the C batch drain) or ``"pyzmq"`` (``recv_multipart``); both ingest the same way.
        self.receive_path: Literal["native", "pyzmq"] = "native" if self._drain_socket is native else "pyzmq"
        self.max_msg_bytes = max_msg_bytes
        self.rcvhwm = rcvhwm
        self.clock = clock
        self.reconnect = reconnect or ReconnectPolicy()
        self.curve = curve
        #: The receive thread starts a round (wait, then drain every ready socket) at most this often: a round then
        #: finds many sockets ready, several messages on a busy one, and each socket's wake-up costs less per
        #: message. It adds up to this much latency to a sample (the decision tick reads every 0.5-1 s).
        self.min_poll_interval_s = min_poll_interval_s
        self._rng = random.Random(seed)
        self.lock = threading.Lock()
        self.loop_errors = 0
        self.received = 0
        self.rounds = 0  # poll_once calls: received / rounds is the batch one round gathers
        # Each endpoint costs three ZMQ sockets (SUB, its monitor, the monitor's peer): a context of our own with the
        # socket limit raised, or the default of 1023 would cap the fleet at 341 endpoints.
        self._own_ctx = context is None
        self._ctx = context if context is not None else zmq.Context()
        if self._own_ctx:
            self._ctx.set(zmq.MAX_SOCKETS, self._ctx.get(zmq.SOCKET_LIMIT))
        self._ctx.setsockopt(zmq.LINGER, 0)
        self._links: dict[str, Link] = {}  # every endpoint followed, with or without an open socket
        # Open SUB sockets and monitors, by readiness (True: a monitor); sockets a capped batch left non-empty.
        self._ready: _Ready = make_readiness(readiness)
        self._carry: list[tuple[zmq.Socket[bytes], Link, bool]] = []
        self._due: set[Link] = set()  # links with a timer (link.due)
        self._departed = dict.fromkeys(TOTALED, 0)  # counts of endpoints no longer followed
        self._pending_workers: Mapping[str, WorkerRecord] | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        # The sockets and the context are released by close(), or when the subscriber is collected without it
        # (sockets first: a context the GC finalizes before its sockets blocks in term() forever, whoever held the
        # subscriber). At exit pyzmq leaves its contexts alone, and so does this (a receive thread may still run).
        self._release = weakref.finalize(self, _release, self._links, self._ready, self._ctx, self._own_ctx)
        self._release.atexit = False

    # -- discovery -------------------------------------------------------------------------------------------

    def set_workers(self, workers: Mapping[str, WorkerRecord]) -> None:
        """Follow discovery: connect to new endpoints, disconnect departed ones, forget departed workers.

        Safe from any thread: the store is updated now (so departed workers' samples drop at once); sockets are
        changed by the receive thread (or now, when no thread runs)."""
        with self.lock:
            self.store.set_workers(workers)
            self._pending_workers = workers
        if self._thread is None:
            self._apply_endpoints()

    @property
    def endpoints(self) -> tuple[str, ...]:
        """Every endpoint followed (its socket may be closed for a backoff)."""
        return tuple(self._links)

    @property
    def reconnects(self) -> int:
        """Connections re-established after a drop, every endpoint ever followed."""
        return self.link_totals().reconnects

    def links(self) -> dict[str, LinkStats]:
        """Every followed endpoint's connection counters (readable from any thread)."""
        return {endpoint: link.stats() for endpoint, link in list(self._links.items())}

    def troubled_links(self, limit: int = 50) -> list[LinkStats]:
        """Up to ``limit`` endpoints that are not connected or ever dropped a connection, most drops first (for
        diagnostics: a fleet has thousands of endpoints, an operator looks at the few in trouble)."""
        troubled = [link.stats() for link in list(self._links.values()) if link.disconnects or not link.connected]
        troubled.sort(key=lambda s: (-s.disconnects - s.connect_retries, s.endpoint))
        return troubled[:limit]

    def link_totals(self) -> LinkTotals:
        """The connection counters of every endpoint ever followed, summed (readable from any thread)."""
        sums = dict(self._departed)
        backing_off = 0
        for link in list(self._links.values()):
            for name in TOTALED:
                sums[name] += getattr(link, name)
            backing_off += link.backoff_s > 0
        return LinkTotals(
            disconnects=sums["disconnects"],
            reconnects=sums["reconnects"],
            connect_retries=sums["connect_retries"],
            protocol_errors=sums["protocol_errors"],
            socket_replacements=sums["replacements"],
            backing_off=backing_off,
        )

    def _apply_endpoints(self) -> None:
        with self.lock:
            workers, self._pending_workers = self._pending_workers, None
        if workers is None:
            return
        wanted = {e for record in workers.values() for e in record.fpm_endpoints}
        for endpoint in [e for e in self._links if e not in wanted]:
            link = self._links.pop(endpoint)
            self._close_socket(link)
            self._due.discard(link)
            for name in TOTALED:
                self._departed[name] += getattr(link, name)
        for endpoint in wanted - self._links.keys():
            link = Link(endpoint)
            if self._open_socket(link):
                self._links[endpoint] = link

    def _open_socket(self, link: Link) -> bool:
        sock = self._ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.MAXMSGSIZE, self.max_msg_bytes)
        sock.setsockopt(zmq.RCVHWM, self.rcvhwm)
        sock.setsockopt(zmq.RECONNECT_IVL, max(1, round(self.reconnect.base_s * 1000)))
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, max(1, round(self.reconnect.max_s * 1000)))
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        if self.curve is not None:
            self.curve.apply(sock)
        monitor = sock.get_monitor_socket(_EVENTS)
        try:
            sock.connect(link.endpoint)
        except zmq.ZMQError as exc:
            log.warning("cannot connect to FPM endpoint %s: %s", link.endpoint, exc)
            sock.disable_monitor()
            monitor.close()
            sock.close()
            return False
        link.sock, link.monitor = sock, monitor
        self._ready.add(sock, (sock, link, False))
        self._ready.add(monitor, (monitor, link, True))
        # A new pipe starts out "awake": what is written to it before it was once read dry raises no ZMQ_FD signal
        # (the monitor's first events do not), so both are read in the next round whatever epoll says.
        self._carry += [(sock, link, False), (monitor, link, True)]
        return True

    def _close_socket(self, link: Link) -> None:
        _close_link(link, self._ready)

    # -- receive ---------------------------------------------------------------------------------------------

    def poll_once(self, timeout_ms: int = 100) -> int:
        """Wait up to ``timeout_ms`` and ingest whatever is ready; returns the number of messages received."""
        if self._pending_workers is not None:
            try:
                self._apply_endpoints()
            except Exception:  # e.g. out of file descriptors: counted, retried on the next discovery change
                self.loop_errors += 1
                log.exception("cannot follow the discovered FPM endpoints")
        if self._due:
            timeout_ms = self._run_timers(timeout_ms)
        self.rounds += 1
        carried, self._carry = self._carry, []
        try:
            ready = self._ready.wait(0.0 if carried else timeout_ms / 1000)
        except (OSError, zmq.ZMQError) as exc:
            self.loop_errors += 1
            log.warning("FPM poll failed: %s", exc)
            self._carry = carried
            return 0
        if carried:
            ready = list(dict.fromkeys(ready + carried))  # a carried socket may be signalled too: drained once
        # Monitor events first: a disconnect must be known before the messages of the connection that follows.
        ready.sort(key=lambda item: not item[2])
        received = 0
        for sock, link, is_monitor in ready:
            try:
                if is_monitor:
                    if link.monitor is sock:
                        received += self._drain_monitor(link)
                elif link.sock is sock:  # not closed by a monitor event of this round
                    got = self._drain(sock, link)
                    received += got
                    if got >= _BATCH:  # left non-empty: its ZMQ_FD will not signal these messages again
                        self._carry.append((sock, link, False))
            except Exception:  # the loop must survive anything one socket does
                self.loop_errors += 1
                log.exception("FPM receive failed")
                # Not read to EAGAIN: its ZMQ_FD may not signal again, so retry it next round (as a level-triggered
                # poll would have).
                self._carry.append((sock, link, is_monitor))
        self.received += received
        return received

    def _drain(self, sock: zmq.Socket[bytes], link: Link) -> int:
        payloads, bad = self._drain_socket(sock, _BATCH)
        if payloads or bad:
            endpoint = link.endpoint
            received_at = self.clock()
            store = self.store
            ingest = store.ingest
            decode = fpm.decode
            decoded = 0
            with self.lock:
                if bad:
                    store.drop(DropReason.BAD_FRAME, endpoint, bad)
                for payload in payloads:
                    try:
                        sample = decode(payload)
                    except Exception:  # FpmDecodeError, or anything a hostile payload provokes: one drop each
                        store.drop(DropReason.DECODE_ERROR, endpoint)
                        continue
                    decoded += 1
                    try:
                        ingest(endpoint, sample, received_at, received_at)
                    except Exception:  # never lose the rest of the batch to one sample
                        self.loop_errors += 1
                        log.exception("FPM ingest failed on %s", endpoint)
            if decoded and not link.healthy:
                link.healthy = True
                link.failures = 0
        return len(payloads) + bad

    def _drain_monitor(self, link: Link) -> int:
        """Handle the link's connection events; returns the messages drained from a socket closed here."""
        monitor = link.monitor
        received = 0
        while monitor is not None and link.monitor is monitor:
            try:
                event = parse_monitor_message(monitor.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                break
            kind = event["event"]
            if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                link.connections += 1
                if link.disconnects or link.replacements:
                    link.reconnects += 1
                link.connected = True
                link.settled = True
            elif kind == zmq.EVENT_CONNECT_RETRIED:
                link.connect_retries += 1
                link.settled = True
            elif kind == zmq.EVENT_DISCONNECTED:
                received += self._on_disconnect(link)
        return received

    def _on_disconnect(self, link: Link) -> int:
        was_connected = link.connected
        link.connected = False
        link.disconnects += 1
        with self.lock:
            self.store.note_disconnect(link.endpoint)
        if link.healthy:
            # The first drop after good traffic: libzmq reconnects by itself, unless this was a protocol error
            # (then it shows nothing more). The verdict waits ``base_s``; the socket keeps its backlog meanwhile.
            link.healthy = False
            link.settled = False
            link.failures = 0
            self._schedule(link, self.reconnect.base_s, verdict=was_connected)
            return 0
        # Drops in a row without one decodable message: close now (libzmq would retry every base_s) and reopen
        # after an exponential backoff.
        link.failures += 1
        received = self._drain(link.sock, link) if link.sock is not None else 0
        self._close_socket(link)
        self._schedule(link, self.reconnect.delay_s(link.failures, self._rng), verdict=False)
        return received

    def _schedule(self, link: Link, delay_s: float, *, verdict: bool) -> None:
        link.due = time.monotonic() + delay_s
        link.backoff_s = 0.0 if verdict or link.sock is not None else delay_s
        link.verdict = verdict
        self._due.add(link)

    def _run_timers(self, timeout_ms: int) -> int:
        """Act on the links whose timer expired; returns the poll timeout that wakes up for the next one."""
        now = time.monotonic()
        wake = now + timeout_ms / 1000
        for link in list(self._due):
            due = link.due
            if due is None or link.endpoint not in self._links:
                self._due.discard(link)
                continue
            if due > now:
                wake = min(wake, due)
                continue
            self._due.discard(link)
            link.due = None
            try:
                self._expire(link)
            except Exception:
                self.loop_errors += 1
                log.exception("FPM reconnect of %s failed", link.endpoint)
        return max(0, round((wake - now) * 1000))

    def _expire(self, link: Link) -> None:
        if link.sock is None:  # the backoff is over: a fresh socket
            link.backoff_s = 0.0
            if self._open_socket(link):
                link.replacements += 1
            else:
                self._schedule(link, self.reconnect.delay_s(link.failures + 1, self._rng), verdict=False)
            return
        if link.monitor is not None:
            self.received += self._drain_monitor(link)
        if link.settled or link.sock is None:
            return
        # No retry, no handshake since the drop: libzmq gave up on the connection (a protocol error). After a
        # completed handshake, from a ZMQ publisher, that is a message over ZMQ_MAXMSGSIZE.
        link.protocol_errors += 1
        if link.verdict:
            with self.lock:
                self.store.drop(DropReason.OVERSIZED, link.endpoint)
        self.received += self._drain(link.sock, link)
        self._close_socket(link)
        link.settled = True
        if self._open_socket(link):
            link.replacements += 1
        else:
            self._schedule(link, self.reconnect.delay_s(link.failures + 1, self._rng), verdict=False)

    # -- thread ----------------------------------------------------------------------------------------------

    def start(self) -> FpmSubscriber:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="fpm-subscriber", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        interval_s = self.min_poll_interval_s
        next_round = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if now < next_round:
                self._stop.wait(next_round - now)
                continue
            next_round = now + interval_s
            self.poll_once(50)

    def close(self) -> None:
        """Stop the receive thread, close every socket and terminate the context it made (once)."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(5.0)
            self._thread = None
        self._due.clear()
        self._carry.clear()
        self._release()

    def __enter__(self) -> FpmSubscriber:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def snapshot(self, now: float) -> FleetSnapshot:
        with self.lock:
            return self.store.snapshot(now)

"""FPM subscriber: the I/O shell in front of :class:`~planner.ingest.store.FleetStore`.

One ZMQ SUB socket per discovered endpoint (so every message is attributed to the endpoint it came from), all
polled by one thread. Each socket caps inbound messages with ZMQ_MAXMSGSIZE and is watched by a monitor socket
for disconnects, after which it reconnects (libzmq does not after an oversized message). Ready sockets are drained
in batches, by the C drain of :mod:`planner.ingest.native` where it is built (``receive_path``); the store is
updated under a lock that readers (:meth:`FpmSubscriber.snapshot`) share. Nothing raises out of the receive
loop: a failure is counted in :attr:`FpmSubscriber.loop_errors` and the loop goes on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Literal

import zmq
from zmq.utils.monitor import parse_monitor_message

from planner.discovery import WorkerRecord
from planner.ingest.native import NATIVE_UNAVAILABLE, Drain, ReceivePath, drain_pyzmq, native_drain
from planner.ingest.store import DropReason, FleetSnapshot, FleetStore
from worker_shim import fpm

__all__ = ["FpmSubscriber"]

log = logging.getLogger(__name__)

_BATCH = 256  # messages drained from one socket before moving to the next ready one


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
    ) -> None:
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
        self.lock = threading.Lock()
        self.loop_errors = 0
        self.received = 0
        self.reconnects = 0
        # Each endpoint costs three ZMQ sockets (SUB, its monitor, the monitor's peer): a context of our own with the
        # socket limit raised, or the default of 1023 would cap the fleet at 341 endpoints.
        self._own_ctx = context is None
        self._ctx = context if context is not None else zmq.Context()
        if self._own_ctx:
            self._ctx.set(zmq.MAX_SOCKETS, self._ctx.get(zmq.SOCKET_LIMIT))
        self._ctx.setsockopt(zmq.LINGER, 0)
        self._sockets: dict[str, zmq.Socket[bytes]] = {}
        self._monitors: dict[zmq.Socket[bytes], str] = {}
        self._endpoint_of: dict[zmq.Socket[bytes], str] = {}
        self._poller = zmq.Poller()
        self._pending_workers: Mapping[str, WorkerRecord] | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

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
        return tuple(self._sockets)

    def _apply_endpoints(self) -> None:
        with self.lock:
            workers, self._pending_workers = self._pending_workers, None
        if workers is None:
            return
        wanted = {e for record in workers.values() for e in record.fpm_endpoints}
        for endpoint in [e for e in self._sockets if e not in wanted]:
            self._close(endpoint)
        for endpoint in wanted - self._sockets.keys():
            self._open(endpoint)

    def _open(self, endpoint: str) -> None:
        sock = self._ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.MAXMSGSIZE, self.max_msg_bytes)
        sock.setsockopt(zmq.RCVHWM, self.rcvhwm)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        try:
            sock.connect(endpoint)
        except zmq.ZMQError as exc:
            log.warning("cannot connect to FPM endpoint %s: %s", endpoint, exc)
            sock.disable_monitor()
            monitor.close()
            sock.close()
            return
        self._sockets[endpoint] = sock
        self._endpoint_of[sock] = endpoint
        self._monitors[monitor] = endpoint
        self._poller.register(sock, zmq.POLLIN)
        self._poller.register(monitor, zmq.POLLIN)

    def _close(self, endpoint: str) -> None:
        sock = self._sockets.pop(endpoint)
        del self._endpoint_of[sock]
        monitor = next(m for m, e in self._monitors.items() if e == endpoint)
        del self._monitors[monitor]
        self._poller.unregister(sock)
        self._poller.unregister(monitor)
        sock.disable_monitor()
        monitor.close()
        sock.close()

    # -- receive ---------------------------------------------------------------------------------------------

    def poll_once(self, timeout_ms: int = 100) -> int:
        """Wait up to ``timeout_ms`` and ingest whatever is ready; returns the number of messages received."""
        if self._pending_workers is not None:
            try:
                self._apply_endpoints()
            except Exception:  # e.g. out of file descriptors: counted, retried on the next discovery change
                self.loop_errors += 1
                log.exception("cannot follow the discovered FPM endpoints")
        received = 0
        try:
            ready = self._poller.poll(timeout_ms)
        except zmq.ZMQError as exc:
            self.loop_errors += 1
            log.warning("FPM poll failed: %s", exc)
            return 0
        # Monitor events first: a disconnect must be known before the messages of the connection that follows.
        ready.sort(key=lambda item: item[0] not in self._monitors)
        for sock, _ in ready:
            try:
                monitored = self._monitors.get(sock)
                if monitored is not None:
                    self._drain_monitor(sock, monitored)
                else:
                    received += self._drain(sock, self._endpoint_of[sock])
            except Exception:  # the loop must survive anything one socket does
                self.loop_errors += 1
                log.exception("FPM receive failed")
        self.received += received
        return received

    def _drain(self, sock: zmq.Socket[bytes], endpoint: str) -> int:
        payloads, bad = self._drain_socket(sock, _BATCH)
        if payloads or bad:
            received_at = self.clock()
            store = self.store
            ingest = store.ingest
            decode = fpm.decode
            with self.lock:
                if bad:
                    store.drop(DropReason.BAD_FRAME, endpoint, bad)
                for payload in payloads:
                    try:
                        sample = decode(payload)
                    except fpm.FpmDecodeError:
                        store.drop(DropReason.DECODE_ERROR, endpoint)
                        continue
                    ingest(endpoint, sample, received_at, received_at)
        return len(payloads) + bad

    def _drain_monitor(self, monitor: zmq.Socket[bytes], endpoint: str) -> None:
        while True:
            try:
                event = parse_monitor_message(monitor.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return
            if event["event"] == zmq.EVENT_DISCONNECTED:
                with self.lock:
                    self.store.note_disconnect(endpoint)
                # After a protocol error (a message over ZMQ_MAXMSGSIZE) libzmq never reconnects on its own: one
                # bad message would silence the worker for good. Reconnect explicitly; harmless after a restart.
                sock = self._sockets.get(endpoint)
                if sock is not None:
                    sock.disconnect(endpoint)
                    sock.connect(endpoint)
                    self.reconnects += 1

    # -- thread ----------------------------------------------------------------------------------------------

    def start(self) -> FpmSubscriber:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="fpm-subscriber", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll_once(50)

    def close(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(5.0)
            self._thread = None
        for endpoint in list(self._sockets):
            self._close(endpoint)
        if self._own_ctx:
            self._ctx.term()

    def __enter__(self) -> FpmSubscriber:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def snapshot(self, now: float) -> FleetSnapshot:
        with self.lock:
            return self.store.snapshot(now)

"""Network faults on real TCP sockets, for the soak benchmark and the ingest tests.

- :class:`ResettingProxy` sits between a ZMQ publisher and its subscribers and resets both sides of every
  connection after a random number of bytes from the publisher: the cut lands in the middle of a message.
- :class:`GarbagePeer` is a non-ZMQ TCP service on a port discovery lists as an FPM endpoint: it answers every
  connection with random bytes and resets it.

Both run daemon threads and count what they did; :meth:`close` stops them.
"""

from __future__ import annotations

import random
import select
import socket
import struct
import threading

__all__ = ["GarbagePeer", "ResettingProxy"]

_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on with a 0 s timeout: close() sends RST instead of FIN


def _reset(sock: socket.socket) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
    except OSError:
        pass
    sock.close()


def _listen() -> socket.socket:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    server.settimeout(0.1)
    return server


def _host_port(endpoint: str) -> tuple[str, int]:
    """``tcp://host:port`` -> ``(host, port)``."""
    host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
    return host, int(port)


class _Server:
    """Accepts on 127.0.0.1:<random port> in a daemon thread and hands each connection to :meth:`_serve`."""

    def __init__(self, seed: int | None) -> None:
        self._rng = random.Random(seed)
        self._server = _listen()
        self.endpoint = f"tcp://127.0.0.1:{self._server.getsockname()[1]}"
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept_loop, name=type(self).__name__, daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve_safely, args=(conn,), daemon=True).start()

    def _serve_safely(self, conn: socket.socket) -> None:
        try:
            self._serve(conn)
        except OSError:
            _reset(conn)

    def _serve(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5.0)
        self._server.close()


class ResettingProxy(_Server):
    """Forwards a ZMQ TCP endpoint and resets each connection after ``min_bytes``..``max_bytes`` bytes from the
    publisher (handshake included), so most cuts fall inside a message. ``cuts_mid_stream`` counts them."""

    def __init__(self, upstream: str, *, seed: int | None = None, min_bytes: int = 100, max_bytes: int = 20_000):
        self.upstream = _host_port(upstream)
        self.min_bytes = min_bytes
        self.max_bytes = max_bytes
        self.cuts_mid_stream = 0
        self.connections = 0
        super().__init__(seed)

    def _serve(self, client: socket.socket) -> None:
        with self._lock:
            self.connections += 1
            budget = self._rng.randint(self.min_bytes, self.max_bytes)
        try:
            upstream = socket.create_connection(self.upstream, timeout=5.0)
        except OSError:
            _reset(client)
            return
        pair = {client: upstream, upstream: client}
        try:
            while not self._stop.is_set():
                readable, _, _ = select.select(list(pair), [], [], 0.1)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    if sock is upstream:
                        if len(data) >= budget:
                            client.sendall(data[:budget])
                            with self._lock:
                                self.cuts_mid_stream += 1
                            return
                        budget -= len(data)
                    pair[sock].sendall(data)
        finally:
            _reset(client)
            _reset(upstream)


class GarbagePeer(_Server):
    """A non-ZMQ peer: answers each connection with 1..``max_bytes`` random bytes, then resets it."""

    def __init__(self, *, seed: int | None = None, max_bytes: int = 2048) -> None:
        self.max_bytes = max_bytes
        self.served = 0
        super().__init__(seed)

    def _serve(self, conn: socket.socket) -> None:
        with self._lock:
            garbage = self._rng.randbytes(self._rng.randint(1, self.max_bytes))
        try:
            conn.sendall(garbage)
            with self._lock:
                self.served += 1
        finally:
            _reset(conn)

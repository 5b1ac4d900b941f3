"""FPM publisher: a ZMQ PUB socket fed from a bounded queue by a background thread.

The engine's step loop calls :meth:`FpmPublisher.publish`, which never blocks: when the queue is full the sample
is dropped and counted. The thread assigns ``counter_id`` (one sequence for samples and heartbeats), stamps the
*current* worker id (so :meth:`FpmPublisher.set_worker_id` applies to step samples and heartbeats alike), and
sends an idle heartbeat when nothing was sent for ``heartbeat_interval_s``. With ``send_interval_s`` > 0 it sends
in bursts: whatever is queued goes out back to back at most every ``send_interval_s`` (a sample waits at most that
long), so libzmq writes a burst in few TCP segments and a subscriber's I/O thread reads several messages per
``recv`` and wake-up, instead of one each; every message is still ``[topic, seq, payload]`` of one step.
:meth:`FpmPublisher.flush` and :meth:`FpmPublisher.close` send what is queued at once, and a burst due after the
next heartbeat goes out at the heartbeat's time instead, so the longest silence stays ``heartbeat_interval_s``.
Every message of one publisher run carries its ``run_id``, a random u64 drawn at :meth:`FpmPublisher.start`: a
subscriber tells a restart (new run id, counter from 0) from loss by it. With ``curve``
(:class:`~worker_shim.curve.CurveServerKeys`) the socket is a CURVE server: only subscribers that know its public
key (and, with ``allowed_clients_dir``, hold an allowed key) read.
"""

from __future__ import annotations

import queue
import secrets
import threading
import time

import msgspec
import zmq
from zmq.auth.thread import ThreadAuthenticator

from worker_shim import fpm
from worker_shim.curve import CurveServerKeys
from worker_shim.fpm import ForwardPassMetrics, QueuedRequests, ScheduledRequests, StepTraffic

__all__ = [
    "DEFAULT_PORT_BASE",
    "DEFAULT_SEND_INTERVAL_S",
    "FpmPublisher",
    "PublisherStats",
    "bind_endpoint",
    "new_run_id",
]

DEFAULT_PORT_BASE = 20380
#: Bursts at most every 100 ms: ~5 steps per burst at 50 Hz (the subscriber's libzmq then costs ~2 us per sample instead
#: of 4-7), as long as the planner's own receive rounds, against a decision tick every 0.5-1 s and a 10 s TTL.
DEFAULT_SEND_INTERVAL_S = 0.1


def bind_endpoint(
    dp_rank: int, *, host: str = "*", base_port: int = DEFAULT_PORT_BASE, ipc_path: str | None = None
) -> str:
    """The endpoint a rank binds: ``tcp://{host}:{base_port + dp_rank}``, or ``ipc://{ipc_path}``."""
    if ipc_path is not None:
        return f"ipc://{ipc_path}"
    if dp_rank < 0:
        raise ValueError(f"dp_rank must be >= 0, got {dp_rank}")
    return f"tcp://{host}:{base_port + dp_rank}"


def new_run_id() -> int:
    """A random non-zero u64 for one publisher run."""
    return secrets.randbits(64) or 1


class PublisherStats(msgspec.Struct, frozen=True, kw_only=True):
    sent: int
    heartbeats: int
    dropped_queue_full: int
    dropped_send: int
    counter_id: int
    run_id: int = 0

    @property
    def dropped(self) -> int:
        return self.dropped_queue_full + self.dropped_send


class FpmPublisher:
    """Publishes FPM samples of one DP rank.

    Use as a context manager or call :meth:`start` / :meth:`close`. ``endpoint`` overrides the default
    ``tcp://{host}:{base_port + dp_rank}``.
    """

    def __init__(
        self,
        *,
        worker_id: str,
        dp_rank: int = 0,
        host: str = "*",
        base_port: int = DEFAULT_PORT_BASE,
        endpoint: str | None = None,
        heartbeat_interval_s: float = 1.0,
        send_interval_s: float = DEFAULT_SEND_INTERVAL_S,
        queue_size: int = 8192,
        topic: bytes = b"",
        sndhwm: int = 100_000,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        run_id: int | None = None,
        curve: CurveServerKeys | None = None,
    ) -> None:
        if heartbeat_interval_s <= 0:
            raise ValueError(f"heartbeat_interval_s must be > 0, got {heartbeat_interval_s}")
        if not 0 <= send_interval_s < float("inf"):
            raise ValueError(f"send_interval_s must be a number >= 0, got {send_interval_s}")
        if queue_size < 1:
            raise ValueError(f"queue_size must be >= 1, got {queue_size}")
        self.dp_rank = dp_rank
        self.endpoint = endpoint or bind_endpoint(dp_rank, host=host, base_port=base_port)
        self.heartbeat_interval_s = heartbeat_interval_s
        self.send_interval_s = send_interval_s
        self.topic = topic
        self._worker_id = worker_id
        self._queue: queue.SimpleQueue[
            tuple[float, ScheduledRequests, QueuedRequests, StepTraffic | msgspec.UnsetType] | None
        ] = queue.SimpleQueue()  # None stops
        self._queue_size = queue_size
        self._pending = 0  # approximate queue depth; SimpleQueue has no bound of its own
        self._lock = threading.Lock()
        self._curve = curve
        # A ZAP handler serves a whole context: the publisher gets one of its own for it unless given one.
        self._own_ctx = context is None and curve is not None and curve.allowed_clients_dir is not None
        self._ctx = context or (zmq.Context() if self._own_ctx else zmq.Context.instance())
        self._auth: ThreadAuthenticator | None = None
        self._sndhwm = sndhwm
        self._socket: zmq.Socket[bytes] | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._hurry = threading.Event()  # flush() / close(): send the burst being gathered now
        self._error: BaseException | None = None
        self._sent = 0
        self._heartbeats = 0
        self._dropped_queue_full = 0
        self._dropped_send = 0
        self._counter = 0
        self._fixed_run_id = run_id
        #: This run's id (drawn at :meth:`start` unless given); 0 before the first start.
        self.run_id = 0
        self.bound_endpoint: str | None = None

    # -- identity --------------------------------------------------------------------------------------------

    @property
    def worker_id(self) -> str:
        return self._worker_id

    def set_worker_id(self, worker_id: str) -> None:
        """Publish every following message (step samples and heartbeats) under ``worker_id``."""
        self._worker_id = worker_id

    # -- lifecycle -------------------------------------------------------------------------------------------

    def start(self) -> FpmPublisher:
        """Bind and start the sending thread; raises if the endpoint cannot be bound."""
        if self._thread is not None:
            return self
        self.run_id = self._fixed_run_id if self._fixed_run_id is not None else new_run_id()
        self._counter = 0
        if self._curve is not None and self._curve.allowed_clients_dir is not None and self._auth is None:
            self._auth = ThreadAuthenticator(self._ctx)
            self._auth.start()
            self._auth.configure_curve(domain="*", location=self._curve.allowed_clients_dir)
        self._thread = threading.Thread(target=self._run, name=f"fpm-publisher-{self.dp_rank}", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread = None
            self._stop_auth()
            raise RuntimeError(f"FPM publisher cannot bind {self.endpoint}: {self._error}") from self._error
        return self

    def close(self, timeout_s: float = 2.0) -> None:
        """Send what is queued, then stop the thread and close the socket."""
        if self._thread is None:
            return
        self._queue.put(None)
        self._hurry.set()
        self._thread.join(timeout_s)
        stuck = self._thread.is_alive()
        self._thread = None
        self._stop_auth(term=not stuck)

    def _stop_auth(self, *, term: bool = True) -> None:
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        if self._own_ctx and term:  # never wait on a socket a stuck thread still holds
            self._ctx.term()
            self._ctx = zmq.Context()  # a later start() gets a fresh one

    def __enter__(self) -> FpmPublisher:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the engine's side -----------------------------------------------------------------------------------

    def publish(
        self,
        wall_time: float,
        scheduled: ScheduledRequests,
        queued: QueuedRequests,
        traffic: StepTraffic | msgspec.UnsetType = msgspec.UNSET,
    ) -> bool:
        """Queue one step sample (with the optional traffic extension); never blocks. Returns False (and counts
        it) when the queue is full."""
        with self._lock:
            if self._pending >= self._queue_size or self._thread is None:
                self._dropped_queue_full += 1
                return False
            self._pending += 1
        self._queue.put((wall_time, scheduled, queued, traffic))
        return True

    def stats(self) -> PublisherStats:
        with self._lock:
            return PublisherStats(
                sent=self._sent,
                heartbeats=self._heartbeats,
                dropped_queue_full=self._dropped_queue_full,
                dropped_send=self._dropped_send,
                counter_id=self._counter,
                run_id=self.run_id,
            )

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Send what is queued now (not at the next burst) and wait until the queue is empty; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if self._pending == 0:
                    return True
            self._hurry.set()
            time.sleep(0.001)
        return False

    # -- the thread ------------------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            sock = self._ctx.socket(zmq.PUB)
        except zmq.ZMQError as exc:
            self._error = exc
            self._ready.set()
            return
        try:
            sock.setsockopt(zmq.SNDHWM, self._sndhwm)
            sock.setsockopt(zmq.LINGER, 500)
            if self._curve is not None:
                self._curve.apply(sock)
            sock.bind(self.endpoint)
            self.bound_endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            self._error = exc
            self._ready.set()
            return
        self._socket = sock
        self._ready.set()
        try:
            self._loop(sock)
        finally:
            sock.close()
            self._socket = None

    def _loop(self, sock: zmq.Socket[bytes]) -> None:
        get, get_nowait = self._queue.get, self._queue.get_nowait
        next_heartbeat = time.monotonic() + self.heartbeat_interval_s
        last_burst = float("-inf")
        while True:
            try:
                item = get(timeout=max(0.0, next_heartbeat - time.monotonic()))
            except queue.Empty:
                beat = fpm.heartbeat(self._worker_id, self.dp_rank, self._counter, self.run_id)
                self._send(sock, beat, heartbeat=True)
                next_heartbeat = time.monotonic() + self.heartbeat_interval_s
                continue
            if item is not None and self.send_interval_s > 0:
                # Gather until the burst is due (or the heartbeat would be, or flush()/close() asks).
                wait_s = min(last_burst + self.send_interval_s, next_heartbeat) - time.monotonic()
                if wait_s > 0:
                    self._hurry.wait(wait_s)
            self._hurry.clear()
            last_burst = time.monotonic()
            while item is not None:  # this one and every one queued behind it, back to back
                self._send_step(sock, item)
                try:
                    item = get_nowait()
                except queue.Empty:
                    break
            if item is None:  # close(): everything queued before it is sent
                return
            next_heartbeat = time.monotonic() + self.heartbeat_interval_s

    def _send_step(
        self,
        sock: zmq.Socket[bytes],
        item: tuple[float, ScheduledRequests, QueuedRequests, StepTraffic | msgspec.UnsetType],
    ) -> None:
        wall_time, scheduled, queued, traffic = item
        sample = ForwardPassMetrics(
            worker_id=self._worker_id,
            dp_rank=self.dp_rank,
            counter_id=self._counter,
            run_id=self.run_id,
            wall_time=wall_time,
            scheduled_requests=scheduled,
            queued_requests=queued,
            traffic=traffic,
        )
        with self._lock:
            self._pending -= 1
        self._send(sock, sample, heartbeat=False)

    def _send(self, sock: zmq.Socket[bytes], sample: ForwardPassMetrics, *, heartbeat: bool) -> None:
        self._counter += 1
        try:
            sock.send_multipart(fpm.frames(sample, self.topic), flags=zmq.NOBLOCK, copy=True)
        except zmq.ZMQError:
            with self._lock:
                self._dropped_send += 1
            return
        with self._lock:
            self._sent += 1
            if heartbeat:
                self._heartbeats += 1

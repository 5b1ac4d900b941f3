"""FPM relay: the shim's local ZMQ FPM, forwarded unchanged onto NATS (a sidecar, or a thread next to the engine).

::

    python -m worker_shim.relay --nats-url nats://nats:4222 --namespace NS --service S --worker-id W --dp-size 8
        [--host 127.0.0.1] [--port-base 20380]      # user: $FPM_NATS_USER (default: the worker id),
        [--batch-ms 20 [--batch-max 64]]            # password: $FPM_NATS_PASSWORD

One ZMQ SUB per DP rank, connected to the shim's publisher on this pod; each message's payload frame (the FPM
msgpack map, byte for byte) is published on ``fpm.<ns>.<service>.<worker_id>.<rank>``
(:func:`planner.transport.subjects.subject`). The subject names the worker this relay was started for, never the
id inside the payload: the server lets this relay's credentials publish only there
(:mod:`planner.transport.nats_config`), and a payload under another id (or ``""``) reaches the planner as it is,
where it is dropped as ``foreign_endpoint`` / named ``identity_not_synced``.

With ``--batch-ms``, the payloads read from all of the worker's ranks within that window (at most
``--batch-max`` of them, and never more bytes than the server's payload cap) go out as ONE message on
``fpm.<ns>.<service>.<worker_id>.b`` (:mod:`planner.transport.batch`: each payload byte for byte, with the rank
it was read from); a payload under the cap that a frame could not hold goes out alone, in today's form. It
costs up to ``batch_ms`` of latency and saves the per-message cost of NATS (the client's, the server's and the
planner's) on all but one payload of each batch. Without it, today's form.

Never blocks the engine (it only reads the shim's PUB socket) and never queues without bound: while the NATS
connection is down, messages are dropped and counted (``dropped_disconnected``); the planner sees the gap in
``counter_id``. A message that is not ``[topic, seq u64, payload]`` is counted (``dropped_bad_frame``), one over
the server's payload cap too (``dropped_oversized``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Mapping, Sequence

import msgspec
import zmq
import zmq.asyncio
from nats.aio.client import Client

from planner.transport.batch import FRAME_HEADER_BYTES, batch_subject, encode_batch, frame_overhead_bytes
from planner.transport.nats_connect import connect_retrying
from planner.transport.subjects import subject
from worker_shim.loop_thread import LoopThread
from worker_shim.parent_watch import die_with_parent, parent_pid_from_env, watch_parent

__all__ = ["FpmRelay", "RelayStats", "main"]

log = logging.getLogger("worker_shim.relay")


class RelayStats(msgspec.Struct, frozen=True, kw_only=True):
    forwarded: int
    dropped_disconnected: int
    dropped_bad_frame: int
    dropped_oversized: int
    nats_errors: int  # errors the server reported (a permissions violation among them)
    reconnects: int
    batches: int = 0  # NATS messages published in the batched form (``forwarded`` counts payloads)


class FpmRelay:
    """Forwards FPM from the local shim endpoints (index = DP rank) onto this worker's NATS subjects."""

    def __init__(
        self,
        *,
        endpoints: Sequence[str],
        servers: Sequence[str],
        namespace: str,
        service: str,
        worker_id: str,
        user: str | None = None,
        password: str | None = None,
        max_payload_bytes: int = 64 * 1024,
        reconnect_wait_s: float = 0.25,
        batch_ms: float | None = None,
        batch_max: int = 64,
    ) -> None:
        if not endpoints:
            raise ValueError("a relay needs at least one local FPM endpoint (one per DP rank)")
        if batch_ms is not None and (batch_ms <= 0 or batch_max < 1):
            raise ValueError("batch_ms must be > 0 and batch_max >= 1")
        self.endpoints = tuple(endpoints)
        self.subjects = tuple(subject(namespace, service, worker_id, rank) for rank in range(len(endpoints)))
        #: where batches go (``batch_ms`` set), None for the unbatched form
        self.batch_subject = batch_subject(namespace, service, worker_id) if batch_ms is not None else None
        self.batch_s = batch_ms / 1000 if batch_ms is not None else 0.0
        self.batch_max = batch_max
        self.servers = list(servers)
        self.max_payload_bytes = max_payload_bytes
        self._user = user if user is not None else worker_id
        self._password = password
        self._reconnect_wait_s = reconnect_wait_s
        self._forwarded = 0
        self._dropped_disconnected = 0
        self._dropped_bad_frame = 0
        self._dropped_oversized = 0
        self._nats_errors = 0
        self._reconnects = 0
        self._batches = 0
        self._ranks: list[int] = []  # the batch being filled: the rank of each payload,
        self._payloads: list[bytes] = []  # the payloads,
        self._frame_bytes = FRAME_HEADER_BYTES  # and an upper bound of its frame's size
        self._batch_started = asyncio.Event()
        self._connected = threading.Event()
        self._thread = LoopThread(self.run, name="fpm-relay")

    def stats(self) -> RelayStats:
        return RelayStats(
            forwarded=self._forwarded,
            dropped_disconnected=self._dropped_disconnected,
            dropped_bad_frame=self._dropped_bad_frame,
            dropped_oversized=self._dropped_oversized,
            nats_errors=self._nats_errors,
            reconnects=self._reconnects,
            batches=self._batches,
        )

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    async def _on_error(self, exc: Exception) -> None:
        self._nats_errors += 1
        log.warning("NATS: %s", exc)

    async def _on_disconnect(self) -> None:
        self._connected.clear()

    async def _on_reconnect(self) -> None:
        self._reconnects += 1
        self._connected.set()

    async def _forward(self, sock: zmq.asyncio.Socket, subj: str, nc: Client) -> None:
        while True:
            parts = await sock.recv_multipart()
            if len(parts) != 3 or len(parts[1]) != 8:
                self._dropped_bad_frame += 1
                continue
            payload = parts[2]
            if len(payload) > self.max_payload_bytes:
                self._dropped_oversized += 1
                continue
            await self._publish_one(nc, subj, payload)

    async def _publish_one(self, nc: Client, subj: str, payload: bytes) -> None:
        if not nc.is_connected:
            self._dropped_disconnected += 1
            return
        try:
            await nc.publish(subj, payload)
        except Exception as exc:  # a reconnect between the check and the publish: the sample is lost
            self._dropped_disconnected += 1
            log.debug("publish on %s failed: %s", subj, exc)
            return
        self._forwarded += 1

    async def _forward_batched(self, sock: zmq.asyncio.Socket, rank: int, nc: Client) -> None:
        while True:
            parts = await sock.recv_multipart()
            if len(parts) != 3 or len(parts[1]) != 8:
                self._dropped_bad_frame += 1
                continue
            payload = parts[2]
            if len(payload) > self.max_payload_bytes:
                self._dropped_oversized += 1
                continue
            size = len(payload) + frame_overhead_bytes(len(payload))
            if FRAME_HEADER_BYTES + size > self.max_payload_bytes:  # fits alone, not in a frame: today's form
                await self._publish_batch(nc)  # what came before it goes first
                await self._publish_one(nc, self.subjects[rank], payload)
                continue
            if self._frame_bytes + size > self.max_payload_bytes:  # would not fit under the server's cap
                await self._publish_batch(nc)
            self._ranks.append(rank)
            self._payloads.append(payload)
            self._frame_bytes += size
            if len(self._payloads) >= self.batch_max:
                await self._publish_batch(nc)
            else:
                self._batch_started.set()

    async def _flush_batches(self, nc: Client) -> None:
        """Publishes a batch ``batch_ms`` after its first payload (if it did not fill up before)."""
        while True:
            await self._batch_started.wait()
            await asyncio.sleep(self.batch_s)
            await self._publish_batch(nc)

    async def _publish_batch(self, nc: Client) -> None:
        ranks, payloads = self._ranks, self._payloads
        self._ranks, self._payloads, self._frame_bytes = [], [], FRAME_HEADER_BYTES
        self._batch_started.clear()
        if not payloads or self.batch_subject is None:
            return
        if not nc.is_connected:
            self._dropped_disconnected += len(payloads)
            return
        try:
            await nc.publish(self.batch_subject, encode_batch(ranks, payloads))
        except Exception as exc:  # a reconnect between the check and the publish: the samples are lost
            self._dropped_disconnected += len(payloads)
            log.debug("publish on %s failed: %s", self.batch_subject, exc)
            return
        self._batches += 1
        self._forwarded += len(payloads)

    async def run(self, stopping: asyncio.Event) -> None:
        """Relay until ``stopping`` is set."""
        ctx = zmq.asyncio.Context()
        socks = []
        nc: Client | None = None
        try:
            for endpoint in self.endpoints:
                sock = ctx.socket(zmq.SUB)
                sock.setsockopt(zmq.MAXMSGSIZE, max(self.max_payload_bytes * 2, 4096))
                sock.setsockopt(zmq.SUBSCRIBE, b"")
                sock.setsockopt(zmq.LINGER, 0)
                sock.connect(endpoint)
                socks.append(sock)
            nc = await connect_retrying(
                stopping,
                servers=self.servers,
                user=self._user,
                password=self._password,
                name=f"fpm-relay {self.subjects[0]}",
                retry_wait_s=self._reconnect_wait_s,
                error_cb=self._on_error,
                disconnected_cb=self._on_disconnect,
                reconnected_cb=self._on_reconnect,
            )
            if nc is None:
                return
            self._connected.set()
            self._batch_started = asyncio.Event()  # of this run's loop
            if self.batch_subject is None:
                pairs = zip(socks, self.subjects, strict=True)
                tasks = [asyncio.create_task(self._forward(sock, subj, nc)) for sock, subj in pairs]
            else:
                tasks = [asyncio.create_task(self._forward_batched(sock, r, nc)) for r, sock in enumerate(socks)]
                tasks.append(asyncio.create_task(self._flush_batches(nc)))
            await stopping.wait()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._publish_batch(nc)  # what was read before the stop
            with contextlib.suppress(Exception):
                await nc.flush(timeout=1)
        finally:
            self._connected.clear()
            if nc is not None:
                await nc.close()
            for sock in socks:
                sock.close()
            ctx.term()

    # -- thread (embedded next to the engine, and tests) -----------------------------------------------------

    def start(self) -> FpmRelay:
        self._thread.start()
        return self

    def wait_connected(self, timeout_s: float) -> bool:
        return self._connected.wait(timeout_s)

    def close(self) -> None:
        self._thread.close()

    def __enter__(self) -> FpmRelay:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m worker_shim.relay", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nats-url", action="append", required=True, help="NATS server URL (repeatable)")
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--service", required=True)
    parser.add_argument("--worker-id", required=True, help="the id this worker registered under")
    parser.add_argument("--dp-size", type=int, default=1)
    parser.add_argument("--host", default="127.0.0.1", help="where the shim's publishers listen")
    parser.add_argument("--port-base", type=int, default=20380, help="the shim's FPM_PORT_BASE")
    parser.add_argument(
        "--batch-ms",
        type=float,
        default=None,
        help="send the payloads read within this window as one NATS message (the batched form); default: one each",
    )
    parser.add_argument("--batch-max", type=int, default=64, help="at most this many payloads per batch")
    return parser


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    args = _parser().parse_args(argv)
    environ = os.environ if env is None else env
    if args.dp_size < 1 or not args.worker_id.strip():
        print("relay: --dp-size must be >= 1 and --worker-id non-empty", file=sys.stderr)
        return 2
    if (args.batch_ms is not None and args.batch_ms <= 0) or args.batch_max < 1:
        print("relay: --batch-ms must be > 0 and --batch-max >= 1", file=sys.stderr)
        return 2
    # started by fpm-worker (its supervisor names itself): die with it, never run on orphaned
    try:
        parent_pid = parent_pid_from_env(environ)
    except ValueError as exc:
        print(f"relay: {exc}", file=sys.stderr)
        return 2
    if parent_pid is not None and not die_with_parent(parent_pid):
        print(f"relay: the process that started it (pid {parent_pid}) is gone: not starting", file=sys.stderr)
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    relay = FpmRelay(
        endpoints=[f"tcp://{args.host}:{args.port_base + rank}" for rank in range(args.dp_size)],
        servers=args.nats_url,
        namespace=args.namespace,
        service=args.service,
        worker_id=args.worker_id,
        user=environ.get("FPM_NATS_USER") or None,
        password=environ.get("FPM_NATS_PASSWORD") or None,
        batch_ms=args.batch_ms,
        batch_max=args.batch_max,
    )

    async def serve() -> None:
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopping.set)
        watch = None if parent_pid is None else asyncio.create_task(watch_parent(parent_pid, stopping))
        await relay.run(stopping)
        if watch is not None:
            stopping.set()
            await watch

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""FpmSubscriber + FleetStore over real ZMQ: the discovery filter, both sides, and garbage on the wire."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator

import msgpack
import pytest
import zmq

from planner.discovery import LeaseRegistry, Role, WorkerRecord
from planner.ingest import native
from planner.ingest.native import ReceivePath
from planner.ingest.readiness import ReadinessKind
from planner.ingest.store import DropReason, FleetStore
from planner.ingest.subscriber import FpmSubscriber
from worker_shim import fpm
from worker_shim.fpm import QueuedRequests, ScheduledRequests
from worker_shim.publisher import FpmPublisher

STEP = ScheduledRequests(num_prefill_requests=1, sum_prefill_tokens=64)
QUEUE = QueuedRequests()


@pytest.fixture()
def ctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield context
    context.destroy(linger=0)


def pump(sub: FpmSubscriber, until: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not until():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached within the timeout")
        sub.poll_once(20)


def rebind(make: Callable[[], FpmPublisher], timeout_s: float = 10.0) -> FpmPublisher:
    """Start a publisher on a port another one in this process just closed (ZMQ releases it asynchronously)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return make().start()
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def record(worker_id: str, endpoint: str) -> WorkerRecord:
    return WorkerRecord(worker_id=worker_id, role=Role.AGG, service="agg", dp_size=1, fpm_endpoints=(endpoint,))


class RawPublisher:
    """A bare PUB socket registered as worker ``worker_id``'s only endpoint, for hand-made (bad) messages."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], sub: FpmSubscriber, worker_id: str) -> None:
        self.sub = sub
        self.worker_id = worker_id
        self.sock = ctx.socket(zmq.PUB)
        endpoint = f"tcp://127.0.0.1:{self.sock.bind_to_random_port('tcp://127.0.0.1')}"
        sub.set_workers({worker_id: record(worker_id, endpoint)})
        self._counter = iter(range(10**6))

    def good(self) -> list[bytes]:
        """The frames of a valid heartbeat with the next counter."""
        return list(fpm.frames(fpm.heartbeat(self.worker_id, 0, next(self._counter))))

    def send_multipart(self, parts: list[bytes]) -> None:
        self.sock.send_multipart(parts)

    def join(self) -> None:
        """Send heartbeats until one arrives: the subscription is live (earlier ones are lost)."""

        def joined() -> bool:
            self.sock.send_multipart(self.good())
            return self.sub.store.rank_view(self.worker_id, 0, 0.0).heartbeats > 0

        pump(self.sub, joined)

    def close(self) -> None:
        self.sock.close(linger=0)


def test_only_discovered_workers_are_kept_and_leavers_are_dropped(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    clock = [0.0]
    registry = LeaseRegistry(default_ttl_s=30.0)
    store = FleetStore(ttl_s=5.0)
    sub = FpmSubscriber(store, context=ctx, clock=lambda: clock[0])
    pubs = [
        FpmPublisher(worker_id=wid, endpoint="tcp://127.0.0.1:*", heartbeat_interval_s=0.02, context=ctx).start()
        for wid in ("registered", "never-registered", "")
    ]
    try:
        eps = [p.bound_endpoint or "" for p in pubs]
        # The stranger and the id-less engine sit on endpoints discovery lists for someone else.
        registry.register(record("registered", eps[0]), now=0.0, ttl_s=10.0)
        registry.register(record("other", eps[1]), now=0.0, ttl_s=10.0)
        registry.register(record("restored", eps[2]), now=0.0, ttl_s=10.0)
        sub.set_workers(registry.workers(0.0))
        assert set(sub.endpoints) == set(eps)
        pump(sub, lambda: store.drops[DropReason.UNKNOWN_WORKER] >= 3 and store.drops[DropReason.EMPTY_WORKER_ID] >= 3)
        for p in pubs:
            p.publish(0.01, STEP, QUEUE)
        pump(sub, lambda: store.rank_view("registered", 0, 0.0).samples >= 1)
        snap = sub.snapshot(0.0)
        assert snap.ranks[("registered", 0)].fresh
        assert snap.ranks[("other", 0)].age_s is None and snap.ranks[("restored", 0)].age_s is None
        assert snap.endpoints[eps[2]].worker_id == "" and snap.endpoints[eps[1]].worker_id == "never-registered"
        assert snap.drops_by_worker["restored"][DropReason.EMPTY_WORKER_ID] >= 3

        # The lease lapses: discovery drops the worker, the subscriber disconnects, later samples never count.
        clock[0] = 11.0
        sub.set_workers(registry.workers(clock[0]))
        assert sub.endpoints == () and store.workers == {}
        kept = store.rank_view("registered", 0, clock[0]).samples
        assert kept == 0  # forgotten with the worker
        pubs[0].publish(0.01, STEP, QUEUE)
        for _ in range(20):
            sub.poll_once(10)
        assert store.rank_view("registered", 0, clock[0]).samples == 0

        # Re-registering (a deregistration then a new lease) brings it back.
        registry.register(record("registered", eps[0]), now=clock[0], ttl_s=10.0)
        sub.set_workers(registry.workers(clock[0]))
        pump(sub, lambda: store.rank_view("registered", 0, clock[0]).heartbeats >= 1)
        registry.deregister("registered")
        sub.set_workers(registry.workers(clock[0]))
        before = store.drops[DropReason.UNKNOWN_WORKER]
        assert (
            store.ingest(eps[0], fpm.heartbeat("registered", 0, 10**6), clock[0], clock[0]) is DropReason.UNKNOWN_WORKER
        )
        assert store.drops[DropReason.UNKNOWN_WORKER] == before + 1
    finally:
        sub.close()
        for p in pubs:
            p.close()


@pytest.mark.parametrize("path", ["native", "pyzmq"])
def test_garbage_on_the_wire_is_dropped_counted_and_the_loop_survives(
    ctx: zmq.Context[zmq.Socket[bytes]], path: ReceivePath
) -> None:
    store = FleetStore(ttl_s=5.0)
    sub = FpmSubscriber(store, context=ctx, max_msg_bytes=4096, receive_path=path)
    assert sub.receive_path == path
    raw = RawPublisher(ctx, sub, "w")
    try:
        good = raw.good
        raw.join()
        seq = good()[1]
        nan = msgpack.packb({"worker_id": "w", "dp_rank": 0, "counter_id": 10**5, "wall_time": math.nan})
        raw.send_multipart([b"", seq])  # wrong part count
        raw.send_multipart([b"", seq, b"x", b"y"])  # wrong part count
        raw.send_multipart([b"", b"\x01\x02", good()[2]])  # short seq
        raw.send_multipart([b"", seq, b"\xc1\xc1 not msgpack"])  # undecodable
        raw.send_multipart([b"", seq, msgpack.packb({"worker_id": 3})])  # wrong types
        raw.send_multipart([b"", seq, nan])  # NaN
        pump(sub, lambda: store.drops[DropReason.INVALID_VALUE] == 1)
        assert store.drops[DropReason.BAD_FRAME] == 3
        assert store.drops[DropReason.DECODE_ERROR] == 2

        # Oversized: ZMQ_MAXMSGSIZE makes ZMQ cut the connection; the same publisher run carrying on after the
        # reconnect shows it was our limit, not a restart.
        raw.send_multipart([b"", seq, b"\x00" * 10_000])

        def counted() -> bool:
            raw.send_multipart(good())
            return store.drops[DropReason.OVERSIZED] == 1

        pump(sub, counted)
        assert sub.loop_errors == 0
        view = store.rank_view("w", 0, 0.0)
        assert view.restarts == 0 and view.heartbeats >= 2
    finally:
        sub.close()
        raw.close()


@pytest.mark.parametrize("path", ["native", "pyzmq"])
def test_a_publisher_restart_on_the_same_endpoint_is_detected(
    ctx: zmq.Context[zmq.Socket[bytes]], path: ReceivePath
) -> None:
    store = FleetStore(ttl_s=5.0)
    sub = FpmSubscriber(store, context=ctx, receive_path=path)
    first = FpmPublisher(worker_id="w", endpoint="tcp://127.0.0.1:*", heartbeat_interval_s=0.01, context=ctx).start()
    endpoint = first.bound_endpoint or ""
    sub.set_workers({"w": record("w", endpoint)})
    try:
        pump(sub, lambda: store.rank_view("w", 0, 0.0).heartbeats >= 1)  # joined: nothing published is lost
        for _ in range(100):
            first.publish(0.01, STEP, QUEUE)
        pump(sub, lambda: store.rank_view("w", 0, 0.0).samples >= 100)
        first.close()
        second = rebind(lambda: FpmPublisher(worker_id="w", endpoint=endpoint, heartbeat_interval_s=0.01, context=ctx))
        try:
            pump(sub, lambda: store.rank_view("w", 0, 0.0).restarts == 1)
            view = store.rank_view("w", 0, 0.0)
            assert view.lost_samples < 100  # not 2**63
            assert store.drops[DropReason.OVERSIZED] == 0
        finally:
            second.close()
    finally:
        sub.close()


def test_the_receive_thread_ingests_in_the_background(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    store = FleetStore(ttl_s=5.0)
    with FpmPublisher(worker_id="w", endpoint="tcp://127.0.0.1:*", heartbeat_interval_s=0.01, context=ctx) as pub:
        with FpmSubscriber(store, context=ctx) as sub:
            sub.set_workers({"w": record("w", pub.bound_endpoint or "")})
            deadline = time.monotonic() + 10
            while sub.snapshot(time.monotonic()).ranks[("w", 0)].heartbeats < 3 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert sub.snapshot(time.monotonic()).ranks[("w", 0)].fresh


def test_a_subscriber_follows_more_endpoints_than_a_default_context_allows() -> None:
    store = FleetStore(ttl_s=5.0)
    sub = FpmSubscriber(store)  # its own context; 3 sockets per endpoint would exhaust the default 1023 at 341
    workers = {f"w{i}": record(f"w{i}", f"ipc:///tmp/fpm-cap-test-{i}") for i in range(400)}
    try:
        sub.set_workers(workers)
        assert len(sub.endpoints) == 400
    finally:
        sub.close()


@pytest.mark.parametrize("path", ["native", "pyzmq"])
def test_a_malformed_message_costs_only_itself_not_its_neighbours(
    ctx: zmq.Context[zmq.Socket[bytes]], path: ReceivePath
) -> None:
    """Each message is read to its last frame, so a short or long one between good ones never shifts the rest."""
    store = FleetStore(ttl_s=5.0)
    sub = FpmSubscriber(store, context=ctx, receive_path=path)
    raw = RawPublisher(ctx, sub, "w")
    try:
        good = raw.good
        raw.join()
        while sub.poll_once(50):  # every join probe in, before counting
            pass
        before = store.rank_view("w", 0, 0.0)
        base = before.heartbeats
        seq = (0).to_bytes(8, "big")
        malformed = [[b"w"], [b"w", seq], [b"w", seq, b"", b"", b""], [b""] * 7]
        for bad in malformed:
            raw.send_multipart(good())
            raw.send_multipart(bad)
        raw.send_multipart(good())
        pump(sub, lambda: store.rank_view("w", 0, 0.0).heartbeats >= base + 5)
        for _ in range(5):
            sub.poll_once(10)
        view = store.rank_view("w", 0, 0.0)
        assert view.heartbeats == base + 5
        assert store.drops[DropReason.BAD_FRAME] == len(malformed)
        assert view.gaps == before.gaps and store.drops[DropReason.DECODE_ERROR] == 0
    finally:
        sub.close()
        raw.close()


def test_the_native_drain_is_built_and_used_by_default() -> None:
    """The C drain is the ingest path that meets the throughput target; a build that lost it must not pass."""
    assert native.RECEIVE_PATH == "native", native.NATIVE_UNAVAILABLE
    sub = FpmSubscriber(FleetStore())
    try:
        assert sub.receive_path == "native"
    finally:
        sub.close()


def test_the_native_drain_reads_at_most_its_batch_and_keeps_order(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    drain = native.native_drain()
    assert drain is not None, native.NATIVE_UNAVAILABLE
    push = ctx.socket(zmq.PUSH)
    pull = ctx.socket(zmq.PULL)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    push.connect(f"tcp://127.0.0.1:{port}")
    try:
        sent = [bytes([i]) * (i + 1) for i in range(10)]
        for payload in sent:
            push.send_multipart([b"t", (7).to_bytes(8, "big"), payload])
        push.send_multipart([b"t"])
        deadline = time.monotonic() + 10
        while not pull.poll(10) and time.monotonic() < deadline:
            pass
        time.sleep(0.2)  # let the I/O thread queue everything
        first, bad = drain(pull, 4)
        assert first == sent[:4] and bad == 0
        rest, bad = drain(pull, 100)
        assert rest == sent[4:] and bad == 1
        assert drain(pull, 100) == ([], 0)  # dry: EAGAIN is not an error
        assert drain(pull, 100) == native.drain_pyzmq(pull, 100)
    finally:
        push.close(linger=0)
        pull.close(linger=0)


def test_the_native_drain_raises_zmq_errors_other_than_eagain(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    drain = native.native_drain()
    assert drain is not None, native.NATIVE_UNAVAILABLE
    pub = ctx.socket(zmq.PUB)  # a PUB socket cannot receive: libzmq answers ENOTSUP
    try:
        with pytest.raises(zmq.ZMQError) as err:
            drain(pub, 10)
        assert err.value.errno == zmq.ENOTSUP
    finally:
        pub.close(linger=0)
    with pytest.raises(ValueError, match="null socket handle"):  # a closed socket: an error, never a crash
        drain(pub, 10)


# -- issue 14: readiness from ZMQ_FD (epoll), rounds at most every min_poll_interval_s ------------------------------


@pytest.mark.parametrize("path", ["native", "pyzmq"])
def test_a_socket_holding_several_batches_is_emptied_without_further_traffic(
    ctx: zmq.Context[zmq.Socket[bytes]], path: ReceivePath
) -> None:
    # ZMQ_FD signals once for what a drain leaves behind: a socket cut at the batch cap must be carried to the
    # next round by the subscriber, or its backlog waits for the endpoint's next message.
    store = FleetStore(ttl_s=5.0)
    sub = FpmSubscriber(store, context=ctx, receive_path=path)
    raw = RawPublisher(ctx, sub, "w")
    try:
        raw.join()
        while sub.poll_once(50):
            pass
        base = store.rank_view("w", 0, 0.0).heartbeats
        for _ in range(700):  # ~3 batches at once (under the PUB's SNDHWM of 1000): no message after these
            raw.send_multipart(raw.good())
        pump(sub, lambda: store.rank_view("w", 0, 0.0).heartbeats == base + 700)
        assert store.rank_view("w", 0, 0.0).gaps == 0 and sub.loop_errors == 0
    finally:
        sub.close()
        raw.close()


def test_a_socket_whose_drain_failed_is_retried_without_further_traffic(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    # A drain that raises leaves the socket unread to EAGAIN: its ZMQ_FD may never signal again for what is left.
    armed = [False]

    def clock() -> float:
        if armed[0]:
            armed[0] = False
            raise OSError("the clock failed once")
        return time.monotonic()

    store = FleetStore(ttl_s=5.0)
    sub = FpmSubscriber(store, context=ctx, clock=clock)
    raw = RawPublisher(ctx, sub, "w")
    try:
        raw.join()
        while sub.poll_once(50):
            pass
        base = store.rank_view("w", 0, 0.0).heartbeats
        for _ in range(700):
            raw.send_multipart(raw.good())
        time.sleep(0.2)  # all queued at the subscriber before the failing round
        armed[0] = True
        # the first batch (256) is read, then lost to the error; the rest must still come in
        pump(sub, lambda: store.rank_view("w", 0, 0.0).heartbeats == base + 700 - 256)
        assert sub.loop_errors == 1
    finally:
        sub.close()
        raw.close()


@pytest.mark.parametrize("readiness", ["epoll", "poller"])
def test_the_receive_thread_batches_rounds_and_keeps_every_sample_attributed(
    ctx: zmq.Context[zmq.Socket[bytes]], readiness: ReadinessKind
) -> None:
    store = FleetStore(ttl_s=30.0)
    # A long minimum interval: messages pile up on many sockets between rounds and are all drained in the next.
    sub = FpmSubscriber(store, context=ctx, min_poll_interval_s=0.3, readiness=readiness)
    ids = [f"w{i}" for i in range(6)]
    pubs = {
        wid: FpmPublisher(worker_id=wid, endpoint="tcp://127.0.0.1:*", heartbeat_interval_s=0.05, context=ctx).start()
        for wid in ids
    }
    # w5 publishes on the endpoint discovery gives w4, w4 under "" (its identity never synced).
    pubs["w4"].set_worker_id("")
    eps = {wid: pubs[wid].bound_endpoint or "" for wid in ids}
    discovered = {wid: record(wid, eps[wid]) for wid in ids[:4]}
    discovered["w4"] = record("w4", eps["w4"])
    discovered["w5"] = record("w5", "tcp://127.0.0.1:1")  # its own endpoint: nobody there
    discovered["x"] = record("x", eps["w5"])
    sub.set_workers(discovered)
    sub.start()
    try:
        deadline = time.monotonic() + 10
        while not all(store.rank_view(wid, 0, 0.0).heartbeats for wid in ids[:4]):
            assert time.monotonic() < deadline, "not every endpoint was heard"
            time.sleep(0.05)
        for _ in range(50):
            for wid in ids:
                pubs[wid].publish(0.01, STEP, QUEUE)
        while not (
            all(store.rank_view(wid, 0, 0.0).samples == 50 for wid in ids[:4])
            and store.drops[DropReason.FOREIGN_ENDPOINT] >= 50
            and store.drops[DropReason.EMPTY_WORKER_ID] >= 50
        ):
            assert time.monotonic() < deadline + 10, "not every sample arrived"
            time.sleep(0.05)
        assert [store.rank_view(wid, 0, 0.0).gaps for wid in ids[:4]] == [0, 0, 0, 0]
        snap = sub.snapshot(0.0)
        assert snap.endpoints[eps["w4"]].worker_id == "" and snap.endpoints[eps["w5"]].worker_id == "w5"
        assert store.rank_view("w4", 0, 0.0).samples == 0 and store.rank_view("x", 0, 0.0).samples == 0
    finally:
        sub.close()
        for pub in pubs.values():
            pub.close()


def test_the_minimum_poll_interval_is_bounded() -> None:
    for bad in (-0.01, 1.5, math.nan):
        with pytest.raises(ValueError, match="min_poll_interval_s"):
            FpmSubscriber(FleetStore(ttl_s=5.0), min_poll_interval_s=bad)

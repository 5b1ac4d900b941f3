"""Issue 12, ingest side, over real ZMQ sockets: decode errors of any kind, plausibility limits, publisher runs
(restart vs loss vs oversized), and per-endpoint reconnects with exponential backoff."""

from __future__ import annotations

import random
import socket
from collections.abc import Iterator

import msgpack
import pytest
import zmq

from planner.bench.faults import GarbagePeer, ResettingProxy
from planner.ingest.native import ReceivePath
from planner.ingest.store import DropReason, FleetStore
from planner.ingest.subscriber import FpmSubscriber, ReconnectPolicy
from tests.planner.test_subscriber import RawPublisher, pump, rebind, record
from worker_shim import fpm
from worker_shim.fpm import QueuedRequests, ScheduledRequests
from worker_shim.publisher import FpmPublisher

STEP = ScheduledRequests(num_prefill_requests=1, sum_prefill_tokens=64)
QUEUE = QueuedRequests()


def nested_payload() -> bytes:
    """A payload nested 1,000 levels deep under an unknown key (1 KB): msgspec raises RecursionError on it."""
    head = msgpack.packb({"worker_id": "w", "dp_rank": 0, "counter_id": 1, "wall_time": 0.0, "x": None})
    assert isinstance(head, bytes) and head.endswith(b"\xc0")
    return head[:-1] + b"\x91" * 1000 + b"\xc0"


@pytest.fixture()
def ctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield context
    context.destroy(linger=0)


# -- item 7: any decode error is one decode_error and never costs the rest of the batch ---------------------------


@pytest.mark.parametrize("path", ["native", "pyzmq"])
def test_a_deeply_nested_payload_is_one_decode_error_and_its_batch_neighbours_are_kept(
    ctx: zmq.Context[zmq.Socket[bytes]], path: ReceivePath
) -> None:
    store = FleetStore(ttl_s=5.0)
    sub = FpmSubscriber(store, context=ctx, receive_path=path)
    raw = RawPublisher(ctx, sub, "w")
    try:
        raw.join()
        while sub.poll_once(50):  # every join probe in, before counting
            pass
        base = store.rank_view("w", 0, 0.0).heartbeats
        seq = (0).to_bytes(8, "big")
        for i in range(20):  # one burst: the nested payloads share receive batches with good messages
            raw.send_multipart(raw.good())
            if i % 4 == 0:
                raw.send_multipart([b"", seq, nested_payload()])
        pump(sub, lambda: store.rank_view("w", 0, 0.0).heartbeats >= base + 20)
        assert store.drops[DropReason.DECODE_ERROR] == 5
        assert sub.loop_errors == 0
    finally:
        sub.close()
        raw.close()


def test_decode_and_ingest_frames_turn_a_recursion_error_into_a_decode_error() -> None:
    with pytest.raises(fpm.FpmDecodeError, match="RecursionError"):
        fpm.decode(nested_payload())
    store = FleetStore()
    store.set_workers({"w": record("w", "tcp://a:1")})
    assert store.ingest_frames("tcp://a:1", [b"", bytes(8), nested_payload()], 0.0, 0.0) is DropReason.DECODE_ERROR
    assert store.drops_by_worker["w"][DropReason.DECODE_ERROR] == 1


# -- item 8: plausibility limits -----------------------------------------------------------------------------------

U64_MAX = 2**64 - 1
EP = "tcp://a:1"


def sample(counter: int = 1, run_id: int = 0, **counts: int) -> fpm.ForwardPassMetrics:
    sched = {k: v for k, v in counts.items() if not k.startswith("q_")}
    queued = {k[2:]: v for k, v in counts.items() if k.startswith("q_")}
    return fpm.ForwardPassMetrics(
        worker_id="w",
        dp_rank=0,
        counter_id=counter,
        wall_time=0.01,
        scheduled_requests=ScheduledRequests(**sched),
        queued_requests=QueuedRequests(**queued),
        run_id=run_id,  # 0: a legacy publisher's sample (no run_id on the wire)
    )


@pytest.fixture()
def store() -> FleetStore:
    s = FleetStore(ttl_s=5.0)
    s.set_workers({"w": record("w", EP)})
    return s


@pytest.mark.parametrize(
    "counts",
    [
        {"sum_prefill_tokens": U64_MAX},  # the sample that froze the service
        {"num_decode_requests": U64_MAX},  # the one that drove the fleet to max
        {"num_prefill_requests": 1_000_001},
        {"sum_prefill_tokens": 10_000_001},
        {"sum_decode_kv_tokens": 1_000_000_001},
        {"sum_prefill_kv_tokens": 1_000_000_001},
        {"q_num_prefill_requests": 1_000_001},
        {"q_num_decode_requests": 1_000_001},
        {"q_sum_prefill_tokens": 10_000_000_001},
    ],
    ids=lambda c: ",".join(c),
)
def test_a_count_beyond_its_limit_is_dropped_as_invalid_value(store: FleetStore, counts: dict[str, int]) -> None:
    assert store.ingest(EP, sample(**counts), 1.0, 1.0) is DropReason.INVALID_VALUE
    assert store.rank_view("w", 0, 1.0).latest is None
    assert store.snapshot(1.0).totals.load["agg"] == (0, 0, 0, 0, 0, 0)


def test_counts_at_their_limits_are_kept(store: FleetStore) -> None:
    limits = store.limits
    kept = sample(
        num_prefill_requests=limits.max_requests,
        sum_prefill_tokens=limits.max_step_tokens,
        sum_decode_kv_tokens=limits.max_kv_tokens,
        q_sum_prefill_tokens=limits.max_queued_tokens,
    )
    assert store.ingest(EP, kept, 1.0, 1.0) is None


def test_limits_are_configurable_and_refuse_nonsense() -> None:
    from planner.ingest.store import FpmLimits

    store = FleetStore(limits=FpmLimits(max_requests=10))
    store.set_workers({"w": record("w", EP)})
    assert store.ingest(EP, sample(num_decode_requests=11), 1.0, 1.0) is DropReason.INVALID_VALUE
    assert store.ingest(EP, sample(num_decode_requests=10), 1.0, 1.0) is None
    with pytest.raises(ValueError, match="max_requests"):
        FpmLimits(max_requests=0)
    with pytest.raises(ValueError, match="max_variance"):
        FpmLimits(max_variance=float("inf"))


def test_a_counter_jump_to_u64_max_is_a_restart_not_two_to_the_64_lost_samples(store: FleetStore) -> None:
    store.ingest(EP, sample(counter=5), 1.0, 1.0)
    assert store.ingest(EP, sample(counter=U64_MAX), 2.0, 2.0) is None
    view = store.rank_view("w", 0, 2.0)
    assert (view.restarts, view.gaps, view.lost_samples) == (1, 0, 0)
    assert store.ingest(EP, sample(counter=U64_MAX + 1), 3.0, 3.0) is DropReason.INVALID_VALUE


def test_a_huge_count_over_the_wire_is_invalid_value(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    store = FleetStore(ttl_s=5.0)
    sub = FpmSubscriber(store, context=ctx)
    raw = RawPublisher(ctx, sub, "w")
    try:
        raw.join()
        bad = sample(counter=10**5, num_decode_requests=U64_MAX)
        raw.send_multipart(list(fpm.frames(bad)))
        pump(sub, lambda: store.drops[DropReason.INVALID_VALUE] == 1)
        assert store.snapshot(0.0).totals.load["agg"][2] == 0
    finally:
        sub.close()
        raw.close()


# -- item 9: publisher runs -------------------------------------------------------------------------------------


def test_a_new_run_id_is_a_restart_whatever_the_counters_say(store: FleetStore) -> None:
    store.ingest(EP, sample(counter=3, run_id=11), 1.0, 1.0)
    assert store.ingest(EP, sample(counter=900, run_id=22), 2.0, 2.0) is None  # restarted with a burst
    view = store.rank_view("w", 0, 2.0)
    assert (view.restarts, view.gaps, view.lost_samples) == (1, 0, 0)
    store.note_disconnect(EP)
    # The same run after a disconnect: a step back is a replay, whatever the disconnect.
    assert store.ingest(EP, sample(counter=899, run_id=22), 3.0, 3.0) is DropReason.OUT_OF_ORDER
    assert store.ingest(EP, sample(counter=905, run_id=22), 3.0, 3.0) is None
    view = store.rank_view("w", 0, 3.0)
    assert (view.restarts, view.gaps, view.lost_samples) == (1, 1, 4)
    assert store.drops[DropReason.OVERSIZED] == 0


def test_a_payload_without_run_id_still_decodes_as_v1() -> None:
    legacy = msgpack.packb({"version": 1, "worker_id": "w", "dp_rank": 0, "counter_id": 4, "wall_time": 0.0})
    assert fpm.decode(legacy).run_id == 0


@pytest.mark.parametrize("path", ["native", "pyzmq"])
def test_a_publisher_that_dies_early_and_restarts_with_a_burst_is_a_restart_not_loss(
    ctx: zmq.Context[zmq.Socket[bytes]], path: ReceivePath
) -> None:
    store = FleetStore(ttl_s=5.0)
    sub = FpmSubscriber(store, context=ctx, receive_path=path)
    first = FpmPublisher(worker_id="w", endpoint="tcp://127.0.0.1:*", heartbeat_interval_s=0.05, context=ctx).start()
    endpoint = first.bound_endpoint or ""
    sub.set_workers({"w": record("w", endpoint)})
    try:
        pump(sub, lambda: store.rank_view("w", 0, 0.0).heartbeats >= 1)
        for _ in range(3):
            first.publish(0.01, STEP, QUEUE)
        pump(sub, lambda: store.rank_view("w", 0, 0.0).samples >= 3)
        first.close()
        second = rebind(lambda: FpmPublisher(worker_id="w", endpoint=endpoint, heartbeat_interval_s=10, context=ctx))
        try:

            def restarted() -> bool:
                for _ in range(200):  # a burst, mostly sent before the subscriber is back
                    second.publish(0.01, STEP, QUEUE)
                return store.rank_view("w", 0, 0.0).restarts >= 1

            pump(sub, restarted)
            view = store.rank_view("w", 0, 0.0)
            assert view.restarts == 1 and view.lost_samples == 0 and view.gaps == 0
            assert store.drops[DropReason.OVERSIZED] == 0
            assert second.run_id != first.run_id
            pump(sub, lambda: sub.links()[endpoint].reconnects >= 1)  # the monitor's events may trail the data
            link = sub.links()[endpoint]
            assert link.disconnects >= 1 and link.protocol_errors == 0
        finally:
            second.close()
    finally:
        sub.close()


@pytest.mark.parametrize("path", ["native", "pyzmq"])
def test_a_plain_tcp_reset_is_a_reconnect_never_oversized(
    ctx: zmq.Context[zmq.Socket[bytes]], path: ReceivePath
) -> None:
    store = FleetStore(ttl_s=5.0)
    sub = FpmSubscriber(store, context=ctx, receive_path=path)
    pub = FpmPublisher(worker_id="w", endpoint="tcp://127.0.0.1:*", heartbeat_interval_s=0.002, context=ctx).start()
    proxy = ResettingProxy(pub.bound_endpoint or "", seed=3, min_bytes=2000, max_bytes=4000)
    sub.set_workers({"w": record("w", proxy.endpoint)})
    try:
        pump(sub, lambda: proxy.cuts_mid_stream >= 3)
        before = store.rank_view("w", 0, 0.0).heartbeats
        pump(sub, lambda: store.rank_view("w", 0, 0.0).heartbeats > before)  # still receiving
        assert store.drops[DropReason.OVERSIZED] == 0
        view = store.rank_view("w", 0, 0.0)
        assert view.restarts == 0  # the same run throughout: what the cuts lost is a gap
        pump(sub, lambda: sub.links()[proxy.endpoint].reconnects >= 3)
        link = sub.links()[proxy.endpoint]
        assert link.disconnects >= 3 and link.protocol_errors == 0 and store.drops[DropReason.OVERSIZED] == 0
    finally:
        sub.close()
        proxy.close()
        pub.close()


# -- item 6: reconnects with exponential backoff and jitter, per endpoint ---------------------------------------


def test_the_backoff_doubles_up_to_its_maximum_with_jitter_below_it() -> None:
    policy = ReconnectPolicy(base_s=0.1, max_s=1.0, jitter=0.0)
    assert [policy.delay_s(k, random.Random(1)) for k in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    jittered = ReconnectPolicy(base_s=0.1, max_s=1.0, jitter=0.5)
    rng = random.Random(7)
    delays = [jittered.delay_s(3, rng) for _ in range(200)]
    assert all(0.4 <= d <= 0.8 for d in delays) and len(set(delays)) > 100
    assert jittered.delay_s(10**6, rng) <= 1.0
    with pytest.raises(ValueError):
        ReconnectPolicy(base_s=2.0, max_s=1.0)


def test_a_garbage_peer_is_retried_with_a_growing_backoff_and_counted(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    store = FleetStore(ttl_s=5.0)
    policy = ReconnectPolicy(base_s=0.005, max_s=0.04, jitter=0.0)
    sub = FpmSubscriber(store, context=ctx, reconnect=policy)
    garbage = GarbagePeer(seed=5)
    sub.set_workers({"g": record("g", garbage.endpoint)})
    backoffs: list[float] = []

    def enough() -> bool:
        link = sub.links()[garbage.endpoint]
        if link.backoff_s and (not backoffs or backoffs[-1] != link.backoff_s):
            backoffs.append(link.backoff_s)
        return link.socket_replacements >= 6

    try:
        pump(sub, enough, timeout_s=60)
        # Each drop in a row without one decodable message doubles the hold-off, up to the maximum.
        assert backoffs[:3] == [0.01, 0.02, 0.04] and max(backoffs) == 0.04
        link = sub.links()[garbage.endpoint]
        assert link.disconnects >= 6 and not link.connected
        assert sub.loop_errors == 0
    finally:
        sub.close()
        garbage.close()


def test_a_refused_endpoint_counts_libzmq_connect_retries(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))  # bound, never listening: connects are refused, and nobody else can take the port
    port = probe.getsockname()[1]
    sub = FpmSubscriber(FleetStore(), context=ctx, reconnect=ReconnectPolicy(base_s=0.005, max_s=0.02))
    endpoint = f"tcp://127.0.0.1:{port}"
    sub.set_workers({"x": record("x", endpoint)})
    try:
        pump(sub, lambda: sub.links()[endpoint].connect_retries >= 3)
        link = sub.links()[endpoint]
        assert link.connections == 0 and link.disconnects == 0 and not link.connected
    finally:
        sub.close()
        probe.close()

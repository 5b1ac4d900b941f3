"""FpmPublisher over real ZMQ sockets: counters, heartbeats, identity changes, drops, binding."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import zmq

from worker_shim import fpm
from worker_shim.fpm import ForwardPassMetrics, QueuedRequests, ScheduledRequests
from worker_shim.publisher import FpmPublisher, bind_endpoint


@pytest.fixture()
def ctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield context
    context.destroy(linger=0)


def _subscribe(ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str) -> zmq.Socket[bytes]:
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    return sub


def _recv(sub: zmq.Socket[bytes], count: int, timeout_s: float = 10.0) -> list[ForwardPassMetrics]:
    out: list[ForwardPassMetrics] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < count and time.monotonic() < deadline:
        if sub.poll(50):
            _, seq, payload = fpm.parse_frames(sub.recv_multipart())
            sample = fpm.decode(payload)
            assert seq == sample.counter_id
            out.append(sample)
    return out


def _connected(pub: FpmPublisher, sub: zmq.Socket[bytes]) -> list[ForwardPassMetrics]:
    """Wait for the first heartbeat: the subscription is live from then on (ZMQ's slow joiner)."""
    first = _recv(sub, 1)
    assert first, "no heartbeat within 10 s"
    return first


STEP = ScheduledRequests(
    num_prefill_requests=1, sum_prefill_tokens=128, num_decode_requests=4, sum_decode_kv_tokens=900
)
QUEUE = QueuedRequests(num_prefill_requests=2, sum_prefill_tokens=256)


def test_bind_endpoint_is_base_port_plus_rank() -> None:
    assert bind_endpoint(0) == "tcp://*:20380"
    assert bind_endpoint(3, host="127.0.0.1", base_port=30000) == "tcp://127.0.0.1:30003"
    assert bind_endpoint(0, ipc_path="/tmp/fpm-0") == "ipc:///tmp/fpm-0"
    with pytest.raises(ValueError, match="dp_rank"):
        bind_endpoint(-1)


def test_samples_and_heartbeats_share_one_increasing_counter(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    with FpmPublisher(
        worker_id="w-a", dp_rank=2, endpoint="tcp://127.0.0.1:*", heartbeat_interval_s=0.05, context=ctx
    ) as pub:
        assert pub.bound_endpoint is not None
        sub = _subscribe(ctx, pub.bound_endpoint)
        _connected(pub, sub)
        for _ in range(5):
            assert pub.publish(0.01, STEP, QUEUE)
        got = _recv(sub, 5 + 2)  # the five steps, then at least two idle heartbeats
    steps = [s for s in got if not s.is_heartbeat]
    beats = [s for s in got if s.is_heartbeat]
    assert len(steps) == 5 and len(beats) >= 2
    counters = [s.counter_id for s in got]
    assert counters == list(range(counters[0], counters[0] + len(got)))
    assert all(s.worker_id == "w-a" and s.dp_rank == 2 for s in got)
    assert steps[0].scheduled_requests == STEP and steps[0].queued_requests == QUEUE
    assert steps[0].wall_time == 0.01
    assert all(b.wall_time == 0.0 for b in beats)


def test_set_worker_id_changes_step_samples_and_heartbeats(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    with FpmPublisher(worker_id="", endpoint="tcp://127.0.0.1:*", heartbeat_interval_s=0.05, context=ctx) as pub:
        assert pub.bound_endpoint is not None
        sub = _subscribe(ctx, pub.bound_endpoint)
        assert _connected(pub, sub)[0].worker_id == ""
        pub.set_worker_id("restored-7")
        pub.publish(0.02, STEP, QUEUE)
        got = _recv(sub, 6)
    step_at = next(i for i, s in enumerate(got) if not s.is_heartbeat)
    assert got[step_at].worker_id == "restored-7"
    later_beats = [s for s in got[step_at + 1 :] if s.is_heartbeat]
    assert later_beats, "no heartbeat after the step sample"
    assert {s.worker_id for s in later_beats} == {"restored-7"}


def test_publish_never_blocks_and_counts_what_it_drops(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    pub = FpmPublisher(worker_id="w", endpoint="tcp://127.0.0.1:*", queue_size=4, context=ctx)
    assert not pub.publish(0.01, STEP, QUEUE)  # not started: dropped, not queued forever
    pub.start()
    attempts = 20_000
    accepted = sum(pub.publish(0.01, STEP, QUEUE) for _ in range(attempts))
    assert pub.flush()
    pub.close()
    stats = pub.stats()
    assert stats.dropped_queue_full == attempts - accepted + 1
    assert stats.dropped_queue_full > 0  # 20k publishes into a queue of 4 overflow it
    assert stats.sent - stats.heartbeats == accepted
    assert stats.dropped_send == 0


def test_binding_a_taken_endpoint_fails_with_the_endpoint_named(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    with FpmPublisher(worker_id="w", endpoint="tcp://127.0.0.1:*", context=ctx) as first:
        taken = first.bound_endpoint
        assert taken is not None
        with pytest.raises(RuntimeError, match=taken.replace(".", r"\.")):
            FpmPublisher(worker_id="w2", endpoint=taken, context=ctx).start()


def test_rejects_nonsense_configuration() -> None:
    with pytest.raises(ValueError, match="heartbeat_interval_s"):
        FpmPublisher(worker_id="w", heartbeat_interval_s=0)
    with pytest.raises(ValueError, match="queue_size"):
        FpmPublisher(worker_id="w", queue_size=0)

"""FpmPublisher's bursts (``send_interval_s``) over real ZMQ sockets: what is queued waits for the burst, then goes
out complete and in order, one step per ``[topic, seq, payload]`` message; flush() and close() send it at once; a
heartbeat due first sends the burst with it."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import zmq

from worker_shim import fpm
from worker_shim.fpm import ForwardPassMetrics, QueuedRequests, ScheduledRequests
from worker_shim.publisher import DEFAULT_SEND_INTERVAL_S, FpmPublisher

STEP = ScheduledRequests(num_prefill_requests=1, sum_prefill_tokens=64, num_decode_requests=3, sum_decode_kv_tokens=500)
QUEUE = QueuedRequests()


@pytest.fixture()
def ctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield context
    context.destroy(linger=0)


def _recv_one(sub: zmq.Socket[bytes], timeout_ms: int) -> ForwardPassMetrics | None:
    if not sub.poll(timeout_ms):
        return None
    frames = sub.recv_multipart()
    assert len(frames) == 3, "one step per message: [topic, seq, payload]"
    _, seq, payload = fpm.parse_frames(frames)
    sample = fpm.decode(payload)
    assert seq == sample.counter_id
    return sample


def _recv(sub: zmq.Socket[bytes], count: int, timeout_s: float = 10.0) -> list[ForwardPassMetrics]:
    out: list[ForwardPassMetrics] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < count and time.monotonic() < deadline:
        got = _recv_one(sub, 50)
        if got is not None:
            out.append(got)
    return out


def _connect(ctx: zmq.Context[zmq.Socket[bytes]], pub: FpmPublisher) -> zmq.Socket[bytes]:
    """A SUB socket that has heard the publisher: probe steps, each flushed, until one arrives (ZMQ's slow joiner),
    then drain the rest of them (up to a heartbeat: every probe came before it)."""
    assert pub.bound_endpoint is not None
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(pub.bound_endpoint)
    deadline = time.monotonic() + 10
    while _recv_one(sub, 100) is None:
        assert time.monotonic() < deadline, "the subscriber heard nothing within 10 s"
        pub.publish(0.0, STEP, QUEUE)
        assert pub.flush()
    while (late := _recv_one(sub, 300)) is not None and not late.is_heartbeat:
        pass  # the probes sent before the heartbeat
    return sub


def test_queued_steps_wait_for_the_burst_then_arrive_complete_and_in_order(
    ctx: zmq.Context[zmq.Socket[bytes]],
) -> None:
    with FpmPublisher(
        worker_id="w-b",
        dp_rank=1,
        endpoint="tcp://127.0.0.1:*",
        send_interval_s=30.0,
        heartbeat_interval_s=60.0,
        context=ctx,
    ) as pub:
        sub = _connect(ctx, pub)  # its last probe was a burst: the next is due 30 s later
        for i in range(4):
            assert pub.publish(0.001 * (i + 1), STEP, QUEUE)
            # A publisher without bursts has sent it by now; this one holds it for the burst.
            assert _recv_one(sub, 200) is None, f"step {i} was sent before its burst"
        sent_before = pub.stats().sent
        assert pub.flush()  # sends the burst now
        got = _recv(sub, 4)
        assert pub.stats().sent == sent_before + 4
    assert [s.wall_time for s in got] == [0.001, 0.002, 0.003, 0.004]
    counters = [s.counter_id for s in got]
    assert counters == list(range(counters[0], counters[0] + 4))
    assert all(not s.is_heartbeat and s.worker_id == "w-b" and s.dp_rank == 1 for s in got)
    assert got[0].scheduled_requests == STEP


def test_a_burst_goes_out_on_its_own_within_the_interval(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    with FpmPublisher(
        worker_id="w", endpoint="tcp://127.0.0.1:*", send_interval_s=0.2, heartbeat_interval_s=60.0, context=ctx
    ) as pub:
        sub = _connect(ctx, pub)
        for i in range(50):
            pub.publish(float(i), STEP, QUEUE)
            time.sleep(0.004)
        got = _recv(sub, 50)  # no flush(): the bursts go out by themselves
    assert [s.wall_time for s in got] == [float(i) for i in range(50)]
    counters = [s.counter_id for s in got]
    assert counters == list(range(counters[0], counters[0] + 50))


def test_close_sends_the_burst_being_gathered(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    pub = FpmPublisher(
        worker_id="w", endpoint="tcp://127.0.0.1:*", send_interval_s=30.0, heartbeat_interval_s=60.0, context=ctx
    ).start()
    sub = _connect(ctx, pub)
    sent_before = pub.stats().sent
    for i in range(5):
        assert pub.publish(float(i), STEP, QUEUE)
    pub.close()  # within its 2 s join: it does not wait the 30 s for the burst
    assert pub.stats().sent == sent_before + 5
    got = _recv(sub, 5)
    assert [s.wall_time for s in got] == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_a_heartbeat_due_before_the_burst_brings_the_burst_forward(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    with FpmPublisher(
        worker_id="w", endpoint="tcp://127.0.0.1:*", send_interval_s=30.0, heartbeat_interval_s=0.1, context=ctx
    ) as pub:
        sub = _connect(ctx, pub)
        assert pub.publish(7.0, STEP, QUEUE)
        got = _recv(sub, 8)  # the step within a heartbeat interval, not 30 s later; heartbeats go on after it
    steps = [s for s in got if not s.is_heartbeat]
    assert len(got) == 8 and [s.wall_time for s in steps] == [7.0]
    assert sum(s.is_heartbeat for s in got[got.index(steps[-1]) + 1 :]) >= 1
    counters = [s.counter_id for s in got]
    assert counters == list(range(counters[0], counters[0] + len(got)))


def test_the_default_interval_and_nonsense_rejected() -> None:
    assert FpmPublisher(worker_id="w").send_interval_s == DEFAULT_SEND_INTERVAL_S == 0.1
    assert FpmPublisher(worker_id="w", send_interval_s=0).send_interval_s == 0
    for bad in (-0.01, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="send_interval_s"):
            FpmPublisher(worker_id="w", send_interval_s=bad)

"""The FPM traffic extension (issue 13, item 1): an optional ``traffic`` key that Dynamo-shaped decoders ignore,
that plain v1 payloads do not carry, that heartbeats never carry, and that the shim's pure accumulator fills."""

from __future__ import annotations

import math
import time

import msgspec
import pytest
import zmq

from worker_shim import fpm
from worker_shim.fpm import (
    HIST_MAX_BUCKET,
    ForwardPassMetrics,
    LogHistogram,
    QueuedRequests,
    ScheduledRequests,
    StepTraffic,
    bucket_bounds,
    bucket_index,
)
from worker_shim.metrics import TrafficAccumulator
from worker_shim.publisher import FpmPublisher


class DynamoScheduled(msgspec.Struct):
    num_prefill_requests: int
    sum_prefill_tokens: int
    var_prefill_length: float
    sum_prefill_kv_tokens: int
    num_decode_requests: int
    sum_decode_kv_tokens: int
    var_decode_kv_tokens: float


class DynamoQueued(msgspec.Struct):
    num_prefill_requests: int
    sum_prefill_tokens: int
    var_prefill_length: float
    num_decode_requests: int


class DynamoForwardPassMetrics(msgspec.Struct):
    """Shaped like Dynamo's decoder: every v1 field required, no ``traffic`` (unknown keys are ignored)."""

    version: int
    worker_id: str
    dp_rank: int
    counter_id: int
    wall_time: float
    scheduled_requests: DynamoScheduled
    queued_requests: DynamoQueued


STEP = ScheduledRequests(
    num_prefill_requests=2, sum_prefill_tokens=700, num_decode_requests=5, sum_decode_kv_tokens=900
)
QUEUE = QueuedRequests(num_prefill_requests=1, sum_prefill_tokens=300)


def _traffic() -> StepTraffic:
    acc = TrafficAccumulator()
    for tokens in (300, 400):
        acc.arrival(tokens)
    acc.first_token(120.5)
    acc.completion(64, 21.0)
    acc.completion(1, None)
    return acc.take()


def _sample(traffic: StepTraffic | msgspec.UnsetType = msgspec.UNSET) -> ForwardPassMetrics:
    return ForwardPassMetrics(
        worker_id="w",
        dp_rank=1,
        counter_id=9,
        wall_time=0.03,
        scheduled_requests=STEP,
        queued_requests=QUEUE,
        traffic=traffic,
    )


def test_a_dynamo_shaped_decoder_reads_the_extended_payload_and_ignores_the_extension() -> None:
    payload = fpm.encode(_sample(_traffic()))
    theirs = msgspec.msgpack.decode(payload, type=DynamoForwardPassMetrics)
    assert theirs.version == 1 and theirs.worker_id == "w" and theirs.counter_id == 9
    assert msgspec.structs.asdict(theirs.scheduled_requests) == msgspec.structs.asdict(STEP)
    assert msgspec.structs.asdict(theirs.queued_requests) == msgspec.structs.asdict(QUEUE)


def test_plain_v1_is_unchanged_and_our_decoder_reads_it_without_the_extension() -> None:
    plain = fpm.encode(_sample())
    assert b"traffic" not in plain
    assert "traffic" not in msgspec.msgpack.decode(plain)
    # a v1 payload from another encoder (a plain dict, as Dynamo's publisher sends)
    theirs = msgspec.msgpack.encode(msgspec.to_builtins(msgspec.msgpack.decode(plain, type=DynamoForwardPassMetrics)))
    for payload in (plain, theirs):
        sample = fpm.decode(payload)
        assert sample.traffic is msgspec.UNSET
        assert sample.scheduled_requests == STEP
        assert fpm.invalid_fields(sample) == ()


def test_the_extension_round_trips_and_an_empty_one_is_an_empty_map() -> None:
    traffic = _traffic()
    back = fpm.decode(fpm.encode(_sample(traffic)))
    assert back.traffic == traffic
    assert traffic.arrivals.count == 2 and traffic.arrivals.sum == 700
    assert traffic.completions.count == 2 and traffic.completions.sum == 65
    assert traffic.ttft_ms.count == 1 and traffic.itl_ms.count == 1  # the one-token output has no ITL
    assert msgspec.msgpack.decode(fpm.encode(_sample(StepTraffic())))["traffic"] == {}
    assert fpm.decode(fpm.encode(_sample(StepTraffic()))).traffic == StepTraffic()
    assert fpm.invalid_fields(back) == ()


def test_heartbeats_carry_no_extension() -> None:
    beat = fpm.heartbeat("w", 0, 3)
    assert beat.traffic is msgspec.UNSET and b"traffic" not in fpm.encode(beat)


def test_the_accumulator_starts_over_after_each_take_and_its_size_does_not_grow_with_the_batch() -> None:
    acc = TrafficAccumulator()
    assert acc.take() == StepTraffic()
    for _ in range(5000):
        acc.arrival(1000)  # 5000 arrivals of one length: one bucket
    step = acc.take()
    assert step.arrivals.count == 5000 and step.arrivals.sum == 5_000_000
    assert step.arrivals.buckets == {bucket_index(1000): 5000}
    assert acc.take() == StepTraffic()
    for n in range(1, 200_000, 7):  # every length there is: at most every bucket once
        acc.arrival(n)
    assert len(acc.take().arrivals.buckets) <= HIST_MAX_BUCKET + 1


@pytest.mark.parametrize("value", [0.0, 0.4, 1.0, 1.04, 2.0, 3.7, 50.0, 999.9, 2000.0, 131072.0, 1e9])
def test_a_value_falls_inside_its_bucket(value: float) -> None:
    low, high = bucket_bounds(bucket_index(value))
    assert low <= value < high
    if value >= 1:
        assert high / low == pytest.approx(2 ** (1 / 16))


def test_values_past_the_last_bucket_and_nan_do_not_break_it() -> None:
    assert bucket_index(2.0**60) == HIST_MAX_BUCKET
    assert bucket_index(math.nan) == 0
    assert bucket_index(-5.0) == 0


@pytest.mark.parametrize(
    ("hist", "bad"),
    [
        (LogHistogram(count=-1), True),
        (LogHistogram(count=1, sum=math.nan, buckets={3: 1}), True),
        (LogHistogram(count=2, sum=5.0, buckets={3: 1}), True),  # buckets do not add up
        (LogHistogram(count=1, sum=5.0, buckets={HIST_MAX_BUCKET + 1: 1}), True),
        (LogHistogram(count=0, sum=0.0, buckets={4: 0}), True),
        (LogHistogram(count=2, sum=5.0, buckets={3: 1, 40: 1}), False),
    ],
)
def test_invalid_fields_names_a_broken_histogram(hist: LogHistogram, bad: bool) -> None:
    sample = _sample(StepTraffic(ttft_ms=hist))
    assert fpm.invalid_fields(sample) == (("traffic.ttft_ms",) if bad else ())


def test_the_publisher_sends_the_extension_on_step_samples_over_real_zmq() -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        with FpmPublisher(worker_id="w", endpoint="tcp://127.0.0.1:*", heartbeat_interval_s=0.05, context=ctx) as pub:
            sub = ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            assert pub.bound_endpoint is not None
            sub.connect(pub.bound_endpoint)
            got: list[ForwardPassMetrics] = []
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not any(s.is_heartbeat for s in got):
                if sub.poll(50):
                    got.append(fpm.decode(fpm.parse_frames(sub.recv_multipart())[2]))
            assert got, "no heartbeat within 10 s"
            traffic = _traffic()
            pub.publish(0.03, STEP, QUEUE, traffic)
            pub.publish(0.03, STEP, QUEUE)
            steps: list[ForwardPassMetrics] = []
            while time.monotonic() < deadline and len(steps) < 2:
                if sub.poll(50):
                    sample = fpm.decode(fpm.parse_frames(sub.recv_multipart())[2])
                    if not sample.is_heartbeat:
                        steps.append(sample)
            sub.close(linger=0)
        assert [s.traffic for s in steps] == [traffic, msgspec.UNSET]
        assert all(s.traffic is msgspec.UNSET for s in got)  # heartbeats
    finally:
        ctx.destroy(linger=0)

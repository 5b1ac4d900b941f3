"""FPM v1 schema rows the mutation run showed missing: negative counters, old versions, the heartbeat definition,
the slow path of ``invalid_fields`` (taken only when something is wrong) and the frame helpers' defaults."""

from __future__ import annotations

import math
from dataclasses import dataclass

import msgpack
import pytest

from worker_shim import fpm
from worker_shim.fpm import ForwardPassMetrics, QueuedRequests, ScheduledRequests


def sample(**overrides: object) -> ForwardPassMetrics:
    fields: dict[str, object] = {"worker_id": "w", "dp_rank": 0, "counter_id": 0, "wall_time": 0.0}
    fields.update(overrides)
    return ForwardPassMetrics(**fields)  # type: ignore[arg-type]


@dataclass
class InvalidRow:
    name: str
    sample: ForwardPassMetrics
    bad: tuple[str, ...]


INVALID_ROWS = [
    InvalidRow(
        "a negative counter_id is named (the fast path must not let it through)", sample(counter_id=-1), ("counter_id",)
    ),
    InvalidRow("a negative dp_rank is named", sample(dp_rank=-1), ("dp_rank",)),
    InvalidRow("a negative wall_time is named", sample(wall_time=-0.001), ("wall_time",)),
    InvalidRow("an infinite wall_time is named", sample(wall_time=math.inf), ("wall_time",)),
    InvalidRow("a NaN wall_time is named", sample(wall_time=math.nan), ("wall_time",)),
    InvalidRow(
        "a NaN variance is named even though every count is >= 0",
        sample(scheduled_requests=ScheduledRequests(var_prefill_length=math.nan)),
        ("scheduled_requests.var_prefill_length",),
    ),
    InvalidRow(
        "an infinite queued count is named",
        sample(queued_requests=QueuedRequests(sum_prefill_tokens=math.inf)),  # type: ignore[arg-type]
        ("queued_requests.sum_prefill_tokens",),
    ),
    InvalidRow(
        "zeros are valid on the slow path: rank 0, counter 0, wall_time 0 next to one bad count",
        sample(queued_requests=QueuedRequests(num_decode_requests=-2)),
        ("queued_requests.num_decode_requests",),
    ),
    InvalidRow(
        "every bad field is named, in schema order",
        sample(
            dp_rank=-1,
            counter_id=-5,
            wall_time=-1.0,
            scheduled_requests=ScheduledRequests(num_prefill_requests=-1, var_decode_kv_tokens=math.inf),
            queued_requests=QueuedRequests(var_prefill_length=-0.5),
        ),
        (
            "dp_rank",
            "counter_id",
            "wall_time",
            "scheduled_requests.num_prefill_requests",
            "scheduled_requests.var_decode_kv_tokens",
            "queued_requests.var_prefill_length",
        ),
    ),
    InvalidRow("an all-zero heartbeat is valid", fpm.heartbeat("w", 0, 0), ()),
    InvalidRow(
        "a busy step with large values is valid",
        sample(
            dp_rank=7,
            counter_id=2**40,
            wall_time=12.5,
            scheduled_requests=ScheduledRequests(num_decode_requests=256, sum_decode_kv_tokens=10**7),
        ),
        (),
    ),
]


@pytest.mark.parametrize("row", INVALID_ROWS, ids=[r.name for r in INVALID_ROWS])
def test_invalid_fields(row: InvalidRow) -> None:
    assert fpm.invalid_fields(row.sample) == row.bad


@dataclass
class HeartbeatRow:
    name: str
    sample: ForwardPassMetrics
    is_heartbeat: bool


HEARTBEAT_ROWS = [
    HeartbeatRow("zero wall time and zero scheduled counts is a heartbeat", sample(), True),
    HeartbeatRow(
        "queued requests do not stop a heartbeat (an idle engine may have a queue it cannot schedule)",
        sample(queued_requests=QueuedRequests(num_prefill_requests=2, sum_prefill_tokens=900)),
        True,
    ),
    HeartbeatRow(
        "zero wall time with decodes scheduled is not a heartbeat",
        sample(scheduled_requests=ScheduledRequests(num_decode_requests=1)),
        False,
    ),
    HeartbeatRow(
        "zero wall time with a non-zero variance is not a heartbeat",
        sample(scheduled_requests=ScheduledRequests(var_decode_kv_tokens=0.5)),
        False,
    ),
    HeartbeatRow("a step that took time with nothing scheduled is not a heartbeat", sample(wall_time=0.001), False),
]


@pytest.mark.parametrize("row", HEARTBEAT_ROWS, ids=[r.name for r in HEARTBEAT_ROWS])
def test_heartbeat_definition(row: HeartbeatRow) -> None:
    assert row.sample.is_heartbeat is row.is_heartbeat


def test_the_heartbeat_builder_keeps_the_ids_and_nothing_else() -> None:
    hb = fpm.heartbeat("worker-9", 2, 41)
    assert hb == ForwardPassMetrics(worker_id="worker-9", dp_rank=2, counter_id=41, wall_time=0.0)
    assert hb.version == fpm.FPM_VERSION == 1
    assert fpm.decode(fpm.encode(hb)).is_heartbeat


@pytest.mark.parametrize("version", [0, -1, 2])
def test_a_version_other_than_1_is_refused_by_number(version: int) -> None:
    payload = msgpack.packb({"version": version, "worker_id": "w", "dp_rank": 0, "counter_id": 1, "wall_time": 0.1})
    with pytest.raises(fpm.FpmDecodeError, match=rf"unsupported FPM version {version} \(this decoder reads 1\)"):
        fpm.decode(payload)


def test_a_payload_without_a_version_is_read_as_version_1() -> None:
    payload = msgpack.packb({"worker_id": "w", "dp_rank": 0, "counter_id": 3, "wall_time": 0.1})
    assert fpm.decode(payload) == sample(counter_id=3, wall_time=0.1)


def test_frames_default_to_the_empty_topic() -> None:
    topic, seq, payload = fpm.frames(sample(counter_id=1))
    assert (topic, seq) == (b"", b"\x00" * 7 + b"\x01")
    assert fpm.decode(payload) == sample(counter_id=1)


@pytest.mark.parametrize(
    ("parts", "message"),
    [
        ([b"", b"\x00" * 8], "expected 3 frames [topic, seq, payload], got 2"),
        ([b"", b"\x00" * 8, b"", b""], "expected 3 frames [topic, seq, payload], got 4"),
        ([b"", b"\x00" * 9, b""], "seq frame must be 8 bytes (u64 big-endian), got 9"),
    ],
)
def test_malformed_frames_say_what_is_wrong(parts: list[bytes], message: str) -> None:
    with pytest.raises(fpm.FpmFrameError) as caught:
        fpm.parse_frames(parts)
    assert str(caught.value) == message


def hist(count: int = 1, total: float = 5.0, buckets: dict[int, int] | None = None) -> fpm.LogHistogram:
    return fpm.LogHistogram(count=count, sum=total, buckets={3: 1} if buckets is None else buckets)


@dataclass
class TrafficRow:
    name: str
    arrivals: fpm.LogHistogram
    bad: bool


TRAFFIC_ROWS = [
    TrafficRow("a consistent histogram is valid", hist(), False),
    TrafficRow("bucket 0 (values below 1) is a valid bucket", hist(buckets={0: 1}), False),
    TrafficRow("the last bucket is a valid bucket", hist(buckets={fpm.HIST_MAX_BUCKET: 1}), False),
    TrafficRow("past the last bucket is not", hist(buckets={fpm.HIST_MAX_BUCKET + 1: 1}), True),
    TrafficRow("a negative bucket is not", hist(buckets={-1: 1}), True),
    TrafficRow("a bucket count of 0 is not (empty buckets are not sent)", hist(count=1, buckets={3: 1, 4: 0}), True),
    TrafficRow("bucket counts must add up to the count", hist(count=2, buckets={3: 1}), True),
    TrafficRow("a NaN sum is not valid", hist(total=math.nan), True),
    TrafficRow("a negative sum is not valid", hist(total=-1.0), True),
    TrafficRow("a zero sum is valid", hist(total=0.0, buckets={0: 1}), False),
    TrafficRow("a negative count is not valid", hist(count=-1, buckets={}), True),
]


@pytest.mark.parametrize("row", TRAFFIC_ROWS, ids=[r.name for r in TRAFFIC_ROWS])
def test_traffic_extension_validity(row: TrafficRow) -> None:
    s = sample(wall_time=0.01, traffic=fpm.StepTraffic(arrivals=row.arrivals, ttft_ms=hist()))
    assert fpm.invalid_fields(s) == (("traffic.arrivals",) if row.bad else ())


def test_bucket_bounds_start_at_zero_and_double_every_16_buckets() -> None:
    assert fpm.bucket_bounds(0) == (0.0, 1.0)
    assert fpm.bucket_bounds(-3) == (0.0, 1.0)
    assert fpm.bucket_bounds(1) == (1.0, 2.0 ** (1 / 16))
    assert fpm.bucket_bounds(17) == (2.0, 2.0 ** (17 / 16))
    assert fpm.bucket_index(1.0) == 1 and fpm.bucket_index(0.99) == 0 and fpm.bucket_index(2.0) == 17


def test_a_heartbeat_carries_its_run_id() -> None:
    assert fpm.heartbeat("w", 0, 5, run_id=77).run_id == 77
    assert fpm.heartbeat("w", 0, 5).run_id == 0


def test_a_decode_error_names_the_version_and_the_cause() -> None:
    with pytest.raises(fpm.FpmDecodeError) as info:
        fpm.decode(b"\xc1")
    message = str(info.value)
    assert message.startswith("not an FPM v1 payload: ") and "malformed" in message


def test_a_payload_nested_too_deep_is_a_decode_error_naming_the_cause() -> None:
    payload = b"\x81\xa1x" + b"\x91" * 200_000 + b"\xc0"  # {"x": [[[...]]]}: an unknown key, nested too deep
    with pytest.raises(fpm.FpmDecodeError) as info:
        fpm.decode(payload)
    assert str(info.value).startswith("not an FPM v1 payload: RecursionError: ")
    assert isinstance(info.value.__cause__, RecursionError)


def test_traffic_is_checked_on_the_slow_path_too() -> None:
    s = sample(counter_id=-1, wall_time=0.01, traffic=fpm.StepTraffic(arrivals=hist(count=2)))
    assert fpm.invalid_fields(s) == ("counter_id", "traffic.arrivals")

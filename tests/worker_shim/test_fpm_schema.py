"""The FPM v1 wire schema: round trip, compatibility with other encoders, one clear error for bad payloads."""

from __future__ import annotations

import math
import subprocess
import sys

import msgpack
import pytest

from worker_shim import fpm
from worker_shim.fpm import ForwardPassMetrics, QueuedRequests, ScheduledRequests


def _sample(**overrides: object) -> ForwardPassMetrics:
    fields: dict[str, object] = {
        "worker_id": "w-1",
        "dp_rank": 1,
        "counter_id": 7,
        "wall_time": 0.0125,
        "scheduled_requests": ScheduledRequests(
            num_prefill_requests=2,
            sum_prefill_tokens=300,
            var_prefill_length=12.5,
            sum_prefill_kv_tokens=64,
            num_decode_requests=5,
            sum_decode_kv_tokens=4000,
            var_decode_kv_tokens=3.5,
        ),
        "queued_requests": QueuedRequests(
            num_prefill_requests=1, sum_prefill_tokens=90, var_prefill_length=0.0, num_decode_requests=2
        ),
    }
    fields.update(overrides)
    return ForwardPassMetrics(**fields)  # type: ignore[arg-type]


def _dynamo_dict() -> dict[str, object]:
    """A plain dict with the keys NVIDIA Dynamo's publisher emits."""
    return {
        "version": 1,
        "worker_id": "dynamo-worker",
        "dp_rank": 0,
        "counter_id": 42,
        "wall_time": 0.02,
        "scheduled_requests": {
            "num_prefill_requests": 1,
            "sum_prefill_tokens": 512,
            "var_prefill_length": 0.0,
            "sum_prefill_kv_tokens": 0,
            "num_decode_requests": 3,
            "sum_decode_kv_tokens": 1500,
            "var_decode_kv_tokens": 10.0,
        },
        "queued_requests": {
            "num_prefill_requests": 0,
            "sum_prefill_tokens": 0,
            "var_prefill_length": 0.0,
            "num_decode_requests": 0,
        },
    }


def test_round_trip_is_field_for_field() -> None:
    sample = _sample()
    assert fpm.decode(fpm.encode(sample)) == sample


def test_payload_is_a_msgpack_map_with_the_wire_keys() -> None:
    raw = msgpack.unpackb(fpm.encode(_sample()))
    assert set(raw) == {
        "version",
        "worker_id",
        "dp_rank",
        "counter_id",
        "wall_time",
        "scheduled_requests",
        "queued_requests",
        "run_id",
    }
    assert set(raw["scheduled_requests"]) == {
        "num_prefill_requests",
        "sum_prefill_tokens",
        "var_prefill_length",
        "sum_prefill_kv_tokens",
        "num_decode_requests",
        "sum_decode_kv_tokens",
        "var_decode_kv_tokens",
    }
    assert set(raw["queued_requests"]) == {
        "num_prefill_requests",
        "sum_prefill_tokens",
        "var_prefill_length",
        "num_decode_requests",
    }
    assert raw["version"] == 1


def test_a_plain_dict_from_another_encoder_decodes() -> None:
    sample = fpm.decode(msgpack.packb(_dynamo_dict()))
    assert sample.worker_id == "dynamo-worker"
    assert sample.scheduled_requests.sum_prefill_tokens == 512
    assert sample.scheduled_requests.sum_decode_kv_tokens == 1500


def test_integer_valued_floats_from_another_encoder_decode() -> None:
    doc = _dynamo_dict()
    doc["wall_time"] = 1  # an encoder may write 1 rather than 1.0
    assert fpm.decode(msgpack.packb(doc)).wall_time == 1.0


def test_unknown_keys_are_ignored_at_every_level() -> None:
    doc = _dynamo_dict()
    doc["extension"] = {"gpu_util": 0.9}
    doc["scheduled_requests"]["spec_decode_tokens"] = 3  # type: ignore[index]
    doc["queued_requests"]["remote_kv"] = [1, 2]  # type: ignore[index]
    assert fpm.decode(msgpack.packb(doc)).counter_id == 42


@pytest.mark.parametrize(
    ("key", "value"),
    [("worker_id", 5), ("dp_rank", "zero"), ("wall_time", "fast"), ("scheduled_requests", [1, 2]), ("counter_id", 1.5)],
)
def test_wrong_types_raise_one_clear_error(key: str, value: object) -> None:
    doc = _dynamo_dict()
    doc[key] = value
    with pytest.raises(fpm.FpmDecodeError, match=key):
        fpm.decode(msgpack.packb(doc))


@pytest.mark.parametrize("payload", [b"", b"\xc1", b"not msgpack at all", msgpack.packb([1, 2, 3])])
def test_garbage_raises_the_same_error(payload: bytes) -> None:
    with pytest.raises(fpm.FpmDecodeError):
        fpm.decode(payload)


def test_a_missing_required_field_is_named() -> None:
    doc = _dynamo_dict()
    del doc["worker_id"]
    with pytest.raises(fpm.FpmDecodeError, match="worker_id"):
        fpm.decode(msgpack.packb(doc))


def test_another_version_is_refused() -> None:
    doc = _dynamo_dict()
    doc["version"] = 2
    with pytest.raises(fpm.FpmDecodeError, match="version 2"):
        fpm.decode(msgpack.packb(doc))


def test_frames_carry_topic_big_endian_seq_and_payload() -> None:
    sample = _sample(counter_id=258)
    topic, seq, payload = fpm.frames(sample, topic=b"fpm")
    assert topic == b"fpm"
    assert seq == b"\x00\x00\x00\x00\x00\x00\x01\x02"
    assert fpm.parse_frames([topic, seq, payload]) == (b"fpm", 258, payload)


@pytest.mark.parametrize("parts", [[b"", b"\x00" * 8], [b"", b"\x00" * 8, b"x", b"y"], [b"", b"\x00" * 7, b"x"]])
def test_malformed_frames_raise(parts: list[bytes]) -> None:
    with pytest.raises(fpm.FpmFrameError):
        fpm.parse_frames(parts)


def test_heartbeat_has_zero_wall_time_and_zero_counts() -> None:
    hb = fpm.heartbeat("w", 3, 11)
    assert hb.is_heartbeat
    assert (hb.wall_time, hb.dp_rank, hb.counter_id) == (0.0, 3, 11)
    assert hb.scheduled_requests == ScheduledRequests() and hb.queued_requests == QueuedRequests()
    assert not _sample().is_heartbeat


@pytest.mark.parametrize(
    ("sample", "bad"),
    [
        (_sample(wall_time=math.nan), ("wall_time",)),
        (_sample(wall_time=-0.1), ("wall_time",)),
        (
            _sample(scheduled_requests=ScheduledRequests(var_decode_kv_tokens=math.inf)),
            ("scheduled_requests.var_decode_kv_tokens",),
        ),
        (_sample(queued_requests=QueuedRequests(sum_prefill_tokens=-1)), ("queued_requests.sum_prefill_tokens",)),
        (_sample(dp_rank=-1), ("dp_rank",)),
        (_sample(), ()),
    ],
)
def test_invalid_fields_names_what_no_engine_produces(sample: ForwardPassMetrics, bad: tuple[str, ...]) -> None:
    assert fpm.invalid_fields(sample) == bad


def test_schema_imports_with_msgspec_alone() -> None:
    code = (
        "import sys\n"
        "for name in ('zmq', 'vllm', 'fastapi', 'numpy', 'torch', 'yaml', 'sklearn'):\n"
        "    sys.modules[name] = None\n"
        "import worker_shim.fpm as f\n"
        "print(f.decode(f.encode(f.heartbeat('w', 0, 1))).counter_id)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"

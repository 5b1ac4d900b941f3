"""Forward-pass metrics (FPM) wire format, version 1.

One sample per engine step (and an idle heartbeat), compatible with NVIDIA Dynamo's forward-pass metrics:
a msgpack **map** encoded from frozen ``msgspec.Struct`` s, sent as three ZMQ frames
``[topic, seq (u64 big-endian), payload]``.

The records hold only scalars and each other, so they can never form a reference cycle: they are declared
``gc=False`` and a store holding millions of them costs the garbage collector nothing. This module needs msgspec
only: the shim (inside vLLM), the planner and the simulator all import it.
Decoding ignores unknown keys (optional extensions are allowed); a payload of the wrong shape raises
:class:`FpmDecodeError` and nothing else.
"""

from __future__ import annotations

import math
import struct

import msgspec
from msgspec.structs import astuple

__all__ = [
    "FPM_VERSION",
    "ForwardPassMetrics",
    "FpmDecodeError",
    "FpmFrameError",
    "QueuedRequests",
    "ScheduledRequests",
    "decode",
    "encode",
    "frames",
    "heartbeat",
    "invalid_fields",
    "parse_frames",
]

FPM_VERSION = 1
_SEQ = struct.Struct(">Q")


class ScheduledRequests(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What one engine step computed."""

    num_prefill_requests: int = 0
    sum_prefill_tokens: int = 0  # tokens computed this step
    var_prefill_length: float = 0.0
    sum_prefill_kv_tokens: int = 0  # tokens read from cache or earlier chunks
    num_decode_requests: int = 0
    sum_decode_kv_tokens: int = 0
    var_decode_kv_tokens: float = 0.0


class QueuedRequests(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What waited after the step was scheduled."""

    num_prefill_requests: int = 0
    sum_prefill_tokens: int = 0
    var_prefill_length: float = 0.0
    num_decode_requests: int = 0  # preempted or waiting for remote KV


class ForwardPassMetrics(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One FPM sample. ``wall_time`` is the step's duration in seconds; 0.0 only on heartbeats."""

    worker_id: str
    dp_rank: int
    counter_id: int
    wall_time: float
    scheduled_requests: ScheduledRequests = ScheduledRequests()
    queued_requests: QueuedRequests = QueuedRequests()
    version: int = FPM_VERSION

    @property
    def is_heartbeat(self) -> bool:
        return self.wall_time == 0.0 and self.scheduled_requests == _EMPTY_SCHEDULED


_EMPTY_SCHEDULED = ScheduledRequests()
_EMPTY_QUEUED = QueuedRequests()


class FpmDecodeError(ValueError):
    """A payload that is not a version-1 FPM sample."""


class FpmFrameError(ValueError):
    """A ZMQ message that is not ``[topic, seq u64 big-endian, payload]``."""


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(ForwardPassMetrics)


def encode(sample: ForwardPassMetrics) -> bytes:
    return _encoder.encode(sample)


def decode(payload: bytes) -> ForwardPassMetrics:
    """Decode one payload; unknown keys are ignored, anything else malformed raises :class:`FpmDecodeError`."""
    try:
        sample = _decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise FpmDecodeError(f"not an FPM v{FPM_VERSION} payload: {exc}") from exc
    if sample.version != FPM_VERSION:
        raise FpmDecodeError(f"unsupported FPM version {sample.version} (this decoder reads {FPM_VERSION})")
    return sample


def heartbeat(worker_id: str, dp_rank: int, counter_id: int) -> ForwardPassMetrics:
    """An idle heartbeat: wall_time 0 and zero counts."""
    return ForwardPassMetrics(worker_id=worker_id, dp_rank=dp_rank, counter_id=counter_id, wall_time=0.0)


def frames(sample: ForwardPassMetrics, topic: bytes = b"") -> tuple[bytes, bytes, bytes]:
    """The three ZMQ frames for ``sample``; ``seq`` is its ``counter_id``."""
    return (topic, _SEQ.pack(sample.counter_id), encode(sample))


def parse_frames(parts: list[bytes]) -> tuple[bytes, int, bytes]:
    """Split a received message into ``(topic, seq, payload)``; raises :class:`FpmFrameError`."""
    if len(parts) != 3:
        raise FpmFrameError(f"expected 3 frames [topic, seq, payload], got {len(parts)}")
    topic, seq, payload = parts
    if len(seq) != 8:
        raise FpmFrameError(f"seq frame must be 8 bytes (u64 big-endian), got {len(seq)}")
    return topic, _SEQ.unpack(seq)[0], payload


def invalid_fields(sample: ForwardPassMetrics) -> tuple[str, ...]:
    """Names of fields whose value no engine can produce: negative or non-finite numbers. Empty when valid."""
    counts = astuple(sample.scheduled_requests) + astuple(sample.queued_requests)
    # Fast path (the ingest hot loop): every count >= 0 and their sum finite means no NaN/inf anywhere.
    if (
        min(counts) >= 0
        and math.isfinite(sum(counts))
        and sample.wall_time >= 0
        and math.isfinite(sample.wall_time)
        and sample.dp_rank >= 0
        and sample.counter_id >= 0
    ):
        return ()
    bad: list[str] = []
    if sample.dp_rank < 0:
        bad.append("dp_rank")
    if sample.counter_id < 0:
        bad.append("counter_id")
    if not math.isfinite(sample.wall_time) or sample.wall_time < 0:
        bad.append("wall_time")
    for prefix, part in (
        ("scheduled_requests", sample.scheduled_requests),
        ("queued_requests", sample.queued_requests),
    ):
        for name in part.__struct_fields__:
            value = getattr(part, name)
            if value < 0 or not math.isfinite(value):
                bad.append(f"{prefix}.{name}")
    return tuple(bad)

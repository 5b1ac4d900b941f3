"""Forward-pass metrics (FPM) wire format, version 1.

One sample per engine step (and an idle heartbeat), compatible with NVIDIA Dynamo's forward-pass metrics:
a msgpack **map** encoded from frozen ``msgspec.Struct`` s, sent as three ZMQ frames
``[topic, seq (u64 big-endian), payload]``.

The records hold only scalars and each other, so they can never form a reference cycle: they are declared
``gc=False`` and a store holding millions of them costs the garbage collector nothing. This module needs msgspec
only: the shim (inside vLLM), the planner and the simulator all import it.
Decoding ignores unknown keys (optional extensions are allowed); a payload of the wrong shape raises
:class:`FpmDecodeError` and nothing else.

**Traffic extension** (optional, backward compatible): a step sample may carry a ``traffic`` map
(:class:`StepTraffic`) with what happened to requests since the previous step sample: arrivals (prompt tokens),
completions (output tokens), the TTFT of requests whose first token was produced and the mean ITL of requests
that finished, each a :class:`LogHistogram` (count + sum + sparse fixed log buckets, so its size is bounded by
the bucket count, never by the batch). A sample without it leaves the key out (``UNSET``), so plain v1 payloads
are byte-for-byte unchanged and decoders that do not know the key (Dynamo's) ignore it. Heartbeats never carry
it. Producers that support the extension send ``traffic`` on every step sample, empty (``{}``) when nothing
happened, so a consumer can tell "no arrivals" from "no extension".
"""

from __future__ import annotations

import math
import struct

import msgspec
from msgspec.structs import astuple

__all__ = [
    "FPM_VERSION",
    "HIST_BUCKETS_PER_OCTAVE",
    "HIST_MAX_BUCKET",
    "ForwardPassMetrics",
    "FpmDecodeError",
    "FpmFrameError",
    "LogHistogram",
    "QueuedRequests",
    "ScheduledRequests",
    "StepTraffic",
    "bucket_bounds",
    "bucket_index",
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


HIST_BUCKETS_PER_OCTAVE = 16  # bucket width 2**(1/16) - 1 = 4.4 %: a percentile read from it is within ~2.2 %
HIST_MAX_BUCKET = 1 + HIST_BUCKETS_PER_OCTAVE * 40  # values up to 2**40 (tokens or ms); larger ones go here


def bucket_index(value: float) -> int:
    """The fixed log bucket of ``value``: 0 for values below 1 (and 0), else ``1 + floor(16 * log2(value))``,
    capped at :data:`HIST_MAX_BUCKET`. Bucket ``k >= 1`` holds ``[2**((k-1)/16), 2**(k/16))``."""
    if not value >= 1.0:  # also catches NaN
        return 0
    return min(HIST_MAX_BUCKET, 1 + int(math.log2(value) * HIST_BUCKETS_PER_OCTAVE))


def bucket_bounds(index: int) -> tuple[float, float]:
    """``[low, high)`` of bucket ``index`` (bucket 0 is ``[0, 1)``)."""
    if index <= 0:
        return 0.0, 1.0
    return 2.0 ** ((index - 1) / HIST_BUCKETS_PER_OCTAVE), 2.0 ** (index / HIST_BUCKETS_PER_OCTAVE)


class LogHistogram(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """``count`` values summing to ``sum``; ``buckets`` maps a :func:`bucket_index` to how many of them fell in
    it (only non-empty buckets are sent)."""

    count: int = 0
    sum: float = 0.0
    buckets: dict[int, int] = msgspec.field(default_factory=dict)


class StepTraffic(msgspec.Struct, frozen=True, kw_only=True, gc=False, omit_defaults=True):
    """The traffic extension of one step sample (see the module docstring); an empty histogram is left out.

    ``arrivals``: prompt tokens of each request that arrived at the engine. ``completions``: output tokens of
    each request that finished. ``ttft_ms``: time to first token of each request whose first token was
    produced (from its arrival time). ``itl_ms``: mean inter-token latency of each request that finished with
    at least two output tokens."""

    arrivals: LogHistogram = LogHistogram()
    completions: LogHistogram = LogHistogram()
    ttft_ms: LogHistogram = LogHistogram()
    itl_ms: LogHistogram = LogHistogram()


class ForwardPassMetrics(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One FPM sample. ``wall_time`` is the step's duration in seconds; 0.0 only on heartbeats. ``traffic``:
    the optional extension (``UNSET``, and absent from the payload, when the producer does not send it)."""

    worker_id: str
    dp_rank: int
    counter_id: int
    wall_time: float
    scheduled_requests: ScheduledRequests = ScheduledRequests()
    queued_requests: QueuedRequests = QueuedRequests()
    version: int = FPM_VERSION
    # Optional (absent = 0, unknown): the publisher run, a random u64 drawn when the publisher starts; a new value
    # on an endpoint is a restart, never loss. Decoders that do not know it (Dynamo's) ignore it.
    run_id: int = 0
    traffic: StepTraffic | msgspec.UnsetType = msgspec.UNSET

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
    except (RecursionError, MemoryError, ValueError, TypeError) as exc:  # e.g. nesting too deep: still a bad payload
        raise FpmDecodeError(f"not an FPM v{FPM_VERSION} payload: {type(exc).__name__}: {exc}") from exc
    if sample.version != FPM_VERSION:
        raise FpmDecodeError(f"unsupported FPM version {sample.version} (this decoder reads {FPM_VERSION})")
    return sample


def heartbeat(worker_id: str, dp_rank: int, counter_id: int, run_id: int = 0) -> ForwardPassMetrics:
    """An idle heartbeat: wall_time 0 and zero counts."""
    return ForwardPassMetrics(worker_id=worker_id, dp_rank=dp_rank, counter_id=counter_id, wall_time=0.0, run_id=run_id)


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
        return () if sample.traffic is msgspec.UNSET else _invalid_traffic(sample.traffic)
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
    if sample.traffic is not msgspec.UNSET:
        bad.extend(_invalid_traffic(sample.traffic))
    return tuple(bad)


def _invalid_traffic(traffic: StepTraffic) -> tuple[str, ...]:
    """Histograms of the traffic extension that no producer can send: a negative count, a non-finite or
    negative sum, a bucket index out of range, a bucket count below 1, or bucket counts not adding up."""
    bad: list[str] = []
    for name in StepTraffic.__struct_fields__:
        hist: LogHistogram = getattr(traffic, name)
        buckets = hist.buckets
        if (
            hist.count < 0
            or not (math.isfinite(hist.sum) and hist.sum >= 0)
            or sum(buckets.values()) != hist.count
            or (buckets and (min(buckets) < 0 or max(buckets) > HIST_MAX_BUCKET or min(buckets.values()) < 1))
        ):
            bad.append(f"traffic.{name}")
    return tuple(bad)

"""Why the store drops a sample: :class:`DropReason`, and the plausibility limits (:class:`FpmLimits`) and check
(:func:`plausible`) behind ``invalid_value``. Pure: no clock, no I/O."""

from __future__ import annotations

import enum
import math
import operator

import msgspec
from msgspec.structs import astuple

from worker_shim import fpm
from worker_shim.fpm import ForwardPassMetrics

__all__ = ["U64_MAX", "DropReason", "FpmLimits", "plausible"]


class DropReason(enum.StrEnum):
    DECODE_ERROR = "decode_error"  # payload is not an FPM v1 msgpack map
    BAD_FRAME = "bad_frame"  # not [topic, seq u64, payload]
    # ZMQ cut the connection for a message over ZMQ_MAXMSGSIZE: a protocol error after the handshake that libzmq
    # does not recover from by itself (counted by the subscriber; never a reset, a restart or a publisher gone).
    OVERSIZED = "oversized"
    UNKNOWN_WORKER = "unknown_worker"  # worker id not discovered (or deregistered, or lease lapsed)
    EMPTY_WORKER_ID = "empty_worker_id"  # published under "" (identity never synced)
    FOREIGN_ENDPOINT = "foreign_endpoint"  # a discovered id/rank arriving on another worker's (or rank's) endpoint
    STALE = "stale"  # received longer than the TTL before it could be stored
    OUT_OF_ORDER = "out_of_order"  # counter not after the last one of the same publisher run (duplicate/replay)
    # NaN, infinite or negative numbers, a count beyond its plausibility limit (FpmLimits); dp_rank outside dp_size
    INVALID_VALUE = "invalid_value"


U64_MAX = 2**64 - 1


class FpmLimits(msgspec.Struct, frozen=True, kw_only=True):
    """Plausibility limits on the counts of one FPM sample: a sample beyond any of them is dropped as
    ``invalid_value``. Generous (far above what an engine step produces) but finite, so one corrupt or hostile
    sample cannot drive a fleet to its maximum or a prediction into float overflow.

    ``max_counter_jump``: a counter step forward larger than this within one publisher run is not taken as that
    many lost samples; it counts as a restart (what happened in between is unknowable)."""

    max_requests: int = 1_000_000  # any num_*_requests
    max_step_tokens: int = 10_000_000  # scheduled sum_prefill_tokens: tokens computed in one step
    max_kv_tokens: int = 1_000_000_000  # sum_prefill_kv_tokens, sum_decode_kv_tokens
    max_queued_tokens: int = 10_000_000_000  # queued sum_prefill_tokens
    max_variance: float = 1e18  # any var_*
    max_wall_time_s: float = 3600.0
    max_counter_jump: int = 1_000_000

    def __post_init__(self) -> None:
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"FpmLimits.{name} must be a finite number > 0, got {value!r}")

    def bound(self, section: str, name: str) -> float:
        """The limit of field ``name`` of ``scheduled_requests`` or ``queued_requests`` (``section``)."""
        if name.startswith("var_"):
            return self.max_variance
        if name.endswith("_requests"):
            return self.max_requests
        if "kv_tokens" in name:
            return self.max_kv_tokens
        if name == "sum_prefill_tokens":
            return self.max_step_tokens if section == "scheduled_requests" else self.max_queued_tokens
        return self.max_kv_tokens  # a count added later: bounded all the same

    def bounds(self) -> tuple[float, ...]:
        """The limits in the order of ``astuple(scheduled_requests) + astuple(queued_requests)``."""
        return tuple(self.bound("scheduled_requests", n) for n in fpm.ScheduledRequests.__struct_fields__) + tuple(
            self.bound("queued_requests", n) for n in fpm.QueuedRequests.__struct_fields__
        )

    def violations(self, sample: ForwardPassMetrics) -> tuple[str, ...]:
        """Names of the fields of ``sample`` beyond their limit; empty when plausible."""
        bad = [
            f"{section}.{name}"
            for section in ("scheduled_requests", "queued_requests")
            for name in getattr(sample, section).__struct_fields__
            if getattr(getattr(sample, section), name) > self.bound(section, name)
        ]
        if sample.wall_time > self.max_wall_time_s:
            bad.append("wall_time")
        if sample.counter_id > U64_MAX:
            bad.append("counter_id")
        if sample.run_id > U64_MAX or sample.run_id < 0:
            bad.append("run_id")
        return tuple(bad)


def plausible(sample: ForwardPassMetrics, bounds: tuple[float, ...], max_wall_time_s: float) -> bool:
    """Nothing an engine cannot produce (:func:`worker_shim.fpm.invalid_fields`: negative, NaN or infinite
    numbers) and every count within ``bounds`` (:meth:`FpmLimits.bounds`) and ``max_wall_time_s``, in one pass of
    C-level comparisons (this runs for every sample): NaN and +inf fail the comparison with the limit, a negative
    count (-inf too) the minimum."""
    counts = astuple(sample.scheduled_requests) + astuple(sample.queued_requests)
    if not (
        all(map(operator.le, counts, bounds))
        and min(counts) >= 0
        and 0.0 <= sample.wall_time <= max_wall_time_s
        and 0 <= sample.counter_id <= U64_MAX
        and 0 <= sample.run_id <= U64_MAX
        and sample.dp_rank >= 0
    ):
        return False
    return sample.traffic is msgspec.UNSET or not fpm.invalid_fields(sample)  # the extension's histograms

"""Bounded sample store that keeps coverage of the whole load range, and the filter in front of it.

:class:`SampleFilter` decides, per FPM sample, whether it may train the model, and says why not
(:class:`SampleVerdict`): heartbeats, impossible values, the first steps after an engine (re)starts
(CUDA-graph capture, ``torch.compile``, cold caches), and steps far slower or faster than the current model
predicts.

:class:`CoverageStore` keeps samples in half-octave bins of the role's load terms and evicts the oldest
sample of the fullest bin when full, so a burst of one load level cannot push out the rest of the range: the
newest samples of every load level stay. Both are pure: no clock, no I/O.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from collections.abc import Iterator

import msgspec

from perf_model.features import StepLoad, load_of, valid_load
from planner.discovery import Role
from planner.errors import ConfigError
from worker_shim.fpm import ForwardPassMetrics

__all__ = ["CoverageStore", "Sample", "SampleFilter", "SampleVerdict", "bin_of", "load_bins"]


class SampleVerdict(enum.StrEnum):
    ACCEPTED = "accepted"
    HEARTBEAT = "heartbeat"  # wall_time 0, nothing scheduled
    INVALID = "invalid"  # negative or non-finite values
    WRONG_ROLE = "wrong_role"  # a step this role's engines do not run (e.g. decode work on a prefill engine)
    WARMUP = "warmup"  # among the first steps after an engine started or restarted
    OUTLIER = "outlier"  # far from what the current model predicts


class Sample(msgspec.Struct, frozen=True, kw_only=True):
    load: StepLoad  # (prefill_tokens, prefill_kv_tokens, decode_requests, decode_kv_tokens)
    wall_time_ms: float
    at: float  # when it was observed (the caller's clock)


def _half_octave(x: float) -> int:
    return int(2.0 * math.log2(1.0 + x))


def load_bins(role: Role, load: StepLoad) -> tuple[int, ...]:
    """Half-octave bin of each of the role's load terms (the coverage key)."""
    p, pkv, b, k = load
    if role is Role.PREFILL:
        return (_half_octave(p), _half_octave(pkv))
    if role is Role.DECODE:
        return (_half_octave(b), _half_octave(k))
    return (_half_octave(p), _half_octave(b), _half_octave(k))


def bin_of(x: float) -> int:
    return _half_octave(x)


class SampleFilter:
    """Per-source warm-up tracking and the role check. The outlier check needs a prediction and is done by the
    model (:meth:`check_outlier`)."""

    def __init__(self, role: Role, *, warmup_steps: int = 16, outlier_factor: float = 3.0) -> None:
        if warmup_steps < 0 or not outlier_factor > 1.0:
            raise ConfigError(f"need warmup_steps >= 0 and outlier_factor > 1, got {warmup_steps}, {outlier_factor}")
        self.role = role
        self.warmup_steps = warmup_steps
        self.outlier_factor = outlier_factor
        # (worker_id, dp_rank) -> (last counter_id, step samples seen since the last start)
        self._sources: dict[tuple[str, int], tuple[int, int]] = {}

    def check(self, sample: ForwardPassMetrics) -> SampleVerdict:
        """Verdict for one sample before the model is consulted; updates warm-up state."""
        if sample.is_heartbeat:
            self._advance(sample, step=False)
            return SampleVerdict.HEARTBEAT
        load = load_of(sample.scheduled_requests)
        if not (math.isfinite(sample.wall_time) and sample.wall_time > 0.0 and valid_load(load)):
            return SampleVerdict.INVALID
        seen = self._advance(sample, step=True)
        if seen <= self.warmup_steps:
            return SampleVerdict.WARMUP
        p, _, b, _ = load
        if (self.role is Role.PREFILL and b > 0) or (self.role is Role.DECODE and p > 0):
            return SampleVerdict.WRONG_ROLE
        if p <= 0 and b <= 0:
            return SampleVerdict.INVALID  # a step that scheduled nothing yet took time
        return SampleVerdict.ACCEPTED

    def check_outlier(self, observed_ms: float, predicted_ms: float) -> bool:
        """True when the observed time is more than ``outlier_factor`` away (either way) from the
        prediction."""
        if predicted_ms <= 0.0:
            return False
        ratio = observed_ms / predicted_ms
        return ratio > self.outlier_factor or ratio < 1.0 / self.outlier_factor

    def _advance(self, sample: ForwardPassMetrics, *, step: bool) -> int:
        key = (sample.worker_id, sample.dp_rank)
        last = self._sources.get(key)
        if last is None or sample.counter_id <= last[0]:
            seen = 0  # new source, or the counter went back: the engine restarted
        else:
            seen = last[1]
        if step:
            seen += 1
        self._sources[key] = (sample.counter_id, seen)
        return seen

    def forget(self, worker_id: str, dp_rank: int) -> None:
        self._sources.pop((worker_id, dp_rank), None)


class CoverageStore:
    """At most ``max_samples`` samples, at most ``per_bin`` per load bin; when full, the fullest bin gives up
    its oldest sample."""

    def __init__(self, role: Role, *, max_samples: int = 4096, per_bin: int = 64) -> None:
        if max_samples < 1 or per_bin < 1:
            raise ConfigError(f"need max_samples >= 1 and per_bin >= 1, got {max_samples}, {per_bin}")
        self.role = role
        self.max_samples = max_samples
        self.per_bin = per_bin
        self._bins: dict[tuple[int, ...], deque[Sample]] = {}
        self._size = 0
        self.added = 0  # ever

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[Sample]:
        for samples in self._bins.values():
            yield from samples

    @property
    def bins(self) -> int:
        return len(self._bins)

    def add(self, sample: Sample) -> None:
        key = load_bins(self.role, sample.load)
        bucket = self._bins.get(key)
        if bucket is None:
            bucket = self._bins[key] = deque()
        bucket.append(sample)
        self._size += 1
        self.added += 1
        if len(bucket) > self.per_bin:
            bucket.popleft()
            self._size -= 1
        if self._size > self.max_samples:
            fullest_key = max(self._bins, key=lambda k: (len(self._bins[k]), -self._bins[k][0].at))
            fullest = self._bins[fullest_key]
            fullest.popleft()
            self._size -= 1
            if not fullest:
                del self._bins[fullest_key]

    def clear(self) -> None:
        self._bins.clear()
        self._size = 0

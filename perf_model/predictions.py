"""Latency and capacity predictions from a step-time function: one step, ITL, TTFT of a chunked prefill
(:func:`prefill_chunks_ms`, in closed form) and the requests/s one replica sustains at the targets
(:class:`ReplicaCapacity`). :class:`StepTimePredictions` holds the arithmetic; a subclass
(:class:`~perf_model.model.PerfModel`) says which step-time function and band to use (:meth:`_require`) and the
request-path TTFT overhead."""

from __future__ import annotations

import abc
import math
from collections.abc import Callable

import msgspec

from perf_model.api import LatencyEstimate
from perf_model.errors import InvalidLoadError
from perf_model.features import StepLoad
from planner.discovery import Role

__all__ = ["ReplicaCapacity", "StepFn", "StepTimePredictions", "prefill_chunks_ms"]

StepFn = Callable[[StepLoad], float]


class ReplicaCapacity(msgspec.Struct, frozen=True, kw_only=True):
    """Requests per second one replica sustains at the targets, for requests of ``isl_tokens``/``osl_tokens``.
    ``rps`` is the figure for the model's role: prefill_rps, decode_rps, or both shares of one engine
    (agg)."""

    rps: float
    prefill_rps: float
    decode_rps: float
    decode_batch: float  # largest decode batch meeting the ITL target (and KV capacity)
    ttft_alone_ms: float  # upper TTFT of one request on an idle engine


def prefill_chunks_ms(step: StepFn, isl_tokens: float, queued_prefill_tokens: float, chunk_tokens: float) -> float:
    """Every step until the last chunk of an ``isl_tokens`` prompt queued behind ``queued_prefill_tokens`` of
    other prompts, in chunks of ``chunk_tokens``, in closed form (a constant number of ``step`` calls whatever
    the sizes: a loop per chunk never ends at 1e20 tokens, where ``1e20 + 8192 == 1e20``).

    The queue fills whole prefill-only steps (nothing cached); the prompt's first chunk shares the step with
    what is left of the queue; its full chunks read their earlier chunks, so their sum is ``full`` steps at
    the mean context, exact when the step time is linear in ``prefill_kv_tokens`` (the live fit and the
    profile timer both are); a partial last chunk follows. Absurd sizes give a huge or infinite time, never a
    hang nor NaN."""
    chunk = chunk_tokens
    total = 0.0
    full_queue_steps = math.floor(queued_prefill_tokens / chunk)
    if full_queue_steps:
        total += full_queue_steps * step((chunk, 0.0, 0.0, 0.0))
    # Rounding at huge sizes may leave the remainder just outside [0, chunk).
    queue_left = min(max(queued_prefill_tokens - full_queue_steps * chunk, 0.0), chunk)
    own = min(chunk - queue_left, isl_tokens)
    total += step((queue_left + own, 0.0, 0.0, 0.0))
    done = own
    rest = isl_tokens - done
    full = math.floor(rest / chunk) if rest > 0 else 0
    if full:
        total += full * step((chunk, done + chunk * (full - 1) / 2.0, 0.0, 0.0))
    tail = rest - full * chunk
    if tail > 0:
        total += step((tail, done + full * chunk, 0.0, 0.0))
    return total


def _load_check(*values: float) -> None:
    if not all(math.isfinite(v) and v >= 0.0 for v in values):
        raise InvalidLoadError(f"loads must be finite and non-negative, got {values}")


class StepTimePredictions(abc.ABC):
    """Predictions for engines of one ``role`` from the step-time function and band :meth:`_require` picks."""

    role: Role

    @property
    @abc.abstractmethod
    def ttft_overhead_ms(self) -> float:
        """Request-path TTFT time spent in no engine step."""

    @abc.abstractmethod
    def _require(self, *, prefill: bool, decode: bool) -> tuple[StepFn, float]:
        """The step-time function and band for a prediction involving prefill and/or decode work; raises
        :class:`~perf_model.errors.ModelNotReadyError` when there is none."""

    def predict_step_ms(
        self, prefill_tokens: float, prefill_kv_tokens: float, decode_requests: float, decode_kv_tokens: float
    ) -> LatencyEstimate:
        """Duration of one engine step with this batch."""
        _load_check(prefill_tokens, prefill_kv_tokens, decode_requests, decode_kv_tokens)
        step, band = self._require(prefill=prefill_tokens > 0, decode=decode_requests > 0)
        value = step((prefill_tokens, prefill_kv_tokens, decode_requests, decode_kv_tokens))
        return LatencyEstimate(value_ms=value, upper_ms=value * band)

    def predict_itl_ms(self, decode_requests: float, decode_kv_tokens: float) -> LatencyEstimate:
        """ITL of one engine decoding ``decode_requests`` sequences holding ``decode_kv_tokens`` in total: the
        decode-only step time (an aggregated engine's prefill chunks come on top)."""
        _load_check(decode_requests, decode_kv_tokens)
        step, band = self._require(prefill=False, decode=True)
        value = step((0.0, 0.0, max(decode_requests, 1.0), decode_kv_tokens))
        return LatencyEstimate(value_ms=value, upper_ms=value * band)

    def predict_ttft_ms(
        self, isl_tokens: float, queued_prefill_tokens: float, max_num_batched_tokens: int
    ) -> LatencyEstimate:
        """TTFT of a request of ``isl_tokens`` behind ``queued_prefill_tokens`` on one engine prefilling in
        chunks of ``max_num_batched_tokens``: the request-path overhead plus every step until its last chunk.
        Queued tokens belong to other requests (read as having nothing cached); the request's own chunks read
        its earlier chunks."""
        _load_check(isl_tokens, queued_prefill_tokens)
        if max_num_batched_tokens < 1:
            raise InvalidLoadError(f"max_num_batched_tokens must be >= 1, got {max_num_batched_tokens}")
        step, band = self._require(prefill=True, decode=False)
        total = prefill_chunks_ms(step, max(isl_tokens, 1.0), queued_prefill_tokens, float(max_num_batched_tokens))
        overhead = self.ttft_overhead_ms
        return LatencyEstimate(value_ms=overhead + total, upper_ms=overhead + total * band)

    def capacity(
        self,
        *,
        isl_tokens: float,
        osl_tokens: float,
        ttft_target_ms: float,
        itl_target_ms: float,
        max_num_batched_tokens: int,
        max_kv_tokens: float | None = None,
        max_utilization: float = 0.95,
    ) -> ReplicaCapacity:
        """Requests/s one replica sustains with every prediction's upper band within the targets.

        Decode: the largest batch B whose ITL (each sequence holding ``isl + osl/2`` tokens on average) meets
        ``itl_target_ms`` and fits ``max_kv_tokens`` (at ``isl + osl`` each); a request then occupies the
        batch for ``osl`` steps, so ``rps = B / (osl * ITL)``.
        Prefill: a request costs ``S`` of engine time: its own prefill, sharing the step floor with the other
        requests of its chunk when ``isl < max_num_batched_tokens``. Requests arriving at random wait (M/D/1)
        on average ``rho*S / (2(1-rho))``; the largest ``rho`` (at most ``max_utilization``) keeping the
        lone-request TTFT plus that wait within ``ttft_target_ms`` gives ``rps = rho / S``.
        Aggregated engines share their time between the two: ``1 / (1/prefill_rps + 1/decode_rps)``."""
        _load_check(isl_tokens, osl_tokens, ttft_target_ms, itl_target_ms)
        if not 0.0 < max_utilization < 1.0:
            raise InvalidLoadError(f"max_utilization must be in (0, 1), got {max_utilization}")
        isl = max(isl_tokens, 1.0)
        osl = max(osl_tokens, 1.0)
        prefill_rps = 0.0
        ttft_alone = self.predict_ttft_ms(isl, 0.0, max_num_batched_tokens).upper_ms
        if self.role is not Role.DECODE and ttft_alone <= ttft_target_ms:
            chunk = float(max_num_batched_tokens)
            if isl >= chunk:
                service_ms = ttft_alone - self.ttft_overhead_ms
            else:  # chunk/isl requests share one step and its floor
                floor_ms = self.predict_step_ms(1.0, 0.0, 0.0, 0.0).upper_ms
                own_ms = self.predict_step_ms(isl, 0.0, 0.0, 0.0).upper_ms
                service_ms = own_ms - floor_ms + floor_ms * isl / chunk
            wait_ms = ttft_target_ms - ttft_alone
            rho = min(max_utilization, 2.0 * wait_ms / (service_ms + 2.0 * wait_ms)) if service_ms > 0 else 0.0
            prefill_rps = rho / service_ms * 1000.0 if service_ms > 0 else 0.0
        decode_rps = 0.0
        batch = 0.0
        if self.role is not Role.PREFILL:
            ctx = isl + osl / 2.0
            limit = 1 << 20
            if max_kv_tokens is not None:
                limit = min(limit, int(max_kv_tokens // (isl + osl)))
            lo, hi = 0, limit
            while lo < hi:  # largest B in [0, limit] with ITL(B) within the target
                mid = (lo + hi + 1) // 2
                if self.predict_itl_ms(mid, mid * ctx).upper_ms <= itl_target_ms:
                    lo = mid
                else:
                    hi = mid - 1
            batch = float(lo)
            if batch > 0:
                itl = self.predict_itl_ms(batch, batch * ctx).upper_ms
                decode_rps = batch / (osl * itl / 1000.0)
        if self.role is Role.PREFILL:
            rps = prefill_rps
        elif self.role is Role.DECODE:
            rps = decode_rps
        else:
            rps = 1.0 / (1.0 / prefill_rps + 1.0 / decode_rps) if prefill_rps > 0 and decode_rps > 0 else 0.0
        return ReplicaCapacity(
            rps=rps,
            prefill_rps=prefill_rps,
            decode_rps=decode_rps,
            decode_batch=batch,
            ttft_alone_ms=ttft_alone,
        )

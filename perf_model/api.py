"""What the decision core asks of a performance model. perf_model implements it; planner.core depends only on
this protocol, so the core runs (in threshold mode) with no model at all."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import msgspec

__all__ = ["LatencyEstimate", "PerfPredictor", "StepPredictor"]


class LatencyEstimate(msgspec.Struct, frozen=True, kw_only=True):
    """A prediction with its uncertainty band: ``upper_ms`` is the value the SLA check uses (e.g. the 90th
    percentile of residuals added), ``value_ms`` the central estimate. Never negative, never NaN."""

    value_ms: float
    upper_ms: float


class PerfPredictor(Protocol):
    @property
    def ready(self) -> bool:
        """True once the model may be trusted (enough samples spanning the load range, or a bootstrap profile)."""
        ...

    def predict_ttft_ms(
        self, isl_tokens: float, queued_prefill_tokens: float, max_num_batched_tokens: int
    ) -> LatencyEstimate:
        """TTFT of a request of ``isl_tokens`` arriving behind ``queued_prefill_tokens`` on one engine that
        prefills in chunks of ``max_num_batched_tokens``."""
        ...

    def predict_itl_ms(self, decode_requests: float, decode_kv_tokens: float) -> LatencyEstimate:
        """Inter-token latency of one engine decoding ``decode_requests`` sequences holding ``decode_kv_tokens``
        tokens of KV cache in total."""
        ...


@runtime_checkable
class StepPredictor(PerfPredictor, Protocol):
    """Optional extension: a model that also predicts one engine step of any mix. The decision core uses it,
    when the predictor has it, for aggregated engines, whose steps carry prefill chunks and decodes together
    (``predict_itl_ms`` is the decode-only step, ``predict_ttft_ms`` prefill-only steps)."""

    def predict_step_ms(
        self, prefill_tokens: float, prefill_kv_tokens: float, decode_requests: float, decode_kv_tokens: float
    ) -> LatencyEstimate:
        """Duration of one engine step computing ``prefill_tokens`` prompt tokens (which attend to
        ``prefill_kv_tokens`` tokens read from cache or earlier chunks, summed) and one token for each of
        ``decode_requests`` sequences holding ``decode_kv_tokens`` tokens of KV cache in total."""
        ...

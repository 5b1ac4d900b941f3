"""What the decision core asks of a performance model. perf_model implements it; planner.core depends only on
this protocol, so the core runs (in threshold mode) with no model at all."""

from __future__ import annotations

from typing import Protocol

import msgspec

__all__ = ["LatencyEstimate", "PerfPredictor"]


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

"""A small analytic :class:`perf_model.api.PerfPredictor` for decision-core tests (a fake at the perf_model
module boundary): a prefill step costs ``prefill_base_ms + prefill_ms_per_token x tokens`` and a decode step
``decode_base_ms + decode_ms_per_request x requests + decode_ms_per_kv_token x kv_tokens``; the upper band is
``(1 + band_frac)`` times the value."""

from __future__ import annotations

import math

from perf_model.api import LatencyEstimate

__all__ = ["AnalyticPerf"]


class AnalyticPerf:
    def __init__(
        self,
        *,
        ready: bool = True,
        prefill_base_ms: float = 10.0,
        prefill_ms_per_token: float = 0.02,
        decode_base_ms: float = 8.0,
        decode_ms_per_request: float = 0.1,
        decode_ms_per_kv_token: float = 0.0001,
        band_frac: float = 0.1,
    ) -> None:
        self._ready = ready
        self.prefill_base_ms = prefill_base_ms
        self.prefill_ms_per_token = prefill_ms_per_token
        self.decode_base_ms = decode_base_ms
        self.decode_ms_per_request = decode_ms_per_request
        self.decode_ms_per_kv_token = decode_ms_per_kv_token
        self.band_frac = band_frac
        self.calls = 0

    @property
    def ready(self) -> bool:
        return self._ready

    def _estimate(self, value_ms: float) -> LatencyEstimate:
        return LatencyEstimate(value_ms=value_ms, upper_ms=value_ms * (1.0 + self.band_frac))

    def predict_ttft_ms(
        self, isl_tokens: float, queued_prefill_tokens: float, max_num_batched_tokens: int
    ) -> LatencyEstimate:
        self.calls += 1
        tokens = isl_tokens + queued_prefill_tokens
        chunks = max(math.ceil(tokens / max_num_batched_tokens), 1)
        return self._estimate(chunks * self.prefill_base_ms + tokens * self.prefill_ms_per_token)

    def predict_itl_ms(self, decode_requests: float, decode_kv_tokens: float) -> LatencyEstimate:
        self.calls += 1
        return self._estimate(
            self.decode_base_ms
            + decode_requests * self.decode_ms_per_request
            + decode_kv_tokens * self.decode_ms_per_kv_token
        )

"""Which limit a saturated aggregated engine names when the OBSERVED decode batch is already past a limit (no
rate needed): the smallest of the KV capacity, ``max_num_seqs`` and the token budget, never ``max_num_seqs`` for
a batch that only the KV cache cannot hold (the linear step model of tests/core/test_core_rows_sla.py)."""

from __future__ import annotations

import math

import pytest

from planner.core.recommend import predict_agg_latency
from tests.core.test_core_rows_sla import StepAnalytic

BASE = {"isl_tokens": 2000.0, "osl_tokens": 100.0, "kv_per_request_tokens": 1000.0, "max_num_batched_tokens": 8192}


@pytest.mark.parametrize(
    ("decode_requests", "max_num_seqs", "kv_capacity_tokens", "label"),
    [
        # 50 running, room for 256 by max_num_seqs but only 40 x 1000 KV tokens: the KV cache limits.
        (50.0, 256.0, 40_000.0, "KV capacity"),
        # KV capacity unknown (0): max_num_seqs limits.
        (50.0, 40.0, 0.0, "max_num_seqs"),
        # both known, max_num_seqs the tighter one.
        (50.0, 30.0, 40_000.0, "max_num_seqs"),
        # max_num_seqs unknown (0), KV capacity tighter than the budget.
        (50.0, 0.0, 40_000.0, "KV capacity"),
        # past the budget (8191 decodes) with both others looser: the token budget.
        (9000.0, 10_000.0, 1e9, "token budget"),
    ],
)
def test_observed_batch_past_a_limit_names_that_limit(
    decode_requests: float, max_num_seqs: float, kv_capacity_tokens: float, label: str
) -> None:
    for rate in (0.0, 5.0):
        got = predict_agg_latency(
            StepAnalytic(),
            rate_per_s=rate,
            decode_requests=decode_requests,
            max_num_seqs=max_num_seqs,
            kv_capacity_tokens=kv_capacity_tokens,
            **BASE,  # type: ignore[arg-type]
        )
        assert got.saturated == label, rate
        assert math.isinf(got.itl_ms) and got.decode_batch == decode_requests

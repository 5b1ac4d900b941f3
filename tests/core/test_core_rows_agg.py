"""``predict_agg_latency`` row by row with a linear step model (tests/core/test_core_rows_sla.py's StepAnalytic:
a step takes ``8 + 0.02 prefill + 0.000001 prefill_kv + 0.1 B + 0.0001 KV`` ms, upper band x1.1): the exact
figures without a rate (worked by hand below), the fixed point with a rate (checked against the documented
formulas), and which limit a saturated engine names."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from planner.core.recommend import AggLatency, predict_agg_latency
from tests.core.test_core_rows_sla import StepAnalytic

BAND = 1.1


def step_ms(prefill: float, prefill_kv: float, batch: float, kv_per: float) -> float:
    return BAND * (8 + 0.02 * prefill + 0.000001 * prefill_kv + 0.1 * batch + 0.0001 * batch * kv_per)


@dataclass
class Row:
    name: str
    kwargs: dict[str, float]
    expected: AggLatency


BASE = {"isl_tokens": 2000.0, "osl_tokens": 100.0, "kv_per_request_tokens": 1000.0, "max_num_batched_tokens": 8192}
INF = math.inf

ROWS = [
    Row(
        "no rate, 10 decoding, 500 prefill tokens scheduled: ITL is that step, 1.1 x (8 + 1 + 1 + 10)",
        {**BASE, "rate_per_s": 0.0, "decode_requests": 10.0, "scheduled_prefill_tokens": 500.0},
        # prompt: one chunk of 2000 with 10 decodes, 1.1 x 50; TTFT 1.1 x (10 + 40) + one step's decode share 2.2
        AggLatency(itl_ms=22.0, ttft_ms=57.2, decode_batch=10.0, prefill_busy_frac=0.0, prompt_prefill_ms=55.0),
    ),
    Row(
        "no rate, nothing decoding: no ITL to miss (0), the prompt alone",
        {**BASE, "rate_per_s": 0.0},
        AggLatency(itl_ms=0.0, ttft_ms=55.0, decode_batch=0.0, prefill_busy_frac=0.0, prompt_prefill_ms=52.8),
    ),
    Row(
        "a 20k prompt: two full chunks (the second reads 8192 earlier tokens: 4096 on average) and 3616 more",
        {**BASE, "isl_tokens": 20_000.0, "rate_per_s": 0.0},
        AggLatency(
            itl_ms=0.0,
            ttft_ms=BAND * (3 * 10 + 400),
            decode_batch=0.0,
            prefill_busy_frac=0.0,
            prompt_prefill_ms=2 * step_ms(8192, 4096, 0, 0) + step_ms(3616, 16384, 0, 0),
        ),
    ),
    Row(
        "queued prefill tokens wait ahead of the prompt (no rate)",
        {**BASE, "rate_per_s": 0.0, "queued_prefill_tokens": 6000.0},
        AggLatency(
            itl_ms=0.0, ttft_ms=BAND * (10 + 160), decode_batch=0.0, prefill_busy_frac=0.0, prompt_prefill_ms=52.8
        ),
    ),
    Row(
        "more running than max_num_seqs: saturated, named max_num_seqs",
        {**BASE, "rate_per_s": 0.0, "decode_requests": 300.0, "max_num_seqs": 256.0},
        AggLatency(
            itl_ms=INF,
            ttft_ms=INF,
            decode_batch=300.0,
            prefill_busy_frac=1.0,
            prompt_prefill_ms=INF,
            saturated="max_num_seqs",
        ),
    ),
    Row(
        "exactly budget - 1 running over a smaller max_num_seqs is still named max_num_seqs",
        {**BASE, "rate_per_s": 0.0, "decode_requests": 8191.0, "max_num_seqs": 100.0},
        AggLatency(
            itl_ms=INF,
            ttft_ms=INF,
            decode_batch=8191.0,
            prefill_busy_frac=1.0,
            prompt_prefill_ms=INF,
            saturated="max_num_seqs",
        ),
    ),
    Row(
        "more running than the token budget allows: named token budget",
        {**BASE, "rate_per_s": 0.0, "decode_requests": 9000.0},
        AggLatency(
            itl_ms=INF,
            ttft_ms=INF,
            decode_batch=9000.0,
            prefill_busy_frac=1.0,
            prompt_prefill_ms=INF,
            saturated="token budget",
        ),
    ),
    Row(
        "prefill alone fills the engine's time: engine time",
        {**BASE, "isl_tokens": 20_000.0, "rate_per_s": 100.0},
        AggLatency(
            itl_ms=INF,
            ttft_ms=INF,
            decode_batch=0.0,
            prefill_busy_frac=1.0,
            prompt_prefill_ms=INF,
            saturated="engine time",
        ),
    ),
    Row(
        "Little's law past max_num_seqs (4): named max_num_seqs, the batch at its limit",
        {**BASE, "rate_per_s": 10.0, "osl_tokens": 1000.0, "max_num_seqs": 4.0},
        AggLatency(
            itl_ms=INF,
            ttft_ms=INF,
            decode_batch=4.0,
            prefill_busy_frac=1.0,
            prompt_prefill_ms=INF,
            saturated="max_num_seqs",
        ),
    ),
    Row(
        "Little's law past the KV capacity (3 sequences of 1000): named KV capacity",
        {**BASE, "rate_per_s": 10.0, "osl_tokens": 1000.0, "max_num_seqs": 256.0, "kv_capacity_tokens": 3000.0},
        AggLatency(
            itl_ms=INF,
            ttft_ms=INF,
            decode_batch=3.0,
            prefill_busy_frac=1.0,
            prompt_prefill_ms=INF,
            saturated="KV capacity",
        ),
    ),
    Row(
        "Little's law past a KV capacity of 3 one-token sequences: named KV capacity",
        {**BASE, "rate_per_s": 10.0, "osl_tokens": 1000.0, "kv_per_request_tokens": 1.0, "kv_capacity_tokens": 3.0},
        AggLatency(
            itl_ms=INF,
            ttft_ms=INF,
            decode_batch=3.0,
            prefill_busy_frac=1.0,
            prompt_prefill_ms=INF,
            saturated="KV capacity",
        ),
    ),
    Row(
        "Little's law past a 4-token budget (3 decodes): named token budget",
        {**BASE, "isl_tokens": 2.0, "rate_per_s": 10.0, "osl_tokens": 1000.0, "max_num_batched_tokens": 4},
        AggLatency(
            itl_ms=INF,
            ttft_ms=INF,
            decode_batch=3.0,
            prefill_busy_frac=1.0,
            prompt_prefill_ms=INF,
            saturated="token budget",
        ),
    ),
    Row(
        "a non-finite input is refused as such",
        {**BASE, "rate_per_s": math.nan},
        AggLatency(
            itl_ms=INF,
            ttft_ms=INF,
            decode_batch=0.0,
            prefill_busy_frac=1.0,
            prompt_prefill_ms=INF,
            saturated="non-finite input",
        ),
    ),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_predict_agg_latency(row: Row) -> None:
    got = predict_agg_latency(StepAnalytic(), **row.kwargs)  # type: ignore[arg-type]
    want = row.expected
    assert got.saturated == want.saturated
    for name in ("itl_ms", "ttft_ms", "decode_batch", "prefill_busy_frac", "prompt_prefill_ms"):
        assert getattr(got, name) == pytest.approx(getattr(want, name), rel=1e-9), name


@pytest.mark.parametrize(("rate", "observed"), [(2.0, 0.0), (5.0, 0.0), (5.0, 40.0), (1.0, 0.0)])
def test_with_a_rate_the_itl_is_the_documented_fixed_point(rate: float, observed: float) -> None:
    """ITL = 1000 / (rate k + (1000 - rate S) / T_d) at B = max(observed, rate x OSL x ITL / 1000); S and k: the
    prompt's chunk steps with B decodes riding along; TTFT behind the M/D/1 queue of prompts at rate x S."""
    isl, osl, kv_per = 3000.0, 200.0, 1500.0
    got = predict_agg_latency(
        StepAnalytic(),
        rate_per_s=rate,
        isl_tokens=isl,
        osl_tokens=osl,
        kv_per_request_tokens=kv_per,
        max_num_batched_tokens=2048,
        decode_requests=observed,
    )
    assert got.saturated == ""
    batch = max(observed, rate * osl * got.itl_ms / 1000.0)
    assert got.decode_batch == pytest.approx(batch, rel=1e-9)
    chunk = 2048 - batch
    full = math.floor(isl / chunk)
    rest = isl - full * chunk
    prompt_ms = full * step_ms(chunk, chunk * (full - 1) / 2, batch, kv_per) + step_ms(
        rest, full * chunk, batch, kv_per
    )
    steps = full + 1
    assert got.prompt_prefill_ms == pytest.approx(prompt_ms, rel=1e-9)
    assert got.prefill_busy_frac == pytest.approx(rate * prompt_ms / 1000.0, rel=1e-9)
    decode_only_ms = step_ms(0, 0, max(batch, 1.0), kv_per)
    itl = 1000.0 / (rate * steps + (1000.0 - rate * prompt_ms) / decode_only_ms)
    assert got.itl_ms == pytest.approx(itl, abs=0.05)  # the bisection stops within 0.01 ms of the fixed point
    busy = rate * prompt_ms / 1000.0
    backlog = isl * busy * busy / (2.0 * (1.0 - busy))
    ttft = BAND * (math.ceil((isl + backlog) / int(chunk)) * 10 + 0.02 * (isl + backlog))
    ttft += math.ceil((backlog + isl) / chunk - 1e-9) * (
        step_ms(chunk, (isl - chunk) / 2, batch, kv_per) - step_ms(chunk, (isl - chunk) / 2, 0, kv_per)
    )
    assert got.ttft_ms == pytest.approx(ttft, rel=1e-6)

"""The pure step-numbers -> FPM function: classification, sums, variances, queues."""

from __future__ import annotations

import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from worker_shim.fpm import QueuedRequests, ScheduledRequests
from worker_shim.metrics import population_variance, queued_requests, scheduled_requests


@pytest.mark.parametrize(
    ("name", "entries", "expected"),
    [
        ("nothing scheduled", [], ScheduledRequests()),
        (
            "one fresh prompt is a prefill of its whole length",
            [(128, 0, 128)],
            ScheduledRequests(num_prefill_requests=1, sum_prefill_tokens=128),
        ),
        (
            "a later chunk reads the earlier chunks as KV",
            [(96, 32, 128)],
            ScheduledRequests(num_prefill_requests=1, sum_prefill_tokens=96, sum_prefill_kv_tokens=32),
        ),
        (
            "three equal prompts have zero length variance",
            [(96, 32, 128)] * 3,
            ScheduledRequests(num_prefill_requests=3, sum_prefill_tokens=288, sum_prefill_kv_tokens=96),
        ),
        (
            "decodes count their context as KV",
            [(1, 16, 10), (1, 20, 10)],
            ScheduledRequests(num_decode_requests=2, sum_decode_kv_tokens=36, var_decode_kv_tokens=4.0),
        ),
        (
            "mixed batch: prompt lengths 40 and 24, one decode",
            [(40, 0, 40), (24, 0, 24), (1, 33, 33)],
            ScheduledRequests(
                num_prefill_requests=2,
                sum_prefill_tokens=64,
                var_prefill_length=64.0,
                num_decode_requests=1,
                sum_decode_kv_tokens=33,
            ),
        ),
        (
            "a request resumed after preemption recomputes as a prefill",
            [(50, 0, 30)],
            ScheduledRequests(num_prefill_requests=1, sum_prefill_tokens=50),
        ),
    ],
)
def test_scheduled_requests(name: str, entries: list[tuple[int, int, int]], expected: ScheduledRequests) -> None:
    assert scheduled_requests(entries) == expected, name


@pytest.mark.parametrize(
    ("name", "entries", "expected"),
    [
        ("empty queue", [], QueuedRequests()),
        (
            "waiting prompts are queued prefills of what is left to compute",
            [(100, 0, False), (200, 50, False)],
            QueuedRequests(num_prefill_requests=2, sum_prefill_tokens=250, var_prefill_length=625.0),
        ),
        (
            "preempted or remote-KV requests are queued decodes",
            [(512, 0, True), (1000, 1000, True), (64, 0, False)],
            QueuedRequests(num_prefill_requests=1, sum_prefill_tokens=64, num_decode_requests=2),
        ),
    ],
)
def test_queued_requests(name: str, entries: list[tuple[int, int, bool]], expected: QueuedRequests) -> None:
    assert queued_requests(entries) == expected, name


_entry = st.tuples(st.integers(1, 4096), st.integers(0, 100_000), st.integers(1, 100_000))


@given(st.lists(_entry, max_size=64))
def test_scheduled_requests_agrees_with_a_direct_computation(entries: list[tuple[int, int, int]]) -> None:
    prefill = [e for e in entries if e[1] < e[2]]
    decode = [e for e in entries if e[1] >= e[2]]
    got = scheduled_requests(entries)
    assert got.num_prefill_requests + got.num_decode_requests == len(entries)
    assert got.sum_prefill_tokens == sum(e[0] for e in prefill)
    assert got.sum_prefill_kv_tokens == sum(e[1] for e in prefill)
    assert got.sum_decode_kv_tokens == sum(e[1] for e in decode)
    lengths = [e[2] for e in prefill]
    contexts = [e[1] for e in decode]
    assert got.var_prefill_length == pytest.approx(statistics.pvariance(lengths) if len(lengths) > 1 else 0.0)
    assert got.var_decode_kv_tokens == pytest.approx(statistics.pvariance(contexts) if len(contexts) > 1 else 0.0)
    assert got.var_prefill_length >= 0 and got.var_decode_kv_tokens >= 0


@given(st.lists(st.integers(0, 10**9), max_size=50))
def test_population_variance_is_exact_and_never_negative(values: list[int]) -> None:
    var = population_variance(len(values), sum(values), sum(v * v for v in values))
    assert var >= 0.0
    assert var == pytest.approx(statistics.pvariance(values) if len(values) > 1 else 0.0, rel=1e-9)

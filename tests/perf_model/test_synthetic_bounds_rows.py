"""Rows for the validation workload's bounds (issue 15, the survivors of perf_model/synthetic.py): prefill never
exceeds the token budget, decode batches respect ``max_batch``, the aggregated decode part spans up to half the
token budget, an absent part carries no tokens, cold steps span 5x..50x, the default worker ids, and the number of
prefill requests a step schedules. (tests/perf_model/test_synthetic_rows.py has the ranges of the default draws.)"""

from __future__ import annotations

import numpy as np
import pytest

from perf_model.step_timer import ProfileStepTimer
from perf_model.synthetic import synthetic_loads, timed_samples
from planner.discovery import Role


def test_prefill_stays_within_the_smallest_token_budget() -> None:
    loads = synthetic_loads(Role.PREFILL, 2000, np.random.default_rng(11), max_num_batched_tokens=16)
    assert {p for p, _, _, _ in loads} == {16.0}  # every chunk, full or partial, is the 16-token budget


def test_prefill_draws_span_their_ranges_at_both_ends() -> None:
    loads = synthetic_loads(Role.PREFILL, 20_000, np.random.default_rng(8), max_num_batched_tokens=4096)
    partial = [(p, pkv) for p, pkv, _, _ in loads if p != 4096]
    tokens = [p for p, _ in partial]
    cached = [pkv for _, pkv in partial if pkv > 0]
    assert min(tokens) == 16 and max(tokens) >= 4000  # 16 .. the chunk
    assert min(cached) == 16 and max(cached) >= 16_000  # 16 .. 16k cached tokens


@pytest.mark.parametrize("max_kv_tokens", [945029.0, 16384.0])
def test_decode_batches_of_one_when_max_batch_is_one(max_kv_tokens: float) -> None:
    loads = synthetic_loads(Role.DECODE, 2000, np.random.default_rng(12), max_batch=1, max_kv_tokens=max_kv_tokens)
    assert {b for _, _, b, _ in loads} == {1.0}
    assert all(128 <= k <= 16384 for _, _, _, k in loads)  # one sequence: its context


def test_aggregated_decode_batches_reach_half_the_token_budget() -> None:
    loads = synthetic_loads(Role.AGG, 3000, np.random.default_rng(3), max_num_batched_tokens=2048)
    batches = [b for _, _, b, _ in loads]
    assert max(batches) <= 1024
    assert max(batches) >= 0.9 * 1024  # the range up to half the budget is spanned


@pytest.mark.parametrize("role", list(Role))
def test_an_absent_part_carries_no_tokens(role: Role) -> None:
    loads = synthetic_loads(role, 3000, np.random.default_rng(13), max_num_batched_tokens=2048)
    assert len(loads) == 3000
    assert all(k == 0 for _, _, b, k in loads if b == 0)  # no decode requests: no decode KV tokens
    assert all(pkv == 0 for p, pkv, _, _ in loads if p == 0)  # no prefill tokens: no cached prefill tokens
    if role is Role.AGG:
        assert any(b == 0 for _, _, b, _ in loads) and any(p == 0 for p, _, _, _ in loads)


def test_cold_steps_span_5x_to_50x(h200_timer: ProfileStepTimer) -> None:
    loads = synthetic_loads(Role.DECODE, 2000, np.random.default_rng(14))
    samples = timed_samples(
        h200_timer, loads, np.random.default_rng(15), noise_frac=0.0, outlier_frac=0.0, cold_steps=2000, engines=1
    )
    ratios = [s.wall_time / h200_timer.step_time_s(*load) for s, load in zip(samples, loads, strict=True)]
    assert len(ratios) == 2000
    assert all(5.0 <= r <= 50.0 for r in ratios)
    assert min(ratios) < 5.5 and max(ratios) > 45.0  # the whole 5x..50x range


def test_default_engines_and_worker_ids(h200_timer: ProfileStepTimer) -> None:
    loads = synthetic_loads(Role.DECODE, 8, np.random.default_rng(16))
    samples = timed_samples(h200_timer, loads, np.random.default_rng(17))
    assert [(s.worker_id, s.counter_id) for s in samples] == [
        ("w0", 1),
        ("w1", 1),
        ("w2", 1),
        ("w3", 1),
        ("w0", 2),
        ("w1", 2),
        ("w2", 2),
        ("w3", 2),
    ]


@pytest.mark.parametrize("role", [Role.PREFILL, Role.AGG])
def test_a_step_with_prefill_tokens_schedules_one_prefill_request(h200_timer: ProfileStepTimer, role: Role) -> None:
    loads = synthetic_loads(role, 400, np.random.default_rng(18))
    samples = timed_samples(h200_timer, loads, np.random.default_rng(19))
    counts = [s.scheduled_requests.num_prefill_requests for s in samples]
    assert counts == [1 if p > 0 else 0 for p, _, _, _ in loads]
    assert 1 in counts


def test_aggregated_steps_stay_within_the_smallest_token_budget() -> None:
    # The decode part may take up to half of a 16-token budget, leaving the prefill part fewer than 16 tokens.
    loads = synthetic_loads(Role.AGG, 2000, np.random.default_rng(16), max_num_batched_tokens=16)
    prefill_and_decode = [(p, b) for p, _, b, _ in loads if p > 0 and b > 0]
    assert len(prefill_and_decode) > 100
    assert all(1 <= p and p + b <= 16 for p, b in prefill_and_decode)

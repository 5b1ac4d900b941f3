"""The validation workload keeps to what its docstring promises, checked over a few thousand draws per role:
load ranges per role, the token budget, round-robin engines with their own counters, cold steps 5x..50x, and
exact profile timing when noise and outliers are off."""

from __future__ import annotations

import numpy as np
import pytest

from perf_model.step_timer import ProfileStepTimer
from perf_model.synthetic import synthetic_loads, timed_samples
from planner.discovery import Role

N = 3000


def test_prefill_loads() -> None:
    loads = synthetic_loads(Role.PREFILL, N, np.random.default_rng(1), max_num_batched_tokens=4096)
    assert len(loads) == 3000
    full = [pkv for p, pkv, _, _ in loads if p == 4096]
    assert full and {pkv for pkv in full} <= {0.0, 4096.0, 8192.0, 12288.0}
    assert len({pkv for pkv in full}) == 4  # 0..3 earlier chunks, all drawn
    partial = [(p, pkv) for p, pkv, _, _ in loads if p != 4096]
    assert partial and all(16 <= p <= 4096 and p == round(p) for p, _ in partial)
    assert all(pkv == 0 or 16 <= pkv <= 16384 for _, pkv in partial)
    assert 0.4 < sum(1 for _, pkv in partial if pkv == 0) / len(partial) < 0.8  # 60 % read nothing cached
    assert 0.3 < len(full) / N < 0.5  # 40 % full chunks
    assert all(b == 0 and k == 0 for _, _, b, k in loads)


def test_decode_loads() -> None:
    loads = synthetic_loads(Role.DECODE, N, np.random.default_rng(2), max_batch=64, max_kv_tokens=200_000)
    assert len(loads) == 3000 and all(p == 0 and pkv == 0 for p, pkv, _, _ in loads)
    batches = [b for _, _, b, _ in loads]
    assert batches and min(batches) == 1 and max(batches) <= 64 and all(b == round(b) for b in batches)
    contexts = [k / b for _, _, b, k in loads]
    assert min(contexts) >= 127 and max(contexts) <= 16_400
    assert all(k <= 200_000 + k / b for _, _, b, k in loads)  # within the KV capacity (one context of rounding)
    assert max(batches) >= 48  # the range is spanned


def test_aggregated_loads_stay_within_the_token_budget() -> None:
    loads = synthetic_loads(Role.AGG, N, np.random.default_rng(3), max_num_batched_tokens=2048)
    assert len(loads) == 3000
    assert all(p + b <= 2048 for p, _, b, _ in loads)
    assert all(b <= 1024 for _, _, b, _ in loads)
    decode_only = sum(1 for p, _, b, _ in loads if p == 0 and b > 0) / N
    prefill_only = sum(1 for p, _, b, _ in loads if b == 0) / N
    assert 0.2 < decode_only < 0.45 and 0.08 < prefill_only < 0.25
    assert all(p > 0 or b > 0 for p, _, b, _ in loads)


def test_timed_samples_round_robin_with_cold_starts(h200_timer: ProfileStepTimer) -> None:
    loads = synthetic_loads(Role.DECODE, 40, np.random.default_rng(4))
    samples = timed_samples(
        h200_timer,
        loads,
        np.random.default_rng(5),
        noise_frac=0.0,
        outlier_frac=0.0,
        cold_steps=3,
        engines=4,
        worker_prefix="e",
    )
    assert len(samples) == 40
    for i, (sample, (p, pkv, b, k)) in enumerate(zip(samples, loads, strict=True)):
        assert (sample.worker_id, sample.dp_rank, sample.counter_id) == (f"e{i % 4}", 0, i // 4 + 1)
        sched = sample.scheduled_requests
        assert (sched.sum_prefill_tokens, sched.sum_prefill_kv_tokens) == (p, pkv)
        assert (sched.num_decode_requests, sched.sum_decode_kv_tokens) == (b, k)
        assert sched.num_prefill_requests == (1 if p > 0 else 0)
        exact = h200_timer.step_time_s(p, pkv, b, k)
        if i // 4 < 3:
            assert 5.0 * exact <= sample.wall_time <= 50.0 * exact
        else:
            assert sample.wall_time == pytest.approx(exact, rel=1e-12)


def test_outliers_and_noise_are_bounded(h200_timer: ProfileStepTimer) -> None:
    loads = synthetic_loads(Role.DECODE, 2000, np.random.default_rng(6))
    samples = timed_samples(h200_timer, loads, np.random.default_rng(7), noise_frac=0.0, outlier_frac=0.2, cold_steps=0)
    ratios = [s.wall_time / h200_timer.step_time_s(*load) for s, load in zip(samples, loads, strict=True)]
    slow = [r for r in ratios if r > 1.0 + 1e-9]
    assert slow and all(1.5 <= r <= 4.0 for r in slow)
    assert 0.15 < len(slow) / len(ratios) < 0.25
    noisy = timed_samples(h200_timer, loads, np.random.default_rng(7), noise_frac=0.02, outlier_frac=0.0, cold_steps=0)
    spread = np.log([s.wall_time / h200_timer.step_time_s(*load) for s, load in zip(noisy, loads, strict=True)])
    assert 0.015 < float(np.std(spread)) < 0.025

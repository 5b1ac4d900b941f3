"""A validation workload: FPM samples of engine steps timed by a
:class:`~perf_model.step_timer.ProfileStepTimer`, with the noise a real fleet shows. Used by the perf-model
benchmark and tests; deterministic for a seed.

What a real engine's stream looks like, and what this produces:

- step loads spread over the engine's range: decode batches of 1..``max_batch`` sequences with contexts of
  128..16k tokens (within the KV capacity), prefill chunks up to ``max_num_batched_tokens`` reading 0..3
  earlier chunks, and (aggregated engines) both in one step within the token budget;
- multiplicative jitter (log-normal, ``noise_frac``), a few slow steps (``outlier_frac``: host stalls, GC,
  preemption; 1.5x..4x), and the first ``cold_steps`` steps of every engine 5x..50x slower (CUDA-graph
  capture, compilation).
"""

from __future__ import annotations

import math

import numpy as np

from perf_model.features import StepLoad
from perf_model.step_timer import ProfileStepTimer
from planner.discovery import Role
from worker_shim.fpm import ForwardPassMetrics, ScheduledRequests

__all__ = ["synthetic_loads", "timed_samples"]


def _log_uniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def _prefill_part(rng: np.random.Generator, budget: float) -> tuple[float, float]:
    """(tokens, cached tokens) of the prefill work in one step with ``budget`` tokens."""
    if rng.random() < 0.4:  # a full chunk of a long prompt, after 0..3 earlier chunks
        return budget, float(rng.integers(0, 4)) * budget
    tokens = float(round(_log_uniform(rng, min(16.0, budget), budget)))  # an aggregated step may leave < 16
    cached = 0.0 if rng.random() < 0.6 else float(round(_log_uniform(rng, 16.0, 16384.0)))
    return tokens, cached


def _decode_part(rng: np.random.Generator, max_batch: int, max_kv_tokens: float) -> tuple[float, float]:
    ctx = _log_uniform(rng, 128.0, 16384.0)
    top = max(1.0, min(float(max_batch), max_kv_tokens / ctx))
    batch = float(max(1, round(_log_uniform(rng, 1.0, top + 0.5))))
    return batch, float(round(batch * ctx))


def synthetic_loads(
    role: Role,
    n: int,
    rng: np.random.Generator,
    *,
    max_num_batched_tokens: int = 8192,
    max_batch: int = 1024,
    max_kv_tokens: float = 945029.0,
) -> list[StepLoad]:
    """``n`` step loads an engine of ``role`` would run."""
    loads: list[StepLoad] = []
    chunk = float(max_num_batched_tokens)
    while len(loads) < n:
        if role is Role.PREFILL:
            p, pkv = _prefill_part(rng, chunk)
            loads.append((p, pkv, 0.0, 0.0))
        elif role is Role.DECODE:
            b, k = _decode_part(rng, max_batch, max_kv_tokens)
            loads.append((0.0, 0.0, b, k))
        else:
            b, k = _decode_part(rng, min(max_batch, max_num_batched_tokens // 2), max_kv_tokens)
            if rng.random() < 0.15:
                b, k = 0.0, 0.0
            p, pkv = (0.0, 0.0) if (b > 0 and rng.random() < 0.4) else _prefill_part(rng, chunk - b)
            loads.append((p, pkv, b, k))
    return loads


def timed_samples(
    timer: ProfileStepTimer,
    loads: list[StepLoad],
    rng: np.random.Generator,
    *,
    noise_frac: float = 0.02,
    outlier_frac: float = 0.01,
    cold_steps: int = 8,
    engines: int = 4,
    worker_prefix: str = "w",
) -> list[ForwardPassMetrics]:
    """FPM samples for ``loads`` spread round-robin over ``engines`` engines, timed by ``timer`` with
    noise."""
    out: list[ForwardPassMetrics] = []
    counters = [0] * engines
    for i, (p, pkv, b, k) in enumerate(loads):
        engine = i % engines
        counters[engine] += 1
        wall_s = timer.step_time_s(p, pkv, b, k) * math.exp(rng.normal(0.0, noise_frac))
        if counters[engine] <= cold_steps:
            wall_s *= rng.uniform(5.0, 50.0)
        elif rng.random() < outlier_frac:
            wall_s *= rng.uniform(1.5, 4.0)
        out.append(
            ForwardPassMetrics(
                worker_id=f"{worker_prefix}{engine}",
                dp_rank=0,
                counter_id=counters[engine],
                wall_time=wall_s,
                scheduled_requests=ScheduledRequests(
                    num_prefill_requests=1 if p > 0 else 0,
                    sum_prefill_tokens=int(p),
                    sum_prefill_kv_tokens=int(pkv),
                    num_decode_requests=int(b),
                    sum_decode_kv_tokens=int(k),
                ),
            )
        )
    return out

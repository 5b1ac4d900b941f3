"""The simulated engine against hand-computed schedules: chunked-prefill budget, max_num_seqs, KV preemption,
prefix caching, and FPM fields equal to what the step computed."""

from __future__ import annotations

import pytest

from planner.errors import ConfigError
from planner.sim.engine import EngineConfig, SimEngine, SimRequest
from planner.sim.timing import ProfileFitTimer
from worker_shim.fpm import QueuedRequests, ScheduledRequests

# A linear timer with round coefficients: 10 ms per step + 0.1 ms per prefill token + 1 ms per decode request.
TIMER = ProfileFitTimer(base_s=0.010, a_p=0.0001, a_attn=0.0, a_d=0.001, a_kv=0.0)

Sample = tuple[float, ScheduledRequests, QueuedRequests, float]


def make(config: EngineConfig) -> tuple[SimEngine, list[Sample]]:
    samples: list[Sample] = []

    def sink(engine: SimEngine, wall: float, sched: ScheduledRequests, queued: QueuedRequests, end: float) -> None:
        samples.append((wall, sched, queued, end))

    return SimEngine("w0", config, TIMER, sink=sink), samples


def run(engine: SimEngine, now: float = 0.0) -> list[SimRequest]:
    done: list[SimRequest] = []
    for _ in range(10_000):
        end = engine.begin_step(now)
        if end is None:
            return done
        done += engine.end_step(end)
        now = end
    raise AssertionError("engine did not drain")


def test_chunked_prefill_splits_the_token_budget_in_admission_order() -> None:
    engine, samples = make(EngineConfig(max_num_batched_tokens=100, prefix_cache=False))
    engine.add(SimRequest(0, 0.0, 150, 1))
    engine.add(SimRequest(1, 0.0, 150, 1))
    run(engine)
    sched = [s[1] for s in samples]
    # step 1: 100 tokens of r0; step 2: r0's last 50 (reading its first 100) + 50 of r1; step 3: r1's last 100.
    assert [(s.num_prefill_requests, s.sum_prefill_tokens, s.sum_prefill_kv_tokens) for s in sched] == [
        (1, 100, 0),
        (2, 100, 100),
        (1, 100, 50),
    ]
    assert [q.num_prefill_requests for _, _, q, _ in samples] == [1, 0, 0]
    assert samples[0][2].sum_prefill_tokens == 150
    # step time = 10 ms + 0.1 ms x 100 tokens = 20 ms each; wall_time in the sample is what the step took
    assert [round(s[0], 9) for s in samples] == [0.02, 0.02, 0.02]
    assert [round(s[3], 9) for s in samples] == [0.02, 0.04, 0.06]


def test_decode_tokens_count_against_the_budget_and_fpm_reports_decode_kv() -> None:
    engine, samples = make(EngineConfig(max_num_batched_tokens=100, prefix_cache=False))
    engine.add(SimRequest(0, 0.0, 50, 3))
    engine.add(SimRequest(1, 0.0, 150, 2))
    done = run(engine)
    rows = [
        (s.num_prefill_requests, s.sum_prefill_tokens, s.num_decode_requests, s.sum_decode_kv_tokens)
        for _, s, _, _ in samples
    ]
    # step 1: r0 50 + r1 50 (budget 100); r0 emits its first token.
    # step 2: r0 decodes (KV 51) and takes 1 token of the budget, so r1 gets 99 of its remaining 100.
    # step 3: r0 decodes (KV 52, its 3rd token: done); r1 its last token of prompt (first output token).
    # step 4: r1 decodes (KV 151, its 2nd token: done).
    assert rows == [(2, 100, 0, 0), (1, 99, 1, 51), (1, 1, 1, 52), (0, 0, 1, 151)]
    assert sorted(r.rid for r in done) == [0, 1]
    assert engine.kv_used_tokens == 0
    assert engine.outstanding_tokens == 0
    r0 = next(r for r in done if r.rid == 0)
    step = [s[0] for s in samples]
    assert step[0] == pytest.approx(0.010 + 0.0001 * 100)
    assert step[1] == pytest.approx(0.010 + 0.0001 * 99 + 0.001)
    assert r0.ttft_s == pytest.approx(step[0])
    assert r0.finish_s == pytest.approx(step[0] + step[1] + step[2])
    assert r0.itl_s == pytest.approx((step[1] + step[2]) / 2)


def test_decode_kv_variance_is_over_the_batch() -> None:
    engine, samples = make(EngineConfig(max_num_batched_tokens=1000, prefix_cache=False))
    engine.add(SimRequest(0, 0.0, 50, 3))
    engine.add(SimRequest(1, 0.0, 120, 3))
    run(engine)
    # both prefilled in step 1; step 2 decodes KV 51 and 121: mean 86, variance 35^2
    _, sched, _, _ = samples[1]
    assert (sched.num_decode_requests, sched.sum_decode_kv_tokens) == (2, 172)
    assert sched.var_decode_kv_tokens == pytest.approx(35.0**2)


def test_max_num_seqs_keeps_later_requests_waiting() -> None:
    engine, samples = make(EngineConfig(max_num_batched_tokens=1000, max_num_seqs=2, prefix_cache=False))
    for i in range(3):
        engine.add(SimRequest(i, 0.0, 10, 5))
    engine.begin_step(0.0)
    assert len(engine.running) == 2
    assert [r.rid for r in engine.waiting] == [2]
    engine.end_step(1.0)
    _, sched, queued, _ = samples[0]
    assert sched.num_prefill_requests == 2
    assert queued.num_prefill_requests == 1
    assert queued.sum_prefill_tokens == 10


def test_kv_full_preempts_the_latest_request_and_recomputes_it() -> None:
    # 2 requests of 40 prompt tokens each; 90 tokens of KV: both prefill (80), then decode grows past 90.
    engine, samples = make(EngineConfig(max_num_batched_tokens=1000, kv_capacity_tokens=90, prefix_cache=False))
    engine.add(SimRequest(0, 0.0, 40, 10))
    engine.add(SimRequest(1, 0.0, 40, 10))
    done = run(engine)
    assert engine.preemptions >= 1
    victim = next(r for r in done if r.rid == 1)
    assert victim.preemptions >= 1
    assert next(r for r in done if r.rid == 0).preemptions == 0
    # the preempted request shows up as a queued decode request while it waits for KV
    assert any(q.num_decode_requests == 1 for _, _, q, _ in samples)
    assert sorted(r.rid for r in done) == [0, 1]
    assert engine.kv_used_tokens == 0
    assert engine.outstanding_tokens == 0
    for _, sched, _, _ in samples:
        assert sched.sum_decode_kv_tokens + sched.sum_prefill_kv_tokens + sched.sum_prefill_tokens <= 90


def test_preempted_request_recomputes_prompt_plus_generated_tokens() -> None:
    engine, samples = make(EngineConfig(max_num_batched_tokens=1000, kv_capacity_tokens=90, prefix_cache=False))
    engine.add(SimRequest(0, 0.0, 40, 10))
    engine.add(SimRequest(1, 0.0, 40, 10))
    run(engine)
    # the recompute prefill of r1 is prompt (40) + the tokens it had generated when it was evicted
    recompute = [s.sum_prefill_tokens for _, s, _, _ in samples[1:] if s.num_prefill_requests]
    assert recompute and all(t > 40 for t in recompute)


def test_prefix_cache_hits_skip_cached_blocks() -> None:
    engine, samples = make(EngineConfig(max_num_batched_tokens=10_000, block_size_tokens=16))
    engine.add(SimRequest(0, 0.0, 64, 1, hash_ids=(1, 2, 3, 4)))
    run(engine)
    engine.add(SimRequest(1, 1.0, 64, 1, hash_ids=(1, 2, 9, 10)))
    run(engine, 1.0)
    second = samples[-1][1]
    assert second.sum_prefill_tokens == 64 - 32  # two leading 16-token blocks cached
    assert second.sum_prefill_kv_tokens == 32


def test_bad_engine_config_is_refused() -> None:
    with pytest.raises(ConfigError):
        EngineConfig(max_num_seqs=0)

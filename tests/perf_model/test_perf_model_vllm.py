"""The perf model fed by a real vLLM CPU engine (tiny random-weight Llama, no download, DP=1) through the shim
and the planner's ingest (FpmSubscriber + FleetStore): it becomes ready on live samples alone and predicts
latencies that grow with load."""

from __future__ import annotations

import math
import time

import pytest

from perf_model.model import ModelSource, PerfModel
from perf_model.samples import SampleVerdict
from planner.discovery import Role, WorkerRecord
from planner.ingest.store import FleetStore
from planner.ingest.subscriber import FpmSubscriber
from tests.fakes.tiny_vllm import FpmCollector, TinyEngine

pytestmark = pytest.mark.vllm


def _prompts(count: int, length: int, salt: int) -> list[list[int]]:
    return [[(11 * i + 3 * j + salt) % 1000 + 3 for j in range(length + 7 * i)] for i in range(count)]


def test_live_vllm_samples_make_the_model_ready_and_monotone(shared_engine: tuple[TinyEngine, FpmCollector]) -> None:
    engine, _ = shared_engine  # the suite's shared DP=1 engine (tests/conftest.py); vLLM is imported by it alone
    worker = engine.worker_id
    assert worker is not None
    store = FleetStore(ttl_s=120.0, window_size=8192)
    record = WorkerRecord(worker_id=worker, role=Role.AGG, service="tiny", dp_size=1, fpm_endpoints=engine.endpoints)
    subscriber = FpmSubscriber(store)
    subscriber.set_workers({worker: record})
    with subscriber:
        # Loads from one short prompt to 16 concurrent long ones: prefill chunks of 16..~2k tokens, decode
        # batches of 1..16 sequences.
        for salt, (count, length) in enumerate(
            [(1, 16), (2, 40), (4, 64), (8, 24), (16, 48), (1, 400), (3, 200), (6, 120), (12, 90), (16, 16)]
        ):
            engine.generate(_prompts(count, length, salt), max_tokens=8)
        deadline = time.monotonic() + 10.0
        seen = -1
        while time.monotonic() < deadline:  # until the subscriber has drained what the engine sent
            with subscriber.lock:
                now_seen = len(store.window(worker, 0))
            if now_seen == seen and seen > 0:
                break
            seen = now_seen
            time.sleep(0.5)
        with subscriber.lock:
            window = store.window(worker, 0)

    model = PerfModel(Role.AGG)  # no profile: readiness must come from live samples alone
    for received_at, sample in window:
        model.observe(sample, now=received_at)
    assert model.maybe_refit(now=window[-1][0])
    status = model.status()
    assert status.not_ready_because == (), status
    assert model.ready and status.source is ModelSource.LIVE
    assert status.verdicts[SampleVerdict.WARMUP] == 16  # the first steps the model saw were left out

    itl = [model.predict_itl_ms(b, b * 100).upper_ms for b in (1, 2, 4, 8, 16, 64)]
    ttft = [model.predict_ttft_ms(isl, 0, engine.max_num_batched_tokens).upper_ms for isl in (1, 16, 256, 2000)]
    queued = [model.predict_ttft_ms(64, q, engine.max_num_batched_tokens).upper_ms for q in (0, 1000, 8000)]
    for series in (itl, ttft, queued):
        assert series and all(math.isfinite(v) and v > 0 for v in series)
        assert series == sorted(series), series
    assert ttft[0] < ttft[-1] and queued[0] < queued[-1]

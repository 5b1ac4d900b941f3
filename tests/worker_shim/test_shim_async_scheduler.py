"""InstrumentedAsyncScheduler constructed and driven by hand, without an engine loop.

vLLM's CPU platform turns async scheduling off, so the engine tests never run the async variant; here it is
built with a real VllmConfig (async scheduling on) and driven like vLLM's async loop drives it: step N+1 is
scheduled before step N's output is applied. The samples it publishes go over real ZMQ.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")

from tests.fakes.tiny_vllm import FpmCollector, free_port_base, write_tiny_llama
from worker_shim.fpm import ForwardPassMetrics

pytestmark = pytest.mark.vllm


def _vllm_config(model_dir: Path) -> Any:
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig

    model = ModelConfig(model=str(model_dir), skip_tokenizer_init=True, max_model_len=1024, dtype="float32", seed=0)
    scheduler = SchedulerConfig(
        max_num_seqs=16,
        max_num_batched_tokens=1024,
        max_model_len=1024,
        is_encoder_decoder=False,
        async_scheduling=True,
        scheduler_cls="worker_shim.InstrumentedAsyncScheduler",
    )
    cache = CacheConfig(block_size=16, enable_prefix_caching=False)
    config = VllmConfig(model_config=model, scheduler_config=scheduler, cache_config=cache)
    config.scheduler_config.async_scheduling = True
    config.cache_config.num_gpu_blocks = 256
    return config


def _kv_cache_config(num_blocks: int) -> Any:
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    spec = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=32, dtype=torch.float32)
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layers.0.attn", "layers.1.attn"], spec)],
    )


@pytest.fixture(scope="module")
def scheduler_and_fpm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, FpmCollector]]:
    from vllm.v1.structured_output import StructuredOutputManager

    from worker_shim import InstrumentedAsyncScheduler

    model_dir = write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))
    base = free_port_base(1)
    mp = pytest.MonkeyPatch()
    mp.setenv("FPM_WORKER_ID", "w-async")
    mp.setenv("FPM_PORT_BASE", str(base))
    mp.setenv("FPM_BIND_HOST", "127.0.0.1")
    mp.setenv("FPM_HEARTBEAT_INTERVAL_S", "0.2")
    config = _vllm_config(model_dir)
    scheduler = InstrumentedAsyncScheduler(
        vllm_config=config,
        kv_cache_config=_kv_cache_config(256),
        structured_output_manager=StructuredOutputManager(config),
        block_size=16,
    )
    mp.undo()
    collector = FpmCollector([f"tcp://127.0.0.1:{base}"]).start()
    assert collector.wait_for(lambda c: len(c.samples()) > 0, timeout_s=20), "no heartbeat from the async shim"
    yield scheduler, collector
    collector.close()
    scheduler.shutdown()


def _request(req_id: str, prompt_len: int, max_tokens: int) -> Any:
    from vllm import SamplingParams
    from vllm.v1.request import Request

    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return Request(
        request_id=req_id,
        prompt_token_ids=[7] * prompt_len,
        sampling_params=params,
        pooling_params=None,
        arrival_time=0.0,
    )


def _model_output(scheduler_output: Any) -> Any:
    from vllm.v1.outputs import ModelRunnerOutput

    req_ids = list(scheduler_output.num_scheduled_tokens)
    return ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={r: i for i, r in enumerate(req_ids)},
        sampled_token_ids=[[11] for _ in req_ids],
        logprobs=None,
        prompt_logprobs_dict={},
        pooler_output=[],
    )


def _drive_async(scheduler: Any, max_steps: int = 200) -> int:
    """vLLM's async loop order: schedule the next step before applying the previous step's output."""
    steps = 0
    previous: Any = None
    while steps < max_steps:
        current = scheduler.schedule() if scheduler.has_requests() else None
        if previous is not None:
            scheduler.update_from_output(previous, _model_output(previous))
        if current is None or current.total_num_scheduled_tokens == 0:
            if current is not None:
                scheduler.update_from_output(current, _model_output(current))
            if previous is None and current is None:
                break
            previous = None
            if not scheduler.has_requests():
                break
            continue
        previous = current
        steps += 1
    return steps


def test_async_variant_is_vllms_async_scheduler() -> None:
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from worker_shim import InstrumentedAsyncScheduler

    assert issubclass(InstrumentedAsyncScheduler, AsyncScheduler)


def test_driven_async_scheduler_publishes_every_step(scheduler_and_fpm: tuple[Any, FpmCollector]) -> None:
    scheduler, collector = scheduler_and_fpm
    collector.clear()
    prompts = {"a": 40, "b": 24, "c": 33}
    max_tokens = 6
    for req_id, length in prompts.items():
        scheduler.add_request(_request(req_id, length, max_tokens))
    steps = _drive_async(scheduler)
    assert steps > 0 and not scheduler.has_requests()
    assert scheduler.fpm_errors == 0

    def active(c: FpmCollector) -> list[ForwardPassMetrics]:
        return [s for s in c.samples() if not s.is_heartbeat]

    assert collector.wait_for(lambda c: len(active(c)) == steps, timeout_s=20), (len(active(collector)), steps)
    samples = active(collector)
    assert {s.worker_id for s in samples} == {"w-async"}
    assert {s.dp_rank for s in samples} == {0}
    assert sum(s.scheduled_requests.sum_prefill_tokens for s in samples) == sum(prompts.values())
    assert sum(s.scheduled_requests.num_prefill_requests for s in samples) == len(prompts)
    # The first token of each request comes from its prefill step; the others from one decode step each.
    assert sum(s.scheduled_requests.num_decode_requests for s in samples) == len(prompts) * (max_tokens - 1)
    assert all(s.wall_time > 0 for s in samples)
    counters = [s.counter_id for s in collector.samples()]
    assert counters == sorted(counters)


def test_set_worker_id_reaches_the_async_variant(scheduler_and_fpm: tuple[Any, FpmCollector]) -> None:
    scheduler, collector = scheduler_and_fpm
    scheduler.set_fpm_worker_id("w-async-2")
    collector.clear()
    scheduler.add_request(_request("d", 20, 3))
    _drive_async(scheduler)
    assert collector.wait_for(
        lambda c: any(s.is_heartbeat for s in c.samples()) and any(not s.is_heartbeat for s in c.samples()),
        timeout_s=20,
    )
    assert {s.worker_id for s in collector.samples()} == {"w-async-2"}


def test_set_worker_id_refuses_an_engine_without_the_shims_scheduler(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The EngineCore utility raises, naming the fix, when the engine runs vLLM's own scheduler."""
    from types import SimpleNamespace

    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.structured_output import StructuredOutputManager

    from worker_shim.identity import install_engine_utilities

    install_engine_utilities()
    config = _vllm_config(write_tiny_llama(tmp_path_factory.mktemp("tiny-plain")))
    config.scheduler_config.async_scheduling = False
    plain = Scheduler(
        vllm_config=config,
        kv_cache_config=_kv_cache_config(64),
        structured_output_manager=StructuredOutputManager(config),
        block_size=16,
    )
    engine = SimpleNamespace(scheduler=plain)
    with pytest.raises(TypeError, match=r"not the FPM shim's: start vLLM with --scheduler-cls worker_shim"):
        EngineCore.set_fpm_worker_id(engine, "w-1")  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="non-empty"):
        EngineCore.set_fpm_worker_id(engine, "")  # type: ignore[attr-defined]

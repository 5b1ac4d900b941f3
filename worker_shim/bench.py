"""``fpm-planner bench shim``: the shim's overhead inside a real vLLM CPU engine.

Two engines on the same tiny random-weight Llama (written to a temporary directory, ``load_format="dummy"``,
nothing downloaded) run side by side in this process: one with vLLM's own ``Scheduler``, one with
``worker_shim.InstrumentedScheduler`` publishing FPM to a subscriber here. Each repetition sends the same batch
of concurrent requests (``ignore_eos``) to each engine in turn (the order alternates), and records tokens/s and
the mean step time (elapsed / generation steps). Also measured: the shim's own per-step work in isolation (pure
metrics + a publish) and the publisher's counters read from the engine over the utility RPC (drops must be 0).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import zmq

from worker_shim import fpm
from worker_shim.metrics import TrafficAccumulator, queued_requests, scheduled_requests
from worker_shim.publisher import FpmPublisher

__all__ = ["add_arguments", "run", "write_tiny_llama"]

_CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "a planner scales fleets of engines from forward pass metrics",
    "prefill and decode steps share one batch on each data parallel rank",
    "tokens per second rise with the batch until the step time grows",
] * 50


def write_tiny_llama(directory: Path) -> Path:
    """Write a tiny Llama (hidden 128, 4 heads, 2 KV heads, head_dim 32, 2 layers, vocab 1024) config and a BPE
    tokenizer trained on a few sentences into ``directory``; returns it. Idempotent; needs ``tokenizers``."""
    directory.mkdir(parents=True, exist_ok=True)
    if (directory / "config.json").exists() and (directory / "tokenizer.json").exists():
        return directory
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=1024, special_tokens=["<unk>", "<s>", "</s>"])
    tokenizer.train_from_iterator(_CORPUS, trainer=trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "model_max_length": 2048,
            }
        )
    )
    (directory / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "hidden_size": 128,
                "intermediate_size": 256,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 32,
                "num_hidden_layers": 2,
                "vocab_size": 1024,
                "max_position_embeddings": 2048,
                "rms_norm_eps": 1e-5,
                "rope_theta": 10000.0,
                "bos_token_id": 1,
                "eos_token_id": 2,
                "tie_word_embeddings": False,
                "torch_dtype": "bfloat16",
            }
        )
    )
    (directory / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    return directory


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON line of figures")
    parser.add_argument("--reps", type=int, default=5, help="measured repetitions per engine")
    parser.add_argument("--requests", type=int, default=16, help="concurrent requests per repetition")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--model-dir", default="", help="tiny model directory (default: a fresh temporary one)")


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _Counter:
    """Counts FPM step samples and counter gaps from one endpoint, on its own thread."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.steps = 0
        self.heartbeats = 0
        self.gaps = 0
        self.wall_time_s = 0.0
        self._last = -1
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        sock = ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        sock.connect(self.endpoint)
        while not self._stop.is_set():
            if not sock.poll(50):
                continue
            sample = fpm.decode(fpm.parse_frames(sock.recv_multipart())[2])
            with self._lock:
                if self._last >= 0 and sample.counter_id != self._last + 1:
                    self.gaps += 1
                self._last = sample.counter_id
                if sample.is_heartbeat:
                    self.heartbeats += 1
                else:
                    self.steps += 1
                    self.wall_time_s += sample.wall_time
        sock.close(linger=0)
        ctx.term()

    def read(self) -> tuple[int, float]:
        with self._lock:
            return self.steps, self.wall_time_s

    def __enter__(self) -> _Counter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


async def _start(model_dir: Path, scheduler_cls: str) -> Any:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    args = AsyncEngineArgs(
        model=str(model_dir),
        load_format="dummy",
        dtype="bfloat16",
        max_model_len=1024,
        max_num_seqs=64,
        max_num_batched_tokens=4096,
        enable_prefix_caching=False,
        scheduler_cls=scheduler_cls,
        disable_log_stats=True,
        seed=0,
    )
    config = args.create_engine_config(usage_context=UsageContext.ENGINE_CONTEXT)
    return AsyncLLM.from_vllm_config(config, usage_context=UsageContext.ENGINE_CONTEXT, disable_log_stats=True)


async def _workload(llm: Any, requests: int, prompt_tokens: int, max_tokens: int) -> tuple[float, int]:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)

    async def one(i: int) -> int:
        tokens = [(i * 31 + j) % 1000 + 3 for j in range(prompt_tokens)]
        final = None
        async for out in llm.generate({"prompt_token_ids": tokens}, params, uuid.uuid4().hex):
            final = out
        return len(final.outputs[0].token_ids) if final is not None else 0

    started = time.perf_counter()
    generated = sum(await asyncio.gather(*(one(i) for i in range(requests))))
    return time.perf_counter() - started, generated


def _shim_work_us(
    requests: int, prompt_tokens: int, max_tokens: int, iterations: int = 20_000, *, traffic: bool = True
) -> float:
    """Per-step cost of what the shim adds on the engine thread, measured in isolation: the pure metrics for a
    decode batch of ``requests`` plus one non-blocking publish; with ``traffic``, also the traffic extension of
    the same workload (each request arrives, gets its first token and completes once per ``max_tokens`` steps)
    and its ``take()`` on every step."""
    entries = [(1, prompt_tokens + max_tokens // 2 + i, prompt_tokens) for i in range(requests)]
    acc = TrafficAccumulator()
    with (
        tempfile.TemporaryDirectory() as tmp,
        FpmPublisher(worker_id="bench", endpoint=f"ipc://{tmp}/fpm", queue_size=iterations + 1) as publisher,
    ):
        started = time.perf_counter()
        for i in range(iterations):
            t0 = time.perf_counter()
            if not traffic:
                publisher.publish(time.perf_counter() - t0, scheduled_requests(entries), queued_requests(()))
                continue
            if i % max_tokens == 0:
                for _ in range(requests):
                    acc.arrival(prompt_tokens)
                    acc.first_token(50.0)
                    acc.completion(max_tokens, 5.0)
            publisher.publish(time.perf_counter() - t0, scheduled_requests(entries), queued_requests(()), acc.take())
        elapsed = time.perf_counter() - started
        publisher.flush(30)
    return elapsed / iterations * 1e6


def _summary(values: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(values),
        "median": statistics.median(values),
        "stdev": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
    }


async def _bench(args: argparse.Namespace, model_dir: Path) -> dict[str, Any]:
    port_base = _free_port()
    os.environ.update(
        {
            "FPM_WORKER_ID": "bench-shim",
            "FPM_PORT_BASE": str(port_base),
            "FPM_BIND_HOST": "127.0.0.1",
            "FPM_HEARTBEAT_INTERVAL_S": "1.0",
        }
    )
    plain = await _start(model_dir, "vllm.v1.core.sched.scheduler.Scheduler")
    shim = await _start(model_dir, "worker_shim.InstrumentedScheduler")
    engines = {"without_shim": plain, "with_shim": shim}
    tokens_per_s: dict[str, list[float]] = {name: [] for name in engines}
    step_ms: dict[str, list[float]] = {name: [] for name in engines}
    fpm_steps: list[int] = []
    fpm_wall_ms: list[float] = []
    try:
        with _Counter(f"tcp://127.0.0.1:{port_base}") as counter:
            for llm in engines.values():  # warm-up, not counted
                await _workload(llm, args.requests, args.prompt_tokens, args.max_tokens)
            await asyncio.sleep(0.5)
            for rep in range(args.reps):
                order = list(engines) if rep % 2 == 0 else list(reversed(engines))
                for name in order:
                    before_steps, before_wall = counter.read()
                    elapsed, generated = await _workload(
                        engines[name], args.requests, args.prompt_tokens, args.max_tokens
                    )
                    tokens_per_s[name].append(generated / elapsed)
                    step_ms[name].append(elapsed * 1e3 / args.max_tokens)
                    if name == "with_shim":
                        await asyncio.sleep(0.2)  # let the last samples arrive
                        after_steps, after_wall = counter.read()
                        fpm_steps.append(after_steps - before_steps)
                        fpm_wall_ms.append((after_wall - before_wall) * 1e3 / max(1, after_steps - before_steps))
            stats = list(await shim.engine_core.call_utility_all_async("fpm_publisher_stats"))
            gaps = counter.gaps
    finally:
        plain.shutdown()
        shim.shutdown()
    ratios = [
        (without / with_ - 1.0) * 100.0
        for with_, without in zip(tokens_per_s["with_shim"], tokens_per_s["without_shim"], strict=True)
    ]
    mean_step_ms = statistics.fmean(step_ms["with_shim"])
    # v1 alone and with the traffic extension, alternated (the first runs of a pair pay for the engines' shutdown)
    v1_us, traffic_us = [], []
    for _ in range(5):
        v1_us.append(_shim_work_us(args.requests, args.prompt_tokens, args.max_tokens, traffic=False))
        traffic_us.append(_shim_work_us(args.requests, args.prompt_tokens, args.max_tokens))
    shim_us = statistics.median(traffic_us)
    shim_us_v1 = statistics.median(v1_us)
    return {
        "bench": "shim",
        "reps": args.reps,
        "requests": args.requests,
        "prompt_tokens": args.prompt_tokens,
        "max_tokens": args.max_tokens,
        "tokens_per_s": {name: _summary(v) for name, v in tokens_per_s.items()},
        "mean_step_ms": {name: _summary(v) for name, v in step_ms.items()},
        "overhead_pct_per_rep": ratios,
        "overhead_pct": _summary(ratios),
        "fpm_steps_per_rep": fpm_steps,
        "fpm_mean_wall_time_ms": statistics.fmean(fpm_wall_ms) if fpm_wall_ms else 0.0,
        "shim_work_us_per_step": shim_us,
        "shim_work_pct_of_step": shim_us / 1e3 / mean_step_ms * 100.0,
        "shim_work_us_per_step_without_traffic": shim_us_v1,
        "publisher": stats,
        "publisher_dropped": sum(int(s["dropped_queue_full"]) + int(s["dropped_send"]) for s in stats),
        "subscriber_counter_gaps": gaps,
    }


def run(args: argparse.Namespace) -> int:
    if args.reps < 1 or args.requests < 1 or args.prompt_tokens < 1 or args.max_tokens < 2:
        raise SystemExit("need --reps >= 1, --requests >= 1, --prompt-tokens >= 1, --max-tokens >= 2")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_tiny_llama(Path(args.model_dir) if args.model_dir else Path(tmp) / "tiny-llama")
        result = asyncio.run(_bench(args, model_dir))
    if args.json:
        print(json.dumps(result))
    else:
        for name in ("with_shim", "without_shim"):
            tps = result["tokens_per_s"][name]
            print(
                f"{name:13s} tokens/s median {tps['median']:.0f} (mean {tps['mean']:.0f} ± {tps['stdev']:.0f}),"
                f" mean step {result['mean_step_ms'][name]['mean']:.2f} ms"
            )
        print(
            f"overhead {result['overhead_pct']['median']:+.2f}% median over {args.reps} reps;"
            f" shim work {result['shim_work_us_per_step']:.1f} us/step"
            f" ({result['shim_work_pct_of_step']:.2f}% of a step); publisher dropped {result['publisher_dropped']}"
        )
    return 0

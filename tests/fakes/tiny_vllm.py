"""A tiny random-weight Llama served by a real vLLM CPU engine, and an FPM collector for it.

Nothing is downloaded: the model directory (config + a tokenizer trained here with ``tokenizers``) is written to
disk and the weights are vLLM's ``load_format="dummy"``. Reuse it anywhere a test or benchmark needs real FPM::

    from tests.fakes.tiny_vllm import FpmCollector, TinyEngine, free_port_base, write_tiny_llama

    model_dir = write_tiny_llama(tmp_path / "tiny-llama")
    base = free_port_base(2)
    with TinyEngine(model_dir, dp_size=2, worker_id="w-1", port_base=base) as engine, \
            FpmCollector(engine.endpoints) as fpm:
        fpm.wait_for(lambda c: all(c.samples(e) for e in c.endpoints))  # every rank heard (heartbeats)
        engine.generate([[5] * 40, [7] * 24], max_tokens=8)  # token-id prompts, greedy, ignore_eos
        fpm.wait_for(lambda c: c.samples()[-1].is_heartbeat)  # idle again
        steps = [s for s in fpm.samples(engine.endpoints[0]) if not s.is_heartbeat]

``write_tiny_llama`` lives in :mod:`worker_shim.bench` (the benchmark needs the same model) and is re-exported.

An engine start takes ~13 s with ``dp_size=1`` and ~30 s with ``dp_size=2`` here: share one per module.
``TinyEngine`` runs vLLM's ``AsyncLLM`` on an event loop of its own thread, so tests stay synchronous.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import zmq

from worker_shim import fpm
from worker_shim.bench import write_tiny_llama
from worker_shim.fpm import ForwardPassMetrics

__all__ = [
    "SHIM_SCHEDULER",
    "FpmCollector",
    "TinyEngine",
    "free_port",
    "free_port_base",
    "tiny_engine_env",
    "write_tiny_llama",
]

T = TypeVar("T")

SHIM_SCHEDULER = "worker_shim.InstrumentedScheduler"
PLAIN_SCHEDULER = "vllm.v1.core.sched.scheduler.Scheduler"
# The model runs eagerly: vLLM's CPU platform would otherwise trace it with Dynamo and compile it with Inductor in
# every engine's worker process (30-60 s each here, more than the rest of an engine start). What the tests read,
# the scheduler's FPM, does not depend on how the forward pass was compiled. ``--enforce-eager`` for launchers.
ENFORCE_EAGER = True


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_port_base(count: int) -> int:
    """A base port ``b`` such that ``b .. b+count-1`` are free on loopback right now."""
    for _ in range(200):
        base = free_port()
        if base + count > 65535:
            continue
        socks: list[socket.socket] = []
        try:
            for offset in range(count):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(sock)
                sock.bind(("127.0.0.1", base + offset))
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError(f"no {count} consecutive free ports found")


def tiny_engine_env(*, worker_id: str | None, port_base: int, heartbeat_interval_s: float = 0.2) -> dict[str, str]:
    """The environment an engine with the shim needs here (``worker_id=None`` leaves ``FPM_WORKER_ID`` unset,
    like an engine snapshotted before its worker had an id)."""
    env = {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_LOGGING_LEVEL": "WARNING",
        "OMP_NUM_THREADS": "1",
        "FPM_PORT_BASE": str(port_base),
        "FPM_BIND_HOST": "127.0.0.1",
        "FPM_HEARTBEAT_INTERVAL_S": repr(heartbeat_interval_s),
    }
    if worker_id is not None:
        env["FPM_WORKER_ID"] = worker_id
    return env


@contextlib.contextmanager
def _patched_environ(values: Mapping[str, str], remove: Sequence[str] = ()) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in [*values, *remove]}
    os.environ.update(values)
    for key in remove:
        os.environ.pop(key, None)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


async def _cancel_pending() -> None:
    """Cancel what vLLM's client left running on the loop (its output handlers) and let it finish."""
    current = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not current]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


class TinyEngine:
    """A real ``AsyncLLM`` on the tiny model, with the shim's scheduler unless ``scheduler_cls`` says otherwise.

    The engine processes inherit the ``FPM_*`` environment at start; prefix caching is off so that summed prefill
    tokens equal the prompts sent."""

    def __init__(
        self,
        model_dir: Path,
        *,
        dp_size: int = 1,
        worker_id: str | None = None,
        port_base: int | None = None,
        scheduler_cls: str = SHIM_SCHEDULER,
        heartbeat_interval_s: float = 0.2,
        max_num_seqs: int = 32,
        max_num_batched_tokens: int = 2048,
        max_model_len: int = 1024,
        log_stats: bool = False,
    ) -> None:
        self.model_dir = model_dir
        self.log_stats = log_stats  # True: RequestOutput.metrics carries vLLM's own per-request stats
        self.dp_size = dp_size
        self.worker_id = worker_id
        self.port_base = port_base if port_base is not None else free_port_base(dp_size)
        self.scheduler_cls = scheduler_cls
        self.heartbeat_interval_s = heartbeat_interval_s
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.llm: Any = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tiny-vllm-loop", daemon=True)

    @property
    def endpoints(self) -> tuple[str, ...]:
        return tuple(f"tcp://127.0.0.1:{self.port_base + rank}" for rank in range(self.dp_size))

    @property
    def engine_core(self) -> Any:
        return self.llm.engine_core

    def start(self) -> TinyEngine:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        self._thread.start()
        env = tiny_engine_env(
            worker_id=self.worker_id, port_base=self.port_base, heartbeat_interval_s=self.heartbeat_interval_s
        )
        args = AsyncEngineArgs(
            model=str(self.model_dir),
            load_format="dummy",
            dtype="bfloat16",
            max_model_len=self.max_model_len,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            enable_prefix_caching=False,
            data_parallel_size=self.dp_size,
            data_parallel_rpc_port=free_port(),
            scheduler_cls=self.scheduler_cls,
            disable_log_stats=not self.log_stats,
            seed=0,
            enforce_eager=ENFORCE_EAGER,
        )

        async def build() -> Any:
            config = args.create_engine_config(usage_context=UsageContext.ENGINE_CONTEXT)
            return AsyncLLM.from_vllm_config(
                config, usage_context=UsageContext.ENGINE_CONTEXT, disable_log_stats=not self.log_stats
            )

        with _patched_environ(env, remove=() if self.worker_id is not None else ("FPM_WORKER_ID",)):
            self.llm = self.run(build(), timeout_s=600)
        return self

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = 300.0) -> T:
        """Run ``coro`` on the engine's event loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def generate(self, prompts: Sequence[Sequence[int]], max_tokens: int) -> list[Any]:
        """Send token-id prompts concurrently (greedy, ``ignore_eos``) and wait for all; returns the final outputs."""
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)

        async def one(tokens: Sequence[int]) -> Any:
            final = None
            async for out in self.llm.generate({"prompt_token_ids": list(tokens)}, params, uuid.uuid4().hex):
                final = out
            return final

        async def all_of() -> list[Any]:
            return list(await asyncio.gather(*(one(p) for p in prompts)))

        return self.run(all_of())

    def close(self) -> None:
        if self.llm is not None:
            llm, self.llm = self.llm, None
            with contextlib.suppress(Exception):
                self.run(asyncio.sleep(0), timeout_s=5)
            llm.shutdown()
            with contextlib.suppress(Exception):
                self.run(_cancel_pending(), timeout_s=10)
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def __enter__(self) -> TinyEngine:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()


class FpmCollector:
    """Subscribes to FPM endpoints (one SUB socket each) and keeps every decoded sample, by endpoint."""

    def __init__(self, endpoints: Sequence[str]) -> None:
        self.endpoints = tuple(endpoints)
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._lock = threading.Lock()
        self._samples: dict[str, list[ForwardPassMetrics]] = {e: [] for e in self.endpoints}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fpm-collector", daemon=True)

    def _run(self) -> None:
        poller = zmq.Poller()
        socks: dict[zmq.Socket[bytes], str] = {}
        for endpoint in self.endpoints:
            sock = self._ctx.socket(zmq.SUB)
            sock.setsockopt(zmq.SUBSCRIBE, b"")
            sock.connect(endpoint)
            poller.register(sock, zmq.POLLIN)
            socks[sock] = endpoint
        try:
            while not self._stop.is_set():
                for sock, _ in poller.poll(50):
                    while True:
                        try:
                            parts = sock.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        sample = fpm.decode(fpm.parse_frames(parts)[2])
                        with self._lock:
                            self._samples[socks[sock]].append(sample)
        finally:
            for sock in socks:
                sock.close(linger=0)

    def start(self) -> FpmCollector:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._ctx.term()

    def __enter__(self) -> FpmCollector:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def samples(self, endpoint: str | None = None) -> list[ForwardPassMetrics]:
        """Everything received so far (from ``endpoint``, or from all, in arrival order per endpoint)."""
        with self._lock:
            if endpoint is not None:
                return list(self._samples[endpoint])
            return [s for e in self.endpoints for s in self._samples[e]]

    def idle(self) -> bool:
        """Every endpoint heard, and its latest sample a heartbeat: no step sent earlier is still on its way."""
        with self._lock:
            return all(samples and samples[-1].is_heartbeat for samples in self._samples.values())

    def clear(self) -> None:
        with self._lock:
            for samples in self._samples.values():
                samples.clear()

    def wait_for(self, condition: Callable[[FpmCollector], bool], timeout_s: float = 30.0) -> bool:
        """Poll ``condition(self)`` until true or ``timeout_s`` passes; returns whether it became true."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if condition(self):
                return True
            time.sleep(0.05)
        return condition(self)

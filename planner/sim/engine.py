"""A simulated vLLM v1 engine: continuous batching with chunked prefill, KV capacity with preemption, optional
prefix caching, timed by a :class:`~planner.sim.timing.StepTimer`, emitting one real FPM sample per step.

Scheduling follows vLLM v1's scheduler, one step at a time:

1. running decode requests get one token each (they count against the token budget);
2. when the KV cache cannot hold those new tokens, the most recently admitted running request is preempted
   (recompute mode: it frees its KV and goes back to the front of the waiting queue);
3. partially prefilled running requests get their next chunk (admission order), within the token budget and
   the free KV;
4. waiting requests are admitted in order while the budget, ``max_num_seqs`` and the free KV allow; a request
   arriving with its KV already computed elsewhere (disaggregated decode) joins the decode batch directly.

Decode work is kept in aggregate (count, sum and sum of squares of KV lengths, a heap of finishing steps), so a
step costs O(requests scheduled for prefill + requests finishing), not O(batch size).

One step is :meth:`SimEngine.begin_step` (schedule, returns the step's end time) followed by
:meth:`SimEngine.end_step` (apply the step, emit its FPM sample, return finished requests).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence

import msgspec

from planner.errors import ConfigError
from planner.sim.timing import StepTimer
from worker_shim.fpm import QueuedRequests, ScheduledRequests
from worker_shim.metrics import TrafficAccumulator

__all__ = ["EngineConfig", "SimEngine", "SimRequest", "StepSink"]


class EngineConfig(msgspec.Struct, frozen=True, kw_only=True):
    """vLLM engine arguments the simulator honours. Defaults: Llama-3.1-8B FP8 on one H200, chunked prefill
    with a 2048-token budget (an ITL-sensitive setting: a full chunk plus a decode batch stays near 40 ms)."""

    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    kv_capacity_tokens: int = 945029
    max_model_len: int = 131072
    prefix_cache: bool = True
    block_size_tokens: int = 512  # prefix-cache block; Mooncake hash ids are 512-token blocks
    ttft_overhead_s: float = 0.0  # time outside the step loop before the first token (tokenize, detokenize)

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens < 1 or self.max_num_seqs < 1 or self.kv_capacity_tokens < 1:
            raise ConfigError("engine needs max_num_batched_tokens, max_num_seqs, kv_capacity_tokens >= 1")
        if self.block_size_tokens < 1 or self.max_model_len < 2 or self.ttft_overhead_s < 0:
            raise ConfigError("engine needs block_size_tokens >= 1, max_model_len >= 2, ttft_overhead_s >= 0")


class SimRequest:
    """One request's life in the simulator. Times are simulated seconds."""

    __slots__ = (
        "arrival_counted",
        "arrival_s",
        "cached_tokens",
        "decode_base",
        "decode_epoch",
        "decode_join",
        "done_prefill",
        "finish_s",
        "first_token_s",
        "generated",
        "hash_ids",
        "isl",
        "osl",
        "preemptions",
        "prefill_only",
        "remote_kv",
        "rid",
        "target_prefill",
    )

    def __init__(self, rid: int, arrival_s: float, isl: int, osl: int, hash_ids: Sequence[int] | None = None) -> None:
        self.rid = rid
        self.arrival_s = arrival_s
        self.isl = max(1, isl)
        self.osl = max(1, osl)
        self.hash_ids = hash_ids
        self.target_prefill = self.isl  # tokens to (re)compute before the next token
        self.done_prefill = 0  # tokens of target_prefill in KV (cached prefix included)
        self.cached_tokens = -1  # prefix-cache hit in tokens; -1 until looked up at admission
        self.generated = 0
        self.first_token_s: float | None = None
        self.finish_s: float | None = None
        self.decode_base = 0  # KV length at decode step s is decode_base + s
        self.decode_epoch = 0  # bumps on preemption: stale heap entries are skipped
        self.decode_join = 0  # decode step index at which it joined the batch (with ``generated`` tokens)
        self.preemptions = 0
        self.prefill_only = False  # disaggregated prefill: done after the first token
        self.remote_kv = False  # disaggregated decode: KV computed elsewhere, no prefill here
        self.arrival_counted = False  # reported as an arrival by the engine holding it (FPM traffic extension)

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def itl_s(self) -> float | None:
        """Mean inter-token latency over the request's decode (0 for a single-token output)."""
        if self.finish_s is None or self.first_token_s is None:
            return None
        return 0.0 if self.osl <= 1 else (self.finish_s - self.first_token_s) / (self.osl - 1)


StepSink = Callable[["SimEngine", float, ScheduledRequests, QueuedRequests, float], None]
"""Receives ``(engine, wall_time_s, scheduled, queued, end_s)`` after every step."""


class SimEngine:
    """One simulated engine (one DP rank). Not thread-safe; driven by a fleet or a test."""

    def __init__(
        self, worker_id: str, config: EngineConfig, timer: StepTimer, *, sink: StepSink | None = None, dp_rank: int = 0
    ) -> None:
        self.worker_id = worker_id
        self.dp_rank = dp_rank
        self.config = config
        self.timer = timer
        self.sink = sink
        self.waiting: deque[SimRequest] = deque()
        self.prefilling: list[SimRequest] = []
        self.running: OrderedDict[int, SimRequest] = OrderedDict()  # admission order, for preemption
        self._heap: list[tuple[int, int, int, SimRequest]] = []  # (last decode step, rid, epoch, request)
        self.n_decode = 0
        self._sum_base = 0
        self._sumsq_base = 0
        self.step_index = 0  # index of the next decode step
        self.kv_prefill_tokens = 0  # KV held by prefilling requests
        self.busy = False
        self.outstanding_tokens = 0  # prompt + output tokens of requests in this engine (router load)
        self.steps = 0
        self.preemptions = 0
        self.last_step_end_s = 0.0
        self._chunks: list[tuple[SimRequest, int]] = []
        self._step_decode = 0
        # Aggregates over ``waiting`` (kept in step with it, so an FPM sample costs O(1) however long the queue).
        self._w_prefill = 0  # waiting requests needing prefill here
        self._w_tokens = 0  # their prefill tokens
        self._w_sumsq = 0  # sum of squared prefill lengths
        self._w_decode = 0  # preempted, or waiting with remote KV
        self._cache: OrderedDict[int, None] = OrderedDict()
        self._cache_blocks = config.kv_capacity_tokens // config.block_size_tokens
        # The FPM traffic extension, as the shim fills it in vLLM: arrivals, first tokens, completions; a sink
        # takes it with each step sample (:meth:`TrafficAccumulator.take`).
        self.traffic = TrafficAccumulator()

    # -- state -----------------------------------------------------------------------------------------------

    @property
    def kv_used_tokens(self) -> int:
        return self.kv_prefill_tokens + self._sum_base + self.n_decode * self.step_index

    @property
    def num_requests(self) -> int:
        return len(self.waiting) + len(self.running)

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    def decode_kv_stats(self) -> tuple[int, int, float]:
        """(decode requests, their KV tokens, variance of KV length) at the next decode step."""
        n, s = self.n_decode, self.step_index
        if n == 0:
            return 0, 0, 0.0
        total = self._sum_base + n * s
        sumsq = self._sumsq_base + 2 * s * self._sum_base + n * s * s
        mean = total / n
        return n, total, max(0.0, sumsq / n - mean * mean)

    def queued_prefill_tokens(self) -> int:
        """Prefill tokens not computed yet: waiting requests and the rest of partially prefilled ones."""
        return self._w_tokens + sum(r.target_prefill - r.done_prefill for r in self.prefilling)

    # -- requests --------------------------------------------------------------------------------------------

    def add(self, request: SimRequest) -> None:
        self._wait_push(request, front=False)
        self.outstanding_tokens += request.isl + request.osl
        if not request.arrival_counted:
            request.arrival_counted = True
            self.traffic.arrival(request.isl)

    def take_waiting(self) -> list[SimRequest]:
        """Remove and return every waiting request (a replica cancelled before it started)."""
        out = list(self.waiting)
        for req in out:
            self.outstanding_tokens -= req.isl + req.osl
            req.arrival_counted = False  # this engine never served them: the one that takes them reports them
        self.waiting.clear()
        self._w_prefill = self._w_tokens = self._w_sumsq = self._w_decode = 0
        return out

    def _wait_push(self, req: SimRequest, *, front: bool) -> None:
        if front:
            self.waiting.appendleft(req)
        else:
            self.waiting.append(req)
        if req.remote_kv or req.generated > 0:
            self._w_decode += 1
        if not req.remote_kv:
            self._w_prefill += 1
            self._w_tokens += req.target_prefill
            self._w_sumsq += req.target_prefill * req.target_prefill

    def _wait_pop(self) -> SimRequest:
        req = self.waiting.popleft()
        if req.remote_kv or req.generated > 0:
            self._w_decode -= 1
        if not req.remote_kv:
            self._w_prefill -= 1
            self._w_tokens -= req.target_prefill
            self._w_sumsq -= req.target_prefill * req.target_prefill
        return req

    # -- the step --------------------------------------------------------------------------------------------

    def begin_step(self, now: float) -> float | None:
        """Schedule one step at ``now``; returns its end time, or None (and stays idle) when there is no work."""
        cfg = self.config
        cap = cfg.kv_capacity_tokens
        preempted = False
        while self.n_decode and self.kv_used_tokens + self.n_decode > cap:
            self._preempt_latest()
            preempted = True
        budget = cfg.max_num_batched_tokens - self.n_decode
        chunks = self._chunks
        chunks.clear()
        free = cap - self.kv_used_tokens - self.n_decode
        for req in self.prefilling:
            if budget <= 0 or free <= 0:
                break
            c = min(req.target_prefill - req.done_prefill, budget, free)
            chunks.append((req, c))
            budget -= c
            free -= c
        while not preempted and self.waiting and len(self.running) < cfg.max_num_seqs:
            req = self.waiting[0]
            if req.remote_kv:
                need = req.target_prefill + 1
                if need > free:
                    break
                self._wait_pop()
                self.running[req.rid] = req
                req.done_prefill = req.target_prefill
                req.generated = max(req.generated, 1)
                self._join_decode(req, now)
                free -= need
                continue
            if budget <= 0:
                break
            cached = 0
            if cfg.prefix_cache and req.hash_ids:
                if req.cached_tokens < 0:  # looked up once per admission, not on every blocked step
                    req.cached_tokens = min(self._cache_lookup(req.hash_ids), req.target_prefill - 1)
                cached = req.cached_tokens
            c = min(req.target_prefill - cached, budget)
            if c + cached > free:
                break
            self._wait_pop()
            req.done_prefill = cached
            self.running[req.rid] = req
            self.prefilling.append(req)
            self.kv_prefill_tokens += req.done_prefill
            chunks.append((req, c))
            budget -= c
            free -= c + req.done_prefill
        n_dec, kv_dec, var_dec = self.decode_kv_stats()
        if not chunks and n_dec == 0:
            self.busy = False
            return None
        p_tokens = 0
        p_kv = 0
        sum_len = 0
        sumsq_len = 0
        for req, c in chunks:
            p_tokens += c
            p_kv += req.done_prefill
            sum_len += req.target_prefill
            sumsq_len += req.target_prefill * req.target_prefill
        self.kv_prefill_tokens += p_tokens
        dt = self.timer.step_time_s(p_tokens, p_kv, n_dec, kv_dec)
        self._step_decode = n_dec
        self.busy = True
        self.steps += 1
        if self.sink is not None:
            n_p = len(chunks)
            mean_len = sum_len / n_p if n_p else 0.0
            scheduled = ScheduledRequests(
                num_prefill_requests=n_p,
                sum_prefill_tokens=p_tokens,
                var_prefill_length=max(0.0, sumsq_len / n_p - mean_len * mean_len) if n_p else 0.0,
                sum_prefill_kv_tokens=p_kv,
                num_decode_requests=n_dec,
                sum_decode_kv_tokens=kv_dec,
                var_decode_kv_tokens=var_dec,
            )
            self._pending_sample = (dt, scheduled, self._queued())
        return now + dt

    def end_step(self, end_s: float) -> list[SimRequest]:
        """Apply the step begun by :meth:`begin_step`; returns requests that finished (or left, for prefill-only
        requests) at ``end_s``."""
        done: list[SimRequest] = []
        s = self.step_index
        self.step_index = s + 1
        if self._step_decode:
            heap = self._heap
            while heap and heap[0][0] <= s:
                _, _, epoch, req = heapq.heappop(heap)
                if epoch != req.decode_epoch:
                    continue
                self._leave_decode(req)
                req.generated = req.osl
                self._finish(req, end_s)
                done.append(req)
        for req, c in self._chunks:
            req.done_prefill += c
            if req.done_prefill < req.target_prefill:
                continue
            self.prefilling.remove(req)
            self.kv_prefill_tokens -= req.done_prefill
            req.generated += 1
            if req.first_token_s is None:
                req.first_token_s = end_s + self.config.ttft_overhead_s
                self.traffic.first_token((req.first_token_s - req.arrival_s) * 1000.0)
            if self.config.prefix_cache and req.hash_ids:
                self._cache_insert(req.hash_ids)
            if req.prefill_only or req.generated >= req.osl:
                self.running.pop(req.rid, None)
                self._finish(req, end_s)
                done.append(req)
            else:
                self._join_decode(req, end_s)
        self._chunks = []
        self.busy = False
        self.last_step_end_s = end_s
        if self.sink is not None:
            dt, scheduled, queued = self._pending_sample
            self.sink(self, dt, scheduled, queued, end_s)
        return done

    # -- internals -------------------------------------------------------------------------------------------

    _pending_sample: tuple[float, ScheduledRequests, QueuedRequests]

    def _queued(self) -> QueuedRequests:
        n = self._w_prefill
        if n == 0 and self._w_decode == 0:
            return _EMPTY_QUEUED
        mean = self._w_tokens / n if n else 0.0
        return QueuedRequests(
            num_prefill_requests=n,
            sum_prefill_tokens=self._w_tokens,
            var_prefill_length=max(0.0, self._w_sumsq / n - mean * mean) if n else 0.0,
            num_decode_requests=self._w_decode,
        )

    def _join_decode(self, req: SimRequest, now: float) -> None:
        """``req`` holds ``target_prefill`` tokens of KV and has generated ``generated`` tokens; from the next
        decode step on it reads ``target_prefill + 1 + (s - join)`` KV tokens at step ``s``."""
        remaining = req.osl - req.generated
        if remaining <= 0:
            self.running.pop(req.rid, None)
            self._finish(req, now)
            return
        join = self.step_index
        req.decode_join = join
        req.decode_base = req.target_prefill + 1 - join
        self.n_decode += 1
        self._sum_base += req.decode_base
        self._sumsq_base += req.decode_base * req.decode_base
        heapq.heappush(self._heap, (join + remaining - 1, req.rid, req.decode_epoch, req))

    def _leave_decode(self, req: SimRequest) -> None:
        self.n_decode -= 1
        self._sum_base -= req.decode_base
        self._sumsq_base -= req.decode_base * req.decode_base
        self.running.pop(req.rid, None)

    def _finish(self, req: SimRequest, end_s: float) -> None:
        req.finish_s = end_s
        self.outstanding_tokens -= req.isl + req.osl
        if req.prefill_only:
            self.traffic.completion(1, None)  # a disaggregated prefill: one token, then the KV leaves
        else:
            itl_s = req.itl_s
            self.traffic.completion(req.osl, None if itl_s is None or req.osl < 2 else itl_s * 1000.0)

    def _preempt_latest(self) -> None:
        """Recompute-mode preemption of the most recently admitted running request."""
        rid, req = next(reversed(self.running.items()))
        self.preemptions += 1
        req.preemptions += 1
        if any(r is req for r in self.prefilling):
            self.prefilling.remove(req)
            self.kv_prefill_tokens -= req.done_prefill
            self.running.pop(rid)
        else:
            generated_now = req.generated + (self.step_index - req.decode_join)
            self._leave_decode(req)
            req.decode_epoch += 1
            req.generated = generated_now
            req.target_prefill = req.isl + generated_now
            req.remote_kv = False
        req.done_prefill = 0
        req.cached_tokens = -1
        self._wait_push(req, front=True)

    def _cache_lookup(self, hash_ids: Sequence[int]) -> int:
        cache = self._cache
        hits = 0
        for h in hash_ids:
            if h not in cache:
                break
            cache.move_to_end(h)
            hits += 1
        return hits * self.config.block_size_tokens

    def _cache_insert(self, hash_ids: Sequence[int]) -> None:
        cache = self._cache
        for h in hash_ids:
            cache[h] = None
            cache.move_to_end(h)
        while len(cache) > self._cache_blocks:
            cache.popitem(last=False)


_EMPTY_QUEUED = QueuedRequests()

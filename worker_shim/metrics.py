"""Step numbers -> FPM fields. Pure: plain integers in, frozen FPM structs out; no vLLM, no clock, no I/O.

The scheduler subclass (:mod:`worker_shim.scheduler`) reads the numbers off vLLM's ``SchedulerOutput`` and queues
and hands them here, so what a sample *means* is decided (and tested) in one place:

- A scheduled request is a **prefill** this step when its prompt was not fully computed before the step
  (``num_computed_tokens < num_prompt_tokens``), a **decode** otherwise. A request resumed after preemption
  recomputes from its cached prefix, so it counts as prefill again.
- ``sum_prefill_tokens``: tokens computed this step for prefill requests; ``sum_prefill_kv_tokens``: tokens they
  already had (prefix-cache hits or earlier chunks); ``var_prefill_length``: population variance of their prompt
  lengths.
- ``sum_decode_kv_tokens`` / ``var_decode_kv_tokens``: context (tokens already in KV) of each decode request.
- Queued: a waiting request that is preempted or waiting for remote KV is a queued **decode**; any other waiting
  request is a queued **prefill** of ``num_tokens - num_computed_tokens`` tokens (sum and variance over those).
- Traffic extension (:class:`TrafficAccumulator`): the scheduler reports each arrival, first token and
  completion as it happens; :meth:`TrafficAccumulator.take` turns what gathered since the last step sample into
  that sample's :class:`~worker_shim.fpm.StepTraffic`. The cost is per event, not per request in the batch.
"""

from __future__ import annotations

from collections.abc import Iterable

from worker_shim.fpm import LogHistogram, QueuedRequests, ScheduledRequests, StepTraffic, bucket_index

__all__ = ["TrafficAccumulator", "population_variance", "queued_requests", "scheduled_requests"]


def population_variance(count: int, total: int, total_sq: int) -> float:
    """Variance of ``count`` integers from their sum and sum of squares, exactly (0.0 below two values)."""
    if count < 2:
        return 0.0
    return float(count * total_sq - total * total) / float(count * count)


def scheduled_requests(entries: Iterable[tuple[int, int, int]]) -> ScheduledRequests:
    """FPM ``scheduled_requests`` from one ``(num_new_tokens, num_computed_tokens, num_prompt_tokens)`` per
    request scheduled this step, where ``num_computed_tokens`` is the count *before* the step."""
    n_pre = pre_tokens = pre_kv = pre_len = pre_len_sq = 0
    n_dec = dec_kv = dec_kv_sq = 0
    for new_tokens, computed, prompt in entries:
        if computed < prompt:
            n_pre += 1
            pre_tokens += new_tokens
            pre_kv += computed
            pre_len += prompt
            pre_len_sq += prompt * prompt
        else:
            n_dec += 1
            dec_kv += computed
            dec_kv_sq += computed * computed
    return ScheduledRequests(
        num_prefill_requests=n_pre,
        sum_prefill_tokens=pre_tokens,
        var_prefill_length=population_variance(n_pre, pre_len, pre_len_sq),
        sum_prefill_kv_tokens=pre_kv,
        num_decode_requests=n_dec,
        sum_decode_kv_tokens=dec_kv,
        var_decode_kv_tokens=population_variance(n_dec, dec_kv, dec_kv_sq),
    )


def queued_requests(entries: Iterable[tuple[int, int, bool]]) -> QueuedRequests:
    """FPM ``queued_requests`` from one ``(num_tokens, num_computed_tokens, waits_as_decode)`` per waiting
    request; ``waits_as_decode`` is true for preempted requests and those waiting for remote KV."""
    n_pre = pre_tokens = pre_tokens_sq = n_dec = 0
    for num_tokens, computed, as_decode in entries:
        if as_decode:
            n_dec += 1
            continue
        remaining = max(0, num_tokens - computed)
        n_pre += 1
        pre_tokens += remaining
        pre_tokens_sq += remaining * remaining
    return QueuedRequests(
        num_prefill_requests=n_pre,
        sum_prefill_tokens=pre_tokens,
        var_prefill_length=population_variance(n_pre, pre_tokens, pre_tokens_sq),
        num_decode_requests=n_dec,
    )


class _Hist:
    __slots__ = ("buckets", "count", "total")

    def __init__(self) -> None:
        self.count = 0
        self.total = 0.0
        self.buckets: dict[int, int] = {}

    def add(self, value: float) -> None:
        self.count += 1
        self.total += value
        k = bucket_index(value)
        self.buckets[k] = self.buckets.get(k, 0) + 1

    def take(self) -> LogHistogram:
        out = LogHistogram(count=self.count, sum=self.total, buckets=self.buckets)
        self.count = 0
        self.total = 0.0
        self.buckets = {}
        return out


_EMPTY_TRAFFIC = StepTraffic()
_EMPTY_HIST = LogHistogram()


class TrafficAccumulator:
    """What happened to requests since the last step sample; see the module docstring. Values must be finite
    and >= 0 (the caller clamps clock skew to 0)."""

    __slots__ = ("_arrivals", "_completions", "_itl", "_ttft", "events")

    def __init__(self) -> None:
        self._arrivals = _Hist()
        self._completions = _Hist()
        self._ttft = _Hist()
        self._itl = _Hist()
        self.events = 0  # events since the last take()

    def arrival(self, prompt_tokens: int) -> None:
        self._arrivals.add(prompt_tokens)
        self.events += 1

    def first_token(self, ttft_ms: float) -> None:
        self._ttft.add(ttft_ms)
        self.events += 1

    def completion(self, output_tokens: int, itl_ms: float | None) -> None:
        """A finished request; ``itl_ms`` is its mean inter-token latency (None below two output tokens)."""
        self._completions.add(output_tokens)
        if itl_ms is not None:
            self._itl.add(itl_ms)
        self.events += 1

    def take(self) -> StepTraffic:
        """The extension for the step sample being published, and start over."""
        if not self.events:
            return _EMPTY_TRAFFIC
        self.events = 0
        return StepTraffic(
            arrivals=self._arrivals.take() if self._arrivals.count else _EMPTY_HIST,
            completions=self._completions.take() if self._completions.count else _EMPTY_HIST,
            ttft_ms=self._ttft.take() if self._ttft.count else _EMPTY_HIST,
            itl_ms=self._itl.take() if self._itl.count else _EMPTY_HIST,
        )

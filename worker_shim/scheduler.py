"""vLLM scheduler subclasses that publish one FPM sample per engine step.

Select one with ``--scheduler-cls worker_shim.InstrumentedScheduler`` (synchronous scheduling, the CPU default) or
``worker_shim.InstrumentedAsyncScheduler`` (async scheduling, vLLM's GPU default). Both are thin: they call
``super()``, read the step's numbers off the ``SchedulerOutput`` and the waiting queues, and let the pure
functions of :mod:`worker_shim.metrics` build the sample, which :class:`~worker_shim.publisher.FpmPublisher`
sends from its own thread (with idle heartbeats). Configuration comes from the engine process's environment
(:class:`~worker_shim.config.ShimConfig`); the rank binds ``FPM_PORT_BASE + parallel_config.data_parallel_index``.

``wall_time`` is the step's duration: from ``schedule()`` (or, when steps overlap under async scheduling, from the
end of the previous step) to the end of ``update_from_output()`` for the same ``SchedulerOutput``. Steps that
schedule no tokens run no forward pass and publish nothing; the heartbeat covers them.

Traffic extension (every step sample carries ``traffic``, see :mod:`worker_shim.fpm`): an **arrival** is a new
request id reaching ``add_request`` (its prompt tokens); a **first token** is seen in ``update_from_output`` for
a request that the matching ``schedule()`` took to the end of its prompt with no output yet (TTFT = now -
``request.arrival_time``, both wall clock, the frontend's stamp); a **completion** is ``_free_request`` (every
finished request, aborted ones included; its mean ITL = (finish - first token) / (output tokens - 1), left out
for aborted requests and single-token outputs). Events between step samples go into the next one. The work is
per event plus one comparison per prefill request scheduled, never per decode request.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus

from worker_shim import identity
from worker_shim.config import ShimConfig
from worker_shim.fpm import QueuedRequests, ScheduledRequests
from worker_shim.metrics import TrafficAccumulator, queued_requests, scheduled_requests
from worker_shim.publisher import FpmPublisher, PublisherStats

__all__ = ["FpmSchedulerMixin", "InstrumentedAsyncScheduler", "InstrumentedScheduler"]

log = logging.getLogger(__name__)

_WAITS_AS_DECODE = frozenset({RequestStatus.PREEMPTED, RequestStatus.WAITING_FOR_REMOTE_KVS})
_MAX_IN_FLIGHT = 64  # scheduled outputs awaiting their update; more means vLLM dropped some (never in 0.32)

identity.install_engine_utilities()


class FpmSchedulerMixin:
    """The FPM part shared by both scheduler classes; must precede vLLM's scheduler in the bases."""

    _fpm_publisher: FpmPublisher
    _fpm_in_flight: dict[int, tuple[float, ScheduledRequests, QueuedRequests, list[Request]]]
    _fpm_last_end: float
    _fpm_traffic: TrafficAccumulator
    _fpm_first_token_s: dict[str, float]  # request id -> wall time of its first token, until it finishes
    _fpm_first_token_due: list[Request]  # filled while reading the step being scheduled
    fpm_errors: int  # steps whose numbers could not be read (no sample published for them)
    # Provided by vLLM's Scheduler.
    parallel_config: Any
    requests: dict[str, Any]
    waiting: Any
    kv_holding_waiting: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        config = ShimConfig.from_env(os.environ)
        dp_rank = int(self.parallel_config.data_parallel_index)
        self._fpm_in_flight = {}
        self._fpm_last_end = 0.0
        self._fpm_traffic = TrafficAccumulator()
        self._fpm_first_token_s = {}
        self._fpm_first_token_due = []
        self.fpm_errors = 0
        self._fpm_publisher = FpmPublisher(
            worker_id=config.worker_id,
            dp_rank=dp_rank,
            endpoint=config.endpoint(dp_rank),
            heartbeat_interval_s=config.heartbeat_interval_s,
            send_interval_s=config.send_interval_s,
            curve=config.curve(),
        ).start()

    # -- what the engine calls -------------------------------------------------------------------------------

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        started = time.perf_counter()
        output: SchedulerOutput = super().schedule(throttle_prefills)  # type: ignore[misc]
        if output.total_num_scheduled_tokens > 0:
            if len(self._fpm_in_flight) >= _MAX_IN_FLIGHT:
                self._fpm_in_flight.clear()
            self._fpm_first_token_due = []
            try:
                step = (
                    started,
                    scheduled_requests(self._scheduled_entries(output)),
                    queued_requests(self._queued_entries()),
                    self._fpm_first_token_due,
                )
            except Exception:  # metrics must never break the engine's step; count, log the first, go on
                self._fpm_error()
            else:
                self._fpm_in_flight[id(output)] = step
        return output

    def add_request(self, request: Request) -> None:
        new = request.request_id not in self.requests
        super().add_request(request)  # type: ignore[misc]
        if new:
            try:
                self._fpm_traffic.arrival(request.num_prompt_tokens)
            except Exception:
                self._fpm_error()

    def _free_request(self, request: Request, delay_free_blocks: bool = False) -> Any:
        result = super()._free_request(request, delay_free_blocks)  # type: ignore[misc]
        try:
            first = self._fpm_first_token_s.pop(request.request_id, None)
            tokens = request.num_output_tokens
            itl_ms = None
            if first is not None and tokens >= 2 and request.status is not RequestStatus.FINISHED_ABORTED:
                itl_ms = max(0.0, time.time() - first) * 1000.0 / (tokens - 1)
            self._fpm_traffic.completion(tokens, itl_ms)
        except Exception:
            self._fpm_error()
        return result

    def _fpm_error(self) -> None:
        self.fpm_errors += 1
        if self.fpm_errors == 1:
            log.exception("FPM shim could not read this step (sample skipped; later ones counted only)")

    def update_from_output(self, scheduler_output: SchedulerOutput, model_runner_output: Any) -> Any:
        result = super().update_from_output(scheduler_output, model_runner_output)  # type: ignore[misc]
        ended = time.perf_counter()
        step = self._fpm_in_flight.pop(id(scheduler_output), None)
        if step is not None:
            started, scheduled, queued, first_token_due = step
            if first_token_due:
                self._fpm_first_tokens(first_token_due)
            self._fpm_publisher.publish(
                ended - max(started, self._fpm_last_end), scheduled, queued, self._fpm_traffic.take()
            )
        self._fpm_last_end = ended
        return result

    def shutdown(self) -> None:
        try:
            super().shutdown()  # type: ignore[misc]
        finally:
            self._fpm_publisher.close()

    # -- identity (called by the EngineCore utility) ---------------------------------------------------------

    def set_fpm_worker_id(self, worker_id: str) -> None:
        """Publish every following step sample and heartbeat under ``worker_id``."""
        self._fpm_publisher.set_worker_id(worker_id)

    @property
    def fpm_worker_id(self) -> str:
        return self._fpm_publisher.worker_id

    @property
    def fpm_dp_rank(self) -> int:
        return self._fpm_publisher.dp_rank

    @property
    def fpm_endpoint(self) -> str:
        return self._fpm_publisher.bound_endpoint or self._fpm_publisher.endpoint

    def fpm_publisher_stats(self) -> PublisherStats:
        return self._fpm_publisher.stats()

    # -- reading the step ------------------------------------------------------------------------------------

    def _fpm_first_tokens(self, due: list[Request]) -> None:
        """Requests whose prompt this step finished: those that now have output got their first token."""
        try:
            now = time.time()
            for request in due:
                if request.num_output_tokens < 1:
                    continue  # e.g. aborted meanwhile, or its output was dropped
                self._fpm_traffic.first_token(max(0.0, now - request.arrival_time) * 1000.0)
                if not request.is_finished():
                    self._fpm_first_token_s[request.request_id] = now
        except Exception:
            self._fpm_error()

    def _scheduled_entries(self, output: SchedulerOutput) -> Iterator[tuple[int, int, int]]:
        num_new = output.num_scheduled_tokens
        requests = self.requests
        due = self._fpm_first_token_due
        for new in output.scheduled_new_reqs:
            request = requests[new.req_id]
            n, computed, prompt = num_new.get(new.req_id, 0), new.num_computed_tokens, request.num_prompt_tokens
            if computed < prompt <= computed + n and request.num_output_tokens == 0:
                due.append(request)
            yield n, computed, prompt
        cached = output.scheduled_cached_reqs
        for req_id, computed in zip(cached.req_ids, cached.num_computed_tokens, strict=True):
            request = requests[req_id]
            n, prompt = num_new.get(req_id, 0), request.num_prompt_tokens
            if computed < prompt and prompt <= computed + n and request.num_output_tokens == 0:
                due.append(request)
            yield n, computed, prompt

    def _queued_entries(self) -> Iterator[tuple[int, int, bool]]:
        for queue in (self.waiting, self.kv_holding_waiting):
            for request in queue:
                yield request.num_tokens, request.num_computed_tokens, request.status in _WAITS_AS_DECODE


class InstrumentedScheduler(FpmSchedulerMixin, Scheduler):
    """vLLM's synchronous :class:`Scheduler` publishing FPM."""


class InstrumentedAsyncScheduler(FpmSchedulerMixin, AsyncScheduler):
    """vLLM's :class:`AsyncScheduler` (the GPU default) publishing FPM."""

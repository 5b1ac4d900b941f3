"""Worker identity for engines restored from a snapshot.

Engine side: importing this module in the engine process (the scheduler classes import it) adds two utility
methods to vLLM's ``EngineCore``, callable over vLLM's utility RPC:

- ``set_fpm_worker_id(worker_id)`` changes the id on step samples *and* heartbeats of that rank, and returns
  ``{"dp_rank", "worker_id"}``; it raises when the engine's scheduler is not the shim's;
- ``fpm_publisher_stats()`` returns that rank's publisher counters (sent, heartbeats, drops) and its pid.

Installing is idempotent, and a method of the same name that vLLM itself defines is left alone.

Parent side: :func:`sync_worker_id` pushes an id to every DP rank of an engine client, bounded by a timeout, and
raises one :class:`WorkerIdSyncError` naming every rank that failed.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from planner.errors import ConfigError, PlannerError

__all__ = [
    "SET_WORKER_ID_METHOD",
    "STATS_METHOD",
    "WorkerIdSyncError",
    "install_engine_utilities",
    "sync_worker_id",
]

SET_WORKER_ID_METHOD = "set_fpm_worker_id"
STATS_METHOD = "fpm_publisher_stats"
_MARK = "__fpm_shim_utility__"
_SHIM_HINT = "start vLLM with --scheduler-cls worker_shim.InstrumentedScheduler (or InstrumentedAsyncScheduler)"


class WorkerIdSyncError(PlannerError):
    """Some DP ranks did not confirm the new worker id. ``failures`` maps each failed rank to its reason."""

    def __init__(self, worker_id: str, failures: Mapping[int, str], num_ranks: int) -> None:
        self.worker_id = worker_id
        self.failures = dict(sorted(failures.items()))
        self.failed_ranks = tuple(self.failures)
        self.num_ranks = num_ranks
        detail = "; ".join(f"rank {rank}: {reason}" for rank, reason in self.failures.items())
        super().__init__(
            f"worker id {worker_id!r} not synced on DP rank(s) {list(self.failed_ranks)} of {num_ranks}: {detail}"
        )


# -- engine side -----------------------------------------------------------------------------------------------


def _shim_scheduler(engine: Any) -> Any:
    from worker_shim.scheduler import FpmSchedulerMixin

    scheduler = getattr(engine, "scheduler", None)
    if not isinstance(scheduler, FpmSchedulerMixin):
        raise TypeError(
            f"this engine's scheduler is {type(scheduler).__module__}.{type(scheduler).__qualname__}, not the FPM"
            f" shim's: {_SHIM_HINT}"
        )
    return scheduler


def _set_fpm_worker_id(self: Any, worker_id: str) -> dict[str, Any]:
    if not isinstance(worker_id, str) or not worker_id or worker_id != worker_id.strip():
        raise ValueError(f"worker_id must be a non-empty string without surrounding whitespace, got {worker_id!r}")
    scheduler = _shim_scheduler(self)
    scheduler.set_fpm_worker_id(worker_id)
    return {"dp_rank": scheduler.fpm_dp_rank, "worker_id": scheduler.fpm_worker_id}


def _fpm_publisher_stats(self: Any) -> dict[str, Any]:
    scheduler = _shim_scheduler(self)
    stats = scheduler.fpm_publisher_stats()
    return {
        "dp_rank": scheduler.fpm_dp_rank,
        "worker_id": scheduler.fpm_worker_id,
        "endpoint": scheduler.fpm_endpoint,
        "pid": os.getpid(),
        "sent": stats.sent,
        "heartbeats": stats.heartbeats,
        "dropped_queue_full": stats.dropped_queue_full,
        "dropped_send": stats.dropped_send,
        "counter_id": stats.counter_id,
        "step_read_errors": scheduler.fpm_errors,
    }


def install_engine_utilities(engine_cls: type | None = None) -> tuple[str, ...]:
    """Add ``set_fpm_worker_id`` and ``fpm_publisher_stats`` to ``engine_cls`` (vLLM's ``EngineCore`` by default)
    unless it already has them; returns the names it added (none on a second call)."""
    if engine_cls is None:
        from vllm.v1.engine.core import EngineCore

        engine_cls = EngineCore
    added: list[str] = []
    for name, func in ((SET_WORKER_ID_METHOD, _set_fpm_worker_id), (STATS_METHOD, _fpm_publisher_stats)):
        if hasattr(engine_cls, name):
            continue  # ours already, or vLLM's own: leave it alone
        setattr(func, _MARK, True)
        setattr(engine_cls, name, func)
        added.append(name)
    return tuple(added)


# -- parent side -----------------------------------------------------------------------------------------------


def _explain(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if f"has no attribute '{SET_WORKER_ID_METHOD}'" in text:
        return f"the engine has no {SET_WORKER_ID_METHOD} utility (the FPM shim is not loaded there): {_SHIM_HINT}"
    return text


def _rank_of(identity: object, index: int) -> int:
    if isinstance(identity, bytes) and len(identity) == 2:
        return int.from_bytes(identity, "little")  # vLLM's engine identity is the DP rank, 2 bytes little-endian
    return index


async def _gather_bounded(
    calls: Mapping[int, Awaitable[Any]], timeout_s: float
) -> tuple[dict[int, Any], dict[int, str]]:
    tasks = {rank: asyncio.ensure_future(call) for rank, call in calls.items()}
    _, pending = await asyncio.wait(tasks.values(), timeout=timeout_s)
    for task in pending:
        task.cancel()
    results: dict[int, Any] = {}
    failures: dict[int, str] = {}
    for rank, task in tasks.items():
        if task in pending:
            failures[rank] = f"no answer within {timeout_s:g}s"
        elif task.cancelled():
            failures[rank] = "call cancelled"
        elif (exc := task.exception()) is not None:
            failures[rank] = _explain(exc)
        else:
            results[rank] = task.result()
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)
    return results, failures


def _check_ack(ack: Any, rank: int | None, worker_id: str) -> str | None:
    if not isinstance(ack, Mapping) or "dp_rank" not in ack or "worker_id" not in ack:
        return f"unexpected answer {ack!r}"
    if rank is not None and ack["dp_rank"] != rank:
        return f"answered as dp_rank {ack['dp_rank']}"
    if ack["worker_id"] != worker_id:
        return f"now publishes as {ack['worker_id']!r}"
    return None


async def sync_worker_id(engine_core_client: Any, worker_id: str, timeout_s: float = 30.0) -> tuple[int, ...]:
    """Make every DP rank behind ``engine_core_client`` (vLLM's ``AsyncLLM.engine_core``) publish as
    ``worker_id``; returns the confirmed ranks. Raises :class:`WorkerIdSyncError` naming each rank that failed
    or did not answer within ``timeout_s`` seconds.

    vLLM's ``call_utility_all_async`` gathers one call per engine and surfaces only the first failure, so when
    the client exposes its per-engine call (``core_engines`` and ``_call_utility_async(..., engine=)``, which
    ``call_utility_all_async`` is built on) each rank is called and judged on its own; otherwise the ranks are
    reached through ``call_utility_all_async`` and judged by the ranks their answers name.
    """
    if not isinstance(worker_id, str) or not worker_id or worker_id != worker_id.strip():
        raise ConfigError(f"worker_id must be a non-empty string without surrounding whitespace, got {worker_id!r}")
    if not math.isfinite(timeout_s) or timeout_s <= 0:
        raise ConfigError(f"timeout_s must be > 0, got {timeout_s}")
    engines = getattr(engine_core_client, "core_engines", None)
    per_engine: Callable[..., Awaitable[Any]] | None = getattr(engine_core_client, "_call_utility_async", None)
    call_all: Callable[..., Awaitable[Any]] | None = getattr(engine_core_client, "call_utility_all_async", None)
    if engines and per_engine is not None:
        ranks = [_rank_of(engine, i) for i, engine in enumerate(engines)]
        calls = {
            rank: per_engine(SET_WORKER_ID_METHOD, worker_id, engine=engine)
            for rank, engine in zip(ranks, engines, strict=True)
        }
        results, failures = await _gather_bounded(calls, timeout_s)
        for rank, ack in results.items():
            problem = _check_ack(ack, rank, worker_id)
            if problem is not None:
                failures[rank] = problem
        if failures:
            raise WorkerIdSyncError(worker_id, failures, len(ranks))
        return tuple(sorted(results))
    if call_all is None:
        raise ConfigError(
            f"{type(engine_core_client).__qualname__} offers no way to reach every engine"
            " (neither core_engines with _call_utility_async nor call_utility_all_async)"
        )
    expected = len(engines) if engines else None
    all_results, all_failures = await _gather_bounded({-1: call_all(SET_WORKER_ID_METHOD, worker_id)}, timeout_s)
    if all_failures:
        size = expected if expected is not None else 0
        raise WorkerIdSyncError(worker_id, {r: all_failures[-1] for r in range(size)} or all_failures, size)
    acks = list(all_results[-1])
    failures = {}
    confirmed: set[int] = set()
    for index, ack in enumerate(acks):
        problem = _check_ack(ack, None, worker_id)
        if problem is not None:
            failures[index] = problem
        else:
            confirmed.add(int(ack["dp_rank"]))
    num_ranks = expected if expected is not None else len(acks)
    for rank in range(num_ranks):
        if rank not in confirmed and rank not in failures:
            failures[rank] = "no confirmation among the answers"
    if failures:
        raise WorkerIdSyncError(worker_id, failures, num_ranks)
    return tuple(sorted(confirmed))

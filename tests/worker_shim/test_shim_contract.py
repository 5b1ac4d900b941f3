"""Contract with vLLM: everything the shim relies on, by name and signature. When vLLM renames or re-signs one
of these, this fails and says which; then the shim (worker_shim.scheduler / identity) must follow."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest

vllm = pytest.importorskip("vllm")

from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.engine import EngineCoreRequestType  # noqa: E402
from vllm.v1.engine.core import EngineCore, EngineCoreProc  # noqa: E402
from vllm.v1.engine.core_client import AsyncMPClient, DPLBAsyncMPClient  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402

from worker_shim.identity import SET_WORKER_ID_METHOD, install_engine_utilities  # noqa: E402
from worker_shim.scheduler import InstrumentedAsyncScheduler, InstrumentedScheduler  # noqa: E402

PINNED = "0.32.0"


def _params(func: Any) -> list[tuple[str, str]]:
    return [(p.name, p.kind.name) for p in inspect.signature(func).parameters.values()]


def _fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_schedule_signature() -> None:
    assert _params(Scheduler.schedule) == [
        ("self", "POSITIONAL_OR_KEYWORD"),
        ("throttle_prefills", "POSITIONAL_OR_KEYWORD"),
    ], f"vLLM {vllm.__version__} re-signed Scheduler.schedule (shim pinned to {PINNED})"


def test_update_from_output_signature() -> None:
    assert _params(Scheduler.update_from_output) == [
        ("self", "POSITIONAL_OR_KEYWORD"),
        ("scheduler_output", "POSITIONAL_OR_KEYWORD"),
        ("model_runner_output", "POSITIONAL_OR_KEYWORD"),
    ], f"vLLM {vllm.__version__} re-signed Scheduler.update_from_output (shim pinned to {PINNED})"


def test_async_scheduler_is_a_scheduler_that_keeps_both_methods() -> None:
    assert issubclass(AsyncScheduler, Scheduler)
    assert _params(AsyncScheduler.schedule) == _params(Scheduler.schedule)
    assert _params(AsyncScheduler.update_from_output) == _params(Scheduler.update_from_output)
    assert _params(Scheduler.shutdown) == [("self", "POSITIONAL_OR_KEYWORD")]


def test_shim_overrides_match_vllm() -> None:
    for shim, base in ((InstrumentedScheduler, Scheduler), (InstrumentedAsyncScheduler, AsyncScheduler)):
        assert issubclass(shim, base)
        for name in ("schedule", "update_from_output", "shutdown", "add_request", "_free_request"):
            assert _params(getattr(shim, name)) == _params(getattr(base, name)), f"{shim.__name__}.{name}"


def test_what_the_traffic_extension_relies_on() -> None:
    """Arrivals at ``add_request``, completions at ``_free_request`` (every finished request, called from
    ``update_from_output`` and ``finish_requests``), TTFT from ``Request.arrival_time`` and the output count."""
    assert _params(Scheduler.add_request) == [("self", "POSITIONAL_OR_KEYWORD"), ("request", "POSITIONAL_OR_KEYWORD")]
    assert _params(Scheduler._free_request) == [
        ("self", "POSITIONAL_OR_KEYWORD"),
        ("request", "POSITIONAL_OR_KEYWORD"),
        ("delay_free_blocks", "POSITIONAL_OR_KEYWORD"),
    ]
    for caller in (Scheduler.update_from_output, Scheduler.finish_requests):
        assert "self._free_request(" in inspect.getsource(caller), caller.__name__
    assert "self.arrival_time" in inspect.getsource(Request.__init__)
    assert isinstance(inspect.getattr_static(Request, "num_output_tokens"), property)
    assert {"FINISHED_ABORTED"} <= set(RequestStatus.__members__)
    assert callable(Request.is_finished)


def test_step_numbers_the_shim_reads() -> None:
    assert {
        "scheduled_new_reqs",
        "scheduled_cached_reqs",
        "num_scheduled_tokens",
        "total_num_scheduled_tokens",
    } <= _fields(SchedulerOutput)
    assert {"req_id", "num_computed_tokens"} <= _fields(NewRequestData)
    assert {"req_ids", "num_computed_tokens"} <= _fields(CachedRequestData)
    init = inspect.getsource(Scheduler.__init__)
    for attribute in ("self.requests", "self.waiting", "self.kv_holding_waiting", "self.parallel_config"):
        assert f"{attribute}" in init, f"Scheduler no longer sets {attribute}"
    for name in ("num_prompt_tokens", "num_computed_tokens", "status"):
        assert name in inspect.getsource(Request.__init__), f"Request.{name}"
    assert isinstance(inspect.getattr_static(Request, "num_tokens"), property)
    assert {"PREEMPTED", "WAITING_FOR_REMOTE_KVS"} <= set(RequestStatus.__members__)


def test_dp_rank_comes_from_data_parallel_index() -> None:
    from vllm.config import ParallelConfig

    assert "data_parallel_index" in {f for f in ParallelConfig.__dataclass_fields__}


def test_utility_dispatch_looks_the_method_up_on_the_engine() -> None:
    """EngineCoreProc resolves a utility by ``getattr(self, method_name)`` when it arrives, so a method added to
    EngineCore is callable."""
    assert hasattr(EngineCoreRequestType, "UTILITY")
    source = inspect.getsource(EngineCoreProc._handle_client_request)
    assert "getattr(self, method_name)" in source, "utility dispatch on EngineCore changed"
    assert issubclass(EngineCoreProc, EngineCore)


def test_call_utility_all_async_and_the_per_engine_call() -> None:
    assert _params(AsyncMPClient.call_utility_all_async) == [
        ("self", "POSITIONAL_OR_KEYWORD"),
        ("method", "POSITIONAL_OR_KEYWORD"),
        ("args", "VAR_POSITIONAL"),
    ]
    assert _params(AsyncMPClient._call_utility_async) == [
        ("self", "POSITIONAL_OR_KEYWORD"),
        ("method", "POSITIONAL_OR_KEYWORD"),
        ("args", "VAR_POSITIONAL"),
        ("engine", "KEYWORD_ONLY"),
    ]
    assert issubclass(DPLBAsyncMPClient, AsyncMPClient)
    assert "self.core_engines" in inspect.getsource(AsyncMPClient.call_utility_all_async)


def test_engine_utility_is_installed_once_and_never_over_a_native_method() -> None:
    install_engine_utilities()
    assert getattr(EngineCore, SET_WORKER_ID_METHOD).__name__ == "_set_fpm_worker_id"
    assert install_engine_utilities() == ()

    class NativeEngine:
        def set_fpm_worker_id(self, worker_id: str) -> str:
            return "native"

    assert install_engine_utilities(NativeEngine) == ("fpm_publisher_stats",)
    assert NativeEngine().set_fpm_worker_id("x") == "native"

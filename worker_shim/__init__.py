"""Worker shim: FPM from inside a vLLM engine.

``worker_shim.fpm`` (the wire schema) and ``worker_shim.publisher`` import without vLLM; the scheduler classes
and identity helpers import vLLM and are loaded on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["InstrumentedAsyncScheduler", "InstrumentedScheduler", "sync_worker_id"]

_LAZY = {
    "InstrumentedScheduler": "worker_shim.scheduler",
    "InstrumentedAsyncScheduler": "worker_shim.scheduler",
    "sync_worker_id": "worker_shim.identity",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'worker_shim' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)

"""The runtime parts in the durable state and back: how a registration is kept, and how a replica takes over
what the state holds (:mod:`planner.service.state_store`).

A registration is kept as the builtins :func:`registration_value` makes of it (what registered the worker, its
lease's TTL included); :func:`restore_state` registers it again with the same values, and applies the run-time
bounds as the ``PATCH /v1/bounds`` they were set by. Which stored registrations a replica takes over (those it
does not know, each at most once) is :meth:`Operations.restorable`'s call. A stored value that cannot be applied
(bounds the core refuses, a registration that is no longer valid or whose endpoint is taken) is logged and
skipped: the replica carries on with what it has. Used by the runner; it imports nothing of it.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec

from planner.discovery import EngineCapacity, Role
from planner.errors import ConfigError, LeaseError
from planner.service.deciding import Decider
from planner.service.operations import Operations
from planner.service.registry import WorkerRegistry
from planner.service.state_store import RuntimeState

__all__ = ["registration_value", "restore_state"]

log = logging.getLogger(__name__)


def registration_value(
    *,
    role: Role,
    service: str,
    dp_size: int,
    fpm_endpoints: tuple[str, ...],
    capacity: EngineCapacity,
    ttl_s: float | None,
) -> dict[str, Any]:
    """A registration as the durable state keeps it (what :func:`restore_state` registers again)."""
    return {
        "role": role.value,
        "service": service,
        "dp_size": dp_size,
        "fpm_endpoints": list(fpm_endpoints),
        "capacity": msgspec.to_builtins(capacity),
        "ttl_s": ttl_s,
    }


def restore_state(state: RuntimeState, *, operations: Operations, decider: Decider, registry: WorkerRegistry) -> None:
    """Take the durable state over: the run-time bounds, and the registrations this replica does not know."""
    patch = operations.bounds_patch(state)
    if patch:
        try:
            decider.patch_bounds(patch)
        except ConfigError as exc:
            log.warning("stored bounds not applied: %s", exc)
    for worker_id, v in operations.restorable(state.registrations, registry.workers):
        try:
            registry.register(
                worker_id,
                role=Role(v["role"]),
                service=str(v["service"]),
                dp_size=int(v["dp_size"]),
                fpm_endpoints=tuple(v["fpm_endpoints"]),
                capacity=msgspec.convert(v["capacity"], EngineCapacity),
                ttl_s=v.get("ttl_s"),
            )
        except (LeaseError, KeyError, ValueError, msgspec.ValidationError) as exc:
            log.warning("stored registration of %s not restored: %s", worker_id, exc)

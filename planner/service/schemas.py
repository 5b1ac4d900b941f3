"""The API's response records (frozen msgspec Structs) and their JSON Schemas for the published OpenAPI spec.

Handlers encode these with msgspec directly; :func:`install_schemas` puts their schemas under
``components.schemas`` and :func:`response` points an operation's 200 answer at one of them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
from fastapi import FastAPI

from planner.core.decision import Coverage, Decision, RoleInputs, StageResult
from planner.core.observation import Traffic
from planner.discovery import EngineCapacity
from planner.service.history import DecisionEntry, OutcomeEntry

__all__ = [
    "BoundsResponse",
    "DecisionsResponse",
    "ExplainResponse",
    "OutcomesResponse",
    "RoleBoundsView",
    "WhatIfResponse",
    "WorkerView",
    "WorkersResponse",
    "install_schemas",
    "response",
]

_REF = "#/components/schemas/{name}"


class WorkerView(msgspec.Struct, frozen=True, kw_only=True):
    worker_id: str
    role: str
    service: str
    dp_size: int
    fpm_endpoints: tuple[str, ...]
    capacity: EngineCapacity
    source: str  # static | kubernetes | registration
    expires_at_s: float | None  # lease end, Unix seconds; None for workers without a lease


class WorkersResponse(msgspec.Struct, frozen=True, kw_only=True):
    workers: tuple[WorkerView, ...]


class DecisionsResponse(msgspec.Struct, frozen=True, kw_only=True):
    decisions: tuple[DecisionEntry, ...]


class OutcomesResponse(msgspec.Struct, frozen=True, kw_only=True):
    outcomes: tuple[OutcomeEntry, ...]


class ExplainResponse(msgspec.Struct, frozen=True, kw_only=True):
    """A decision, every pipeline stage with its value and reason, what it saw, and what became of it.

    ``traffic``: the traffic window the core read for the decision's role (from the FPM traffic extension: arrival
    rate, ISL/OSL mean and p50/p90/p99, observed TTFT/ITL p50/p90/p99, observed attainment, samples and window
    length; unknown figures are null); null when the core had no traffic for it."""

    id: int
    core_id: str
    tick: int
    role: str
    service: str
    decided_at_s: float
    leader: bool
    mode: str
    current: int
    recommended: int
    final: int
    action: str
    reasons: tuple[str, ...]
    summary: str
    inputs: RoleInputs
    coverage: Coverage
    stages: tuple[StageResult, ...]
    outcomes: tuple[OutcomeEntry, ...]
    traffic: Traffic | None = None


class WhatIfResponse(msgspec.Struct, frozen=True, kw_only=True):
    applied: bool  # always false: what-if never acts
    decided_at_s: float
    decisions: tuple[Decision, ...]


class RoleBoundsView(msgspec.Struct, frozen=True, kw_only=True):
    min_replicas: int
    max_replicas: int
    gpus_per_replica: int


class BoundsResponse(msgspec.Struct, frozen=True, kw_only=True):
    roles: dict[str, RoleBoundsView]
    max_total_gpus: int | None  # GPU budget over every role; None = unlimited


_TYPES: tuple[type[msgspec.Struct], ...] = (
    WorkersResponse,
    DecisionsResponse,
    OutcomesResponse,
    ExplainResponse,
    WhatIfResponse,
    BoundsResponse,
)


def response(struct: type[msgspec.Struct], description: str = "OK") -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route whose 200 answer is ``struct``."""
    return {
        200: {
            "description": description,
            "content": {"application/json": {"schema": {"$ref": _REF.format(name=struct.__name__)}}},
        }
    }


def install_schemas(app: FastAPI) -> None:
    """Add the response records' schemas to the app's OpenAPI document (generated once, on first request)."""
    _, components = msgspec.json.schema_components(_TYPES, ref_template=_REF)
    original: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            spec = original()
            schemas = spec.setdefault("components", {}).setdefault("schemas", {})
            for name, schema in components.items():
                schemas.setdefault(name, schema)
            app.openapi_schema = spec
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

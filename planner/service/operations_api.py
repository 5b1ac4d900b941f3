"""HTTP routes of the operator controls: ``POST /v1/pause``, ``POST /v1/resume`` (operator credential),
``GET /v1/pause`` and ``GET /v1/audit``. Installed by planner.service.app with its credential dependency; the
routes call :class:`~planner.service.operations.Operations` and never the runner."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Annotated, Any

import msgspec
from fastapi import FastAPI, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from planner.service.operations import ALL_SERVICES, Operations

__all__ = ["PauseBody", "install_operations_api"]


class PauseBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    service: str = Field(ALL_SERVICES, min_length=1, max_length=253, description="a service, or '*' for all")
    reason: str = Field("", max_length=1024)


class ResumeBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    service: str = Field(ALL_SERVICES, min_length=1, max_length=253)


class PauseView(BaseModel):
    service: str
    by: str
    at_s: float
    reason: str


class PausesResponse(BaseModel):
    paused: list[PauseView]


class AuditView(BaseModel):
    at_s: float
    who: str = Field(description="the credential's name (never the token)")
    action: str
    section: str
    key: str
    before: Any = None
    after: Any = None


class AuditResponse(BaseModel):
    records: list[AuditView]


def _json(payload: Any, status: int = 200) -> Response:
    return Response(msgspec.json.encode(payload), status_code=status, media_type="application/json")


class TargetsResponse(BaseModel):
    roles: dict[str, dict[str, Any]] = Field(
        description="per role: mode, sla_ttft_ms, sla_itl_ms, min_replicas, max_replicas (what the next tick uses)"
    )


def install_operations_api(
    app: FastAPI,
    ops: Operations,
    *,
    as_operator: list[Any],
    services: Callable[[], Iterable[str]],
    targets: Callable[[], dict[str, dict[str, Any]]] | None = None,
) -> None:
    """Add the routes. ``as_operator``: the app's operator-credential dependency (it puts the Principal on
    ``request.state.principal``); ``services``: the services the planner decides (for the Events of ``*``);
    ``targets``: the SLA targets and bounds per role (``GET /v1/targets``, read by the diagnostics page)."""
    if targets is not None:
        read_targets = targets

        @app.get("/v1/targets", tags=["operations"], response_model=TargetsResponse)
        async def get_targets() -> Response:
            return _json({"roles": read_targets()})

    def pauses() -> Response:
        return _json({"paused": [msgspec.to_builtins(p) for p in ops.pauses()]})

    @app.get("/v1/pause", tags=["operations"], response_model=PausesResponse)
    async def get_pauses() -> Response:
        return pauses()

    @app.post("/v1/pause", tags=["operations"], dependencies=as_operator, response_model=PausesResponse,
              responses={401: {"description": "missing or wrong token"}})  # fmt: skip
    async def pause(body: PauseBody, request: Request) -> Response:
        who = request.state.principal.name
        await asyncio.to_thread(ops.pause, body.service, who=who, reason=body.reason, services=services())
        return pauses()

    @app.post("/v1/resume", tags=["operations"], dependencies=as_operator, response_model=PausesResponse,
              responses={401: {"description": "missing or wrong token"}})  # fmt: skip
    async def resume(body: ResumeBody, request: Request) -> Response:
        who = request.state.principal.name
        await asyncio.to_thread(ops.resume, body.service, who=who, services=services())
        return pauses()

    @app.get("/v1/audit", tags=["operations"], response_model=AuditResponse)
    async def audit(limit: Annotated[int, Query(ge=1, le=10_000)] = 100) -> Response:
        records = ops.store.audit(limit)
        return _json({"records": [msgspec.to_builtins(r) for r in reversed(records)]})
